"""/proc/net/softnet_stat parser.

Kernel format (net/core/net-procfs.c softnet_seq_show()): one row per *online* CPU, each column
``%08x`` (32-bit, wraps — take deltas modulo 2**32)::

    processed dropped time_squeeze 0 0 0 0 0 0(cpu_collision) received_rps flow_limit_count
    [backlog_len cpu_id]                                  13 columns: 5.10 .. 6.3
    [backlog_len cpu_id input_qlen process_qlen]          15 columns: 6.4+ (this VM: 6.18)

Rows are per online CPU, *not* indexed by CPU id: column 13 carries the id (commit 7d58e6555870,
5.10). Layouts without that column are rejected (the row -> CPU mapping would be a guess).
Well-formed files are decoded in one ``bytes.fromhex`` call after a layout check of every row.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polltuned.errors import ParseError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

PATH = "/proc/net/softnet_stat"
WIDTH_BITS = 32
_HEXTOK = re.compile(r"[0-9a-f]{8}")
_HEX_WS = b"0123456789abcdef \n"
#: column index of each SoftnetRow field
COLS = {"processed": 0, "dropped": 1, "time_squeeze": 2, "received_rps": 9, "flow_limit_count": 10,
        "backlog_len": 11}


@dataclass(frozen=True)
class SoftnetRow:
    cpu: int
    processed: int
    dropped: int
    time_squeeze: int
    received_rps: int
    flow_limit_count: int
    backlog_len: int


@dataclass(frozen=True, eq=False)
class SoftnetRecord(Mapping[int, SoftnetRow]):
    """cpu id -> SoftnetRow (a Mapping), backed by ``matrix`` (rows x columns, int64)."""

    ids: tuple[int, ...]
    matrix: npt.NDArray[np.int64]

    def __getitem__(self, cpu: int) -> SoftnetRow:
        row = self.matrix[self.ids.index(cpu)].tolist()
        return SoftnetRow(cpu, *(row[c] for c in COLS.values()))

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def column(self, name: str) -> npt.NDArray[np.int64]:
        return self.matrix[:, COLS[name]]


def _strict(lines: list[tuple[int, str]], path: str) -> None:
    """Raise the precise ParseError for the first bad row."""
    for lineno, line in lines:
        parts = line.split(" ")
        if len(parts) not in (13, 15):
            raise ParseError(path, lineno, f"expected 13 or 15 columns, got {len(line.split())}")
        for p in parts:
            if not _HEXTOK.fullmatch(p):
                raise ParseError(path, lineno, f"expected 8-digit lowercase hex columns, got {p[:40]!r}")
    raise ParseError(path, lines[0][0] if lines else None, "rows of different widths")


def parse_softnet(text: str, path: str = PATH) -> SoftnetRecord:
    import numpy as np

    lines = [(i, ln) for i, ln in enumerate(text.split("\n"), 1) if ln]
    if not lines:
        raise ParseError(path, None, "no rows")
    ncol = (len(lines[0][1]) + 1) // 9
    ok = (ncol in (13, 15) and text.isascii() and not text.encode("ascii").translate(None, _HEX_WS)
          and all(len(ln) == 9 * ncol - 1 and ln[8::9] == " " * (ncol - 1) and ln.count(" ") == ncol - 1
                  for _, ln in lines))
    if not ok:
        _strict(lines, path)
    raw = bytes.fromhex("".join(ln for _, ln in lines).replace(" ", ""))
    arr = np.frombuffer(raw, dtype=">u4").astype(np.int64).reshape(len(lines), ncol)
    arr.flags.writeable = False
    ids = tuple(arr[:, 12].tolist())
    if len(set(ids)) != len(ids):
        dup = next(c for c in ids if ids.count(c) > 1)
        raise ParseError(path, lines[ids.index(dup) + ids[ids.index(dup) + 1:].index(dup) + 1][0],
                         f"duplicate row for cpu {dup}")
    return SoftnetRecord(ids, arr)

"""/proc/net/softnet_stat parser.

Kernel format (net/core/net-procfs.c softnet_seq_show()): one row per *online* CPU, each column
``%08x`` (32-bit, wraps — take deltas modulo 2**32)::

    processed dropped time_squeeze 0 0 0 0 0 0(cpu_collision) received_rps flow_limit_count
    [backlog_len cpu_id]                                  13 columns: 5.10 .. 6.3
    [backlog_len cpu_id input_qlen process_qlen]          15 columns: 6.4+ (this VM: 6.18)

Rows are per online CPU, *not* indexed by CPU id: column 13 carries the id (commit 7d58e6555870,
5.10). Layouts without that column are rejected (the row -> CPU mapping would be a guess).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from polltuned.errors import ParseError

PATH = "/proc/net/softnet_stat"
WIDTH_BITS = 32
_ROW = re.compile(r"[0-9a-f]{8}(?: [0-9a-f]{8}){12}(?:(?: [0-9a-f]{8}){2})?")


@dataclass(frozen=True)
class SoftnetRow:
    cpu: int
    processed: int
    dropped: int
    time_squeeze: int
    received_rps: int
    flow_limit_count: int
    backlog_len: int


def parse_softnet(text: str, path: str = PATH) -> Mapping[int, SoftnetRow]:
    rows: dict[int, SoftnetRow] = {}
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        parts = line.split()
        if len(parts) not in (13, 15):
            raise ParseError(path, lineno, f"expected 13 or 15 columns, got {len(parts)}")
        if not _ROW.fullmatch(line):
            bad = next((p for p in parts if len(p) != 8 or not re.fullmatch("[0-9a-f]+", p)), line)
            raise ParseError(path, lineno, f"expected 8-digit lowercase hex columns, got {bad[:40]!r}")
        v = [int(p, 16) for p in parts]
        cpu = v[12]
        if cpu in rows:
            raise ParseError(path, lineno, f"duplicate row for cpu {cpu}")
        rows[cpu] = SoftnetRow(cpu, v[0], v[1], v[2], v[9], v[10], v[11])
    if not rows:
        raise ParseError(path, None, "no rows")
    return rows

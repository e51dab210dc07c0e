"""/proc/softirqs parser.

Kernel format (fs/proc/softirqs.c, show_softirqs(), unchanged 2.6.31 .. 6.18)::

                        CPU0       CPU1          (header: for_each_possible_cpu -> "CPU%-8d")
              HI:          0          0
           TIMER:      12283      13190
          NET_TX:          3          0
          NET_RX:       1237       2130
    ...                                          (NR_SOFTIRQS rows "%12s:" then " %10u" per CPU)

Columns are *possible* CPUs (offline ones included), named in the header, so CPU ids are taken
from the header, never from the column index. Counts are ``unsigned int`` per CPU (kstat_softirqs_cpu)
and wrap at 2**32. Each count is the number of times that vector's handler ran on that CPU.
Rows in the exact kernel layout (" %10u" fields) are parsed in one numpy call; anything else goes
through the strict token parser.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from polltuned.counters._util import cpu_header_line, int_block, uints
from polltuned.errors import ParseError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

PATH = "/proc/softirqs"
WIDTH_BITS = 32
KNOWN = ("HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU")


@dataclass(frozen=True, eq=False)
class SoftirqsRecord:
    cpus: tuple[int, ...]                  # header order
    names: tuple[str, ...]                 # vector names, file order
    matrix: npt.NDArray[np.int64]          # shape (len(names), len(cpus))

    @cached_property
    def counts(self) -> Mapping[str, tuple[int, ...]]:
        """vector name -> one count per entry of ``cpus``"""
        return {n: tuple(row) for n, row in zip(self.names, self.matrix.tolist())}

    def for_cpu(self, name: str) -> dict[int, int]:
        row = self.counts.get(name)
        return {} if row is None else dict(zip(self.cpus, row))


def _name(line: str, lineno: int, path: str) -> tuple[str, str]:
    name, colon, rest = line.partition(":")
    name = name.strip()
    if not colon or not name or not (name.isascii() and name.replace("_", "").isalnum()):
        raise ParseError(path, lineno, f"expected 'NAME: counts...', got {line.strip()[:40]!r}")
    return name, rest


def _record(cpus: tuple[int, ...], names: list[str], rows: object) -> SoftirqsRecord:
    import numpy as np

    arr = np.asarray(rows, dtype=np.int64).reshape(len(names), len(cpus))
    arr.flags.writeable = False
    return SoftirqsRecord(cpus, tuple(names), arr)


def parse_softirqs(text: str, path: str = PATH) -> SoftirqsRecord:
    lines = text.split("\n")
    cpus = cpu_header_line(lines, path)
    n = len(cpus)
    body = [(i, ln) for i, ln in enumerate(lines[1:], 2) if ln.strip()]
    named = [(i, *_name(ln, i, path)) for i, ln in body]
    names = [nm for _, nm, _ in named]
    if len(set(names)) == len(names) and "NET_RX" in names:
        rests = [r for _, _, r in named]
        if all(len(r) == 11 * n and r[0::11] == " " * n for r in rests):
            arr = int_block("".join(rests))
            if arr is not None and arr.size == n * len(rests) and (not arr.size or int(arr.max()) < 1 << 32):
                return _record(cpus, names, arr)
    rows: list[list[int]] = []
    seen: set[str] = set()
    for lineno, name, rest in named:
        vals = uints(rest.split(), path, lineno, name)
        if len(vals) != n:
            raise ParseError(path, lineno, f"{name}: {len(vals)} counts for {n} CPU columns")
        if max(vals) >= 1 << 32:
            raise ParseError(path, lineno, f"{name}: count wider than 32 bits")
        if name in seen:
            raise ParseError(path, lineno, f"duplicate row {name!r}")
        seen.add(name)
        rows.append(vals)
    if "NET_RX" not in seen:
        raise ParseError(path, None, "no NET_RX row")
    return _record(cpus, names, rows)

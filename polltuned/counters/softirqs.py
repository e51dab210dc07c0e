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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from polltuned.counters._util import cpu_id, uints
from polltuned.errors import ParseError

PATH = "/proc/softirqs"
WIDTH_BITS = 32
KNOWN = ("HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU")


@dataclass(frozen=True)
class SoftirqsRecord:
    cpus: tuple[int, ...]                      # header order
    counts: Mapping[str, tuple[int, ...]]      # vector name -> one count per entry of ``cpus``

    def for_cpu(self, name: str) -> dict[int, int]:
        row = self.counts.get(name)
        return {} if row is None else dict(zip(self.cpus, row))


def parse_softirqs(text: str, path: str = PATH) -> SoftirqsRecord:
    lines = text.split("\n")
    header = lines[0].split() if lines else []
    if not header:
        raise ParseError(path, 1, "missing 'CPU0 CPU1 ...' header")
    cpus = tuple(cpu_id(h, "CPU", path, 1) for h in header)
    if len(set(cpus)) != len(cpus):
        raise ParseError(path, 1, "duplicate CPU column in header")
    counts: dict[str, tuple[int, ...]] = {}
    for lineno, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        name, colon, rest = line.partition(":")
        name = name.strip()
        if not colon or not name or not (name.isascii() and name.replace("_", "").isalnum()):
            raise ParseError(path, lineno, f"expected 'NAME: counts...', got {line.strip()[:40]!r}")
        vals = uints(rest.split(), path, lineno, name)
        if len(vals) != len(cpus):
            raise ParseError(path, lineno, f"{name}: {len(vals)} counts for {len(cpus)} CPU columns")
        if name in counts:
            raise ParseError(path, lineno, f"duplicate row {name!r}")
        counts[name] = tuple(vals)
    if "NET_RX" not in counts:
        raise ParseError(path, None, "no NET_RX row")
    return SoftirqsRecord(cpus=cpus, counts=counts)

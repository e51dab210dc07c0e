"""/proc/loadavg parser.

Kernel format (fs/proc/loadavg.c loadavg_proc_show())::

    0.01 0.06 0.03 1/92 4638
    avg1 avg5 avg15 nr_running()/nr_threads last_pid

``nr_running`` is global (all CPUs) and includes the reader itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from polltuned.counters._util import ufloat, uint
from polltuned.errors import ParseError

PATH = "/proc/loadavg"


@dataclass(frozen=True)
class LoadavgRecord:
    load1: float
    load5: float
    load15: float
    procs_running: int
    threads: int


def parse_loadavg(text: str, path: str = PATH) -> LoadavgRecord:
    lines = [ln for ln in text.split("\n") if ln.strip()]
    if len(lines) != 1:
        raise ParseError(path, 1 if not lines else 2, "expected exactly one line")
    parts = lines[0].split()
    if len(parts) != 5:
        raise ParseError(path, 1, f"expected 5 fields, got {len(parts)}")
    running, slash, threads = parts[3].partition("/")
    if not slash:
        raise ParseError(path, 1, f"field 4: expected running/threads, got {parts[3][:40]!r}")
    uint(parts[4], path, 1, "last_pid")
    return LoadavgRecord(
        ufloat(parts[0], path, 1, "avg1"),
        ufloat(parts[1], path, 1, "avg5"),
        ufloat(parts[2], path, 1, "avg15"),
        uint(running, path, 1, "running"),
        uint(threads, path, 1, "threads"),
    )

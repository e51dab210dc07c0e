"""Per-process CPU time of the workload's processes.

On the real host through psutil (polltuned.host.procs); on a fake tree from ``/proc/PID/stat``.
Kernel format of /proc/PID/stat (fs/proc/array.c do_task_stat())::

    pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
        utime stime cutime cstime priority nice num_threads itrealvalue starttime ...

utime (14) / stime (15) in clock ticks (USER_HZ=100); starttime (22) in ticks since boot.
``comm`` may contain spaces and parentheses, so the fields start after the *last* ')'.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from polltuned.counters._util import uints
from polltuned.counters.base import Absent, Reader, SampleContext
from polltuned.counters.stat import USER_HZ
from polltuned.errors import HostError, ParseError
from polltuned.host.fs import Host
from polltuned.host.procs import cpu_times, warm_up


@dataclass(frozen=True)
class ProcTimes:
    pid: int
    user_s: float
    system_s: float
    start: float        # identity guard against pid reuse (create time or starttime ticks)


def parse_pid_stat(text: str, path: str) -> ProcTimes:
    line = text.split("\n", 1)[0]
    lp, rp = line.find("("), line.rfind(")")
    if lp < 1 or rp < lp:
        raise ParseError(path, 1, "expected 'pid (comm) state ...'")
    pid_tok = line[:lp].strip()
    rest = line[rp + 1:].split()
    if len(rest) < 20:
        raise ParseError(path, 1, f"expected at least 22 fields, got {len(rest) + 2}")
    pid = uints([pid_tok], path, 1, "pid")[0]
    utime, stime = uints(rest[11:13], path, 1, "utime/stime")
    start = uints([rest[19]], path, 1, "starttime")[0]
    return ProcTimes(pid, utime / USER_HZ, stime / USER_HZ, float(start))


class _PsutilProcs:
    def __init__(self, pids: Callable[[], Iterable[int]]) -> None:
        self._pids = pids
        warm_up()

    def read(self) -> Mapping[int, ProcTimes]:
        return {pid: ProcTimes(pid, u, s, c) for pid, (u, s, c) in cpu_times(self._pids()).items()}

    def close(self) -> None:
        return None


class _FsProcs:
    def __init__(self, host: Host, pids: Callable[[], Iterable[int]]) -> None:
        self._host = host
        self._pids = pids

    def read(self) -> Mapping[int, ProcTimes]:
        out: dict[int, ProcTimes] = {}
        for pid in self._pids():
            p = f"/proc/{pid}/stat"
            try:
                text = self._host.read_text(p)
            except HostError as e:
                if e.errno in (errno.ENOENT, errno.ESRCH):
                    continue  # the process exited: tolerated
                raise
            out[pid] = parse_pid_stat(text, p)
        return out

    def close(self) -> None:
        return None


class ProcsCollector:
    name = "procs"
    default = True
    doc = "per-process user+system CPU of the workload's pids (psutil; /proc/PID/stat on a fake tree)"

    def start(self, host: Host, ctx: SampleContext) -> Reader:
        if ctx.pids is None:
            raise Absent("pids", reason="no workload pids given")
        if host.is_real:
            return _PsutilProcs(ctx.pids)
        return _FsProcs(host, ctx.pids)

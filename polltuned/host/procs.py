"""Per-process CPU time of the workload's processes through psutil (real host only).

Busy-poll and threaded-NAPI work is accounted as *system* time of the polling task (or of the
``napi/<dev>-<id>`` kthread), not in the softirq counters, so the objective needs this.
psutil's ``cpu_times()`` covers all threads of the process; ``create_time`` guards pid reuse.
"""

from __future__ import annotations

from collections.abc import Iterable


def warm_up() -> None:
    """Import psutil now, outside the timed part of a sample."""
    import psutil  # noqa: F401


def cpu_times(pids: Iterable[int]) -> dict[int, tuple[float, float, float]]:
    """pid -> (user_s, system_s, create_time); pids that vanished or are not readable are left out."""
    import psutil

    out: dict[int, tuple[float, float, float]] = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                t = p.cpu_times()
                out[pid] = (float(t.user), float(t.system), float(p.create_time()))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def task_samples(descendants_of: int | None = None) -> dict[int, tuple[int, str, float, str]]:
    """Every user-space process (or only the descendants of ``descendants_of``): pid -> (CPU it
    last ran on, state letter, user+system seconds, command line joined by spaces). Kernel threads
    (pid 2 and its children) are left out. One psutil pass (``/proc/PID/stat`` field 39
    ``processor`` and field 3 ``state``, ``cmdline``)."""
    import psutil

    only: set[int] | None = None
    if descendants_of is not None:
        try:
            only = {c.pid for c in psutil.Process(descendants_of).children(recursive=True)}
        except psutil.Error:
            only = set()

    letters = {psutil.STATUS_RUNNING: "R", psutil.STATUS_SLEEPING: "S", psutil.STATUS_DISK_SLEEP: "D",
               psutil.STATUS_STOPPED: "T", psutil.STATUS_ZOMBIE: "Z", psutil.STATUS_IDLE: "I"}
    out: dict[int, tuple[int, str, float, str]] = {}
    for p in psutil.process_iter(["pid", "ppid", "cpu_num", "status", "cpu_times", "cmdline"]):
        info = p.info
        pid = int(info["pid"])
        if only is not None and pid not in only:
            continue
        if pid == 2 or info.get("ppid") == 2 or info.get("cpu_times") is None or info.get("cpu_num") is None:
            continue
        t = info["cpu_times"]
        out[pid] = (int(info["cpu_num"]), letters.get(str(info.get("status")), "?"),
                    float(t.user) + float(t.system), " ".join(info.get("cmdline") or []))
    return out

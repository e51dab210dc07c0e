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

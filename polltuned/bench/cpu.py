"""The bench's accounting of what disturbs a window: steal and other processes' CPU; and the wait
for a quiet machine before measuring. The window's own CPU (idle polling included) is the daemon's
CPU account, polltuned.metrics.cpu_scope."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from polltuned.clock import Clock
from polltuned.counters.stat import USER_HZ, StatRecord, parse_stat
from polltuned.errors import PolltunedError
from polltuned.host.fs import Host


def read_steal_ticks(host: Host) -> int | None:
    """Steal ticks (USER_HZ) of all CPUs from /proc/stat; None when unreadable."""
    try:
        return int(parse_stat(host.read_text("/proc/stat")).total.steal)
    except (PolltunedError, ValueError):
        return None


def foreign_cores(before: Mapping[int, float], after: Mapping[int, float], elapsed_s: float) -> float:
    """Pure: cores used by other processes over a window (pids present at both ends)."""
    if elapsed_s <= 0:
        return 0.0
    return sum(max(0.0, after[p] - before[p]) for p in before.keys() & after.keys()) / elapsed_s


def busy_cores(before: StatRecord, after: StatRecord, elapsed_s: float) -> float:
    """Pure: cores busy (every /proc/stat field but idle and iowait) between two parsed /proc/stat
    records (polltuned.counters.stat.StatRecord) ``elapsed_s`` apart."""
    if elapsed_s <= 0:
        return 0.0

    def busy(t: Any) -> int:
        return int(t.user + t.nice + t.system + t.irq + t.softirq + t.steal)

    return max(0, busy(after.total) - busy(before.total)) / USER_HZ / elapsed_s


def wait_for_quiet(host: Host, clock: Clock, *, max_cores: float = 0.15, hold_s: float = 10.0,
                   timeout_s: float = 900.0, progress: Callable[[str], None] = lambda s: None) -> tuple[bool, float]:
    """Block until the whole machine used at most ``max_cores`` for ``hold_s`` seconds in a row
    (1 s samples of /proc/stat), or ``timeout_s`` passed. Returns (quiet, seconds waited). For
    measurements on a shared host: other processes' CPU disturbs latency (vm-bench.md §0)."""
    t0 = clock.monotonic()
    quiet_since: float | None = None
    prev = parse_stat(host.read_text("/proc/stat"))
    t_prev = t0
    last_note = t0
    while True:
        clock.sleep(1.0)
        now = clock.monotonic()
        cur = parse_stat(host.read_text("/proc/stat"))
        cores = busy_cores(prev, cur, now - t_prev)
        prev, t_prev = cur, now
        if cores <= max_cores:
            quiet_since = now if quiet_since is None else quiet_since
            if now - quiet_since >= hold_s:
                return True, now - t0
        else:
            quiet_since = None
        if now - t0 >= timeout_s:
            progress(f"the machine did not get quiet within {timeout_s:.0f} s (last second: {cores:.2f} cores busy); "
                     "measuring anyway")
            return False, now - t0
        if now - last_note >= 30:
            progress(f"waiting for a quiet machine: {cores:.2f} cores busy (want <= {max_cores:.2f} for "
                     f"{hold_s:.0f} s)")
            last_note = now

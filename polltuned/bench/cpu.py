"""The bench's CPU accounting around each window: guest idle-poll (halt-polling) time, steal and
other processes' CPU; and the wait for a quiet machine before measuring.

Why guest idle polling is added to CPU: with ``guest_halt_poll_ns`` the vCPU spins in the cpuidle
POLL state, which /proc/stat counts as idle (vm-bench.md §8); without the correction the tuner
would see that knob as free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from polltuned.clock import Clock
from polltuned.counters.stat import USER_HZ, StatRecord, parse_stat
from polltuned.errors import HostError, PolltunedError
from polltuned.host.fs import Host


def parse_cpuidle_poll_us(names_times: Sequence[tuple[str, str]]) -> float:
    """Pure: total µs spent in cpuidle states named ``POLL``, from (name, time) file contents
    (/sys/devices/system/cpu/cpuN/cpuidle/stateM/{name,time}; time is cumulative µs)."""
    total = 0.0
    for name, t in names_times:
        if name.strip() == "POLL":
            try:
                total += float(t.strip())
            except ValueError:
                continue
    return total


def read_cpuidle_poll_us(host: Host) -> float | None:
    pairs: list[tuple[str, str]] = []
    for cpu in host.glob("/sys/devices/system/cpu", "cpu[0-9]*"):
        base = f"/sys/devices/system/cpu/{cpu}/cpuidle"
        for st in host.glob(base, "state[0-9]*"):
            try:
                pairs.append((host.read_text(f"{base}/{st}/name"), host.read_text(f"{base}/{st}/time")))
            except HostError:
                continue
    return parse_cpuidle_poll_us(pairs) if pairs else None


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

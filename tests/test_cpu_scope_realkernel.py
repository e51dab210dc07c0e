"""The one CPU account on the real kernel (root; holds the real-kernel lock): raising
guest_halt_poll_ns raises the CPU the daemon's scope reports while an idle-heavy load runs.

With cpuidle-haltpoll a vCPU about to halt first spins in the cpuidle POLL state for up to
guest_halt_poll_ns; /proc/stat counts that spinning as idle. The load wakes up every ~100 µs (a
timer-driven sleep loop pinned to one CPU: the CPU goes idle between wake-ups, the case halt
polling is for). Three windows at 0 ns, then three at 200000 ns (not interleaved: see the loop), and
guest_halt_poll_ns is restored to its original value whatever happens.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from polltuned.clock import SystemClock
from polltuned.counters import Sampler
from polltuned.host.fs import FsHost
from polltuned.metrics.cpu_scope import IdlePoll, make_cpu_scope
from polltuned.policy.loader import policy_from_dict

HALT_POLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
LOAD = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    time.sleep(0.0001)\n"


def idle_entries() -> int:
    """Entries into any cpuidle state on any CPU (the ``usage`` counters), summed."""
    return sum(int(p.read_text()) for p in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpuidle/state*/usage"))


@pytest.mark.realkernel
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_halt_polling_raises_the_scopes_cpu(real_kernel: None) -> None:
    host = FsHost("/")
    if not HALT_POLL.exists():
        pytest.skip("no cpuidle-haltpoll driver (guest_halt_poll_ns) on this machine")
    poll = IdlePoll(host)
    if poll.read() is None:
        pytest.skip(poll.missing or "no cpuidle POLL state")
    clock = SystemClock()
    sampler = Sampler(host, clock=clock)
    # the bench's layout: a nic inside a namespace, so the scope is the whole host (every CPU)
    knobs = {"net.core.busy_poll": {"min": 0, "max": 50}}
    pol = policy_from_dict({"name": "halt", "nic": "ptx-none/veth0", "knobs": knobs,
                            "probe": {"kind": "command", "argv": ["true"], "regex": "p99=(?P<p99>\\S+)"}})
    scope = make_cpu_scope(pol, host, sampler, sampler.nics, clock=clock)
    original = HALT_POLL.read_text().strip()
    cpu = min(1, (os.cpu_count() or 1) - 1)
    load = subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", LOAD.format(s=60)])
    readings: dict[int, list[tuple[float, float]]] = {0: [], 200000: []}
    entries0 = idle_entries()
    try:
        clock.sleep(0.5)
        # 0 first, then 200000: lowering guest_halt_poll_ns does not stop a poll window that keeps
        # covering the load's wake-ups (the haltpoll governor adjusts its per-CPU limit only after a
        # real halt, and while it polls 200 µs a 100 µs load never halts): measured in CI, windows at
        # 0 that followed 200000 still polled 0.93 cores. Interleaving would measure that carry-over.
        for value in (0, 0, 0, 200000, 200000, 200000):
            HALT_POLL.write_text(f"{value}\n")
            clock.sleep(0.3)                          # the governor's poll window adapts
            scope.begin()
            clock.sleep(2.0)
            r = scope.end()
            readings[value].append((r.cores, r.idle_poll_cores or 0.0))
    finally:
        HALT_POLL.write_text(original + "\n")
        load.kill()
        load.wait(10)
    assert HALT_POLL.read_text().strip() == original
    if idle_entries() == entries0:
        # measured on the project's VM (Dec 2026): every cpuidle state's usage stays frozen while
        # CPUs idle, so the idle loop never reaches cpuidle and guest_halt_poll_ns cannot act
        pytest.skip("no cpuidle state was entered during the load (usage counters did not move): this "
                    "machine's idle loop bypasses cpuidle, so halt polling cannot act here")
    off = statistics.median(c for c, _ in readings[0])
    on = statistics.median(c for c, _ in readings[200000])
    poll_off = statistics.median(p for _, p in readings[0])
    poll_on = statistics.median(p for _, p in readings[200000])
    print(f"guest_halt_poll_ns 0: {off:.3f} cores (idle poll {poll_off:.3f}); "
          f"200000: {on:.3f} cores (idle poll {poll_on:.3f}); all {readings}")
    assert poll_on > 0.05 and poll_on > 5 * poll_off + 0.01, readings
    assert on > off, readings

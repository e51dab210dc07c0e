"""The workload changes mid-run: one ping-pong session, then 16 parallel sessions from window 16.

Before the change busy polling wins (as in busypoll_split); after it, busy_read 50 makes the p99
~8x worse (vm-bench §6: 4/16 parallel sessions, p99 +700...+1250 %). ``expected`` describes the
workload after the change (what gets deployed): keeping the baseline is right. A tuner that trusts
what it learnt before the change deploys a disaster; interleaved confirmation must catch it.
"""

import math
from typing import Any

import numpy as np

from polltuned.worlds.scenario import knob, noisy

SHIFT_AT = 16
NONSTATIONARY = True


def _before(config: dict[str, Any]) -> tuple[float, float]:
    br = knob(config, "net.core.busy_read")
    if br > 0:
        return 17.0 + 198.0 * math.exp(-br / 9.0) + 0.05 * br, 0.3 + 0.7 * (1.0 - math.exp(-br / 6.0))
    return 215.0, 0.3


def _after(config: dict[str, Any]) -> tuple[float, float]:
    br = knob(config, "net.core.busy_read")
    tm = knob(config, "kernel.timer_migration", 1)
    p99, cpu = 400.0, 1.0
    if br > 0:
        p99 *= 1.0 + 7.0 * (1.0 - math.exp(-br / 10.0))
        cpu = 1.8
    if tm == 0:
        p99 *= 0.98
    return p99, cpu


def expected(config: dict[str, Any]) -> dict[str, float]:
    p99, cpu = _after(config)
    return {"p99_us": p99, "cpu_cores": cpu}


def measure(config: dict[str, Any], rng: np.random.Generator, window: int = 0) -> dict[str, float]:
    p99, cpu = _before(config) if window < SHIFT_AT else _after(config)
    return {"p99_us": noisy(rng, p99, 0.08), "cpu_cores": noisy(rng, cpu, 0.03, 0.0)}

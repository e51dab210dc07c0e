"""Spinning hurts with few sessions: 10 parallel request/response streams.

Modelled on seed 004 (-3 % to -10 % at 10 instances): busy_poll and busy_read cost CPU and add a
little latency; nothing else matters. The right answer is to keep the baseline.
"""

import math
from typing import Any

import numpy as np

from polltuned.worlds.scenario import knob, noisy


def expected(config: dict[str, Any]) -> dict[str, float]:
    br = knob(config, "net.core.busy_read")
    bp = knob(config, "net.core.busy_poll")
    p99 = 120.0
    cpu = 0.5
    if bp > 0:
        p99 *= 1.0 + 0.08 * (1.0 - math.exp(-bp / 15.0))
        cpu += 0.4 * (1.0 - math.exp(-bp / 15.0))
    if br > 0:
        p99 *= 1.0 + 0.10 * (1.0 - math.exp(-br / 15.0))
        cpu += 0.5 * (1.0 - math.exp(-br / 15.0))
    return {"p99_us": p99, "cpu_cores": cpu}


def measure(config: dict[str, Any], rng: np.random.Generator, window: int = 0) -> dict[str, float]:
    e = expected(config)
    return {"p99_us": noisy(rng, e["p99_us"], 0.08), "cpu_cores": noisy(rng, e["cpu_cores"], 0.03, 0.0)}

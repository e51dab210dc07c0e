"""A cliff: a region of catastrophic latency next to the good region.

Busy reading 20-80 µs trims the p99 from 100 µs to ~60 µs. Beyond ~110 µs the poller starves the
application on this 2-vCPU guest and the p99 goes x10 (vm-bench §11: busy_read 200 on a shared vCPU,
+2180 %). IRQ deferral with gro_flush_timeout > 200 µs is a second cliff (+1100 % in vm-bench §4).
A tuner must find the gain without living on the cliff, and must never deploy it.
"""

import math
from typing import Any

import numpy as np

from polltuned.worlds.scenario import knob, noisy


def expected(config: dict[str, Any]) -> dict[str, float]:
    br = knob(config, "net.core.busy_read")
    defer = knob(config, "napi_defer_hard_irqs")
    gft = knob(config, "gro_flush_timeout")
    p99 = 100.0
    cpu = 0.3
    if br > 0:
        p99 = 58.0 + 42.0 * math.exp(-br / 12.0) + 0.05 * br
        cpu = 0.3 + 0.6 * (1.0 - math.exp(-br / 8.0))
        if br > 110:
            p99 *= 1.0 + 9.0 / (1.0 + math.exp(-(br - 120.0) / 4.0))
    if defer > 0 and gft > 200_000:
        p99 *= 12.0
    elif defer > 0 and gft > 0:
        p99 *= 1.0 + gft / 200_000 * 0.5
    return {"p99_us": p99, "cpu_cores": cpu}


def measure(config: dict[str, Any], rng: np.random.Generator, window: int = 0) -> dict[str, float]:
    e = expected(config)
    return {"p99_us": noisy(rng, e["p99_us"], 0.08), "cpu_cores": noisy(rng, e["cpu_cores"], 0.03, 0.0)}

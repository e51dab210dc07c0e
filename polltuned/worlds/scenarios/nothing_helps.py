"""Nothing helps: every knob is neutral or harmful. The right answer is to keep the baseline.

A host where the bottleneck is elsewhere (application CPU): busy polling only burns CPU and adds a
little latency, IRQ deferral adds latency, gro_normal_batch and timer_migration are pure noise.
"""

import math
from typing import Any

import numpy as np

from polltuned.worlds.scenario import knob, noisy


def expected(config: dict[str, Any]) -> dict[str, float]:
    br = knob(config, "net.core.busy_read")
    bp = knob(config, "net.core.busy_poll")
    defer = knob(config, "napi_defer_hard_irqs")
    gft = knob(config, "gro_flush_timeout")
    p99 = 180.0
    cpu = 0.6
    for v in (br, bp):
        if v > 0:
            cpu += 0.5 * (1.0 - math.exp(-v / 10.0))
            p99 *= 1.02
    if gft > 0:
        p99 *= 1.0 + min(gft, 500_000) / 500_000 * (0.6 if defer > 0 else 0.1)
    return {"p99_us": p99, "cpu_cores": cpu}


def measure(config: dict[str, Any], rng: np.random.Generator, window: int = 0) -> dict[str, float]:
    e = expected(config)
    return {"p99_us": noisy(rng, e["p99_us"], 0.08), "cpu_cores": noisy(rng, e["cpu_cores"], 0.03, 0.0)}

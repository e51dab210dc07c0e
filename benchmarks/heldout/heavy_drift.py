"""Held-out: heavy drift. The host's latency wanders by +-40 % over tens of windows (vm-bench §7:
batches drift by +-25 %, §14: steal), with a noisy-neighbour episode (x1.7) in windows 30-44. The
landscape itself does not move: busy_read 15-80 µs trims the p99 by ~30 % for ~0.4 cores; only
comparisons made side by side are meaningful.
"""

import math
from typing import Any

import numpy as np

from polltuned.worlds.scenario import knob, noisy


def expected(config: dict[str, Any]) -> dict[str, float]:
    br = knob(config, "net.core.busy_read")
    defer = knob(config, "napi_defer_hard_irqs")
    gft = min(knob(config, "gro_flush_timeout"), 500_000)
    tm = knob(config, "kernel.timer_migration", 1)
    p99, cpu = 220.0, 0.6
    if br > 0:
        p99 *= 1.0 - 0.32 * br ** 2 / (br ** 2 + 8.0 ** 2)
        p99 += 0.25 * br
        cpu += 0.45 * (1.0 - math.exp(-br / 15.0))
    if defer > 0 and gft > 0:
        p99 *= 1.2 + 2.0 * gft / 500_000
        cpu *= 0.85
    if tm == 0:
        p99 *= 1.02
    return {"p99_us": p99, "p50_us": p99 * 0.5, "cpu_cores": cpu}


def drift(window: int) -> float:
    w = float(window)
    x = 0.25 * math.sin(2 * math.pi * w / 70.0) + 0.12 * math.sin(2 * math.pi * w / 23.0 + 1.0) - 0.12 * math.sin(1.0)
    if 30 <= window < 45:
        x += math.log(1.7)
    return math.exp(x)


def measure(config: dict[str, Any], rng: np.random.Generator, window: int = 0) -> dict[str, float]:
    e = expected(config)
    f = drift(window)
    return {"p99_us": noisy(rng, e["p99_us"] * f, 0.10, 0.05, 1.5), "p50_us": noisy(rng, e["p50_us"] * f, 0.05, 0.0),
            "cpu_cores": noisy(rng, e["cpu_cores"], 0.03, 0.0)}

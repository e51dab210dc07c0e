"""Held-out: static busy_read = busy_poll = 50 is harmful. A paced request/response service
(vm-bench §9, 2-10 k requests/s): a short busy_read window (5-20 µs) catches most replies and
trims the p99 by about a third for little CPU, but a longer window keeps the server spinning after
each reply and delays the worker that shares its CPU (+3 % per µs above 20 µs), and busy_poll makes
the epoll loop spin in front of the worker (+60 %). Deferral is the usual latency trap. Noisy, with
heavy tails (paced p99 CVs are high).
"""

import math
from typing import Any

import numpy as np

from polltuned.worlds.scenario import knob, noisy


def expected(config: dict[str, Any]) -> dict[str, float]:
    br = knob(config, "net.core.busy_read")
    bp = knob(config, "net.core.busy_poll")
    defer = knob(config, "napi_defer_hard_irqs")
    gft = min(knob(config, "gro_flush_timeout"), 500_000)
    p99, cpu = 180.0, 0.25
    if br > 0:
        p99 *= 1.0 - 0.35 * br ** 3 / (br ** 3 + 4.0 ** 3)
        p99 *= 1.0 + 0.03 * max(0.0, br - 20.0)
        cpu += 0.012 * br
    if bp > 0:
        p99 *= 1.0 + 0.6 * bp ** 2 / (bp ** 2 + 5.0 ** 2)
        cpu += 0.5 * (1.0 - math.exp(-bp / 10.0))
    if defer > 0 and gft > 0:
        p99 *= 1.5 + 2.5 * gft / 500_000
        cpu *= 0.7
    return {"p99_us": p99, "p50_us": p99 * 0.45, "cpu_cores": cpu}


def measure(config: dict[str, Any], rng: np.random.Generator, window: int = 0) -> dict[str, float]:
    e = expected(config)
    return {"p99_us": noisy(rng, e["p99_us"], 0.20, 0.08, 2.2), "p50_us": noisy(rng, e["p50_us"], 0.08, 0.0),
            "cpu_cores": noisy(rng, e["cpu_cores"], 0.04, 0.0)}

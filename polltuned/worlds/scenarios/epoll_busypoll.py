"""Epoll busy polling halves round trips: one thread, many sockets on one epoll set.

Modelled on seed 002 (sockperf ping-pong, epoll: round trip ~18 µs -> ~8 µs with busy polling).
The epoll path uses net.core.busy_poll; busy_read (per-socket blocking reads) does nothing here.
Optimum: busy_poll ~ 40-80 µs, everything else at the defaults.
"""

import math
from typing import Any

import numpy as np

from polltuned.worlds.scenario import knob, noisy


def expected(config: dict[str, Any]) -> dict[str, float]:
    bp = knob(config, "net.core.busy_poll")
    defer = knob(config, "napi_defer_hard_irqs")
    gft = knob(config, "gro_flush_timeout")
    p99 = 30.0
    cpu = 0.25
    if bp > 0:
        p99 = 13.0 + 17.0 * math.exp(-bp / 12.0) + 0.02 * bp
        cpu = 0.25 + 0.75 * (1.0 - math.exp(-bp / 8.0))
    elif defer > 0 and gft > 0:
        p99 *= 1.0 + min(gft, 500_000) / 20_000 * 0.4
    return {"p99_us": p99, "p50_us": p99 * 0.6, "cpu_cores": cpu}


def measure(config: dict[str, Any], rng: np.random.Generator, window: int = 0) -> dict[str, float]:
    e = expected(config)
    return {"p99_us": noisy(rng, e["p99_us"], 0.08), "p50_us": noisy(rng, e["p50_us"], 0.04, 0.0),
            "cpu_cores": noisy(rng, e["cpu_cores"], 0.03, 0.0)}

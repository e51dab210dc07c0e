"""Held-out: an optimum that needs several knobs changed together (IRQ suspension). With busy_poll
on *and* deferral on (napi_defer_hard_irqs >= 1, gro_flush_timeout >= ~10 µs) the epoll application
is the only consumer of the queue: lower latency and less CPU than the baseline. busy_poll alone
cuts latency a little but burns a core; deferral alone is the usual latency trap. From the
baseline, every single-knob move looks worse.
"""

import math
from typing import Any

import numpy as np

from polltuned.worlds.scenario import knob, noisy


def expected(config: dict[str, Any]) -> dict[str, float]:
    bp = knob(config, "net.core.busy_poll")
    defer = knob(config, "napi_defer_hard_irqs")
    gft = min(knob(config, "gro_flush_timeout"), 500_000)
    poll = bp ** 3 / (bp ** 3 + 15.0 ** 3) if bp > 0 else 0.0
    deferred = (1.0 - math.exp(-defer / 1.5)) / (1.0 + math.exp(-(math.log(gft) - math.log(8_000)) * 3.0)) \
        if (defer > 0 and gft > 0) else 0.0
    suspend = poll * deferred
    p99 = 100.0 * (1.0 - 0.15 * poll)
    cpu = 0.5 + 1.2 * poll
    if defer > 0 and gft > 0:
        p99 *= 1.0 + (1.0 - poll) * (0.3 + 1.5 * (gft / 500_000) ** 0.5)
    # suspension: the poller owns the queue, no IRQs, no wasted spinning
    p99 *= 1.0 - 0.35 * suspend
    cpu -= 1.0 * suspend
    return {"p99_us": p99, "p50_us": p99 * 0.55, "cpu_cores": max(cpu, 0.3)}


def measure(config: dict[str, Any], rng: np.random.Generator, window: int = 0) -> dict[str, float]:
    e = expected(config)
    return {"p99_us": noisy(rng, e["p99_us"], 0.10, 0.04, 1.5), "p50_us": noisy(rng, e["p50_us"], 0.05, 0.0),
            "cpu_cores": noisy(rng, e["cpu_cores"], 0.03, 0.0)}

"""Busy polling wins alone: client and server on separate vCPUs, one ping-pong session.

Modelled on seed 000 and vm-bench §3/§12 (split layout, veth NAPI): busy_read >= ~25 µs cuts the
p99 round trip from ~215 µs to ~20 µs while the polling vCPU goes to 100 %. busy_poll does nothing
(the application blocks in recvfrom), IRQ deferral without busy polling adds latency, the other
knobs do nothing. Optimum: busy_read ~ 40-60 µs.
"""

import math
from typing import Any

import numpy as np

from polltuned.worlds.scenario import knob, noisy


def expected(config: dict[str, Any]) -> dict[str, float]:
    br = knob(config, "net.core.busy_read")
    defer = knob(config, "napi_defer_hard_irqs")
    gft = knob(config, "gro_flush_timeout")
    cpu = 0.30
    if br > 0:
        p99 = 17.0 + 198.0 * math.exp(-br / 9.0) + 0.05 * br
        cpu = 0.30 + 0.70 * (1.0 - math.exp(-br / 6.0))
    else:
        p99 = 215.0
        if defer > 0 and gft > 0:  # deferral without busy polling: waits for the flush timer
            p99 *= 1.0 + min(gft, 500_000) / 20_000 * 0.5
            cpu *= 0.4
    return {"p99_us": p99, "p50_us": p99 * 0.55, "cpu_cores": cpu}


def measure(config: dict[str, Any], rng: np.random.Generator, window: int = 0) -> dict[str, float]:
    e = expected(config)
    p99 = noisy(rng, e["p99_us"], 0.08)
    return {"p99_us": p99, "p50_us": noisy(rng, e["p50_us"], 0.04, 0.0),
            "cpu_cores": noisy(rng, e["cpu_cores"], 0.03, 0.0)}

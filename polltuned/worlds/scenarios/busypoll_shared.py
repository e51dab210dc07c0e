"""Busy polling loses when another task shares the CPU (client and server on one vCPU).

Modelled on seed 000 (the reply: "spinning is wrong whenever someone else could use the CPU") and
vm-bench §12 "same" layout: busy_read 50 turns a 28 µs p99 into ~177 µs (+530 %). IRQ deferral adds
latency; kernel.timer_migration=0 trims ~3 %. The right answer: no busy polling; the best gain
available (~3 %) is below a 5 % minimum effect, so keeping the baseline is correct.
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
    tm = knob(config, "kernel.timer_migration", 1)
    p99 = 28.2
    cpu = 0.35
    if br > 0:
        p99 *= 1.0 + 5.3 * (1.0 - math.exp(-br / 10.0))
        cpu = 0.35 + 0.65 * (1.0 - math.exp(-br / 6.0))
    if bp > 0:
        p99 *= 1.0 + 0.4 * (1.0 - math.exp(-bp / 20.0))
    if defer > 0 and gft > 0:
        p99 *= 1.0 + min(gft, 500_000) / 50_000 * 0.3
    if tm == 0:
        p99 *= 0.97
    return {"p99_us": p99, "cpu_cores": cpu}


def measure(config: dict[str, Any], rng: np.random.Generator, window: int = 0) -> dict[str, float]:
    e = expected(config)
    return {"p99_us": noisy(rng, e["p99_us"], 0.08), "cpu_cores": noisy(rng, e["cpu_cores"], 0.03, 0.0)}

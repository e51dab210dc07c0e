"""Held-out: a narrow optimum. An epoll application on a veth whose NAPI holds UDP in the GRO
list (vm-bench §1.3 "napi" mode): busy_poll below ~10 µs catches nothing, and once it catches the
packets the round trip is about the busy-poll window plus ~14 µs, so every extra µs costs latency.
The best busy_poll sits in a narrow band just above the catch threshold. busy_read does nothing
(the application polls through epoll). Deferral without busy polling waits for the timer; with busy
polling the held packets wait for gro_flush_timeout too.
"""

from typing import Any

import numpy as np

from polltuned.worlds.scenario import knob, noisy


def expected(config: dict[str, Any]) -> dict[str, float]:
    bp = knob(config, "net.core.busy_poll")
    defer = knob(config, "napi_defer_hard_irqs")
    gft = knob(config, "gro_flush_timeout")
    tm = knob(config, "kernel.timer_migration", 1)
    caught = bp ** 8 / (bp ** 8 + 12.0 ** 8) if bp > 0 else 0.0
    p99 = 140.0 * (1.0 - caught) + caught * (14.0 + 1.1 * bp)
    cpu = 0.3 + 0.7 * (1.0 - np.exp(-bp / 5.0)) if bp > 0 else 0.3
    if defer > 0 and gft > 0:
        p99 *= 1.0 + (1.0 - caught) * (0.25 + 2.0 * (min(gft, 500_000) / 500_000) ** 0.5)
        p99 += caught * min(gft, 500_000) / 1000.0 * 0.5
        cpu *= 1.0 - 0.2 * (1.0 - np.exp(-gft / 20_000.0))
    if tm == 0:
        p99 *= 1.01
    return {"p99_us": float(p99), "p50_us": float(p99) * 0.6, "cpu_cores": float(cpu)}


def measure(config: dict[str, Any], rng: np.random.Generator, window: int = 0) -> dict[str, float]:
    e = expected(config)
    return {"p99_us": noisy(rng, e["p99_us"], 0.12, 0.04, 1.6), "p50_us": noisy(rng, e["p50_us"], 0.06, 0.0),
            "cpu_cores": noisy(rng, e["cpu_cores"], 0.03, 0.0)}

"""Held-out: a step-shaped, replay-like landscape. Like a replay of recorded windows, every
configuration gets the records of the nearest recorded arm (distance |log1p(a) - log1p(b)| per
knob), so the landscape is flat plateaus separated by jumps, with no gradient to follow. The arms
are modelled on vm-bench tables B/B3 (busy_read sweep, napitso) and C2 (deferral with and without
busy polling): windows are resampled from each arm's few records, so the noise is the arm's own.
"""

import math
from typing import Any

import numpy as np

from polltuned.worlds.scenario import knob

# (busy_read, napi_defer_hard_irqs, gro_flush_timeout) -> [(p99 µs, CPU cores), ...]
ARMS: dict[tuple[float, float, float], list[tuple[float, float]]] = {
    (0, 0, 0): [(171.4, 0.61), (219.8, 0.63), (184.4, 0.60), (207.9, 0.63), (163.0, 0.62)],
    (5, 0, 0): [(154.7, 0.79), (131.0, 0.77), (178.0, 0.80)],
    (10, 0, 0): [(103.5, 1.38), (61.0, 1.36), (148.0, 1.40)],
    (25, 0, 0): [(16.0, 1.91), (17.2, 1.95), (15.1, 1.96)],
    (50, 0, 0): [(17.0, 1.99), (18.1, 1.98), (16.2, 2.00)],
    (100, 0, 0): [(17.1, 1.98), (17.5, 1.99), (16.8, 1.97)],
    (200, 0, 0): [(16.3, 2.00), (16.9, 2.00), (15.9, 1.99)],
    (0, 2, 20_000): [(234.5, 0.78), (205.0, 0.80), (262.0, 0.76)],
    (0, 2, 200_000): [(573.6, 0.147), (566.0, 0.15), (581.0, 0.14)],
    (50, 2, 20_000): [(36.4, 1.995), (27.0, 1.99), (46.0, 2.00)],
    (50, 2, 200_000): [(38.9, 1.99), (30.1, 1.99), (49.0, 1.98)],
    (200, 2, 200_000): [(19.1, 2.00), (16.2, 2.00), (22.4, 2.00)],
}


def _nearest(config: dict[str, Any]) -> list[tuple[float, float]]:
    br = knob(config, "net.core.busy_read")
    defer = knob(config, "napi_defer_hard_irqs")
    gft = knob(config, "gro_flush_timeout")
    if not (defer > 0 and gft > 0):
        defer, gft = 0.0, 0.0

    def d(a: float, b: float) -> float:
        return abs(math.log1p(a) - math.log1p(b))

    key = min(ARMS, key=lambda k: d(br, k[0]) + d(defer, k[1]) + d(gft, k[2]))
    return ARMS[key]


def expected(config: dict[str, Any]) -> dict[str, float]:
    recs = _nearest(config)
    return {"p99_us": float(np.mean([r[0] for r in recs])), "cpu_cores": float(np.mean([r[1] for r in recs]))}


def measure(config: dict[str, Any], rng: np.random.Generator, window: int = 0) -> dict[str, float]:
    recs = _nearest(config)
    p99, cpu = recs[int(rng.integers(len(recs)))]
    return {"p99_us": p99, "cpu_cores": cpu}

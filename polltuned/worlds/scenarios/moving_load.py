"""The load moves without notice: one ping-pong session alone on the server's CPU, then four
sessions with two clients runnable on the server's CPU, and back (as ``bench --workload mix``).

Alone, busy_read pays (p99 215 -> ~20 µs from ~30 µs busy value, as busypoll_split); shared, the
poller delays the runnable clients: busy_read 50 makes the p99 ~5x worse and the defaults are best
(vm-bench §6, seeds 000/004: busy polling must yield to runnable tasks). timer_migration = 0 gains
3 % in both. The schedule (windows): quiet 0-69, shared 70-129, quiet 130-209, shared 210-249,
quiet 250-299, then it repeats every 300. The load is exposed as context: ``flows`` (1 or 4),
``runnable_others`` (0 or 2) and ``offered_rate`` (requests/s, ~5 % noise) — none of them moves
with the knobs.
"""

import math
from typing import Any

import numpy as np

from polltuned.worlds.scenario import knob, noisy

NONSTATIONARY = True
SEGMENTS = ((0, "quiet"), (70, "shared"), (130, "quiet"), (210, "shared"), (250, "quiet"))
PERIOD = 300
CONTEXT = {"quiet": (1.0, 0.0, 9000.0), "shared": (4.0, 2.0, 30000.0)}


def load_at(window: int) -> str:
    w = max(0, int(window)) % PERIOD
    label = SEGMENTS[0][1]
    for start, name in SEGMENTS:
        if w >= start:
            label = name
    return label


def _model(config: dict[str, Any], load: str) -> tuple[float, float]:
    br = knob(config, "net.core.busy_read")
    tm = knob(config, "kernel.timer_migration", 1)
    if load == "quiet":
        if br > 0:
            p99 = 17.0 + 198.0 * math.exp(-br / 9.0) + 0.05 * br
            cpu = 0.3 + 0.7 * (1.0 - math.exp(-br / 6.0))
        else:
            p99, cpu = 215.0, 0.3
    else:
        p99, cpu = 300.0, 0.9
        if br > 0:
            p99 *= 1.0 + 4.0 * (1.0 - math.exp(-br / 12.0))
            cpu = 1.6
    if tm == 0:
        p99 *= 0.97
    return p99, cpu


def expected_at(config: dict[str, Any], window: int) -> dict[str, float]:
    p99, cpu = _model(config, load_at(window))
    return {"p99_us": p99, "cpu_cores": cpu}


def expected(config: dict[str, Any]) -> dict[str, float]:
    return expected_at(config, PERIOD - 1)


def measure(config: dict[str, Any], rng: np.random.Generator, window: int = 0) -> dict[str, float]:
    load = load_at(window)
    p99, cpu = _model(config, load)
    flows, others, rate = CONTEXT[load]
    return {"p99_us": noisy(rng, p99, 0.08), "cpu_cores": noisy(rng, cpu, 0.03, 0.0),
            "context:flows": flows, "context:runnable_others": others,
            "context:offered_rate": rate * math.exp(float(rng.normal(0.0, 0.05)))}

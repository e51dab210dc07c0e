"""Optimisers: the Optimiser protocol, a shared observation history, and the backend registry.

Every optimiser sees the objective as ``y = log(J / J_baseline)`` (lower is better, 0 = as good
as the host was), one observation per measurement window. Failed windows are never told: they go
to ``tell_failed`` so the configuration is not proposed again.

Backends (explicit registry, heavy imports lazy):
  * ``skopt``  — scikit-optimize GP (Matern 5/2 ARD + white noise) with domain seeds, a trust region
    around the host's current values that grows on success, a safety filter and noise-aware EI;
  * ``random`` — uniform random search over the same encoded space (a baseline);
  * ``grid``   — a shuffled full-factorial grid over a few levels per knob (a baseline).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from polltuned.errors import UsageError
from polltuned.optimiser.space import Space
from polltuned.records import KnobValue


@dataclass(frozen=True)
class Recommendation:
    config: dict[str, KnobValue]
    predicted: float          # model's (or observed mean) y for the config
    observed_mean: float
    windows: int


class Optimiser(Protocol):
    name: str

    def ask(self, remaining: int | None = None) -> dict[str, KnobValue]:
        """Next configuration to try; ``remaining`` = windows left in the budget (a hint)."""
        ...
    def tell(self, config: Mapping[str, KnobValue], y: float) -> None: ...
    def tell_failed(self, config: Mapping[str, KnobValue]) -> None: ...
    def best(self) -> Recommendation | None: ...
    @property
    def cpu_seconds(self) -> float: ...


@dataclass
class _Entry:
    config: dict[str, KnobValue]
    ys: list[float]


class History:
    """Observations keyed by canonical configuration (mutable, owned by one optimiser)."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.entries: dict[str, _Entry] = {}
        self.order: list[tuple[str, float]] = []   # (key, y) in tell order
        self.failed: set[str] = set()

    def add(self, config: Mapping[str, KnobValue], y: float) -> str:
        if not np.isfinite(y):
            raise ValueError(f"non-finite objective {y!r} must not be told to an optimiser")
        k = self.space.key_of(config)
        e = self.entries.get(k)
        if e is None:
            e = _Entry(self.space.canonical(config), [])
            self.entries[k] = e
        e.ys.append(float(y))
        self.order.append((k, float(y)))
        return k

    def seen(self, config: Mapping[str, KnobValue]) -> int:
        k = self.space.key_of(config)
        e = self.entries.get(k)
        return len(e.ys) if e else (1 if k in self.failed else 0)

    def best_observed(self) -> Recommendation | None:
        if not self.entries:
            return None
        # mean of log-ratios; a config seen once is shrunk slightly towards 0 (no better than baseline)
        def score(e: _Entry) -> float:
            m = float(np.mean(e.ys))
            return m * len(e.ys) / (len(e.ys) + 0.25)

        e = min(self.entries.values(), key=score)
        m = float(np.mean(e.ys))
        return Recommendation(dict(e.config), m, m, len(e.ys))


class CpuMeter:
    """Process CPU seconds spent inside ``with`` blocks (re-entrant: nested blocks count once)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._t0 = 0.0
        self._depth = 0

    def __enter__(self) -> CpuMeter:
        if self._depth == 0:
            self._t0 = time.process_time()
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.total += time.process_time() - self._t0


def make_optimiser(name: str, space: Space, baseline: Mapping[str, KnobValue], *, seed: int,
                   initial_points: int = 6, safety_limit: float | None = None) -> Optimiser:
    """Build a backend by name (explicit registry)."""
    if name == "skopt":
        from polltuned.optimiser.skopt_backend import SkoptOptimiser
        return SkoptOptimiser(space, baseline, seed=seed, initial_points=initial_points,
                              safety_limit=safety_limit)
    if name == "random":
        from polltuned.optimiser.baselines import RandomOptimiser
        return RandomOptimiser(space, baseline, seed=seed)
    if name == "grid":
        from polltuned.optimiser.baselines import GridOptimiser
        return GridOptimiser(space, baseline, seed=seed)
    raise UsageError(f"tuning.optimiser: unknown optimiser {name!r} (choose skopt, random or grid)")


OPTIMISERS = ("skopt", "random", "grid")

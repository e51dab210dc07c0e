"""What every optimiser backend builds on: the Optimiser protocol, the observation history and
its bookkeeping (polltuned.optimiser names the backends; they import this module, never the registry)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from polltuned.optimiser.space import Space
from polltuned.records import KnobValue

#: a window's load context (signal name -> value, see records.Window.context)
Context = Mapping[str, float]


@dataclass(frozen=True)
class Recommendation:
    config: dict[str, KnobValue]
    predicted: float          # model's (or observed mean) y for the config
    observed_mean: float
    windows: int


class Optimiser(Protocol):
    name: str

    def ask(self, remaining: int | None = None,
            pending: Sequence[Mapping[str, KnobValue]] = (), *,
            context: Context | None = None) -> dict[str, KnobValue]:
        """Next configuration to try. ``remaining``: windows left in the budget (a hint);
        ``pending``: configurations being measured elsewhere right now (not to be proposed again);
        ``context``: the load now (a contextual backend optimises the knobs with it fixed)."""
        ...
    def tell(self, config: Mapping[str, KnobValue], y: float, *, context: Context | None = None) -> None: ...
    def retell(self, observations: Sequence[tuple[Mapping[str, KnobValue], float]], *,
               contexts: Sequence[Context | None] | None = None) -> None:
        """Replace every observation (the engine revised the windows' reference levels);
        ``contexts``, when given, runs parallel to ``observations``."""
        ...
    def tell_failed(self, config: Mapping[str, KnobValue]) -> None: ...
    def set_noise(self, sd: float) -> None:
        """The measured window-to-window standard deviation of y (from the reference windows)."""
        ...
    def best(self, *, context: Context | None = None) -> Recommendation | None:
        """The recommendation; ``context``: for the load given (a contextual backend's posterior
        at that context; others ignore it)."""
        ...
    def candidate(self, *, context: Context | None = None) -> Recommendation | None:
        """The configuration worth confirming against the baseline: the best evaluated one that
        is not the baseline (None when there is none); ``context`` as for ``best``."""
        ...
    def simplify(self, config: Mapping[str, KnobValue], *, context: Context | None = None) -> dict[str, KnobValue]:
        """``config`` with the knobs that do not matter put back; ``context``: at the load given (a
        contextual backend's posterior there; others ignore it)."""
        ...
    @property
    def cpu_seconds(self) -> float: ...


@runtime_checkable
class Predicting(Protocol):
    """An optimiser with a model the engine can query (the GP): posterior (mean, sd) of y."""

    def predict(self, configs: Sequence[Mapping[str, KnobValue]], *,
                context: Context | None = None,
                against: Mapping[str, KnobValue] | None = None) -> list[tuple[float, float]]:
        """Posterior (mean, sd) of y at each config; with ``against``, of y(config) - y(against),
        the sd from the joint posterior (a configuration the model has not seen differs from one it
        has by a wide margin even where the two means are close)."""
        ...


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

    def reset(self) -> None:
        self.entries.clear()
        self.order.clear()

    def seen(self, config: Mapping[str, KnobValue]) -> int:
        k = self.space.key_of(config)
        e = self.entries.get(k)
        return len(e.ys) if e else (1 if k in self.failed else 0)

    def best_observed(self, exclude: str | None = None) -> Recommendation | None:
        entries = [e for k, e in self.entries.items() if k != exclude]
        if not entries:
            return None

        # mean of log-ratios; a config seen once is shrunk slightly towards 0 (no better than baseline)
        def score(e: _Entry) -> float:
            m = float(np.mean(e.ys))
            return m * len(e.ys) / (len(e.ys) + 0.25)

        e = min(entries, key=score)
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


class HistoryBookkeeping:
    """What every backend shares: observations in a History, retell, failures, optimiser CPU."""

    space: Space
    hist: History
    _cpu: CpuMeter

    def tell(self, config: Mapping[str, KnobValue], y: float, *, context: Context | None = None) -> None:
        with self._cpu:
            self.hist.add(config, y)

    def retell(self, observations: Sequence[tuple[Mapping[str, KnobValue], float]], *,
               contexts: Sequence[Context | None] | None = None) -> None:
        with self._cpu:
            self.hist.reset()
            for c, y in observations:
                self.hist.add(c, y)

    def tell_failed(self, config: Mapping[str, KnobValue]) -> None:
        self.hist.failed.add(self.space.key_of(config))

    def set_noise(self, sd: float) -> None:
        return None

    def best(self, *, context: Context | None = None) -> Recommendation | None:
        return self.hist.best_observed()

    def candidate(self, *, context: Context | None = None) -> Recommendation | None:
        return self.hist.best_observed(exclude=self.baseline_key())

    def baseline_key(self) -> str | None:
        return None

    def simplify(self, config: Mapping[str, KnobValue], *, context: Context | None = None) -> dict[str, KnobValue]:
        return dict(config)

    @property
    def cpu_seconds(self) -> float:
        return self._cpu.total

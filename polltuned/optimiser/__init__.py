"""Optimisers: the Optimiser protocol, a shared observation history, and the one registry.

Every optimiser sees the objective as ``y = log(J / level)`` (lower is better, 0 = as good as the
baseline measured next to it, see polltuned.engine.reference), one observation per measurement
window. Failed windows are never told as numbers: they go to ``tell_failed`` so the configuration
is not proposed again. Because a window's reference level is revised when the next reference
window arrives, the engine may replace every observation at once with ``retell``.

The registry :data:`OPTIMISERS` (name -> factory, heavy imports lazy) is the only list of
optimisers; its names are :data:`polltuned.policy.names.OPTIMISER_NAMES` (a leaf module of the
policy's vocabulary: the schema validates ``tuning.optimiser`` against it, the CLI offers them). The protocol and the
shared history the backends build on are in :mod:`polltuned.optimiser.base`.
  * ``skopt``  — scikit-optimize GP: space-filling start over the whole space, trust regions that
    restart, global candidates in every acquisition, a safety filter on the model's upper bound;
  * ``random`` — uniform random search over the same encoded space (a baseline);
  * ``grid``   — a shuffled full-factorial grid over a few levels per knob (a baseline);
  * ``skopt-worker`` — the same ``skopt`` GP in a model worker process (polltuned.optimiser.proxy):
    the daemon's choice for ``skopt`` (polltuned.daemon.wiring), so its own process never loads the
    model's libraries; same answers to the same calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from polltuned.errors import UsageError
from polltuned.optimiser.base import (
    Context,
    CpuMeter,
    History,
    HistoryBookkeeping,
    Optimiser,
    Predicting,
    Recommendation,
)
from polltuned.optimiser.space import Space
from polltuned.policy.names import OPTIMISER_NAMES
from polltuned.records import KnobValue

__all__ = ["OPTIMISERS", "OPTIMISER_NAMES", "Context", "CpuMeter", "History", "HistoryBookkeeping", "Optimiser",
           "Predicting", "Recommendation", "make_optimiser"]

Factory = Callable[..., Optimiser]


def _skopt(space: Space, baseline: Mapping[str, KnobValue], *, seed: int, initial_points: int,
           safety_limit: float | None) -> Optimiser:
    from polltuned.optimiser.skopt_backend import SkoptOptimiser  # lazy: scikit-optimize is heavy
    return SkoptOptimiser(space, baseline, seed=seed, initial_points=initial_points, safety_limit=safety_limit)


def _random(space: Space, baseline: Mapping[str, KnobValue], *, seed: int, initial_points: int,
            safety_limit: float | None) -> Optimiser:
    from polltuned.optimiser.baselines import RandomOptimiser  # lazy: the registry imports no backend
    return RandomOptimiser(space, baseline, seed=seed)


def _grid(space: Space, baseline: Mapping[str, KnobValue], *, seed: int, initial_points: int,
          safety_limit: float | None) -> Optimiser:
    from polltuned.optimiser.baselines import GridOptimiser  # lazy: the registry imports no backend
    return GridOptimiser(space, baseline, seed=seed)


def _skopt_worker(space: Space, baseline: Mapping[str, KnobValue], *, seed: int, initial_points: int,
                  safety_limit: float | None) -> Optimiser:
    from polltuned.host.modelproc import spawn_model_worker  # lazy: only the daemon starts model workers
    from polltuned.optimiser.proxy import WorkerOptimiser  # lazy: the registry imports no backend

    return WorkerOptimiser(space, baseline, seed=seed, initial_points=initial_points, safety_limit=safety_limit,
                           spawn=lambda: spawn_model_worker(idle_s=WORKER_IDLE_S))


#: seconds a model worker may sit idle before it exits (the next call starts another, exactly where it was)
WORKER_IDLE_S = 60.0

#: the one registry of optimisers, in the order of OPTIMISER_NAMES (tests/test_import_graph.py holds them equal)
OPTIMISERS: dict[str, Factory] = {"skopt": _skopt, "random": _random, "grid": _grid, "skopt-worker": _skopt_worker}


def make_optimiser(name: str, space: Space, baseline: Mapping[str, KnobValue], *, seed: int,
                   initial_points: int = 6, safety_limit: float | None = None) -> Optimiser:
    """Build a backend by name (explicit registry)."""
    factory = OPTIMISERS.get(name)
    if factory is None:
        raise UsageError(f"tuning.optimiser: unknown optimiser {name!r} (choose {', '.join(OPTIMISERS)})")
    return factory(space, baseline, seed=seed, initial_points=initial_points, safety_limit=safety_limit)

"""Baseline optimisers: uniform random search and a shuffled grid, over the same space."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from polltuned.optimiser.base import Context, CpuMeter, History, HistoryBookkeeping
from polltuned.optimiser.space import Space
from polltuned.records import KnobValue


class RandomOptimiser(HistoryBookkeeping):
    name = "random"

    def __init__(self, space: Space, baseline: Mapping[str, KnobValue], *, seed: int) -> None:
        self.space = space
        self.hist = History(space)
        self.rng = np.random.default_rng(seed)
        self._cpu = CpuMeter()
        self._base_key = space.key_of(baseline)

    def baseline_key(self) -> str | None:
        return self._base_key

    def ask(self, remaining: int | None = None,
            pending: Sequence[Mapping[str, KnobValue]] = (), *,
            context: Context | None = None) -> dict[str, KnobValue]:
        busy = {self.space.key_of(p) for p in pending}
        with self._cpu:
            for _ in range(200):
                c = self.space.sample_uniform(self.rng, 1)[0]
                if self.hist.seen(c) == 0 and self.space.key_of(c) not in busy:
                    return c
            return c


class GridOptimiser(HistoryBookkeeping):
    """Full-factorial grid over ``Space.levels`` per knob, visited in a seeded random order."""

    name = "grid"

    def __init__(self, space: Space, baseline: Mapping[str, KnobValue], *, seed: int,
                 max_points: int = 100_000) -> None:
        self.space = space
        self.hist = History(space)
        self._cpu = CpuMeter()
        rng = np.random.default_rng(seed)
        levels = [space.levels(d) for d in space.dims]
        combos = list(itertools.islice(itertools.product(*levels), max_points))
        order = rng.permutation(len(combos))
        self._queue: list[dict[str, KnobValue]] = []
        seen: set[str] = set()
        for i in order:
            c = space.canonical(dict(zip(space.keys, combos[int(i)])))
            k = space.key_of(c)
            if k not in seen:
                seen.add(k)
                self._queue.append(c)
        self._pos = 0
        self._rng = rng
        self._base_key = space.key_of(baseline)

    def baseline_key(self) -> str | None:
        return self._base_key

    def ask(self, remaining: int | None = None,
            pending: Sequence[Mapping[str, KnobValue]] = (), *,
            context: Context | None = None) -> dict[str, KnobValue]:
        busy = {self.space.key_of(p) for p in pending}
        with self._cpu:
            while self._pos < len(self._queue):
                c = self._queue[self._pos]
                self._pos += 1
                if self.hist.seen(c) == 0 and self.space.key_of(c) not in busy:
                    return c
            return self.space.sample_uniform(self._rng, 1)[0]

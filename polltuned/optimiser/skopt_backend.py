"""The scikit-optimize backend: a GP surrogate that searches the whole feasible space, safely.

Proposals, in order:

1. **A space-filling start** of ``max(initial_points, min(knobs + 4, 10))`` points (``Space.space_filling``:
   scrambled Sobol for switches and categories, values stratified per knob) over every knob's whole
   range, switches on and off; the host's own values are never the centre of anything. The policy's
   domain seeds, one knob at a time, fill at most half of the start (extra candidates, tried once;
   nothing later centres on them); a policy without seeds gets a wholly space-filling start.
2. **Bayesian optimisation**: a scikit-optimize ``GaussianProcessRegressor`` whose kernel is
   additive per knob (a Matern on each knob's own columns) plus a full ARD Matern for interactions
   (polltuned.optimiser.kernels), plus a white-noise term whose level starts at, and is bounded
   around, the noise the engine *measured* on its reference windows (a GP left alone under-estimates
   large noise, optimisation.md §2.2); hyper-parameters warm-started from the previous fit. Every
   acquisition scores candidates from three sources: a trust region around the incumbent (side
   ``length`` in the unit cube; doubles after 2 successes, halves after ``max(3, d/2)`` failures,
   and *restarts* — back to its initial size, the next acquisition drawn from the whole space only — when it falls below
   ``length_min``), uniform global samples (``global_fraction`` of every pool), and the policy's
   domain seeds not yet tried (extra candidates, never the centre). The pick maximises expected
   improvement over the best *posterior mean* of an evaluated configuration (noise-aware, not the
   luckiest window).
3. **Safety from the model**: once a few configurations are known, a candidate whose upper bound
   ``mu + safety_kappa * sd`` exceeds the guard limit is skipped, and nothing is proposed within a
   small radius of a configuration that already broke the guard (a GP smooths a cliff away).
4. **Endgame**: in the last windows of the budget, or when nothing has a useful probability of
   beating the incumbent by ``min_gain``, the most promising evaluated configurations are re-measured
   (a sharper final pick, no exploration cost).

``best()`` is the evaluated configuration with the lowest posterior mean + ``rec_kappa`` sd (a
configuration seen once in a lucky window does not beat one measured repeatedly). Bounded cost:
the GP is fitted on at most ``max_fit_points`` observations (the best half and the most recent
half), acquisition scores ~1000 candidates, BLAS is capped at one thread (threadpoolctl); past
``refit_after`` observations the hyper-parameters are re-optimised only every ``refit_every`` tells
(between them the GP is refitted with the last hyper-parameters), so a daemon that keeps telling
for days pays a bounded cost per step.

**Context (J(knobs, context))**: once observations come with a context (``tell(..., context=)``:
the load a window saw, records.Window.context), the surrogate's input is the encoded knobs plus one
column per context signal: ``log1p(value)`` centred on the span of the told contexts, the span at
least ``log(2)`` (a 10 % wobble of a rate is not "another load"), unknown signals in the middle.
The kernel is ``context_kernel`` (polltuned.optimiser.kernels.contextual: ``"product"`` by
default — the knob kernel times a Matern over the context, measured better than ``"sum"`` on the
moving-load family, see benchmarks/tuner_quality.py --horizon). Every acquisition, ``best``,
``candidate``, the endgame and ``simplify`` then work at the context given (or the last one seen):
the knobs are optimised with the context fixed; "evaluated", "seen n times" and "too close to an
evaluated configuration" count only windows whose context was within ``ctx_near`` (unit distance)
of it, so the configuration that was best at another load can be measured again at this one.
Without any context told, every step is exactly the context-free path above.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import zip_longest
from typing import Any

import numpy as np

from polltuned.optimiser.base import Context, CpuMeter, History, HistoryBookkeeping, Recommendation, _Entry
from polltuned.optimiser.kernels import CONTEXT_KERNELS, additive_plus_full, contextual
from polltuned.optimiser.space import Space
from polltuned.records import KnobValue


class SkoptOptimiser(HistoryBookkeeping):
    name = "skopt"

    def __init__(self, space: Space, baseline: Mapping[str, KnobValue], *, seed: int,
                 initial_points: int = 6, safety_limit: float | None = None,
                 max_fit_points: int = 80, n_candidates: int = 1000, context_kernel: str = "product",
                 refit_every: int = 5, refit_after: int = 60) -> None:
        if context_kernel not in CONTEXT_KERNELS:
            raise ValueError(f"context_kernel {context_kernel!r}: choose one of {', '.join(CONTEXT_KERNELS)}")
        self.space = space
        self.hist = History(space)
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.baseline = space.canonical(baseline)
        self._base_key = space.key_of(self.baseline)
        self.safety_limit = safety_limit
        self.max_fit_points = max_fit_points
        self.n_candidates = n_candidates
        self._cpu = CpuMeter()
        self.noise_sd = 0.15
        self.length_init = 0.5
        self.length_min = 0.06
        self.length_max = 1.0
        self.length = self.length_init
        self.global_fraction = 0.3
        self.rec_kappa = 1.0
        self.cand_kappa = 0.5
        self.safety_kappa = 1.5
        self.min_gain = 0.02      # log units: an improvement worth exploring for (~2 %)
        self.exploit_cap = 6      # re-measure a configuration at most this often
        self.endgame_windows = 3
        self.bad_radius = 0.08
        self.min_move = 0.05
        self._succ = 0
        self._fail = 0
        self._restart = False
        self._model: Any = None
        self._model_recipe: dict[str, Any] | None = None
        self._model_sig: tuple[int, float] = (-1, -1.0)
        self._bad: list[np.ndarray] = []
        self._body_theta: np.ndarray | None = None
        # context (see the module docstring): one dict per told observation, parallel to hist.order
        self.context_kernel = context_kernel
        self.refit_every = refit_every
        self.refit_after = refit_after
        self.ctx_min_span = math.log(2.0)
        self.ctx_near = 0.25
        self._ctxs: list[dict[str, float]] = []
        self._ctx_now: dict[str, float] = {}
        self._bad_ctx: list[dict[str, float]] = []
        self._since_refit = 0
        base = self._base_key
        n_design = max(initial_points, min(len(space.dims) + 4, 10))
        self._seeds = space.seed_configs(self.baseline)
        # the policy's domain seeds (one knob at a time on top of the host's values) take at most
        # half of the start, interleaved with the space-filling points; the rest of the search
        # never centres on them. Without seeds the whole start is space-filling.
        seeded = self._seeds[: n_design // 2]
        filling = [c for c in space.space_filling(n_design - len(seeded), seed) if space.key_of(c) != base]
        self._design = [c for pair in zip_longest(filling, seeded) for c in pair if c is not None]
        # then all the seeds together (a static profile), once, after the one-knob seeds: a
        # candidate of every acquisition until measured, like them
        joint = space.joint_seed(self.baseline)
        if joint is not None:
            self._seeds.append(joint)
            self._design.append(joint)

    # ------------------------------------------------------------------ protocol
    def ask(self, remaining: int | None = None,
            pending: Sequence[Mapping[str, KnobValue]] = (), *,
            context: Context | None = None) -> dict[str, KnobValue]:
        busy = {self.space.key_of(p) for p in pending}
        if context:
            self._ctx_now = _clean(context)
        with self._cpu, _one_blas_thread():
            while self._design:
                c = self._design.pop(0)
                k = self.space.key_of(c)
                if self.hist.seen(c) == 0 and k not in busy:
                    return c
            if sum(1 for k in self.hist.entries if k != self._base_key) < 2:
                for c in self.space.sample_uniform(self.rng, 50):
                    if self.hist.seen(c) == 0 and self.space.key_of(c) not in busy | {self._base_key}:
                        return c
            if remaining is not None and remaining <= self.endgame_windows:
                ex = self._exploit(busy)
                if ex is not None:
                    return ex
            return self._acquire(pending, busy)

    def tell(self, config: Mapping[str, KnobValue], y: float, *, context: Context | None = None) -> None:
        with self._cpu:
            k = self.space.key_of(config)
            first = k not in self.hist.entries
            prev_best = self._best_mean()
            self.hist.add(config, y)
            c = _clean(context) if context else {}
            self._ctxs.append(c)
            if c:
                self._ctx_now = c
            self._since_refit += 1
            if self.safety_limit is not None and y >= self.safety_limit:
                self._bad.append(self.space.encode(config))
                self._bad_ctx.append(c)
            if first and prev_best is not None and k != self._base_key:
                self._trust_region_update(y < prev_best - self.min_gain)

    def retell(self, observations: Sequence[tuple[Mapping[str, KnobValue], float]], *,
               contexts: Sequence[Context | None] | None = None) -> None:
        with self._cpu:
            self.hist.reset()
            self._ctxs = []
            cs: Sequence[Context | None] = contexts if contexts is not None else [None] * len(observations)
            if len(cs) != len(observations):
                raise ValueError(f"retell: {len(cs)} contexts for {len(observations)} observations")
            for (c, y), cx in zip(observations, cs):
                self.hist.add(c, y)
                self._ctxs.append(_clean(cx) if cx else {})
            last = next((c for c in reversed(self._ctxs) if c), None)
            if last is not None:
                self._ctx_now = last

    def set_noise(self, sd: float) -> None:
        if math.isfinite(sd) and sd > 0:
            self.noise_sd = float(sd)

    def best(self, *, context: Context | None = None) -> Recommendation | None:
        if len(self.hist.entries) < 3:
            return self.hist.best_observed()
        with self._cpu, _one_blas_thread():
            keys, mu, sd = self._posterior_at_observed(context)
            ys_of = self._ys_of(context)
        sc = mu + self.rec_kappa * sd
        # where the model cannot tell configurations apart (within 0.01), the one whose own
        # windows are best by their upper bound (mean + rec_kappa x noise / sqrt n) wins
        near = [i for i in range(len(keys)) if sc[i] <= float(np.min(sc)) + 0.01]
        i = min(near, key=lambda j: self._upper_or(ys_of(keys[j]), float(sc[j])))
        e = self.hist.entries[keys[i]]
        ys = ys_of(keys[i]) or e.ys
        return Recommendation(dict(e.config), float(mu[i]), float(np.mean(ys)), len(ys))

    def candidate(self, *, context: Context | None = None) -> Recommendation | None:
        """The configuration to confirm: the evaluated non-baseline configuration with the lowest
        posterior mean + ``cand_kappa`` sd (less cautious than ``best``: the interleaved
        confirmation that follows is the safety net, the search's pick only nominates)."""
        if len(self.hist.entries) < 3:
            return self.hist.best_observed(exclude=self._base_key)
        with self._cpu, _one_blas_thread():
            keys, mu, sd = self._posterior_at_observed(context)
            ys_of = self._ys_of(context)
        idx = [i for i, k in enumerate(keys) if k != self._base_key]
        if not idx:
            return None
        sc = {i: float(mu[i] + self.cand_kappa * sd[i]) for i in idx}
        lo = min(sc.values())
        near = [i for i in idx if sc[i] <= lo + 0.01]
        i = min(near, key=lambda j: self._upper_or(ys_of(keys[j]), sc[j]))
        e = self.hist.entries[keys[i]]
        ys = ys_of(keys[i]) or e.ys
        return Recommendation(dict(e.config), float(mu[i]), float(np.mean(ys)), len(ys))

    def baseline_key(self) -> str | None:
        return self._base_key

    def predict(self, configs: Sequence[Mapping[str, KnobValue]], *,
                context: Context | None = None,
                against: Mapping[str, KnobValue] | None = None) -> list[tuple[float, float]]:
        """Posterior (mean, sd) of y at ``configs`` (polltuned.optimiser.Predicting; the engine's
        simplification and per-knob shares) at ``context`` (default: the last one seen); with
        ``against``, of the difference y(config) - y(against), its sd from the joint posterior
        covariance. Too few observations: (nan, inf) each."""
        if len(self.hist.entries) < 3 or not configs:
            return [(math.nan, math.inf)] * len(configs)
        with self._cpu, _one_blas_thread():
            model = self._fit()
            cs = [self.space.canonical(c) for c in configs]
            if against is None:
                mu, sd = model.predict(self._X(cs, context), return_std=True)
                return [(float(m), float(d)) for m, d in zip(mu, sd)]
            dm, ds = _differences(model, self._X([self.space.canonical(against), *cs], context))
        return [(float(m), float(d)) for m, d in zip(dm, ds)]

    def simplify(self, config: Mapping[str, KnobValue], *, context: Context | None = None) -> dict[str, KnobValue]:
        """Put back, one at a time, every knob whose change the model is confident does not
        matter: the simplified configuration's posterior mean + sd stays within ``tol`` of the
        candidate's (an unexplored simplification has a larger sd and is not taken). Fewer changed
        knobs: less risk on the host and a clearer report. Never down to the baseline; the result is
        re-measured by the confirmation anyway."""
        if len(self.hist.entries) < 3:
            return dict(config)
        tol = 0.01
        with self._cpu, _one_blas_thread():
            model = self._fit()
            cur = self.space.canonical(config)
            m0, s0 = model.predict(self._X([cur], context), return_std=True)
            limit = float(m0[0] + s0[0]) + tol
            while True:
                trials = [self.space.canonical({**cur, k: self.baseline[k]}) for k in self.space.keys
                          if cur.get(k) != self.baseline.get(k)]
                trials = [c for c in trials if self.space.key_of(c) != self._base_key]
                if not trials:
                    break
                mu, sd = model.predict(self._X(trials, context), return_std=True)
                ub = mu + sd
                j = int(np.argmin(ub))
                if float(ub[j]) > limit:
                    break
                cur = trials[j]
        return cur

    # ------------------------------------------------------------------ state (model worker)
    def state(self) -> dict[str, Any]:
        """Everything that changes after construction, as plain JSON data (floats round-trip
        exactly through JSON): an optimiser built with the same arguments and given this in
        :meth:`restore` answers every later call exactly as this one would
        (polltuned.optimiser.worker: a model worker that exited is rebuilt from it)."""
        h = self.hist
        return {
            "v": 1,
            "entries": [[k, e.config, e.ys] for k, e in h.entries.items()],
            "order": [[k, y] for k, y in h.order], "failed": sorted(h.failed),
            "rng": self.rng.bit_generator.state, "design": self._design,
            "noise_sd": self.noise_sd, "length": self.length, "succ": self._succ, "fail": self._fail,
            "restart": self._restart, "bad": [[float(x) for x in b] for b in self._bad],
            "bad_ctx": self._bad_ctx, "ctxs": self._ctxs, "ctx_now": self._ctx_now,
            "since_refit": self._since_refit,
            "body_theta": None if self._body_theta is None else [float(t) for t in self._body_theta],
            "model": None if self._model is None else {"recipe": self._model_recipe, "sig": list(self._model_sig)},
            "cpu": self._cpu.total,
        }

    def restore(self, st: Mapping[str, Any]) -> None:
        """Take over :meth:`state` of an optimiser built with the same arguments (the fitted GP is
        refitted from its recipe: the same model)."""
        if st.get("v") != 1:
            raise ValueError(f"unknown optimiser state version {st.get('v')!r}")
        h = self.hist
        h.entries.clear()
        for k, cfg, ys in st["entries"]:
            h.entries[str(k)] = _Entry(dict(cfg), [float(y) for y in ys])
        h.order[:] = [(str(k), float(y)) for k, y in st["order"]]
        h.failed = {str(k) for k in st["failed"]}
        self.rng.bit_generator.state = st["rng"]
        self._design = [dict(c) for c in st["design"]]
        self.noise_sd = float(st["noise_sd"])
        self.length = float(st["length"])
        self._succ, self._fail, self._restart = int(st["succ"]), int(st["fail"]), bool(st["restart"])
        self._bad = [np.array(b, dtype=float) for b in st["bad"]]
        self._bad_ctx = [dict(c) for c in st["bad_ctx"]]
        self._ctxs = [dict(c) for c in st["ctxs"]]
        self._ctx_now = dict(st["ctx_now"])
        self._body_theta = None if st["body_theta"] is None else np.array(st["body_theta"], dtype=float)
        self._cpu.total = float(st["cpu"])
        m = st["model"]
        self._model, self._model_recipe, self._model_sig = None, None, (-1, -1.0)
        if m is not None:
            with self._cpu, _one_blas_thread():
                self._model, _ = _fit_gp(self.space, m["recipe"], self.context_kernel, self.seed)
            self._model_recipe = m["recipe"]
            self._model_sig = (int(m["sig"][0]), float(m["sig"][1]))
        self._since_refit = int(st["since_refit"])

    # ------------------------------------------------------------------ trust region
    def _trust_region_update(self, success: bool) -> None:
        if success:
            self._succ += 1
            self._fail = 0
        else:
            self._fail += 1
            self._succ = 0
        if self._succ >= 2:
            self.length = min(self.length_max, self.length * 2)
            self._succ = 0
        if self._fail >= max(3, len(self.space.dims) // 2):
            self.length /= 2
            self._fail = 0
            if self.length < self.length_min:
                self.length = self.length_init
                self._restart = True

    def _tr_samples(self, center: np.ndarray, n: int, length: float) -> list[dict[str, KnobValue]]:
        """Perturb ``center`` (encoded): each knob changes with probability 1/2 (at least one); a
        number moves within +-length/2, a switch flips (and a knob switched on lands anywhere in its
        range) or a category changes with probability ``min(0.5, length)``."""
        sp = self.space
        out: list[dict[str, KnobValue]] = []
        p_flip = min(0.5, max(0.1, length))
        for _ in range(n):
            u = center.copy()
            mask = self.rng.random(len(sp.dims)) < 0.5
            if not mask.any():
                mask[int(self.rng.integers(len(sp.dims)))] = True
            for d, m in zip(sp.dims, mask):
                if not m:
                    continue
                o = d.offset
                if d.kind == "num":
                    u[o] = np.clip(u[o] + length * (self.rng.random() - 0.5), 0.0, 1.0)
                elif d.kind == "switch":
                    on = u[o] >= 0.5
                    if self.rng.random() < p_flip:
                        on = not on
                        if on:
                            u[o + 1] = self.rng.random()
                    elif on:
                        u[o + 1] = np.clip(u[o + 1] + length * (self.rng.random() - 0.5), 0.0, 1.0)
                    u[o] = 1.0 if on else 0.0
                elif d.width > 1 and self.rng.random() < p_flip:
                    cur = int(np.argmax(u[o:o + d.width]))
                    new = int(self.rng.integers(d.width - 1))
                    new = new + 1 if new >= cur else new
                    u[o:o + d.width] = 0.0
                    u[o + new] = 1.0
            out.append(sp.decode(u))
        return out

    # ------------------------------------------------------------------ model
    def _fit(self, lies: Sequence[tuple[Mapping[str, KnobValue], float]] = ()) -> Any:
        n = len(self.hist.order)
        sig = (n, self.noise_sd)
        if self._model is not None and self._model_sig == sig and not lies:
            return self._model
        recipe = self._recipe(lies)
        gp, frozen = _fit_gp(self.space, recipe, self.context_kernel, self.seed)
        if not frozen and not lies:
            self._since_refit = 0
        if not lies:
            self._model = gp
            self._model_recipe = recipe
            self._body_theta = np.array(gp.kernel_.k1.theta)
            self._model_sig = sig
        return gp

    def _recipe(self, lies: Sequence[tuple[Mapping[str, KnobValue], float]] = ()) -> dict[str, Any]:
        """Everything a fit depends on, as plain JSON data (inputs, targets, noise level, context
        columns, the warm-start point, whether the hyper-parameters stay frozen): :func:`_fit_gp` of
        the same recipe gives the same GP, so a model worker restored from :meth:`state` predicts
        exactly what this one does."""
        n = len(self.hist.order)
        ctx = self._contextual()
        obs = list(enumerate(self.hist.order))
        if len(obs) > self.max_fit_points:
            half = self.max_fit_points // 2
            best = sorted(obs, key=lambda t: t[1][1])[:half]
            keep = {i for i, _ in best}
            recent = [t for t in reversed(obs) if t[0] not in keep][: self.max_fit_points - half]
            obs = sorted(best + recent)
        y = [v for _, (_, v) in obs]
        if ctx:
            scale = self._ctx_scale()
            rows = [np.concatenate([self.space.encode(self.hist.entries[k].config),
                                    self._ctx_unit(self._ctxs[i], scale)]) for i, (k, _) in obs]
            now = self._ctx_unit(self._ctx_now, scale)
            rows += [np.concatenate([self.space.encode(c), now]) for c, _ in lies]
            y += [v for _, v in lies]
            Xa = np.array(rows)
        else:
            X = [self.space.encode(self.hist.entries[k].config) for _, (k, _) in obs]
            for c, v in lies:
                X.append(self.space.encode(c))
                y.append(v)
            Xa = np.array(X)
        ya = np.array(y)
        var = float(np.var(ya)) if len(ya) > 1 else 1.0
        # the measured noise, in the units of the normalised y the GP fits
        nl = float(np.clip(self.noise_sd ** 2 / max(var, 1e-6), 1e-4, 4.0))
        prev = self._body_theta
        return {"X": Xa.tolist(), "y": ya.tolist(), "nl": nl, "n_ctx": len(self._ctx_keys()) if ctx else 0,
                "theta": None if prev is None else [float(t) for t in prev],
                # a long horizon: past refit_after observations, re-optimise the hyper-parameters
                # only every refit_every tells (in between: the GP refitted with the last ones)
                "freeze": n > self.refit_after and self._since_refit < self.refit_every}

    def _posterior_at_observed(self, context: Context | None = None) -> tuple[list[str], np.ndarray, np.ndarray]:
        model = self._fit()
        keys = list(self.hist.entries)
        X = self._X([self.hist.entries[k].config for k in keys], context)
        mu, sd = model.predict(X, return_std=True)
        return keys, np.asarray(mu), np.asarray(sd)

    # ------------------------------------------------------------------ context
    def _contextual(self) -> bool:
        return any(self._ctxs)

    def _ctx_keys(self) -> list[str]:
        keys: set[str] = set()
        for c in self._ctxs:
            keys.update(c)
        return sorted(keys)

    def _ctx_scale(self) -> dict[str, tuple[float, float]]:
        """signal -> (centre, span) of log1p(value) over the told contexts (span >= ctx_min_span)."""
        out: dict[str, tuple[float, float]] = {}
        for k in self._ctx_keys():
            zs = [math.log1p(c[k]) for c in self._ctxs if k in c]
            lo, hi = min(zs), max(zs)
            out[k] = ((lo + hi) / 2.0, max(hi - lo, self.ctx_min_span))
        return out

    def _ctx_unit(self, ctx: Mapping[str, float], scale: Mapping[str, tuple[float, float]]) -> np.ndarray:
        out = np.full(len(scale), 0.5)
        for j, (k, (centre, span)) in enumerate(scale.items()):
            v = ctx.get(k)
            if v is not None:
                out[j] = 0.5 + (math.log1p(v) - centre) / span
        return out

    def _query_ctx(self, context: Context | None) -> dict[str, float]:
        return _clean(context) if context else self._ctx_now

    def _X(self, configs: Sequence[Mapping[str, KnobValue]], context: Context | None = None) -> np.ndarray:
        """Model inputs for ``configs`` at ``context`` (default: the last one seen)."""
        X = np.array([self.space.encode(c) for c in configs]) if configs else np.zeros((0, self.space.width))
        if not self._contextual():
            return X
        u = self._ctx_unit(self._query_ctx(context), self._ctx_scale())
        return np.hstack([X, np.tile(u, (len(X), 1))])

    def _near_mask(self, context: Context | None) -> list[bool]:
        """Per told observation: was its context within ``ctx_near`` of ``context``? (all True
        without context)."""
        if not self._contextual():
            return [True] * len(self.hist.order)
        scale = self._ctx_scale()
        u = self._ctx_unit(self._query_ctx(context), scale)
        return [float(np.max(np.abs(self._ctx_unit(c, scale) - u), initial=0.0)) <= self.ctx_near
                for c in self._ctxs]

    def _ys_of(self, context: Context | None) -> Any:
        """key -> the ys observed near ``context`` (every y of the key without context)."""
        if not self._contextual():
            return lambda k: self.hist.entries[k].ys
        near: dict[str, list[float]] = {}
        for (k, y), m in zip(self.hist.order, self._near_mask(context)):
            if m:
                near.setdefault(k, []).append(y)
        return lambda k: near.get(k, [])

    def _bad_near(self) -> list[np.ndarray]:
        """Configurations that broke the guard at a context near the current one (all of them
        without context)."""
        if not self._contextual():
            return list(self._bad)
        scale = self._ctx_scale()
        u = self._ctx_unit(self._ctx_now, scale)
        return [b for b, c in zip(self._bad, self._bad_ctx)
                if float(np.max(np.abs(self._ctx_unit(c, scale) - u), initial=0.0)) <= self.ctx_near]

    def _upper_or(self, ys: Sequence[float], fallback: float) -> float:
        return self._upper(ys) if ys else fallback + 1.0

    def _upper(self, ys: Sequence[float]) -> float:
        return float(np.mean(ys)) + self.rec_kappa * self.noise_sd / math.sqrt(len(ys))

    def _best_mean(self) -> float | None:
        if not self.hist.entries:
            return None
        return min(float(np.mean(e.ys)) for e in self.hist.entries.values())

    # ------------------------------------------------------------------ proposals
    def _exploit(self, busy: set[str] = frozenset()) -> dict[str, KnobValue] | None:  # type: ignore[assignment]
        """Re-measure the most promising evaluated configurations (robust order), never the
        baseline (the reference windows measure it anyway)."""
        keys, mu, sd = self._posterior_at_observed()
        ys_of = self._ys_of(None)
        order = np.argsort(mu + self.rec_kappa * sd)
        for i in order[:3]:
            k = keys[int(i)]
            e = self.hist.entries[k]
            if k == self._base_key or k in busy:
                continue
            safe = self.safety_limit is None or float(mu[int(i)]) < self.safety_limit
            if len(ys_of(k)) < self.exploit_cap and safe:
                return dict(e.config)
        return None

    def _acquire(self, pending: Sequence[Mapping[str, KnobValue]], busy: set[str]) -> dict[str, KnobValue]:
        from scipy.stats import norm

        base_model = self._fit()
        keys, mu_obs, sd_obs = self._posterior_at_observed()
        y_best = float(np.min(mu_obs))
        # constant liar for configurations measured elsewhere right now (fleet): pretend they
        # scored the current best, so the acquisition looks elsewhere
        model = self._fit([(p, y_best) for p in pending]) if pending else base_model
        inc = self.hist.entries[keys[int(np.argmin(mu_obs + self.rec_kappa * sd_obs))]].config
        n_glob = self.n_candidates if self._restart else int(self.n_candidates * self.global_fraction)
        cands = self._tr_samples(self.space.encode(inc), self.n_candidates - n_glob, self.length)
        cands += self.space.sample_uniform(self.rng, n_glob)
        cands += [s for s in self._seeds if self.hist.seen(s) == 0]
        ys_of = self._ys_of(None)
        uniq: dict[str, dict[str, KnobValue]] = {}
        for c in cands:
            k = self.space.key_of(c)
            if k in self.hist.failed or k in busy:
                continue
            e = self.hist.entries.get(k)
            if e is not None and len(ys_of(k)) >= 3:
                continue
            uniq[k] = c
        pool = list(uniq.values())
        X = self._X(pool)
        w = self.space.width
        # with context, "evaluated" and "broke the guard" mean: at a context near this one
        evaluated = [e.config for k, e in self.hist.entries.items() if ys_of(k)]
        if len(pool) and evaluated:
            # a new proposal is a real move: nothing within min_move of an evaluated configuration
            # (re-measuring one is the endgame's job, not the acquisition's)
            E = np.array([self.space.encode(c) for c in evaluated])
            dmin = np.min(np.linalg.norm(X[:, None, :w] - E[None, :, :], axis=2), axis=1)
            keep = dmin >= self.min_move
            if keep.any():
                pool = [c for c, kp in zip(pool, keep) if kp]
                X = X[keep]
        bad = self._bad_near()
        if bad and len(pool):
            B = np.array(bad)
            dmin = np.min(np.linalg.norm(X[:, None, :w] - B[None, :, :], axis=2), axis=1)
            keep = dmin >= self.bad_radius
            pool = [c for c, kp in zip(pool, keep) if kp]
            X = X[keep]
        if not pool:
            ex = self._exploit(busy)
            return ex if ex is not None else dict(self.baseline)
        mu, sd = model.predict(X, return_std=True)
        sd = np.maximum(sd, 1e-9)
        z = (y_best - mu) / sd
        ei = (y_best - mu) * norm.cdf(z) + sd * norm.pdf(z)
        safe = np.ones(len(pool), dtype=bool)
        if self.safety_limit is not None and len(self.hist.entries) >= 4:
            safe = mu + self.safety_kappa * sd < self.safety_limit
            if not safe.any():
                ex = self._exploit(busy)
                if ex is not None:
                    return ex
                return pool[int(np.argmin(mu + self.safety_kappa * sd))]
            ei = np.where(safe, ei, -np.inf)
        i = int(np.argmax(ei))
        restart = self._restart
        self._restart = False
        # nothing has a useful chance of beating the incumbent by min_gain: re-measure the best
        # instead (a sharper final pick, no exploration cost); after a restart, explore anyway
        pi = np.where(safe, norm.cdf((y_best - self.min_gain - mu) / sd), 0.0)
        if not restart and float(np.max(pi)) < 0.05:
            ex = self._exploit(busy)
            if ex is not None:
                return ex
        return pool[i]


def _differences(model: Any, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and sd of y(X[i]) - y(X[0]) for i >= 1, from the joint posterior covariance
    (the white-noise term is zero at prediction: the difference of the functions, not of windows)."""
    mu, cov = model.predict(X, return_cov=True)
    c = np.asarray(cov, dtype=np.float64)
    var = np.diag(c)[1:] + c[0, 0] - 2.0 * c[0, 1:]
    return np.asarray(mu[1:] - mu[0], dtype=np.float64), np.sqrt(np.maximum(var, 0.0))


def _fit_gp(space: Space, recipe: Mapping[str, Any], context_kernel: str, seed: int) -> tuple[Any, bool]:
    """The GP of a recipe (SkoptOptimiser._recipe), fitted; and whether its hyper-parameters were
    kept frozen (no L-BFGS). Deterministic: the same recipe gives the same model."""
    from skopt.learning import GaussianProcessRegressor

    Xa = np.array(recipe["X"], dtype=float).reshape(len(recipe["y"]), -1)
    ya = np.array(recipe["y"], dtype=float)
    nl = float(recipe["nl"])
    nb = (nl / 4.0, min(nl * 4.0, 10.0))
    groups = [tuple(range(d.offset, d.offset + d.width)) for d in space.dims]
    if recipe["n_ctx"]:
        w = space.width
        cols = tuple(range(w, w + int(recipe["n_ctx"])))
        kernel = contextual(groups, w, cols, nl, nb, context_kernel)
    else:
        kernel = additive_plus_full(groups, space.width, nl, nb)
    # warm start: the hyper-parameters start where the last fit ended (one L-BFGS run instead of
    # restarts from scratch keeps a step well under 0.3 s at 100 observations)
    prev = None if recipe["theta"] is None else np.array(recipe["theta"], dtype=float)
    warm = prev is not None and len(prev) == len(kernel.k1.theta)
    if prev is not None and warm:
        b = kernel.k1.bounds
        kernel.k1.theta = np.clip(prev, b[:, 0], b[:, 1])
    frozen = warm and bool(recipe["freeze"])
    extra: dict[str, Any] = {"optimizer": None} if frozen else {}
    gp = GaussianProcessRegressor(kernel=kernel, normalize_y=True, noise="gaussian",
                                  n_restarts_optimizer=0 if warm else 1, random_state=seed, **extra)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gp.fit(Xa, ya)
    return gp, frozen


class _one_blas_thread:
    """Cap BLAS/OpenMP threads at one while fitting so the optimiser does not disturb the host."""

    def __enter__(self) -> None:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # pragma: no cover - threadpoolctl is a dependency
            self._ctx: Any = None
            return
        self._ctx = threadpool_limits(limits=1)

    def __exit__(self, *exc: object) -> None:
        if self._ctx is not None:
            self._ctx.restore_original_limits()


def _clean(context: Context) -> dict[str, float]:
    """Finite, non-negative context values only (a signal the window could not compute is absent)."""
    out: dict[str, float] = {}
    for k, v in context.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out[str(k)] = max(f, 0.0)
    return dict(sorted(out.items()))

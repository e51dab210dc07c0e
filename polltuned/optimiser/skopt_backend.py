"""The scikit-optimize backend: a GP surrogate with domain knowledge around it.

What it does, in order of proposals:

1. **Domain seeds** (from the policy: busy_read/busy_poll 50 µs per the kernel docs, the
   ``gro_flush_timeout`` 20 µs + ``napi_defer_hard_irqs`` 10 example, ...), all together first
   (the static "expert" assignment), then one knob at a time on top of the host's values.
2. **A small space-filling design inside a trust region** centred on the host's current values
   (maximin subset of trust-region samples), so the first trials stay near what the host had.
3. **Bayesian optimisation**: a scikit-optimize ``Optimizer`` with a GP (ConstantKernel x Matern 5/2
   with one length scale per column, plus a white-noise term: ``noise="gaussian"``) is fitted on
   every told window (repeats are separate observations, so the GP sees the noise). Candidates
   come from a TuRBO-like trust region around the incumbent (side grows x2 after 2 successes,
   halves after 4 failures) plus 5 % global samples and any untried seed; a safety filter drops
   candidates whose upper confidence bound exceeds the guard limit; the pick maximises expected
   improvement over the best *posterior mean* of an evaluated point (noisy EI, not the luckiest
   window).

Bounded cost: the GP is fitted on at most ``max_fit_points`` observations (the best half and the
most recent half), acquisition scores ~1000 candidates, BLAS is capped at one thread
(threadpoolctl), so a tell+ask stays well under 0.3 s at 100 observations on 2 vCPUs.
``best()`` is the evaluated configuration with the lowest posterior mean.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from polltuned.optimiser import CpuMeter, History, Recommendation
from polltuned.optimiser.space import Space
from polltuned.records import KnobValue


class SkoptOptimiser:
    name = "skopt"

    def __init__(self, space: Space, baseline: Mapping[str, KnobValue], *, seed: int,
                 initial_points: int = 6, safety_limit: float | None = None,
                 max_fit_points: int = 60, n_candidates: int = 768) -> None:
        self.space = space
        self.hist = History(space)
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.baseline = space.canonical(baseline)
        self.safety_limit = safety_limit
        self.max_fit_points = max_fit_points
        self.n_candidates = n_candidates
        self._cpu = CpuMeter()
        self.length = 0.2
        self.rec_kappa = 1.0
        self.safety_kappa = 2.0
        self.endgame_windows = 4
        self.max_length = 0.3
        self.global_fraction = 0.0   # candidates drawn from the whole space (0: trust region only)
        self.min_gain = 0.025     # log units: an improvement worth exploring for (~2.5 %)
        self.exploit_cap = 8      # re-measure a configuration at most this often
        self._succ = 0
        self._fail = 0
        self._last_key: str | None = None
        self._model: Any = None
        self._model_n = -1
        self._bad: list[np.ndarray] = []   # encoded configs that broke the guard limit
        self.bad_radius = 0.15
        self._ceiling: dict[int, float] = {}
        seeds = space.seed_configs(self.baseline)
        self._seeds = seeds
        self._pending: list[dict[str, KnobValue]] = list(seeds)
        self._pending += self._fill_design(max(0, initial_points - len(seeds)))

    # ------------------------------------------------------------------ protocol
    def ask(self, remaining: int | None = None) -> dict[str, KnobValue]:
        with self._cpu, _one_blas_thread():
            while self._pending:
                c = self._pending.pop(0)
                if self.hist.seen(c) == 0:
                    return c
            if len(self.hist.entries) < 3:
                return self._tr_samples(self.space.encode(self.baseline), 1, 0.5)[0]
            if remaining is not None and remaining <= self.endgame_windows:
                ex = self._exploit()
                if ex is not None:
                    return ex
            return self._acquire()

    def tell(self, config: Mapping[str, KnobValue], y: float) -> None:
        with self._cpu:
            k = self.space.key_of(config)
            prev_best = self._best_mean()
            self.hist.add(config, y)
            if self.safety_limit is not None and y >= self.safety_limit:
                self._bad.append(self.space.encode(config))
                self._learn_ceiling(config)
            if k != self._last_key and prev_best is not None and k != self.space.key_of(self.baseline):
                if y < prev_best - 0.01:
                    self._succ += 1
                    self._fail = 0
                else:
                    self._fail += 1
                    self._succ = 0
                if self._succ >= 2:
                    self.length = min(self.max_length, self.length * 2)
                    self._succ = 0
                if self._fail >= 4:
                    self.length = max(0.05, self.length / 2)
                    self._fail = 0
            self._last_key = k

    def tell_failed(self, config: Mapping[str, KnobValue]) -> None:
        self.hist.failed.add(self.space.key_of(config))

    def best(self) -> Recommendation | None:
        if len(self.hist.entries) < 3:
            return self.hist.best_observed()
        with self._cpu, _one_blas_thread():
            keys, mu, sd = self._posterior_at_observed()
        # robust pick: posterior mean plus one posterior sd, so a config seen once in a lucky
        # window does not beat one measured repeatedly (the winner's curse under noise)
        i = int(np.argmin(mu + self.rec_kappa * sd))
        e = self.hist.entries[keys[i]]
        return Recommendation(dict(e.config), float(mu[i]), float(np.mean(e.ys)), len(e.ys))

    def _posterior_at_observed(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        model = self._fit()
        keys = list(self.hist.entries)
        X = np.array([self.space.encode(self.hist.entries[k].config) for k in keys])
        mu, sd = model.predict(X, return_std=True)
        return keys, np.asarray(mu), np.asarray(sd)

    def _exploit(self) -> dict[str, KnobValue] | None:
        """End of budget: re-measure the most promising evaluated configurations (robust order)."""
        keys, mu, sd = self._posterior_at_observed()
        order = np.argsort(mu + self.rec_kappa * sd)
        for i in order[:3]:
            e = self.hist.entries[keys[int(i)]]
            if len(e.ys) < self.exploit_cap and (self.safety_limit is None or float(mu[int(i)]) < self.safety_limit):
                return dict(e.config)
        return None

    @property
    def cpu_seconds(self) -> float:
        return self._cpu.total

    # ------------------------------------------------------------------ internals
    def _best_mean(self) -> float | None:
        if not self.hist.entries:
            return None
        return min(float(np.mean(e.ys)) for e in self.hist.entries.values())

    def _fill_design(self, n: int) -> list[dict[str, KnobValue]]:
        """A few random points in a small trust region around the baseline (not a maximin
        design: maximin picks extremes, and extremes are where a live host gets hurt)."""
        if n <= 0:
            return []
        return self._tr_samples(self.space.encode(self.baseline), n, self.length)

    def _tr_samples(self, center: np.ndarray, n: int, length: float) -> list[dict[str, KnobValue]]:
        """Perturb ``center`` (encoded): each knob changes with probability 1/2 (at least one)."""
        sp = self.space
        out: list[dict[str, KnobValue]] = []
        p_flip = min(0.5, max(0.15, length))
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
                            # switched on: at a seed, or near it (mid-range without seeds)
                            ctr = (d.to_unit(float(d.seeds[int(self.rng.integers(len(d.seeds)))]))
                                   if d.seeds else 0.5)
                            if d.seeds and self.rng.random() < 0.5:
                                u[o + 1] = ctr
                            else:
                                u[o + 1] = np.clip(ctr + 2 * length * (self.rng.random() - 0.5), 0.0, 1.0)
                    elif on:
                        u[o + 1] = np.clip(u[o + 1] + length * (self.rng.random() - 0.5), 0.0, 1.0)
                    u[o] = 1.0 if on else 0.0
                else:
                    if self.rng.random() < p_flip and d.width > 1:
                        cur = int(np.argmax(u[o:o + d.width]))
                        new = int(self.rng.integers(d.width - 1))
                        new = new + 1 if new >= cur else new
                        u[o:o + d.width] = 0.0
                        u[o + new] = 1.0
            out.append(sp.decode(u))
        return out

    def _fit(self) -> Any:
        n = len(self.hist.order)
        if self._model is not None and self._model_n == n:
            return self._model
        from skopt import Optimizer
        from skopt.space import Real
        from skopt.utils import cook_estimator

        obs = list(enumerate(self.hist.order))
        if len(obs) > self.max_fit_points:
            half = self.max_fit_points // 2
            best = sorted(obs, key=lambda t: t[1][1])[:half]
            keep = {i for i, _ in best}
            recent = [t for t in reversed(obs) if t[0] not in keep][: self.max_fit_points - half]
            obs = sorted(best + recent)
        X = [list(self.space.encode(self.hist.entries[k].config)) for _, (k, _) in obs]
        y = [v for _, (_, v) in obs]
        dims = [Real(0.0, 1.0) for _ in range(self.space.width)]
        gp = cook_estimator("GP", space=dims, noise="gaussian", n_restarts_optimizer=1,
                            random_state=self.seed)
        opt = Optimizer(dims, base_estimator=gp, n_initial_points=1, acq_func="EI",
                        acq_optimizer="sampling", acq_optimizer_kwargs={"n_points": 16},
                        model_queue_size=1, random_state=self.seed)
        opt.tell(X, y)
        self._model = opt.models[-1]
        self._model_n = n
        return self._model

    def _acquire(self) -> dict[str, KnobValue]:
        from scipy.stats import norm

        model = self._fit()
        inc = self.best_inside()
        center = self.space.encode(inc)
        n_tr = int(self.n_candidates * (1.0 - self.global_fraction))
        cands = self._tr_samples(center, n_tr, self.length)
        cands += self.space.sample_uniform(self.rng, self.n_candidates - n_tr)
        cands += [s for s in self._seeds if self.hist.seen(s) == 0]
        uniq: dict[str, dict[str, KnobValue]] = {}
        for c in cands:
            k = self.space.key_of(c)
            if k in self.hist.failed:
                continue
            e = self.hist.entries.get(k)
            if e is not None and len(e.ys) >= 3:
                continue
            uniq[k] = c
        pool = list(uniq.values())
        X = np.array([self.space.encode(c) for c in pool]) if pool else np.zeros((0, self.space.width))
        if self._bad and len(pool):
            # hard memory of harm: never propose anything close to a configuration that already
            # broke the guard limit (a GP smooths a cliff away; this does not)
            B = np.array(self._bad)
            dmin = np.min(np.linalg.norm(X[:, None, :] - B[None, :, :], axis=2), axis=1)
            keep = (dmin >= self.bad_radius) & np.array([self._under_ceiling(x) for x in X])
            pool = [c for c, kp in zip(pool, keep) if kp]
            X = X[keep]
        if not pool:
            ex = self._exploit()
            return ex if ex is not None else dict(self.baseline)
        mu, sd = model.predict(X, return_std=True)
        sd = np.maximum(sd, 1e-9)
        obs_X = np.array([self.space.encode(e.config) for e in self.hist.entries.values()])
        y_best = float(np.min(model.predict(obs_X)))
        xi = 0.01
        z = (y_best - mu - xi) / sd
        ei = (y_best - mu - xi) * norm.cdf(z) + sd * norm.pdf(z)
        if self.safety_limit is not None and len(self.hist.order) >= 6:
            ucb = mu + self.safety_kappa * sd
            safe = ucb < self.safety_limit
            ei = np.where(safe, ei, -np.inf) if safe.any() else -ucb
        i = int(np.argmax(ei))
        # probability that the best candidate beats the incumbent by a worthwhile margin; when it
        # is small, nothing nearby is worth the exploration cost on a live host: re-measure the
        # incumbent instead (no exploration regret, and a sharper final pick)
        pi = norm.cdf((y_best - self.min_gain - mu) / sd)
        if self.safety_limit is not None and len(self.hist.order) >= 6:
            pi = np.where(mu + self.safety_kappa * sd < self.safety_limit, pi, 0.0)
        if float(np.max(pi)) < 0.05:
            ex = self._exploit()
            if ex is not None:
                return ex
        return pool[i]

    def _learn_ceiling(self, config: Mapping[str, KnobValue]) -> None:
        """Harm at a value no known-good trial ever reached: cap that knob halfway between the
        highest known-good value and the harmful one (cliffs sit at the top of polling knobs:
        busy_read 200 on a shared vCPU, gro_flush_timeout with deferral). Conservative on purpose:
        a wrongly blamed knob only loses the part of its range nobody has shown to be safe."""
        u = self.space.encode(config)
        good = [self.space.encode(e.config) for e in self.hist.entries.values()
                if float(np.mean(e.ys)) < (self.safety_limit or 0.0) / 2]
        for d in self.space.dims:
            if d.kind == "cat":
                continue
            on_col = d.offset if d.kind == "switch" else None
            col = d.offset + (1 if d.kind == "switch" else 0)
            if on_col is not None and u[on_col] < 0.5:
                continue
            vals = [g[col] for g in good if on_col is None or g[on_col] >= 0.5]
            top = max(vals) if vals else 0.0
            if u[col] > top:
                cap = (u[col] + top) / 2
                self._ceiling[col] = min(self._ceiling.get(col, 1.0), cap)

    def _under_ceiling(self, u: np.ndarray) -> bool:
        return all(u[c] <= cap for c, cap in self._ceiling.items())

    def simplify(self, config: Mapping[str, KnobValue]) -> dict[str, KnobValue]:
        """Put back, one at a time, every knob whose change the model says does not matter
        (posterior mean within ``tol`` of the recommendation's). Fewer changed knobs: less risk on
        the host and a clearer report. The result is re-measured by the confirmation anyway."""
        if len(self.hist.entries) < 3:
            return dict(config)
        tol = 0.01
        with self._cpu, _one_blas_thread():
            model = self._fit()
            cur = self.space.canonical(config)
            cur_mu = float(model.predict(self.space.encode(cur)[None, :])[0])
            limit = cur_mu + tol
            changed = True
            while changed:
                changed = False
                trials = []
                for k in self.space.keys:
                    if cur.get(k) != self.baseline.get(k):
                        c = self.space.canonical({**cur, k: self.baseline[k]})
                        trials.append(c)
                if not trials:
                    break
                X = np.array([self.space.encode(c) for c in trials])
                mu = model.predict(X)
                j = int(np.argmin(mu))
                if float(mu[j]) <= limit:
                    cur = trials[j]
                    changed = True
        return cur

    def best_inside(self) -> dict[str, KnobValue]:
        r = self.best()
        return r.config if r is not None else dict(self.baseline)


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


def log_ratio(j: float, j_ref: float) -> float:
    return math.log(j / j_ref)

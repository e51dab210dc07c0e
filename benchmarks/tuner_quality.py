#!/usr/bin/env python3
"""Tuner-quality benchmark: polltuned's engine vs random search, grid search and static values.

Every method runs through the same engine (baseline first, guard rails, interleaved confirmation)
at the same budget of measurement windows, on every scenario, with the same noise seeds; only the
optimiser differs. ``static`` deploys tuned's network-latency values (busy_read = busy_poll = 50)
without measuring. Scores use the scenario's noise-free ``expected`` function, never shown to the
tuners:

  regret      normalised regret (J(x) - J*) / (J(baseline) - J*) of the recommendation after 10 and
              20 windows, and of the *deployed* configuration after the full budget + confirmation
  within5     runs whose deployed J <= 1.05 J*, and the median window at which the recommendation
              first got there
  cumreg      cumulative regret of the search windows, sum (J(x_t) / J* - 1)
  breach      search windows spent at configurations truly worse than the guard limit
              (J > J(baseline) x (1 + guard.max_regression))
  worse       runs that deployed something worse than the baseline
  kept        runs that kept the baseline
  cpu/trial   optimiser CPU seconds per trial (ask + tell + recommendation)

J* is found by a dense search of ``expected`` (random samples + coordinate refinement).

Aggregate over every (landscape, seed) run of a method (printed for every run; the family's
targets are checked on it):

  regret      median and 90th percentile (the worst 10 %) of the deployed normalised regret, over
              the runs on landscapes with an effect (>= 5 % gain available; on a flat landscape the
              normalised regret of keeping the baseline is 1 by definition, so they are judged by
              "kept" instead)
  excess      median and 90th percentile of J(deployed) / J* - 1 over all runs
  within5     fraction of runs deploying within 5 % of J*, on landscapes with >= 10 % gain available
  evaluated5  on the same runs, the fraction whose search *measured* a configuration within 5 % of J*
              (by its true J): the search's coverage. within5 below it is lost by the pick and the
              confirmation; evaluated5 itself is the ceiling of any pick rule for that search
  cumreg      median cumulative regret; breach: mean guard breaches (both over stationary landscapes:
              on a nonstationary one they are measured against the final workload)
  worse       runs (all landscapes) that deployed something worse than the baseline
  kept        fraction of runs that kept the baseline, on flat landscapes (< 5 % gain available)

Usage:
  benchmarks/tuner_quality.py [--scenarios DIR | --family N [--family-seed S]] [--policy FILE]
                              [--seeds N] [--budget N] [--methods polltuned,random,grid,static]
                              [--no-seeds] [--per-landscape | --no-per-landscape] [--jobs N] [--json] [--quick]
  benchmarks/tuner_quality.py --cost     # optimiser CPU per step at 10/50/100/200/300 observations
  benchmarks/tuner_quality.py --horizon 300 [--family N --moving] [--methods polltuned,random,...] [--json]
  benchmarks/tuner_quality.py --horizon 300 --family N --moving --methods oracle-pick,oracle-measured   # ceilings
  benchmarks/tuner_quality.py --family N --moving --kernel-compare W [--kernel-variants V]   # optimiser only

``--horizon N`` runs the daemon's whole cycle for N windows per run (``run_horizon``: engine rounds
through ``polltuned.engine.driver.drive`` on one window clock; where the engine stops after a round, the
deployment is held and today's drift rule — a context signal > 30 % away for 3 windows — starts a
re-tune from it) and scores the configuration *in force* at every window against the optimum of the load
of that window (``Scenario.expected_at``/``load_at``): ``within5_at`` {"50","150","300"}, plus "600" and
"1000" when the horizon reaches them (share of runs within 5 % at that window), ``regret_median`` per
span (J/J* - 1 of what was in force; 0-50, 50-150, 150-300, then 300-horizon), ``within5_window_share``
per span (the share of all windows in force within 5 %: the long horizon's steadier view),
``explore_share_after_100`` (windows after 100 that were not holding), deployments and those worse
than the kernel defaults — every change of the configuration in force (a decision, a switch, a
challenger's win, a fallback), judged at the load of its first window; ``..._5pct``: worse by more
than NO_EFFECT — ``knobs_changed_per_deployment`` and ``inert_knobs_per_deployment`` (of the knobs
each deployment changes from the defaults, those whose reversion alone moves the true J at that load
by less than INERT: "deploy only what matters", judged with what the world knows), and the share of
windows in force worse than the kernel defaults. The same
checkpoints also give ``within10_at`` and ``within20_at`` (J within 10 / 20 % of the optimum of the
load), ``captured_at`` (for runs whose checkpoint load has more than NO_EFFECT to gain: the share of
that gain the configuration in force realises, (J_defaults - J) / (J_defaults - J*); median, mean, share
of runs at >= 80 %), ``by_available_gain`` (the same per band of the gain available at the checkpoint's
load), ``within5_at_gain``/``within10_at_gain`` (the shares among runs whose checkpoint load has
more than NO_EFFECT to gain: keeping the defaults on a load with nothing to gain is not a find), and
``severe_window_share``: the share of windows whose *measured* configuration
(exploration included, unlike "in force") had more than SEVERE (2x) the defaults' J at that load — the
stalls users feel while the daemon searches. Two figures separate the search from the decisions:
``measured_within5_at`` (share of runs that had *measured*, by that window, a configuration within 5 %
of the optimum of that window's load — no holding or confirmation rule can do better than the search's
coverage) and, per load, ``space_within5`` (the share of uniformly drawn configurations within 5 % of
its optimum: how small the target is). ``--noise-scale S`` (family landscapes only, S > 0) scales the
window noise (CV, outlier probability, CPU noise) by S: at 0.05 the windows are nearly exact, which
shows what the search reaches when noise is not the limit. ``--explore-share X`` (0..0.5) sets the
policy's ``hold.explore_share``: how much more learning while holding buys. Methods: ``polltuned``
(contextual GP, product kernel), ``polltuned-sum``, ``polltuned-nocontext`` (the context hidden), ``random``.
``--moving`` takes the moving-load family (``family-moving:SEED:INDEX``) for ``--family``.

``--family N`` runs landscapes 0..N-1 of the random scenario family S (polltuned.worlds.family,
default S = 1) instead of scenario files; the per-landscape table is then printed only with
``--per-landscape``. ``--no-seeds`` removes every ``seeds`` entry from the policy before running
(J* is still searched with the policy's seeds, so it is the same with and without).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from pydantic import ValidationError  # noqa: E402

from polltuned.clock import FakeClock  # noqa: E402
from polltuned.engine.core import Engine  # noqa: E402
from polltuned.engine.driver import drive  # noqa: E402
from polltuned.engine.phases import WindowKind  # noqa: E402
from polltuned.objective import value_of  # noqa: E402
from polltuned.optimiser import make_optimiser  # noqa: E402
from polltuned.optimiser.space import Space  # noqa: E402
from polltuned.policy.edits import strip_seeds  # noqa: E402
from polltuned.policy.loader import load_policy  # noqa: E402
from polltuned.policy.schema import Policy  # noqa: E402
from polltuned.records import KnobValue  # noqa: E402
from polltuned.stats import percentile  # noqa: E402
from polltuned.study import memory_study  # noqa: E402
from polltuned.worlds.env import ScenarioEnv, default_config  # noqa: E402
from polltuned.worlds.family import make_landscape, parse_name  # noqa: E402
from polltuned.worlds.scenario import Scenario, load_scenario, shipped_dir  # noqa: E402

METHODS = {"polltuned": "skopt", "random": "random", "grid": "grid", "static": None}
STATIC = {"net.core.busy_read": 50, "net.core.busy_poll": 50}
CHECKPOINTS = (10, 20)
#: a deployed knob whose reversion alone moves the true J by less than this does not matter
INERT = 0.01
NO_EFFECT = 0.05   # a scenario whose best gain is below this (the policy's min_effect) has "no effect"
SEVERE = 2.0       # a window measured at more than this x the defaults' J at its load: a stall users feel
BIG_EFFECT = 0.10  # the within-5 % target is checked on landscapes with at least this much gain


def J(sc: Scenario, pol: Policy, cfg: Mapping[str, KnobValue]) -> float:
    return value_of(sc.expected(cfg), pol.objective)


def optimum(sc: Scenario, pol: Policy, base: dict[str, KnobValue],
            seed: int = 12345) -> tuple[float, dict[str, KnobValue]]:
    import numpy as np

    space = Space.from_policy(pol)
    rng = np.random.default_rng(seed)
    cands = [dict(base), *space.sample_uniform(rng, 4000), *space.seed_configs(base)]
    scored = sorted(((J(sc, pol, {**base, **c}), c) for c in cands), key=lambda t: t[0])
    best_j, best_c = scored[0]
    for _, start in scored[:8]:
        cur = {**base, **start}
        cur_j = J(sc, pol, cur)
        for _ in range(3):
            for d in space.dims:
                vals: list[KnobValue] = list(d.choices) if d.kind == "cat" else (
                    ([d.off_value] if d.kind == "switch" else []) + [d.from_unit(u) for u in np.linspace(0, 1, 60)])
                for v in vals:
                    c = space.canonical({**cur, d.key: v})
                    j = J(sc, pol, {**base, **c})
                    if j < cur_j:
                        cur, cur_j = {**base, **c}, j
        if cur_j < best_j:
            best_j, best_c = cur_j, cur
    return best_j, best_c


#: the windows of the search itself (the budget): what exploration costs
SEARCH_KINDS = (WindowKind.REFERENCE, WindowKind.TRIAL, WindowKind.REPEAT)


def run_one(sc_path: str, pol: Policy, method: str, seed: int, budget: int) -> dict[str, Any]:
    sc = load_scenario(sc_path)
    tuning = pol.tuning.model_copy(update={"seed": seed, "budget": budget})
    p = pol.model_copy(update={"tuning": tuning})
    base = default_config(p)
    j_base = J(sc, p, base)
    limit = j_base * (1 + p.guard.max_regression)
    if METHODS[method] is None:
        dep = {**base, **{k: v for k, v in STATIC.items() if k in p.knobs}}
        jd = J(sc, p, dep)
        return {"deployed": dep, "J_dep": jd, "rec": {b: jd for b in CHECKPOINTS},
                "search_J": [jd] * budget, "breach": budget if jd > limit else 0, "cpu_per_trial": 0.0,
                "kept": dep == base, "first_within": None}
    env = ScenarioEnv(p, sc, seed=seed, baseline=base)
    space = Space.from_policy(p)
    opt = make_optimiser(METHODS[method] or "", space, base, seed=seed, initial_points=p.tuning.initial_points,
                         safety_limit=math.log(1 + p.guard.max_regression))
    t = Engine(p, memory_study(p), current=env.current(), clock=FakeClock(), optimiser=opt)
    r = drive(t, env)
    assert r is not None
    search = [{**base, **c} for kind, c in t.trace.windows if kind in SEARCH_KINDS]
    search_J = [J(sc, p, c) for c in search]
    recs = t.trace.recommendations

    def rec_at(b: int) -> dict[str, KnobValue]:
        cfg = dict(base)
        for w, c in recs:
            if w <= b:
                cfg = {**base, **c}
        return cfg

    rec_J = {b: J(sc, p, rec_at(b)) for b in CHECKPOINTS}
    rec_trace = [(w, J(sc, p, {**base, **c})) for w, c in recs]
    n_trials = max(1, len(r.trials))
    return {"deployed": r.deployed, "J_dep": J(sc, p, r.deployed), "rec": rec_J, "rec_trace": rec_trace,
            "search_J": search_J, "breach": sum(1 for j in search_J if j > limit),
            "cpu_per_trial": opt.cpu_seconds / n_trials, "kept": r.deployed_is_baseline,
            "reason": r.reason}


def _task(args: tuple[str, Policy, str, int, int]) -> tuple[str, str, int, dict[str, Any]]:
    sc_path, pol, method, seed, budget = args
    return sc_path, method, seed, run_one(sc_path, pol, method, seed, budget)


def summarise(sc_path: str, pol: Policy, runs: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    sc = load_scenario(sc_path)
    base = default_config(pol)
    j_base = J(sc, pol, base)
    j_star, c_star = optimum(sc, pol, base)
    gap = j_base - j_star
    effect = gap / j_star >= NO_EFFECT
    denom = gap if gap > 1e-9 * j_star else math.nan

    def nreg(j: float) -> float:
        if math.isnan(denom):
            return 0.0 if j <= j_star * (1 + 1e-9) else math.inf
        return (j - j_star) / denom

    out: dict[str, Any] = {"scenario": sc.name, "J_baseline": j_base, "J_star": j_star,
                           "optimum": {k: v for k, v in c_star.items() if base.get(k) != v},
                           "gain_available": gap / j_base, "effect": effect, "nonstationary": sc.nonstationary,
                           "methods": {}}
    fam = parse_name(sc.name)
    if fam is not None:
        out["params"] = make_landscape(*fam).describe()
    for method, rs in runs.items():
        if not rs:
            continue
        dep_reg = [nreg(r["J_dep"]) for r in rs]
        within = [r["J_dep"] <= 1.05 * j_star for r in rs]
        # the search's coverage: did it measure (true J) a configuration within 5 % of J* at all?
        evaluated = [bool(r["search_J"]) and min(r["search_J"]) <= 1.05 * j_star for r in rs]
        per_run = {
            "regret_deployed": dep_reg,
            "excess": [r["J_dep"] / j_star - 1 for r in rs],
            "within5": within,
            "evaluated5": evaluated,
            "cum_regret": [sum(j / j_star - 1 for j in r["search_J"]) for r in rs],
            "breaches": [r["breach"] for r in rs],
            "worse": [r["J_dep"] > j_base * (1 + 1e-9) for r in rs],
            "kept": [bool(r["kept"]) for r in rs],
        }
        firsts = []
        for r in rs:
            f = next((w for w, j in r.get("rec_trace", []) if j <= 1.05 * j_star), None)
            if f is not None:
                firsts.append(f)
        m = {
            "runs": len(rs),
            "regret_10": statistics.median(nreg(r["rec"][10]) for r in rs),
            "regret_20": statistics.median(nreg(r["rec"][20]) for r in rs),
            "regret_deployed": statistics.median(dep_reg),
            "within5": sum(within),
            "within5_frac": sum(within) / len(rs),
            "evaluated5_frac": sum(evaluated) / len(rs),
            "median_window_within5": statistics.median(firsts) if firsts else None,
            "cum_regret": statistics.median(sum(j / j_star - 1 for j in r["search_J"]) for r in rs),
            "breaches": statistics.mean(r["breach"] for r in rs),
            "worse_than_baseline": sum(1 for r in rs if r["J_dep"] > j_base * (1 + 1e-9)),
            "kept_baseline": sum(1 for r in rs if r["kept"]) / len(rs),
            "cpu_per_trial": statistics.median(r["cpu_per_trial"] for r in rs),
            "per_run": per_run,
        }
        out["methods"][method] = m
    return out


def aggregate(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per method, over every (landscape, seed) run: see the module docstring."""
    methods: list[str] = []
    for s in summaries:
        methods += [m for m in s["methods"] if m not in methods]
    big = [s for s in summaries if s["gain_available"] >= BIG_EFFECT]
    flat = [s for s in summaries if not s["effect"]]
    out: dict[str, Any] = {
        "landscapes": len(summaries),
        "landscapes_gain_ge_10": len(big),
        "landscapes_gain_5_10": sum(1 for s in summaries if s["effect"] and s["gain_available"] < BIG_EFFECT),
        "landscapes_flat": len(flat),
        "landscapes_nonstationary": sum(1 for s in summaries if s["nonstationary"]),
        "methods": {},
    }
    for method in methods:
        def runs(sel: Sequence[dict[str, Any]], key: str, method: str = method) -> list[Any]:
            return [x for s in sel if method in s["methods"] for x in s["methods"][method]["per_run"][key]]

        eff = [s for s in summaries if s["effect"]]
        stat = [s for s in summaries if not s["nonstationary"]]
        reg, exc = runs(eff, "regret_deployed"), runs(summaries, "excess")
        within, kept, cum = runs(big, "within5"), runs(flat, "kept"), runs(stat, "cum_regret")
        evald = runs(big, "evaluated5")
        out["methods"][method] = {
            "runs": len(runs(summaries, "kept")),
            "regret_deployed_median": statistics.median(reg) if reg else None,
            "regret_deployed_p90": percentile(reg, 0.9) if reg else None,
            "excess_median": statistics.median(exc) if exc else None,
            "excess_p90": percentile(exc, 0.9) if exc else None,
            "within5_frac": sum(within) / len(within) if within else None,
            "within5_runs": len(within),
            "evaluated5_frac": sum(evald) / len(evald) if evald else None,
            "cum_regret_median": statistics.median(cum) if cum else None,
            "breaches_mean": statistics.mean(runs(stat, "breaches")) if stat else None,
            "worse_than_baseline": sum(runs(summaries, "worse")),
            "kept_flat_frac": sum(kept) / len(kept) if kept else None,
            "kept_flat_runs": len(kept),
        }
    return out


def check_aggregate(agg: dict[str, Any], label: str) -> list[str]:
    """The family targets, for polltuned's engine, on the aggregate."""
    ms = agg["methods"]
    pt, rnd = ms.get("polltuned"), ms.get("random")
    if pt is None:
        return []
    lines = []
    if rnd is not None and pt["regret_deployed_median"] is not None and rnd["regret_deployed_median"] is not None:
        ok = pt["regret_deployed_median"] <= 0.5 * rnd["regret_deployed_median"] + 1e-9
        lines.append(f"{'PASS' if ok else 'FAIL'} {label}: median deployed regret {pt['regret_deployed_median']:.3f} "
                     f"<= 0.5 x random {rnd['regret_deployed_median']:.3f}")
    if pt["within5_frac"] is not None:
        ok = pt["within5_frac"] >= 0.8
        lines.append(f"{'PASS' if ok else 'FAIL'} {label}: within 5 % of J* in {pt['within5_frac']:.0%} of "
                     f"{pt['within5_runs']} runs on landscapes with >= 10 % gain (>= 80 %)")
    ok = pt["worse_than_baseline"] == 0
    lines.append(f"{'PASS' if ok else 'FAIL'} {label}: worse-than-baseline deployments = {pt['worse_than_baseline']} "
                 f"of {pt['runs']} runs (0)")
    if pt["kept_flat_frac"] is not None:
        ok = pt["kept_flat_frac"] >= 0.9
        lines.append(f"{'PASS' if ok else 'FAIL'} {label}: baseline kept in {pt['kept_flat_frac']:.0%} of "
                     f"{pt['kept_flat_runs']} runs on flat landscapes (< 5 % gain) (>= 90 %)")
    return lines


def aggregate_table(agg: dict[str, Any]) -> str:
    def f(x: Any, fmt: str = "{:.2f}") -> str:
        if x is None:
            return "-"
        if isinstance(x, float) and math.isinf(x):
            return "inf"
        return fmt.format(x)

    rows = ["| method | runs | regret deployed median | regret p90 | within 5 % (gain >= 10 %) | measured within 5 %"
            " | cum. regret median | breaches mean | worse than baseline | kept baseline (flat) | excess J median"
            " | excess J p90 |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for method, m in agg["methods"].items():
        rows.append(f"| {method} | {m['runs']} | {f(m['regret_deployed_median'], '{:.3f}')} | "
                    f"{f(m['regret_deployed_p90'], '{:.3f}')} | {f(m['within5_frac'], '{:.0%}')} | "
                    f"{f(m.get('evaluated5_frac'), '{:.0%}')} | {f(m['cum_regret_median'], '{:.1f}')} | "
                    f"{f(m['breaches_mean'])} | {m['worse_than_baseline']} | "
                    f"{f(m['kept_flat_frac'], '{:.0%}')} | {f(m['excess_median'], '{:.1%}')} | "
                    f"{f(m['excess_p90'], '{:.1%}')} |")
    return "\n".join(rows)


def check_targets(summaries: Sequence[dict[str, Any]]) -> list[str]:
    lines = []
    for s in summaries:
        ms = s["methods"]
        pt, rnd = ms.get("polltuned"), ms.get("random")
        if pt is None:
            continue
        name = s["scenario"]
        ok = pt["worse_than_baseline"] == 0
        lines.append(f"{'PASS' if ok else 'FAIL'} {name}: worse-than-baseline deploys = {pt['worse_than_baseline']}")
        if rnd is not None and s.get("nonstationary"):
            lines.append(f"n/a  {name}: exploration cost not compared (the world changes mid-run; regret is "
                         "measured against the final workload)")
        elif rnd is not None:
            cr = pt["cum_regret"] <= 0.6 * rnd["cum_regret"] + 1e-9
            lines.append(f"{'PASS' if cr else 'FAIL'} {name}: cumulative regret {pt['cum_regret']:.2f} <= 0.6 x random "
                         f"{rnd['cum_regret']:.2f}")
            br = pt["breaches"] <= 0.6 * rnd["breaches"] + 1e-9
            lines.append(f"{'PASS' if br else 'FAIL'} {name}: guard breaches {pt['breaches']:.2f} <= 0.6 x random "
                         f"{rnd['breaches']:.2f}")
        if s["effect"]:
            w = pt["within5_frac"] >= 0.8
            lines.append(f"{'PASS' if w else 'FAIL'} {name}: within 5 % in {pt['within5_frac']:.0%} of runs (>= 80 %)")
            if rnd is not None:
                rr = pt["regret_deployed"] <= 0.5 * rnd["regret_deployed"] + 1e-9
                lines.append(f"{'PASS' if rr else 'FAIL'} {name}: regret {pt['regret_deployed']:.3f} <= 0.5 x random "
                             f"{rnd['regret_deployed']:.3f}")
        else:
            k = pt["kept_baseline"] >= 0.9 or pt["within5_frac"] >= 0.9
            lines.append(f"{'PASS' if k else 'FAIL'} {name} (no effect): kept baseline {pt['kept_baseline']:.0%}, "
                         f"within 5 % {pt['within5_frac']:.0%} (>= 90 %)")
    return lines


def table(summaries: Sequence[dict[str, Any]]) -> str:
    def f(x: Any, fmt: str = "{:.2f}") -> str:
        if x is None:
            return "-"
        if isinstance(x, float) and math.isinf(x):
            return "inf"
        return fmt.format(x)

    rows = ["| scenario (gain avail.) | method | regret@10 | regret@20 | regret deployed | within 5 % (median window)"
            " | cum. regret | breaches | worse | kept base | opt. CPU s/trial |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        head = f"{s['scenario']} ({s['gain_available']:.0%}{'' if s['effect'] else ', no effect'})"
        for method, m in s["methods"].items():
            rows.append(
                f"| {head} | {method} | {f(m['regret_10'])} | {f(m['regret_20'])} | {f(m['regret_deployed'])} | "
                f"{m['within5']}/{m['runs']} ({f(m['median_window_within5'], '{:.0f}')}) | "
                f"{f(m['cum_regret'], '{:.1f}')} | "
                f"{f(m['breaches'])} | {m['worse_than_baseline']} | {m['kept_baseline']:.0%} | "
                f"{f(m['cpu_per_trial'], '{:.3f}')} |")
            head = ""
    return "\n".join(rows)


def cost_table(pol: Policy, sizes: Sequence[int] = (10, 50, 100, 200, 300), reps: int = 5) -> str:
    """Optimiser CPU seconds per step (tell + ask + recommendation) at N observations: polltuned's
    bounded skopt backend vs an out-of-the-box skopt GP Optimizer (gp_hedge, lbfgs) on the same
    encoded space. BLAS capped at one thread for both."""
    import numpy as np
    from skopt import Optimizer
    from threadpoolctl import threadpool_limits

    from polltuned.optimiser.skopt_backend import SkoptOptimiser

    space = Space.from_policy(pol)
    base = default_config(pol)
    rows = ["| observations | polltuned skopt backend (s/step) | ... with a context, 2 loads (s/step) |"
            " skopt GP default (s/step) |", "|---|---|---|---|"]
    for n in sizes:
        rng = np.random.default_rng(n)
        cfgs = space.sample_uniform(rng, n)
        ys = [float(rng.normal(0, 0.3)) for _ in cfgs]
        ours = SkoptOptimiser(space, base, seed=0, safety_limit=math.log(1.5))
        ours._design.clear()
        for c, y in zip(cfgs, ys):
            ours.hist.add(c, y)
        t_ours = []
        for _ in range(reps):
            t0 = time.process_time()
            c = ours.ask(remaining=100)
            ours.tell(c, float(rng.normal(0, 0.3)))
            ours.best()
            t_ours.append(time.process_time() - t0)
        ctx = SkoptOptimiser(space, base, seed=0, safety_limit=math.log(1.5))
        ctx._design.clear()
        loads = ({"flows": 1.0, "runnable_others": 0.0}, {"flows": 4.0, "runnable_others": 2.0})
        for i, (c, y) in enumerate(zip(cfgs, ys)):
            ctx.tell(c, y, context=loads[(i // 25) % 2])
        t_ctx = []
        for _ in range(reps):
            t0 = time.process_time()
            c = ctx.ask(remaining=100, context=loads[0])
            ctx.tell(c, float(rng.normal(0, 0.3)), context=loads[0])
            ctx.best(context=loads[0])
            t_ctx.append(time.process_time() - t0)
        dims = [(0.0, 1.0)] * space.width
        X = [list(space.encode(c)) for c in cfgs]
        with threadpool_limits(limits=1):
            ref = Optimizer(dims, base_estimator="GP", n_initial_points=1, random_state=0, model_queue_size=1)
            ref.tell(X[:-1], ys[:-1])
            t_ref = []
            for _ in range(max(1, reps // 2)):
                t0 = time.process_time()
                ref.tell(X[-1], ys[-1])
                ref.ask()
                t_ref.append(time.process_time() - t0)
        rows.append(f"| {n} | {statistics.median(t_ours):.3f} | {statistics.median(t_ctx):.3f} | "
                    f"{statistics.median(t_ref):.3f} |")
    return "\n".join(rows)


def _summary_task(args: tuple[str, Policy, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    return summarise(*args)


def _pool_map(fn: Any, items: Sequence[Any], jobs: int) -> list[Any]:
    if jobs > 1 and len(items) > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(jobs) as pool:
            return list(pool.map(fn, items, chunksize=1))
    return [fn(t) for t in items]



# ---------------------------------------------------------------- the long horizon (--horizon N)
#: horizon methods: the engine with polltuned's contextual GP (product kernel), the same with the
#: sum kernel, the same with the context hidden from it, and random search in the same cycle
HORIZON_METHODS = {"polltuned": ("skopt", "product", True), "polltuned-sum": ("skopt", "sum", True),
                   "polltuned-nocontext": ("skopt", "product", False), "random": ("random", "product", True)}
#: diagnostics, not tuners (--horizon only): the daemon's own cycle — its searches, confirmations,
#: HOLD, switches and challengers unchanged — with the decision's pick replaced by what only the world
#: knows. ``oracle-pick``: the true optimum of the load the decision is for (a perfect search and
#: pick: what the confirm/hold machinery alone allows); ``oracle-measured``: of the configurations
#: the engine measured at that load, the one with the best true J, when it is truly at least
#: MIN_ORACLE_GAIN better than the originals (a perfect pick rule over what the search measured).
#: Both deploy the pick as it is (no simplification, no model veto); ``oracle-pick-simplified``
#: gives the optimum to the engine's own simplification and model check (``Engine._simplify``,
#: ``_predicted_too_little``) before the confirmation: what those steps cost a perfect pick.
ORACLE_METHODS = {"oracle-pick": ("optimum", True), "oracle-measured": ("measured", True),
                  "oracle-pick-simplified": ("optimum", False)}
HORIZON_METHODS.update({m: ("skopt", "product", True) for m in ORACLE_METHODS})
MIN_ORACLE_GAIN = 0.05
HORIZON_AT = (50, 150, 300, 600, 1000)
#: today's HOLD drift rule, emulated while the engine has no HOLD cycle of its own: a context signal
#: more than 30 % away from its value at deployment for 3 windows in a row starts a re-tune
DRIFT_RATIO = 1.3
DRIFT_WINDOWS = 3


class HorizonEnv:
    """A ScenarioEnv with one clock of windows for the whole horizon (every engine session's
    window indices restart at 0; the world's load does not) and a record of every window."""

    def __init__(self, inner: ScenarioEnv, *, hide_context: bool) -> None:
        self.inner = inner
        self.hide_context = hide_context
        self.t = 0
        self.windows: list[tuple[int, dict[str, KnobValue], dict[str, float]]] = []

    def current(self) -> dict[str, KnobValue]:
        return self.inner.current()

    def apply(self, config: Mapping[str, KnobValue]) -> None:
        self.inner.apply(config)

    def describe(self) -> Mapping[str, object]:
        return self.inner.describe()

    def measure(self, window_index: int) -> Any:
        from dataclasses import replace

        w = self.inner.measure(self.t)
        self.windows.append((self.t, self.inner.current(), dict(w.context)))
        self.t += 1
        return replace(w, context={}) if self.hide_context else w


def _drifted(ref: Mapping[str, float], ctx: Mapping[str, float]) -> bool:
    for k, v0 in ref.items():
        v = ctx.get(k)
        if v is not None and abs(math.log1p(v) - math.log1p(v0)) > math.log(DRIFT_RATIO):
            return True
    return False


def scenario_with_noise(sc_path: str, scale: float) -> Scenario:
    """The scenario; with ``scale`` != 1 a family landscape whose window noise (CV, outlier
    probability, CPU noise) is scaled by ``scale`` (the noise-free model is unchanged)."""
    from dataclasses import replace

    from polltuned.worlds.family import Landscape, MovingLandscape

    sc = load_scenario(sc_path)
    if scale == 1.0:
        return sc
    ls = getattr(sc._measure, "__self__", None)   # a family scenario measures through its landscape
    if not isinstance(ls, (Landscape, MovingLandscape)):
        raise SystemExit(f"--noise-scale: {sc_path} is not a family landscape (use --family)")
    n = ls.noise
    noisy = replace(ls, noise=replace(n, cv=n.cv * scale, outlier_p=min(1.0, n.outlier_p * scale),
                                      cpu_cv=n.cpu_cv * scale))
    return replace(sc, _measure=noisy.measure)


def run_horizon(sc_path: str, pol: Policy, method: str, seed: int, horizon: int,
                noise_scale: float = 1.0) -> dict[str, Any]:
    """One run of the daemon's whole cycle for ``horizon`` windows: each round is an Engine driven
    by polltuned.engine.driver.drive; whatever the engine does not do itself (the previous release's
    engine stops after confirming) is done here as the daemon would: hold the deployment, and start a
    re-tune (warm-started from the same study, today's deployment as the round's baseline) after the
    drift rule fires. Per window: its kind (the engine's WindowKind, or "hold"), configuration and
    the configuration in force (the last held one; the kernel defaults before any)."""
    from polltuned.optimiser.skopt_backend import SkoptOptimiser

    backend, kernel, see_ctx = HORIZON_METHODS[method]
    sc = scenario_with_noise(sc_path, noise_scale)
    p = pol.model_copy(update={"tuning": pol.tuning.model_copy(update={"seed": seed})})
    base = default_config(p)
    env = HorizonEnv(ScenarioEnv(p, sc, seed=seed, baseline=base), hide_context=not see_ctx)
    study = memory_study(p)
    space = Space.from_policy(p)
    kinds: list[str] = []
    in_force: list[dict[str, KnobValue]] = []
    active: dict[str, KnobValue] = dict(base)
    rounds = 0
    cpu = 0.0
    decisions: list[dict[str, Any]] = []
    while env.t < horizon:
        rounds += 1
        cur = env.current()
        safety = math.log(1 + p.guard.max_regression)
        opt = (SkoptOptimiser(space, cur, seed=seed + rounds, initial_points=p.tuning.initial_points,
                              safety_limit=safety, context_kernel=kernel) if backend == "skopt"
               else make_optimiser(backend, space, cur, seed=seed + rounds, safety_limit=safety))
        eng_cls = (Engine if method not in ORACLE_METHODS
                   else oracle_engine(*ORACLE_METHODS[method], sc, p, base, env))
        eng = eng_cls(p, study, current=cur, clock=FakeClock(), optimiser=opt, follow=True)
        n0 = len(env.windows)
        r = drive(eng, env, max_windows=horizon - env.t,
                  on_event=functools.partial(_note_decision, env=env, round_no=rounds, eng=eng, out=decisions))
        cpu += opt.cpu_seconds
        got = [str(k) for k, _ in eng.trace.windows]
        new = len(env.windows) - n0
        got = (got + ["?"] * new)[:new]
        for k, (_, cfg, _) in zip(got, env.windows[n0:]):
            if k == WindowKind.HOLD:
                active = dict(cfg)
            kinds.append(k)
            in_force.append(dict(active))
        if r is None or env.t >= horizon:
            break
        active = {**base, **r.deployed}
        env.apply(active)
        ref = env.windows[-1][2] if env.windows else {}
        streak = 0
        while env.t < horizon:
            env.measure(env.t)
            kinds.append("hold")
            in_force.append(dict(active))
            streak = streak + 1 if _drifted(ref, env.windows[-1][2]) else 0
            if streak >= DRIFT_WINDOWS:
                break
    # a stop at the horizon may finish a confirmation pair past it: score the horizon only
    return {"kinds": kinds[:horizon], "configs": [c for _, c, _ in env.windows][:horizon],
            "in_force": in_force[:horizon],
            "rounds": rounds, "cpu_s": cpu, "windows": min(env.t, horizon),
            "decisions": [d for d in decisions if d["window"] <= horizon]}


#: the engine's decision events in follow mode (a round's first decision, a region search's, a resumed
#: confirmation's): "HOLD: region N deployed CFG (why)" / "HOLD: region N keeps the originals (why)"
_DECISION = re.compile(r"^HOLD: region (\d+) (deployed|keeps the originals)")


def _note_decision(ev: Any, *, env: HorizonEnv, round_no: int, eng: Engine, out: list[dict[str, Any]]) -> None:
    """Collect one decision event of a horizon run: the windows measured when it was made, the round,
    the region, whether something was deployed, the configuration of the region's entry then (the
    active one at the event) and the engine's reason (the text in brackets)."""
    m = _DECISION.match(ev.message)
    if m is None:
        return
    why = ev.message[ev.message.find(" (") + 2:-1] if ev.message.endswith(")") else ""
    h = eng.state.hold
    cfg = dict(h.active.config) if h is not None and h.active is not None else None
    out.append({"window": env.t, "round": round_no, "region": int(m.group(1)), "deployed": m.group(2) == "deployed",
                "config": cfg, "why": why})


def oracle_engine(mode: str, raw: bool, sc: Scenario, pol: Policy, base: dict[str, KnobValue],
                  env: HorizonEnv) -> type[Engine]:
    """An Engine whose pick (``Engine._pick``) knows the world (ORACLE_METHODS): ``mode`` "optimum"
    or "measured"; ``raw``: deployed without the engine's simplification and model check. The load a
    decision is for is the load of the window whose context is nearest the engine's decision
    context (``where``) — the engine never learns the label."""
    from polltuned.engine.hold import distance, log_context

    optima: dict[str, tuple[float, dict[str, KnobValue]]] = {}
    first: dict[str, int] = {}

    def load_of(ctx: Mapping[str, float] | None) -> tuple[str, _AtWindow]:
        t_best = env.t - 1
        if ctx:
            lc = log_context(ctx)
            near = [(distance(log_context(c), lc), t) for t, _, c in env.windows if c]
            if near:
                t_best = min(near)[1]
        label = sc.load_at(max(t_best, 0))
        first.setdefault(label, max(t_best, 0))
        return label, _AtWindow(sc, first[label])

    class OraclePick(Engine):
        def _pick(self, where: Mapping[str, float] | None = None) -> dict[str, KnobValue] | None:
            st = self.state
            label, at = load_of(where if where is not None else st.context)
            j_base = J(at, pol, st.baseline)  # type: ignore[arg-type]
            if mode == "optimum":
                if label not in optima:
                    optima[label] = optimum(at, pol, base)  # type: ignore[arg-type]
                j, cfg = optima[label]
            else:
                measured = [dict(o.config) for o in st.obs if not (o.reference or o.aborted or o.infeasible)
                            and not (where is not None and o.context and self._far(o.context, where))]
                if not measured:
                    return None
                j, cfg = min(((J(at, pol, {**st.baseline, **c}), c) for c in measured),  # type: ignore[arg-type]
                             key=lambda jc: jc[0])
            if j > j_base * (1.0 - MIN_ORACLE_GAIN) or self.space.key_of(cfg) == st.base_key:
                return None
            return {k: cfg[k] for k in self.space.keys if k in cfg}

    if not raw:
        return OraclePick

    class OraclePickRaw(OraclePick):
        def _simplify(self, cfg: Mapping[str, KnobValue], where: Mapping[str, float] | None = None
                      ) -> tuple[dict[str, KnobValue], tuple[tuple[str, float], ...]]:
            return {**self.state.baseline, **cfg}, ()

        def _predicted_too_little(self, cand: Mapping[str, KnobValue],
                                  where: Mapping[str, float] | None = None) -> str | None:
            return None

    return OraclePickRaw


def _horizon_task(args: tuple[str, Policy, str, int, int, float]) -> tuple[str, str, int, dict[str, Any]]:
    sc_path, pol, method, seed, horizon, noise_scale = args
    return sc_path, method, seed, run_horizon(sc_path, pol, method, seed, horizon, noise_scale)


def first_windows(sc: Scenario, horizon: int) -> dict[str, int]:
    """load label -> the first window (< horizon) at that load."""
    first: dict[str, int] = {}
    for t in range(horizon):
        first.setdefault(sc.load_at(t), t)
    return first


def load_optima(sc_path: str, pol: Policy, horizon: int) -> dict[str, tuple[float, float]]:
    """load label -> (J of the kernel defaults, J*) at that load (J* by optimum() on expected_at)."""
    sc = load_scenario(sc_path)
    base = default_config(pol)
    out: dict[str, tuple[float, float]] = {}
    for label, t in first_windows(sc, horizon).items():
        at = _AtWindow(sc, t)
        out[label] = (J(at, pol, base), optimum(at, pol, base)[0])  # type: ignore[arg-type]
    return out


def space_share_within(sc: Any, pol: Policy, base: dict[str, KnobValue], j_star: float, *, within: float = 0.05,
                       n: int = 1000, seed: int = 4321) -> float:
    """Share of ``n`` uniformly drawn configurations (deterministic) whose J is within ``within``
    of ``j_star``: how small the target of a search is at that load."""
    import numpy as np

    space = Space.from_policy(pol)
    cands = space.sample_uniform(np.random.default_rng(seed), n)
    return sum(J(sc, pol, {**base, **c}) <= j_star * (1.0 + within) for c in cands) / n


class _AtWindow:
    """A scenario seen at one window's load (``expected`` = ``expected_at(., window)``)."""

    def __init__(self, sc: Scenario, window: int) -> None:
        self.sc, self.window = sc, window

    def expected(self, cfg: Mapping[str, KnobValue]) -> dict[str, float]:
        return self.sc.expected_at(cfg, self.window)


def summarise_horizon(sc_path: str, pol: Policy, runs: Mapping[str, list[dict[str, Any]]],
                      horizon: int) -> dict[str, Any]:
    """Per method: regret over time of the configuration in force against the optimum of the load
    of each window, within 5 % at windows 50/150/300, exploration share after window 100, deployments
    worse than the kernel defaults (at the load of the window they were made) and windows spent in
    force worse than the defaults."""
    sc = load_scenario(sc_path)
    optima = load_optima(sc_path, pol, horizon)
    labels = [sc.load_at(t) for t in range(horizon)]
    base = default_config(pol)
    first = first_windows(sc, horizon)
    out: dict[str, Any] = {"scenario": sc.name, "loads": {k: {"J_baseline": b, "J_star": s, "space_within5":
                                                              space_share_within(_AtWindow(sc, first[k]), pol, base, s)}
                                                          for k, (b, s) in optima.items()},
                           "changes": [t for t in range(1, horizon) if labels[t] != labels[t - 1]], "methods": {}}
    at = [w for w in HORIZON_AT if w <= horizon]
    for method, rs in runs.items():
        if not rs:
            continue
        per: dict[str, list[Any]] = {"within5_at": [], "within10_at": [], "within20_at": [], "captured_at": [],
                                     "available_at": [],
                                     "measured_within5_at": [], "regret": [], "explore_after_100": [],
                                     "deploys": [], "worse_deploy": [], "worse_deploy_5": [],
                                     "knobs_changed": [], "knobs_inert": [],
                                     "worse_windows": [], "severe_windows": [], "rounds": [],
                                     "cpu_per_window": []}
        for r in rs:
            n = len(r["in_force"])
            jf = [J(_AtWindow(sc, t), pol, r["in_force"][t]) for t in range(n)]
            ex = [jf[t] / optima[labels[t]][1] - 1.0 for t in range(n)]
            worse = [jf[t] > optima[labels[t]][0] * (1 + 1e-9) for t in range(n)]
            per["regret"].append(ex)
            for pct in (5, 10, 20):
                per[f"within{pct}_at"].append({str(w): bool(w - 1 < n and ex[w - 1] <= pct / 100) for w in at})
            per["captured_at"].append({str(w): gain_captured(optima[labels[w - 1]], jf[w - 1])
                                       for w in at if w - 1 < n})
            per["available_at"].append({str(w): optima[labels[w - 1]][0] / optima[labels[w - 1]][1]
                                        for w in at if w - 1 < n})
            per["severe_windows"].append(sum(J(_AtWindow(sc, t), pol, c) > SEVERE * optima[labels[t]][0]
                                             for t, c in enumerate(r["configs"][:n])) / max(1, n))
            per["measured_within5_at"].append(measured_within(sc, pol, r["configs"][:n], labels, optima, at))
            late = r["kinds"][100:]
            per["explore_after_100"].append(sum(1 for k in late if k not in ("hold", WindowKind.HOLD)) / len(late)
                                            if late else 0.0)
            # every configuration HOLD put in force (a round's or a region's decision, a switch, a
            # challenger's win, a fallback), judged at the load of the first window it held
            deps = put_in_force(r["in_force"][:n])
            jd = [(J(_AtWindow(sc, t), pol, c), optima[labels[t]][0]) for t, c in deps]
            per["deploys"].append(len(deps))
            per["worse_deploy"].append(sum(1 for j, jb in jd if j > jb * (1 + 1e-9)))
            per["worse_deploy_5"].append(sum(1 for j, jb in jd if j > jb * (1 + NO_EFFECT)))
            for t, c in deps:
                ch, inert = deployed_knobs(_AtWindow(sc, t), pol, base, c)
                per["knobs_changed"].append(ch)
                per["knobs_inert"].append(inert)
            per["worse_windows"].append(sum(worse) / max(1, n))
            per["rounds"].append(r["rounds"])
            per["cpu_per_window"].append(r["cpu_s"] / max(1, r["windows"]))
        spans = [(0, 50), (50, 150), (150, min(horizon, 300))] + ([(300, horizon)] if horizon > 300 else [])
        out["methods"][method] = {
            "runs": len(rs),
            "within5_at": {str(w): sum(d[str(w)] for d in per["within5_at"]) / len(rs) for w in at},
            "within10_at": {str(w): sum(d[str(w)] for d in per["within10_at"]) / len(rs) for w in at},
            "within20_at": {str(w): sum(d[str(w)] for d in per["within20_at"]) / len(rs) for w in at},
            "measured_within5_at": {str(w): sum(d[str(w)] for d in per["measured_within5_at"]) / len(rs) for w in at},
            "explore_share_after_100": statistics.mean(per["explore_after_100"]),
            "regret_median": {f"{a}-{b}": (statistics.median(statistics.mean(x[a:b]) for x in per["regret"]
                                                            if len(x) > a) if b > a else None) for a, b in spans},
            "within5_window_share": {f"{a}-{b}": (statistics.mean(sum(e <= 0.05 for e in x[a:b]) / len(x[a:b])
                                                                  for x in per["regret"] if len(x) > a)
                                                  if b > a else None) for a, b in spans},
            "worse_than_baseline_deployments": sum(per["worse_deploy"]),
            "worse_than_baseline_deployments_5pct": sum(per["worse_deploy_5"]),
            "deployments": sum(per["deploys"]),
            "knobs_changed_per_deployment": _mean_or_none(per["knobs_changed"]),
            "inert_knobs_per_deployment": _mean_or_none(per["knobs_inert"]),
            "worse_than_baseline_window_share": statistics.mean(per["worse_windows"]),
            "severe_window_share": statistics.mean(per["severe_windows"]),
            "rounds_mean": statistics.mean(per["rounds"]),
            "optimiser_cpu_per_window_s": statistics.median(per["cpu_per_window"]),
            "per_run": per,
        }
    return out


def measured_within(sc: Scenario, pol: Policy, configs: Sequence[Mapping[str, KnobValue]], labels: Sequence[str],
                    optima: Mapping[str, tuple[float, float]], at: Sequence[int],
                    within: float = 0.05) -> dict[str, bool]:
    """Per checkpoint ``w``: whether a window before ``w`` measured, at the load of window ``w - 1``,
    a configuration within ``within`` of that load's optimum (the search's coverage: the best any
    decision rule could have deployed there)."""
    near = [J(_AtWindow(sc, t), pol, c) <= optima[labels[t]][1] * (1.0 + within) for t, c in enumerate(configs)]
    return {str(w): w - 1 < len(near) and any(near[t] for t in range(w) if labels[t] == labels[w - 1]) for w in at}


def deployed_knobs(at: Any, pol: Policy, base: Mapping[str, KnobValue], cfg: Mapping[str, KnobValue]
                   ) -> tuple[int, int]:
    """(knobs a deployment changes from the kernel defaults, those of them that do not matter at
    the load ``at``: putting one back alone moves the true J by less than INERT) — "deploy only what
    matters", judged with what the world knows."""
    full = {**base, **cfg}
    changed = [k for k in full if full[k] != base.get(k, full[k])]
    j = J(at, pol, full)
    inert = sum(1 for k in changed if abs(J(at, pol, {**full, k: base[k]}) / j - 1.0) < INERT)
    return len(changed), inert


def put_in_force(in_force: Sequence[Mapping[str, KnobValue]]) -> list[tuple[int, dict[str, KnobValue]]]:
    """(window, configuration) for every window whose configuration in force differs from the
    window before's: each decision, switch, challenger win or fallback that changed what the host
    runs while holding (the first window is compared with nothing: it holds the kernel defaults)."""
    return [(t, dict(c)) for t, c in enumerate(in_force) if t > 0 and dict(c) != dict(in_force[t - 1])]


def has_gain(j_defaults: float, j_star: float = 1.0) -> bool:
    """A load with more than NO_EFFECT to gain (J_defaults / J*; ``j_star`` 1: a ratio is given):
    elsewhere keeping the defaults is already within reach of the optimum."""
    return j_defaults > j_star * (1.0 + NO_EFFECT)


def gain_captured(load: tuple[float, float], j: float) -> float | None:
    """The share of a load's available gain that J ``j`` realises: (J_defaults - j) / (J_defaults -
    J*) for a load ``(J_defaults, J*)`` with more than NO_EFFECT available (1 at the optimum, 0 on
    the defaults, negative when worse than them); None for a load where nothing is to be had."""
    jb, js = load
    if not has_gain(jb, js):
        return None
    return (jb - j) / (jb - js)


def _shares(flags: Sequence[Mapping[str, bool]]) -> dict[str, float]:
    return {k: sum(d[k] for d in flags) / len(flags) for k in (flags[0] if flags else {})}


def _captured(xs: Sequence[float | None]) -> dict[str, float | int | None]:
    """Median and mean of the gain captured over the runs whose checkpoint load had a gain, the
    share of them that captured at least 80 % of it, and how many runs that is."""
    v = [x for x in xs if x is not None]
    if not v:
        return {"runs": 0, "median": None, "mean": None, "ge80": None}
    return {"runs": len(v), "median": statistics.median(v), "mean": statistics.mean(v),
            "ge80": sum(x >= 0.8 for x in v) / len(v)}


#: J_defaults / J* of a checkpoint's load: no gain, a small one (hard to show in a few windows), a
#: large one, more than 2x
GAIN_BANDS = ((0.0, 1.0 + NO_EFFECT, "<=1.05"), (1.0 + NO_EFFECT, 1.25, "1.05-1.25"), (1.25, 2.0, "1.25-2"),
              (2.0, math.inf, ">2"))


def _with_gain(flags: Sequence[Mapping[str, bool]], available: Sequence[Mapping[str, float]]
               ) -> dict[str, float | None]:
    """Per checkpoint, the share of ``flags`` set among the runs whose load at that checkpoint has
    more than NO_EFFECT available (J_defaults / J*): the headline shares without the loads where
    keeping the defaults is already optimal (None: no such run)."""
    out: dict[str, float | None] = {}
    for k in (flags[0] if flags else {}):
        hits = [f[k] for f, a in zip(flags, available) if k in a and has_gain(a[k])]
        out[k] = sum(hits) / len(hits) if hits else None
    return out


def by_available_gain(per: Sequence[Mapping[str, list[Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per checkpoint and band of the gain available at its load (J_defaults / J*): how many runs,
    the share within 5 % and within 10 %, and the median share of the gain captured — which loads the
    misses come from (``per``: summarise_horizon's per-run lists, one per scenario)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for p in per:
        for w5, w10, cap, av in zip(p["within5_at"], p["within10_at"], p["captured_at"], p["available_at"]):
            for k, a in av.items():
                band = next(name for _, hi, name in GAIN_BANDS if a <= hi)
                cell = out.setdefault(k, {}).setdefault(band, {"runs": 0, "within5": 0, "within10": 0, "cap": []})
                cell["runs"] += 1
                cell["within5"] += w5[k]
                cell["within10"] += w10[k]
                if cap.get(k) is not None:
                    cell["cap"].append(cap[k])
    return {k: {band: {"runs": c["runs"], "within5": c["within5"] / c["runs"], "within10": c["within10"] / c["runs"],
                       "captured_median": statistics.median(c["cap"]) if c["cap"] else None}
                for band, c in sorted(v.items(), key=lambda kv: [b[2] for b in GAIN_BANDS].index(kv[0]))}
            for k, v in out.items()}


def aggregate_horizon(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    methods: list[str] = []
    for s in summaries:
        methods += [m for m in s["methods"] if m not in methods]
    gained = [ld["space_within5"] for s in summaries for ld in s["loads"].values()
              if has_gain(ld["J_baseline"], ld["J_star"])]
    out: dict[str, Any] = {"scenarios": len(summaries), "methods": {},
                           "loads_with_gain": len(gained),
                           "space_within5_median": statistics.median(gained) if gained else None}
    for m in methods:
        per = [s["methods"][m]["per_run"] for s in summaries if m in s["methods"]]
        w5 = [d for p in per for d in p["within5_at"]]
        m5 = [d for p in per for d in p["measured_within5_at"]]
        cap = [d for p in per for d in p["captured_at"]]
        ex = [x for p in per for x in p["explore_after_100"]]
        out["methods"][m] = {
            "runs": len(w5),
            "within5_at": {k: sum(d[k] for d in w5) / len(w5) for k in (w5[0] if w5 else {})},
            **{f"within{pct}_at": _shares([d for p in per for d in p[f"within{pct}_at"]]) for pct in (10, 20)},
            "captured_at": {k: _captured([d.get(k) for d in cap]) for k in (w5[0] if w5 else {})},
            "by_available_gain": by_available_gain(per),
            **{f"within{pct}_at_gain": _with_gain([d for p in per for d in p[f"within{pct}_at"]],
                                                  [d for p in per for d in p["available_at"]]) for pct in (5, 10)},
            "measured_within5_at": {k: sum(d[k] for d in m5) / len(m5) for k in (m5[0] if m5 else {})},
            "within5_window_share": _window_shares([x for p in per for x in p["regret"]]),
            "explore_share_after_100": statistics.mean(ex) if ex else None,
            "worse_than_baseline_deployments": sum(sum(p["worse_deploy"]) for p in per),
            "worse_than_baseline_deployments_5pct": sum(sum(p["worse_deploy_5"]) for p in per),
            "deployments": sum(sum(p["deploys"]) for p in per),
            "knobs_changed_per_deployment": _mean_or_none([x for p in per for x in p["knobs_changed"]]),
            "inert_knobs_per_deployment": _mean_or_none([x for p in per for x in p["knobs_inert"]]),
            "worse_than_baseline_window_share": statistics.mean(x for p in per for x in p["worse_windows"]),
            "severe_window_share": statistics.mean(x for p in per for x in p["severe_windows"]),
            "severe_window_share_worst_run": max(x for p in per for x in p["severe_windows"]),
            "optimiser_cpu_per_window_s": statistics.median(x for p in per for x in p["cpu_per_window"]),
        }
    return out


def _mean_or_none(xs: Sequence[float]) -> float | None:
    return statistics.mean(xs) if xs else None


def _window_shares(regret: Sequence[Sequence[float]]) -> dict[str, float]:
    """Per span of windows (0-50, 50-150, 150-300, then 300-1000, 1000-horizon as far as the runs
    go), the share of windows whose configuration in force was within 5 % of the optimum of their
    load, over every run: the long horizon's view (a checkpoint is one window of each run)."""
    n = max((len(x) for x in regret), default=0)
    edges = [e for e in (0, 50, 150, 300, 1000) if e < n] + [n]
    out: dict[str, float] = {}
    for a, b in itertools.pairwise(edges):
        cells = [e <= 0.05 for x in regret for e in x[a:b]]
        if cells:
            out[f"{a}-{b}"] = sum(cells) / len(cells)
    return out


def _pct(x: float | None, fmt: str = "{:.0%}") -> str:
    return "-" if x is None else fmt.format(x)


def horizon_table(summaries: Sequence[dict[str, Any]], agg: dict[str, Any]) -> str:
    spans = next((list(d["regret_median"]) for s in summaries for d in s["methods"].values()), ["0-50", "50-150"])
    rows = ["| scenario | method | within 5 % @50 | @150 | @300 | " + " | ".join(f"regret {k}" for k in spans)
            + " | explore after 100 | worse deploys | worse windows | rounds |",
            "|---|---|---|---|---|" + "---|" * len(spans) + "---|---|---|---|"]
    for s in summaries:
        head = s["scenario"]
        for m, d in s["methods"].items():
            w, rg = d["within5_at"], d["regret_median"]
            rows.append(f"| {head} | {m} | {_pct(w.get('50'))} | {_pct(w.get('150'))} | {_pct(w.get('300'))} | "
                        + " | ".join(_pct(v, "{:.1%}") for v in rg.values())
                        + f" | {d['explore_share_after_100']:.1%} | {d['worse_than_baseline_deployments']} | "
                          f"{d['worse_than_baseline_window_share']:.1%} | {d['rounds_mean']:.1f} |")
            head = ""
    rows += ["", "| method | runs | within 5 % @50 | @150 | @300 | measured within 5 % @50 | @150 | @300 "
             "| explore after 100 | worse deploys | worse windows | knobs per deployment (inert) "
             "| optimiser CPU s/window |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m, d in agg["methods"].items():
        w, mw = d["within5_at"], d["measured_within5_at"]
        kc, ki = d.get("knobs_changed_per_deployment"), d.get("inert_knobs_per_deployment")
        rows.append(f"| {m} | {d['runs']} | {_pct(w.get('50'))} | {_pct(w.get('150'))} | {_pct(w.get('300'))} | "
                    f"{_pct(mw.get('50'))} | {_pct(mw.get('150'))} | {_pct(mw.get('300'))} | "
                    f"{d['explore_share_after_100']:.1%} | {d['worse_than_baseline_deployments']} | "
                    f"{d['worse_than_baseline_window_share']:.1%} | "
                    + ("-" if kc is None else f"{kc:.2f} ({ki:.2f})")
                    + f" | {d['optimiser_cpu_per_window_s']:.3f} |")
    rows += ["", "| method | within 10 % @50 | @150 | @300 | within 20 % @50 | @150 | @300 | gain captured @150: median"
             " (>= 80 %) | @300: median (>= 80 %) | windows measured > 2x the defaults (worst run) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m, d in agg["methods"].items():
        w10, w20, cap = d["within10_at"], d["within20_at"], d["captured_at"]
        cells = [_pct(w10.get(k)) for k in ("50", "150", "300")] + [_pct(w20.get(k)) for k in ("50", "150", "300")]
        cells += [f"{_pct(c.get('median'))} ({_pct(c.get('ge80'))})" if c else "-"
                  for c in (cap.get("150"), cap.get("300"))]
        cells.append(f"{d['severe_window_share']:.1%} ({d['severe_window_share_worst_run']:.1%})")
        rows.append(f"| {m} | " + " | ".join(cells) + " |")
    rows += ["", f"| method | on loads with more than {NO_EFFECT:.0%} available: within 5 % @50 | @150 | @300 "
             "| within 10 % @50 | @150 | @300 |", "|---|---|---|---|---|---|---|"]
    for m, d in agg["methods"].items():
        g5, g10 = d["within5_at_gain"], d["within10_at_gain"]
        rows.append(f"| {m} | " + " | ".join(_pct(g.get(k)) for g in (g5, g10) for k in ("50", "150", "300")) + " |")
    for m, d in agg["methods"].items():
        bands = d.get("by_available_gain") or {}
        if not bands:
            continue
        rows += ["", f"{m}, by the gain available at the checkpoint's load (J_defaults / J*): runs, within 5 %, "
                 "within 10 %, median share of the gain captured", "",
                 "| checkpoint | " + " | ".join(name for _, _, name in GAIN_BANDS) + " |",
                 "|---|" + "---|" * len(GAIN_BANDS)]
        for k, v in bands.items():
            cells = []
            for _, _, name in GAIN_BANDS:
                c = v.get(name)
                cells.append("-" if c is None else f"{c['runs']}: {_pct(c['within5'])} / {_pct(c['within10'])} / "
                             + _pct(c["captured_median"]))
            rows.append(f"| {k} | " + " | ".join(cells) + " |")
    if agg.get("space_within5_median") is not None:
        rows += ["", f"{agg['loads_with_gain']} loads with more than {NO_EFFECT:.0%} available; median share of the "
                 f"space within 5 % of a load's optimum: {agg['space_within5_median']:.2%}"]
    return "\n".join(rows)


def main_horizon(a: argparse.Namespace, pol: Policy, run_pol: Policy, paths: Sequence[str]) -> int:
    methods = [m for m in a.methods.split(",") if m]
    bad = [m for m in methods if m not in HORIZON_METHODS]
    if bad:
        raise SystemExit(f"--horizon: unknown method {bad[0]!r} (choose from {', '.join(HORIZON_METHODS)})")
    t0 = time.monotonic()
    tasks = [(p, run_pol, m, s, a.horizon, a.noise_scale) for p in paths for m in methods for s in range(a.seeds)]
    results = _pool_map(_horizon_task, tasks, a.jobs)
    by: dict[str, dict[str, list[dict[str, Any]]]] = {p: {m: [] for m in methods} for p in paths}
    for p, m, _s, r in results:
        by[p][m].append(r)
    summaries = [summarise_horizon(p, pol, by[p], a.horizon) for p in paths]
    agg = aggregate_horizon(summaries)
    for sm in summaries:
        for d in sm["methods"].values():
            d.pop("per_run", None)
    elapsed = time.monotonic() - t0
    if a.json:
        print(json.dumps({"horizon": a.horizon, "seeds": a.seeds, "methods": methods, "elapsed_s": elapsed,
                          "noise_scale": a.noise_scale, "explore_share": run_pol.hold.explore_share,
                          "no_seeds": a.no_seeds, "scenarios": summaries, "aggregate": agg}, indent=1, default=str))
    else:
        print(f"tuner quality, horizon {a.horizon} windows: {len(paths)} scenarios x {a.seeds} seeds x "
              f"{len(methods)} methods, policy seeds {'removed' if a.no_seeds else 'as given'}, "
              + (f"window noise x{a.noise_scale:g}, " if a.noise_scale != 1.0 else "")
              + f"hold.explore_share {run_pol.hold.explore_share:g}, {elapsed:.0f} s\n")
        print(horizon_table(summaries, agg))
    return 0



def with_explore_share(pol: Policy, share: float) -> Policy:
    """``pol`` with ``hold.explore_share`` = ``share``, checked by the policy schema's own rule
    (pydantic.ValidationError outside it)."""
    hold = type(pol.hold).model_validate({**pol.hold.model_dump(), "explore_share": share})
    return pol.model_copy(update={"hold": hold})


def kernel_compare_run(sc_path: str, pol: Policy, variant: str, seed: int, windows: int) -> dict[str, Any]:
    """Optimiser only (no engine): every window measures the kernel defaults and one proposal at
    the current load, tells the log-ratio with the window's context (``variant`` "none": without),
    and scores ``best(context=now)`` against the optimum of the current load."""
    import numpy as np

    from polltuned.optimiser.skopt_backend import SkoptOptimiser

    sc = load_scenario(sc_path)
    p = pol.model_copy(update={"tuning": pol.tuning.model_copy(update={"seed": seed})})
    base = default_config(p)
    space = Space.from_policy(p)
    opt = SkoptOptimiser(space, base, seed=seed, initial_points=p.tuning.initial_points,
                         safety_limit=math.log(1 + p.guard.max_regression),
                         context_kernel="product" if variant == "none" else variant)
    rng = np.random.default_rng(seed)
    optima = load_optima(sc_path, p, windows)
    excess = []
    for t in range(windows):
        mb = sc.measure(base, rng, window=t)
        ctx = {k.split(":", 1)[1]: v for k, v in mb.items() if k.startswith("context:")} if variant != "none" else None
        c = opt.ask(remaining=None, context=ctx)
        m = sc.measure({**base, **c}, rng, window=t)
        opt.tell(c, math.log(value_of(m, p.objective) / value_of(mb, p.objective)), context=ctx)
        rec = opt.best(context=ctx)
        cfg = {**base, **(rec.config if rec is not None else {})}
        excess.append(J(_AtWindow(sc, t), p, cfg) / optima[sc.load_at(t)][1] - 1.0)  # type: ignore[arg-type]
    return {"excess": excess, "cpu_per_step": opt.cpu_seconds / windows}


def _kc_task(args: tuple[str, Policy, str, int, int]) -> tuple[str, str, int, dict[str, Any]]:
    sc_path, pol, variant, seed, windows = args
    return sc_path, variant, seed, kernel_compare_run(sc_path, pol, variant, seed, windows)


#: the optimiser-only loop's variants (``--kernel-variants``)
KERNEL_VARIANTS = ("product", "sum", "none")


def kernel_compare(pol: Policy, paths: Sequence[str], seeds: int, windows: int, jobs: int,
                   variants: Sequence[str] = KERNEL_VARIANTS) -> dict[str, Any]:
    """Product vs sum context kernel vs no context, on the moving-load family (optimiser only): per
    variant the share of windows after W/3 within 5 % of the current load's optimum, and the share of
    runs within 5 % at each checkpoint (``HORIZON_AT`` up to W, and W)."""
    tasks = [(p, pol, v, s, windows) for p in paths for v in variants for s in range(seeds)]
    res = _pool_map(_kc_task, tasks, jobs)
    marks = sorted({c for c in HORIZON_AT if c <= windows} | {windows})
    out: dict[str, Any] = {}
    for v in variants:
        runs = [r for _, vv, _, r in res if vv == v]
        late = [x for r in runs for x in r["excess"][windows // 3:]]
        out[v] = {"runs": len(runs), "within5_share_after_third": sum(1 for x in late if x <= 0.05) / max(1, len(late)),
                  "within5_at": {str(c): sum(1 for r in runs if r["excess"][c - 1] <= 0.05) / max(1, len(runs))
                                 for c in marks},
                  "excess_median_after_third": statistics.median(late) if late else None,
                  "cpu_per_step_s": statistics.median(r["cpu_per_step"] for r in runs)}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default=str(shipped_dir()), help="directory of scenario .py files")
    ap.add_argument("--family", type=int, default=None, metavar="N",
                    help="run landscapes 0..N-1 of the random scenario family instead of scenario files")
    ap.add_argument("--family-seed", type=int, default=1, metavar="S", help="the family's seed (default 1)")
    ap.add_argument("--policy", default=str(HERE.parent / "policies" / "sim-default.toml"))
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--methods", default="polltuned,random,grid,static")
    ap.add_argument("--only", default="", help="comma-separated scenario names to run (default: all)")
    ap.add_argument("--no-seeds", action="store_true", help="remove every `seeds` entry from the policy")
    ap.add_argument("--per-landscape", action=argparse.BooleanOptionalAction, default=None,
                    help="print the per-landscape table and checks (default: on for --scenarios, off for --family)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="3 seeds, budget 20 (for tests)")
    ap.add_argument("--cost", action="store_true", help="only measure optimiser CPU per step vs observations")
    ap.add_argument("--horizon", type=int, default=None, metavar="N",
                    help="run the daemon's whole cycle for N windows (methods: " + ", ".join(HORIZON_METHODS) + ")")
    ap.add_argument("--kernel-compare", type=int, default=None, metavar="W",
                    help="optimiser only, W windows: product vs sum context kernel vs no context (JSON)")
    ap.add_argument("--kernel-variants", default=",".join(KERNEL_VARIANTS), metavar="V,...",
                    help="with --kernel-compare: which of " + ", ".join(KERNEL_VARIANTS) + " to run (default: all)")
    ap.add_argument("--noise-scale", type=float, default=1.0, metavar="S",
                    help="with --horizon and --family: scale the landscapes' window noise by S > 0 (0.05: nearly "
                         "exact windows; what the search reaches when noise is not the limit)")
    ap.add_argument("--explore-share", type=float, default=None, metavar="X",
                    help="with --horizon: the policy's hold.explore_share set to X (0..0.5): the share of HOLD "
                         "windows that may measure challengers (does more learning while holding close the gap?)")
    ap.add_argument("--moving", action="store_true",
                    help="with --family: the moving-load family (family-moving:SEED:INDEX)")
    a = ap.parse_args(argv)
    if a.cost:
        print(cost_table(load_policy(a.policy)))
        return 0
    if a.quick:
        a.seeds, a.budget = min(a.seeds, 3), min(a.budget, 20)
    if a.horizon is not None and a.methods == ap.get_default("methods"):
        a.methods = "polltuned,random"
    methods = [m for m in a.methods.split(",") if m]
    known = HORIZON_METHODS if a.horizon is not None else METHODS
    for m in methods:
        if m not in known:
            ap.error(f"--methods: unknown method {m!r} (choose from {', '.join(known)})")
    if a.horizon is not None and a.horizon < 1:
        ap.error(f"--horizon must be >= 1 (got {a.horizon})")
    if not (math.isfinite(a.noise_scale) and a.noise_scale > 0):
        ap.error(f"--noise-scale must be a finite number > 0 (got {a.noise_scale})")
    if a.noise_scale != 1.0 and (a.horizon is None or a.family is None):
        ap.error("--noise-scale works with --horizon and --family only")
    if a.explore_share is not None and a.horizon is None:
        ap.error("--explore-share works with --horizon only")
    pol = load_policy(a.policy)
    run_pol = strip_seeds(pol) if a.no_seeds else pol
    if a.explore_share is not None:
        try:
            run_pol = with_explore_share(run_pol, a.explore_share)
        except ValidationError as e:
            ap.error(f"--explore-share {a.explore_share}: hold.explore_share: {e.errors()[0]['msg']}")
    if a.family is not None:
        if a.family < 1 or a.family_seed < 0:
            ap.error(f"--family must be >= 1 and --family-seed >= 0 (got {a.family}, {a.family_seed})")
        prefix = "family-moving" if a.moving else "family"
        paths = [f"{prefix}:{a.family_seed}:{i}" for i in range(a.family)]
        what = f"family {a.family_seed}, landscapes 0..{a.family - 1}"
    else:
        paths = sorted(str(p) for p in Path(a.scenarios).glob("*.py") if not p.name.startswith("_"))
        what = f"{len(paths)} scenarios from {a.scenarios}"
    if a.only:
        want = set(a.only.split(","))
        paths = [p for p in paths if Path(p).stem in want or p in want]
    if not paths:
        ap.error(f"--scenarios: no scenario files in {a.scenarios}")
    if a.kernel_compare is not None:
        if a.kernel_compare < 1:
            ap.error(f"--kernel-compare must be >= 1 (got {a.kernel_compare})")
        variants = [v for v in a.kernel_variants.split(",") if v]
        for v in variants or [a.kernel_variants]:
            if v not in KERNEL_VARIANTS:
                ap.error(f"--kernel-variants: unknown variant {v!r} (choose from {', '.join(KERNEL_VARIANTS)})")
        print(json.dumps(kernel_compare(run_pol, paths, a.seeds, a.kernel_compare, a.jobs, variants), indent=1))
        return 0
    if a.horizon is not None:
        return main_horizon(a, pol, run_pol, paths)
    per_landscape = a.per_landscape if a.per_landscape is not None else a.family is None
    tasks = [(p, run_pol, m, s, a.budget) for p in paths for m in methods for s in range(a.seeds)]
    t0 = time.monotonic()
    results = _pool_map(_task, tasks, a.jobs)
    by: dict[str, dict[str, list[dict[str, Any]]]] = {p: {m: [] for m in methods} for p in paths}
    for p, m, _s, r in results:
        by[p][m].append(r)
    # J* is searched with the policy as given (seeds included), so it does not depend on --no-seeds
    summaries = _pool_map(_summary_task, [(p, pol, by[p]) for p in paths], a.jobs)
    checks = check_targets(summaries)
    agg = aggregate(summaries)
    label = f"family {a.family_seed}" if a.family is not None else "aggregate"
    agg_checks = check_aggregate(agg, label)
    for sm in summaries:
        for m in sm["methods"].values():
            m.pop("per_run", None)
    elapsed = time.monotonic() - t0
    if a.json:
        print(json.dumps({"seeds": a.seeds, "budget": a.budget, "methods": methods, "elapsed_s": elapsed,
                          "family": {"seed": a.family_seed, "n": a.family} if a.family is not None else None,
                          "no_seeds": a.no_seeds, "scenarios": summaries, "targets": checks,
                          "aggregate": agg, "aggregate_targets": agg_checks}, indent=1, default=str))
    else:
        print(f"tuner quality: {what} ({agg['landscapes_gain_ge_10']} with >= 10 % gain available, "
              f"{agg['landscapes_gain_5_10']} with 5-10 %, {agg['landscapes_flat']} flat < 5 %, "
              f"{agg['landscapes_nonstationary']} nonstationary) x {a.seeds} seeds x {len(methods)} methods, "
              f"budget {a.budget} windows, policy seeds {'removed' if a.no_seeds else 'as given'}, {elapsed:.0f} s\n")
        if per_landscape:
            print(table(summaries))
            print()
            print("\n".join(checks))
            print()
        print(aggregate_table(agg))
        print()
        print("\n".join(agg_checks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

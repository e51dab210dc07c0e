#!/usr/bin/env python3
"""How much of "within 5 % of the optimum" window noise lets any tuner show: a bound on the family.

The horizon benchmark (``tuner_quality.py --horizon``) asks that the configuration in force be within
5 % of the optimum of the current load. On many loads that needs, beside the busy-polling knob that
carries most of the gain, two or three small knobs worth a few per cent each. A tuner that deploys
only what it has shown to matter (the issue's "deploy only what matters" and "a challenger wins
with the same confidence as a first deployment") must resolve each such knob against its original
value through noisy windows. This script measures, per load, how many windows that takes, with
every choice made in the tuner's favour, and so bounds the share of checkpoints at which within
5 % can be *shown* with a given number of exploration windows. It runs no tuner.

Per load of a landscape (the load of its first window; ``Scenario.expected_at``):

1. J* and its configuration c* (``tuner_quality.optimum``: 4000 uniform samples + coordinate
   refinement).
2. The minimal configuration: starting at c*, knobs are put back to their original values one at a
   time, always the one whose reversion costs least, while J stays within 5 % of J*. The knobs left
   are the ones within 5 % needs (this is one small set; another may exist, the greedy one is
   usually the cheapest to show).
3. For each needed knob, the effect d = log(J with that knob reverted / J of the minimal config),
   and for the whole gain d = log(J originals / J minimal). The windows to show d at one-sided
   alpha 0.05 with power 0.5 (a coin flip; the tuner's favour) are z^2 s^2 / d^2 with z = 1.645 and
   s the robust (MAD) standard deviation of log J per window of the *less* noisy of the two arms,
   as if the other arm were known exactly (free HOLD windows; the tuner's favour again). Outlier
   windows are discounted by the MAD. ``--power 0.8`` gives the usual design figure, ``--paired``
   the windows of an interleaved comparison that measures both arms (2 (z_a + z_b)^2 (s_1^2 + s_2^2) / d^2).
4. A load *needs* the largest of these (all of them must be shown).

Checkpoint share: at window w (150, 300), the load in force is reachable with B exploration windows
when it has less than 5 % to gain (the originals are within 5 %) or it needs at most B windows.
B = 12 is one region search, 30 a first search, and 105 / 120 every exploration window the issue's
budget allows by window 150 / 300 (all of the first 100 plus 10 % after, spent on that one load).
The share is an upper bound on ``within5_at`` for a tuner that only deploys what it has shown; a
tuner that deploys unshown knobs can be lucky, and unlucky.

Usage:
  benchmarks/resolvability.py --family 50 --family-seed S [--moving] [--horizon 300] [--policy FILE]
                              [--noise-scale X] [--power 0.5|0.8] [--paired] [--jobs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks._load import load  # noqa: E402
from polltuned.objective import value_of  # noqa: E402
from polltuned.optimiser.space import Space  # noqa: E402
from polltuned.policy.loader import load_policy  # noqa: E402
from polltuned.policy.schema import Policy  # noqa: E402
from polltuned.records import KnobValue  # noqa: E402
from polltuned.worlds.env import default_config  # noqa: E402

TQ: Any = load("tuner_quality")
WITHIN = 0.05
Z_ALPHA = statistics.NormalDist().inv_cdf(0.95)   # one-sided alpha 0.05
POWERS = (0.5, 0.8)
BUDGETS = (12, 30, 60, 105, 120)
CHECKPOINTS = (150, 300)
#: every exploration window the issue's budget allows by a checkpoint: the first 100, then 10 %
ALLOWED = {150: 105, 300: 120}
NOISE_WINDOWS = 800


def log_sd(sc: Any, pol: Policy, cfg: Mapping[str, KnobValue], window: int, seed: int) -> float:
    """Robust standard deviation (1.4826 x MAD) of log J over ``NOISE_WINDOWS`` measured windows."""
    rng = np.random.default_rng(seed)
    xs = np.array([math.log(max(1e-12, value_of(sc.measure(cfg, rng, window=window), pol.objective)))
                   for _ in range(NOISE_WINDOWS)])
    return float(1.4826 * np.median(np.abs(xs - np.median(xs))))


def windows_to_show(effect_log: float, sd: float, power: float, sd_other: float | None = None) -> float:
    """Windows to show a log-effect ``effect_log`` (> 0) at one-sided alpha 0.05 with ``power``.
    Without ``sd_other``: the explored arm's windows, the other arm known exactly,
    (z_a + z_b)^2 sd^2 / d^2. With it: an interleaved comparison measuring both arms equally,
    2 (z_a + z_b)^2 (sd^2 + sd_other^2) / d^2 windows in all. At least 1."""
    if effect_log <= 0:
        return math.inf
    z = Z_ALPHA + statistics.NormalDist().inv_cdf(power)
    var = sd * sd if sd_other is None else 2.0 * (sd * sd + sd_other * sd_other)
    return max(1.0, z * z * var / (effect_log * effect_log))


def minimal_config(at: Any, pol: Policy, space: Space, base: dict[str, KnobValue], c_star: Mapping[str, KnobValue],
                   j_star: float) -> dict[str, KnobValue]:
    """From ``c_star``, put knobs back to ``base`` one at a time (cheapest first) while J <= (1 + WITHIN) J*."""
    cur = {**base, **c_star}
    while True:
        best: tuple[float, dict[str, KnobValue]] | None = None
        for k in space.keys:
            if cur[k] == base[k]:
                continue
            c = {**base, **space.canonical({**cur, k: base[k]})}
            j = TQ.J(at, pol, c)
            if j <= j_star * (1.0 + WITHIN) and (best is None or j < best[0]):
                best = (j, c)
        if best is None:
            return cur
        cur = best[1]


def load_need(sc: Any, pol: Policy, window: int, power: float, paired: bool = False,
              seed: int = 777) -> dict[str, Any]:
    """One load (the load of ``window``): gain, the knobs within 5 % needs, and the windows to show each."""
    space = Space.from_policy(pol)
    base = default_config(pol)
    at = TQ._AtWindow(sc, window)
    j_base = TQ.J(at, pol, base)
    j_star, c_star = TQ.optimum(at, pol, base)
    out: dict[str, Any] = {"window": window, "J_baseline": j_base, "J_star": j_star,
                           "gain": j_base / j_star - 1.0}
    if j_base <= j_star * (1.0 + WITHIN):
        out.update(needed={}, need_windows=0.0, minimal={})
        return out
    cmin = minimal_config(at, pol, space, base, c_star, j_star)
    j_min = TQ.J(at, pol, cmin)
    sd_min = log_sd(sc, pol, cmin, window, seed)
    sd_base = log_sd(sc, pol, base, window, seed + 1)

    def show(d: float, sd_a: float, sd_b: float) -> float:
        return windows_to_show(d, sd_a, power, sd_b) if paired else windows_to_show(d, min(sd_a, sd_b), power)

    needed: dict[str, dict[str, float]] = {
        "(gain)": {"effect": j_base / j_min - 1.0, "windows": show(math.log(j_base / j_min), sd_min, sd_base)}}
    for k in space.keys:
        if cmin[k] == base[k]:
            continue
        rev = {**base, **space.canonical({**cmin, k: base[k]})}
        j_rev = TQ.J(at, pol, rev)
        needed[k] = {"effect": j_rev / j_min - 1.0,
                     "windows": show(math.log(j_rev / j_min), sd_min, log_sd(sc, pol, rev, window, seed + 2))}
    out.update(needed=needed, need_windows=max(v["windows"] for v in needed.values()),
               minimal={k: cmin[k] for k in space.keys if cmin[k] != base[k]}, J_minimal=j_min,
               sd_minimal=sd_min, sd_baseline=sd_base)
    return out


def landscape(path: str, pol: Policy, horizon: int, power: float, noise_scale: float,
              paired: bool = False) -> dict[str, Any]:
    sc = TQ.scenario_with_noise(path, noise_scale)
    first = TQ.first_windows(sc, horizon)
    loads = {label: load_need(sc, pol, t, power, paired) for label, t in first.items()}
    at = {str(w): sc.load_at(w - 1) for w in CHECKPOINTS if w <= horizon}
    return {"scenario": path, "loads": loads, "checkpoint_load": at}


def _task(args: tuple[str, Policy, int, float, float, bool]) -> dict[str, Any]:
    return landscape(*args)


def reachable(ld: Mapping[str, Any], budget: float) -> bool:
    return bool(ld["need_windows"] <= budget)


def summary(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    shares: dict[str, dict[str, float]] = {}
    for w in CHECKPOINTS:
        lds = [r["loads"][r["checkpoint_load"][str(w)]] for r in results if str(w) in r["checkpoint_load"]]
        if not lds:
            continue
        row = {str(b): sum(reachable(ld, b) for ld in lds) / len(lds) for b in BUDGETS}
        row["allowed"] = sum(reachable(ld, ALLOWED[w]) for ld in lds) / len(lds)
        row["no_gain"] = sum(ld["need_windows"] == 0 for ld in lds) / len(lds)
        shares[str(w)] = row
    gained = [ld for r in results for ld in r["loads"].values() if ld["need_windows"] > 0]
    small = [v["effect"] for ld in gained for k, v in ld["needed"].items() if k != "(gain)"]
    return {"checkpoints": shares, "loads": sum(len(r["loads"]) for r in results), "loads_with_gain": len(gained),
            "need_windows_median": statistics.median(ld["need_windows"] for ld in gained) if gained else None,
            "needed_knobs_median": statistics.median(len(ld["needed"]) - 1 for ld in gained) if gained else None,
            "smallest_needed_effect_median": statistics.median(
                min((v["effect"] for k, v in ld["needed"].items() if k != "(gain)"), default=math.inf)
                for ld in gained) if gained else None,
            "needed_effect_share_below_5pct": (sum(e < 0.05 for e in small) / len(small)) if small else None}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", type=int, required=True)
    ap.add_argument("--family-seed", type=int, default=1)
    ap.add_argument("--moving", action="store_true", help="the moving-load family (as tuner_quality --moving)")
    ap.add_argument("--horizon", type=int, default=300)
    ap.add_argument("--policy", default=str(HERE.parent / "policies" / "sim-default.toml"))
    ap.add_argument("--noise-scale", type=float, default=1.0)
    ap.add_argument("--power", type=float, default=0.5, choices=POWERS)
    ap.add_argument("--paired", action="store_true", help="both arms measured equally (an interleaved "
                    "comparison) instead of the other arm known exactly")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.family < 1 or a.family_seed < 0 or a.horizon < 1:
        ap.error(f"--family >= 1, --family-seed >= 0, --horizon >= 1 (got {a.family}, {a.family_seed}, {a.horizon})")
    if not (math.isfinite(a.noise_scale) and a.noise_scale > 0):
        ap.error(f"--noise-scale must be a finite number > 0 (got {a.noise_scale})")
    pol = load_policy(a.policy)
    prefix = "family-moving" if a.moving else "family"
    paths = [f"{prefix}:{a.family_seed}:{i}" for i in range(a.family)]
    t0 = time.monotonic()
    results = TQ._pool_map(_task, [(p, pol, a.horizon, a.power, a.noise_scale, a.paired) for p in paths], a.jobs)
    sm = summary(results)
    if a.json:
        print(json.dumps({"family": {"seed": a.family_seed, "n": a.family, "moving": a.moving},
                          "horizon": a.horizon, "power": a.power, "noise_scale": a.noise_scale, "paired": a.paired,
                          "elapsed_s": time.monotonic() - t0, "summary": sm, "landscapes": results},
                         indent=1, default=str))
        return 0
    print(f"resolvability: {prefix} {a.family_seed}, {a.family} landscapes, {sm['loads']} loads "
          f"({sm['loads_with_gain']} with >= 5 % to gain), power {a.power}, noise x {a.noise_scale}, "
          f"{'interleaved pairs' if a.paired else 'the other arm known exactly'}, "
          f"{time.monotonic() - t0:.0f} s")
    print(f"per load with a gain: median windows needed {sm['need_windows_median']:.0f}, median knobs needed "
          f"{sm['needed_knobs_median']}, median smallest needed effect {sm['smallest_needed_effect_median']:.1%}")
    print("checkpoint | no gain | " + " | ".join(f"B={b}" for b in BUDGETS) + " | B allowed")
    for w, row in sm["checkpoints"].items():
        print(f"{w} | {row['no_gain']:.0%} | " + " | ".join(f"{row[str(b)]:.0%}" for b in BUDGETS)
              + f" | {row['allowed']:.0%} (B={ALLOWED[int(w)]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

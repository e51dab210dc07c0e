"""The final comparison: every arm measured once per round, interleaved in a rotating order, so
slow drift of the host spreads over all arms; summaries per arm.

J > 0, and windows vary multiplicatively (a disturbed window doubles p99, it does not add 20 µs),
so everything is computed on log J (polltuned.stats):

* an arm's J is the geometric mean over its rounds, its 95 % CI the Student-t interval of the
  mean of log J mapped back with exp (so a positive quantity never gets a negative bound);
* the paired ratio arm/default uses, per round, log J_arm - log J_default of the two windows of
  that round (pairs cancel what the round shares), its CI the t interval of those differences;
* stopping rule: at least ``min_rounds`` rounds; then stop as soon as every arm's CI half-width
  is within ``rel_halfwidth`` of its J; never more than ``max_rounds`` rounds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from polltuned.engine.env import TrialEnv
from polltuned.objective import arm_latency, score
from polltuned.policy.schema import Objective
from polltuned.records import Config, KnobValue, Window
from polltuned.stats import geo_mean, log_ci, nonneg_ci, paired_log_ratios, ratio_ci, rel_halfwidth

#: tuned's network-latency profile (static): busy_read = busy_poll = 50 µs
STATIC_OVERRIDES: dict[str, KnobValue] = {"net.core.busy_read": 50, "net.core.busy_poll": 50}
#: the arms of the final comparison, in the table's order
ARMS = ("default", "static", "deployed", "oracle")


@dataclass(frozen=True)
class StopRule:
    """When the final comparison stops (see above)."""

    min_rounds: int = 8
    max_rounds: int = 16
    rel_halfwidth: float = 0.15
    level: float = 0.95

    def __post_init__(self) -> None:
        if self.min_rounds < 1 or self.max_rounds < self.min_rounds:
            raise ValueError(f"need 1 <= min_rounds <= max_rounds (got {self.min_rounds}, {self.max_rounds})")
        if self.rel_halfwidth <= 0 or not (0 < self.level < 1):
            raise ValueError(f"need rel_halfwidth > 0 and 0 < level < 1 (got {self.rel_halfwidth}, {self.level})")


def comparison_done(per_arm: Mapping[str, Sequence[float | None]], rule: StopRule) -> tuple[bool, str]:
    """Pure: whether the comparison can stop after the rounds in ``per_arm`` (arm -> J per round,
    None for a failed window), and why."""
    rounds = max((len(v) for v in per_arm.values()), default=0)
    if rounds >= rule.max_rounds:
        wide = [n for n, v in per_arm.items()
                if rel_halfwidth(log_ci([x for x in v if x is not None], rule.level),
                                 geo_mean([x for x in v if x is not None])) > rule.rel_halfwidth]
        return True, (f"hard cap of {rule.max_rounds} rounds"
                      + (f"; CI still wider than ±{rule.rel_halfwidth:.0%} for {', '.join(wide)}" if wide else ""))
    if rounds < rule.min_rounds:
        return False, f"{rounds} of at least {rule.min_rounds} rounds"
    for n, v in per_arm.items():
        js = [x for x in v if x is not None]
        if rel_halfwidth(log_ci(js, rule.level), geo_mean(js)) > rule.rel_halfwidth:
            return False, f"{n}: CI wider than ±{rule.rel_halfwidth:.0%} after {rounds} rounds"
    return True, f"every arm's J within ±{rule.rel_halfwidth:.0%} ({rule.level:.0%} CI) after {rounds} rounds"


def window_objective(w: Window, objective: Objective) -> float | None:
    """J of one window, or None when it failed, is infeasible or not finite."""
    if not w.ok:
        return None
    s = score(w, objective)
    return s.value if s.ok and math.isfinite(s.value) and s.value > 0 else None


@dataclass(frozen=True)
class ArmSummary:
    name: str
    config: dict[str, KnobValue]
    windows: int
    failed: int
    p50: float
    p99: float
    p999: float
    cpu_cores: float
    #: geometric mean of J over the rounds, and its 95 % CI (log scale)
    objective: float
    objective_ci: tuple[float, float]
    p99_ci: tuple[float, float]
    #: J per window, in round order (None: failed / infeasible window)
    values: tuple[float | None, ...]
    foreign_cores: float = math.nan
    cpu_ci: tuple[float, float] = (math.nan, math.nan)
    objective_median: float = math.nan
    #: paired ratio of J to the default arm's J in the same round, and its 95 % CI
    ratio: float = math.nan
    ratio_ci: tuple[float, float] = (math.nan, math.nan)
    pairs: int = 0
    steal_cores: float = math.nan
    throughput: float = math.nan
    #: geometric mean of p99 over rounds (the centre of p99_ci; ``p99`` is the median)
    p99_geomean: float = math.nan

    def to_json(self) -> dict[str, object]:
        def f(x: float | None) -> float | None:
            return round(x, 4) if x is not None and math.isfinite(x) else None

        return {"config": dict(self.config), "windows": self.windows, "failed": self.failed,
                "p50_us": f(self.p50), "p99_us": f(self.p99), "p999_us": f(self.p999),
                "cpu_cores": f(self.cpu_cores), "objective": f(self.objective),
                "objective_ci95": [f(self.objective_ci[0]), f(self.objective_ci[1])],
                "objective_stat": "geometric mean over rounds; CI on log J",
                "objective_median": f(self.objective_median),
                "ratio_to_default": f(self.ratio),
                "ratio_ci95": [f(self.ratio_ci[0]), f(self.ratio_ci[1])], "pairs": self.pairs,
                "p99_geomean_us": f(self.p99_geomean), "p99_ci95": [f(self.p99_ci[0]), f(self.p99_ci[1])],
                "foreign_cores": f(self.foreign_cores), "steal_cores": f(self.steal_cores),
                "throughput": f(self.throughput),
                "cpu_ci95": [f(self.cpu_ci[0]), f(self.cpu_ci[1])],
                "objective_samples": [f(v) for v in self.values]}


def summarise_arm(name: str, config: Mapping[str, KnobValue], windows: Sequence[Window],
                  objective: Objective, baseline: Sequence[Window] | None = None,
                  level: float = 0.95) -> ArmSummary:
    """Pure: the arm's latency statistics (from its merged histograms where every window has one,
    else medians of the per-window statistics), mean CPU, geometric-mean J with its
    log-scale CI, and (with ``baseline``, the default arm's windows of the same rounds) the paired
    ratio to it."""
    ok = [w for w in windows if w.ok]

    def med(stat: str) -> float:
        # windows with latency histograms: the statistic of all the arm's requests together (their
        # histograms added; polltuned.objective.arm_latency), else the median of the per-window ones
        merged = arm_latency(ok, stat)
        if merged is not None:
            return merged
        xs = [v for w in ok if (v := w.stat(stat)) is not None]
        return statistics.median(xs) if xs else math.nan

    def mean_extra(key: str) -> float:
        xs = [w.extra[key] for w in ok if key in w.extra]
        return statistics.fmean(xs) if xs else math.nan

    cpus = [w.cpu_cores for w in ok if w.cpu_cores is not None]
    per_round = [window_objective(w, objective) for w in windows]
    js = [j for j in per_round if j is not None]
    p99s = [v for w in ok if (v := w.stat("p99")) is not None]
    tps = [w.throughput_pps for w in ok if w.throughput_pps is not None]
    ratio, rci, pairs = math.nan, (math.nan, math.nan), 0
    if baseline is not None:
        lr = paired_log_ratios(per_round, [window_objective(w, objective) for w in baseline])
        ratio, rci = ratio_ci(lr, level)
        pairs = len(lr)
    return ArmSummary(
        name=name, config=dict(config), windows=len(windows), failed=len(windows) - len(ok),
        p50=med("p50"), p99=med("p99"), p999=med("p999"),
        cpu_cores=statistics.fmean(cpus) if cpus else math.nan,
        objective=geo_mean(js), objective_ci=log_ci(js, level), p99_ci=log_ci(p99s, level),
        values=tuple(per_round), foreign_cores=mean_extra("foreign_cores"), cpu_ci=nonneg_ci(cpus, level),
        objective_median=statistics.median(js) if js else math.nan, ratio=ratio, ratio_ci=rci, pairs=pairs,
        steal_cores=mean_extra("steal_cores"), throughput=statistics.median(tps) if tps else math.nan,
        p99_geomean=geo_mean(p99s))


def compare_interleaved(env: TrialEnv, arms: Mapping[str, Config], rounds: int, *, first_index: int,
                        on_window: Callable[[str, int, Window], None] | None = None,
                        stop: Callable[[], bool] = lambda: False,
                        done: Callable[[Mapping[str, Sequence[Window]]], bool] | None = None,
                        ) -> dict[str, list[Window]]:
    """Measure every arm once per round, in a rotating order (A/B/C, B/C/A, ...) so drift spreads.
    At most ``rounds`` rounds; after each complete round ``done(windows so far)`` may end it early."""
    names = list(arms)
    out: dict[str, list[Window]] = {n: [] for n in names}
    idx = first_index
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            if stop():
                return out
            env.apply(arms[n])
            w = env.measure(idx)
            idx += 1
            out[n].append(w)
            if on_window is not None:
                on_window(n, r, w)
        if done is not None and done(out):
            break
    return out


def run_comparison(env: TrialEnv, arms: Mapping[str, Config], objective: Objective, rule: StopRule, *,
                   first_index: int, on_window: Callable[[str, int, Window], None] | None = None,
                   ) -> tuple[dict[str, list[Window]], str]:
    """The final comparison under ``rule``: returns every arm's windows (one per round) and why it
    stopped."""
    reason = [""]

    def done(ws: Mapping[str, Sequence[Window]]) -> bool:
        ok, why = comparison_done({n: [window_objective(w, objective) for w in v] for n, v in ws.items()}, rule)
        reason[0] = why
        return ok

    wins = compare_interleaved(env, arms, rule.max_rounds, first_index=first_index, on_window=on_window,
                               done=done)
    return wins, reason[0]


def summarise_comparison(arms: Mapping[str, Config], wins: Mapping[str, Sequence[Window]],
                         objective: Objective, level: float = 0.95) -> dict[str, ArmSummary]:
    """Pure: every arm's summary, paired against the ``default`` arm when there is one."""
    base = wins.get("default")
    return {n: summarise_arm(n, arms[n], wins[n], objective, baseline=base, level=level) for n in arms}

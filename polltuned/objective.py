"""From one measurement window to one number to minimise (pure).

``score(window, objective)`` returns a Score: the objective value J (lower is better), its latency
and CPU components, and whether the window is *usable* (``ok``) and *feasible*. A failed window or
one missing the statistic the objective needs is not usable (never scored as a good number); a
window that breaks a constraint (CPU budget, throughput floor, drops increase, latency ceiling) is
usable but infeasible — constraints are infeasibility, never a silent penalty.

Combinations (policy ``objective.combine``):
  latency            J = L
  latency_x_cpu      J = L * (1 + cpu_weight * cpu_cores)
  latency_cpu_budget J = L, infeasible when cpu_cores > constraints.cpu_budget_cores
  cpu_per_throughput J = cpu_cores / throughput_pps * 1e6 (CPU µs per packet), infeasible when
                     L > latency_ceiling_us
The latency L is the window's ``objective.statistic``; where the window carries a histogram
(polltuned.histogram) it comes from the histogram (:func:`latency_of`), and :func:`arm_latency`
gives the statistic of several windows together (their histograms added: the true p99 of all
their requests, not a mean of per-window p99s).
CPU cost is the cores spent in system+softirq+irq on the CPUs in scope, including the
application's busy-poll time (it appears as system time); the probe/env fills ``cpu_cores``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from polltuned.histogram import PERCENTILES, HistogramError, LatencyHistogram, merge, statistic_us
from polltuned.policy.schema import Objective
from polltuned.records import Window


@dataclass(frozen=True)
class Score:
    ok: bool
    value: float = math.nan
    latency_us: float = math.nan
    cpu_cores: float = math.nan
    feasible: bool = True
    reasons: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "value": _j(self.value),
            "latency_us": _j(self.latency_us),
            "cpu_cores": _j(self.cpu_cores),
            "feasible": self.feasible,
            "reasons": list(self.reasons),
        }


def _j(x: float) -> float | None:
    return x if math.isfinite(x) else None


def needs_cpu(obj: Objective) -> bool:
    return obj.combine in ("latency_x_cpu", "latency_cpu_budget", "cpu_per_throughput") or (
        obj.constraints.cpu_budget_cores is not None)


def latency_of(w: Window, statistic: str) -> float | None:
    """The window's ``statistic`` in µs: from its histogram where it has a usable one, else from
    ``Window.latency``; None when neither gives a finite number."""
    if w.histogram is not None:
        try:
            v = statistic_us(w.histogram, statistic)
        except HistogramError:
            v = None
        if v is not None and math.isfinite(v):
            return v
    return w.stat(statistic)


def arm_histogram(windows: Iterable[Window]) -> LatencyHistogram | None:
    """The sum of the histograms of the usable windows (an arm: windows, rounds, hosts); None when
    any usable window has none (their percentiles then cannot be merged exactly) or none is usable."""
    ws = [w for w in windows if w.ok]
    if not ws or any(w.histogram is None for w in ws):
        return None
    try:
        return merge(w.histogram for w in ws if w.histogram is not None)
    except HistogramError:
        return None


def arm_latency(windows: Iterable[Window], statistic: str) -> float | None:
    """``statistic`` (p50/p90/p99/p999/mean/max) of all the requests of ``windows`` together, from
    their merged histograms; None when they cannot be merged (see :func:`arm_histogram`)."""
    h = arm_histogram(windows)
    if h is None or h.count == 0:
        return None
    if statistic in PERCENTILES:
        return h.percentile_us(PERCENTILES[statistic])
    return h.stats_us().get(statistic)


def score(w: Window, obj: Objective, *, baseline_drops_per_s: float | None = None) -> Score:
    if not w.ok:
        return Score(ok=False, reasons=(f"window failed: {w.error or 'unknown error'}",))
    lat = latency_of(w, obj.statistic)
    if lat is None or lat <= 0:
        return Score(ok=False, reasons=(f"window has no usable {obj.statistic} latency",))
    cpu = w.cpu_cores
    if cpu is not None and not math.isfinite(cpu):
        cpu = None
    if needs_cpu(obj) and cpu is None:
        return Score(ok=False, latency_us=lat, reasons=("window has no CPU measurement",))
    c = cpu if cpu is not None else math.nan
    reasons: list[str] = []
    if obj.combine == "latency" or obj.combine == "latency_cpu_budget":
        value = lat
    elif obj.combine == "latency_x_cpu":
        value = lat * (1.0 + obj.cpu_weight * max(c, 0.0))
    else:  # cpu_per_throughput
        tp = w.throughput_pps
        if tp is None or not math.isfinite(tp) or tp <= 0:
            return Score(ok=False, latency_us=lat, cpu_cores=c,
                         reasons=("window has no throughput for cpu_per_throughput",))
        value = max(c, 0.0) / tp * 1e6
        if obj.latency_ceiling_us is not None and lat > obj.latency_ceiling_us:
            reasons.append(f"{obj.statistic} {lat:.1f} µs > latency_ceiling_us {obj.latency_ceiling_us:g}")
    cons = obj.constraints
    if cons.cpu_budget_cores is not None and c > cons.cpu_budget_cores:
        reasons.append(f"cpu {c:.2f} cores > cpu_budget_cores {cons.cpu_budget_cores:g}")
    if cons.throughput_floor_pps is not None:
        tp = w.throughput_pps
        if tp is None or tp < cons.throughput_floor_pps:
            reasons.append(f"throughput {tp} pps < throughput_floor_pps {cons.throughput_floor_pps:g}")
    if cons.max_drops_increase_per_s is not None and baseline_drops_per_s is not None:
        d = w.drops_per_s
        if d is not None and d - baseline_drops_per_s > cons.max_drops_increase_per_s:
            reasons.append(f"drops {d:.1f}/s exceed baseline {baseline_drops_per_s:.1f}/s by more than "
                           f"{cons.max_drops_increase_per_s:g}/s")
    if not math.isfinite(value) or value <= 0:
        return Score(ok=False, latency_us=lat, cpu_cores=c, reasons=(f"non-finite objective {value!r}",))
    return Score(ok=True, value=value, latency_us=lat, cpu_cores=c, feasible=not reasons,
                 reasons=tuple(reasons))


def value_of(measurement: dict[str, float], obj: Objective) -> float:
    """J of a scenario-style dict (``p99_us``, ``cpu_cores``, ...) — used to score tuners from
    ``expected(config)``. Infeasible points get +inf."""
    lat_key = {"p50": "p50_us", "p90": "p90_us", "p99": "p99_us", "p999": "p999_us", "mean": "mean_us"}
    key = lat_key[obj.statistic]
    lat = measurement.get(key, measurement.get("p99_us", math.nan))
    w = Window(ok=True, latency={obj.statistic: float(lat)}, cpu_cores=measurement.get("cpu_cores"),
               throughput_pps=measurement.get("throughput_pps"), drops_per_s=measurement.get("drops_per_s"))
    s = score(w, obj)
    if not s.ok:
        return math.inf
    return s.value if s.feasible else math.inf


# ---------------------------------------------------------------- score -> model value
def model_value(j: float, level_log: float) -> float:
    """What the optimiser is told for one window: the log-ratio of its J to the reference level
    measured next to it (``level_log`` = log J of the neighbouring baseline windows)."""
    return math.log(j) - level_log


def penalised(y: float, limit: float, *, infeasible: bool) -> float:
    """A guard abort or a broken constraint, told as a capped bad number: the optimiser must learn
    the region is bad without one huge value flattening the surrogate (optimisation.md §2.8)."""
    return min(max(y, limit) + (0.3 if infeasible else 0.0), limit + 1.0)


def guard_limit(max_regression: float, window_se: float, z: float = 1.65) -> float:
    """Log-ratio above which one window shows, beyond its noise, a regression larger than the
    policy's ``guard.max_regression``: the limit plus ``z`` standard errors of a window's ratio."""
    return math.log(1.0 + max_regression) + z * window_se

"""The bench's result (BenchResult, its JSON document) and the table ``polltuned bench`` prints."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from polltuned.bench.comparison import ARMS, ArmSummary


@dataclass
class BenchResult:
    workload: str
    arms: dict[str, ArmSummary]
    tuning: dict[str, object]
    trials: list[dict[str, object]]
    duration_s: float
    restored: bool
    knobs: list[str]
    dropped_knobs: dict[str, str]
    world: Mapping[str, object]
    deployed_is_default: bool
    comparison: dict[str, object] = field(default_factory=dict)
    policy: str = ""
    tuning_s: float = math.nan
    #: --wait-quiet: whether the machine was quiet when the run started (None: not asked)
    started_quiet: bool | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"v": 2, "workload": self.workload, "policy": self.policy, "world": dict(self.world),
                             "knobs": self.knobs, "dropped_knobs": self.dropped_knobs}
        for n in ARMS:
            if n in self.arms:
                d[n] = self.arms[n].to_json()
        d["arms"] = [n for n in ARMS if n in self.arms]
        d["comparison"] = self.comparison
        d["deployed_is_default"] = self.deployed_is_default
        d["tuning"] = self.tuning
        d["trials"] = self.trials
        d["duration_s"] = round(self.duration_s, 1)
        d["tuning_s"] = round(self.tuning_s, 1) if math.isfinite(self.tuning_s) else None
        d["started_quiet"] = self.started_quiet
        d["restored"] = self.restored
        return d


def _fmt(x: float, nd: int = 1) -> str:
    return f"{x:.{nd}f}" if math.isfinite(x) else "-"


def _fmt_ci(ci: tuple[float, float], nd: int = 1) -> str:
    return f"[{_fmt(ci[0], nd)}, {_fmt(ci[1], nd)}]" if all(map(math.isfinite, ci)) else "-"


def _fmt_ratio(x: float) -> str:
    """Three significant digits: a 0.0036 ratio must not print as 0.004 or 0.00."""
    return f"{x:.3g}" if math.isfinite(x) else "-"


def _fmt_ratio_ci(ci: tuple[float, float]) -> str:
    return f"[{_fmt_ratio(ci[0])}, {_fmt_ratio(ci[1])}]" if all(map(math.isfinite, ci)) else "-"


def render_table(res: BenchResult) -> str:
    tput = any(math.isfinite(a.throughput) for a in res.arms.values())
    rows = [("config", "p50 µs", "p99 µs", "CPU cores", *(("req/s",) if tput else ()), "J", "J 95% CI",
             "J/default", "ratio 95% CI", "n", "foreign CPU", "steal")]
    for n in ARMS:
        a = res.arms.get(n)
        if a is None:
            continue
        rows.append((n, _fmt(a.p50), _fmt(a.p99), _fmt(a.cpu_cores, 2),
                     *((_fmt(a.throughput, 0),) if tput else ()), _fmt(a.objective),
                     _fmt_ci(a.objective_ci), _fmt_ratio(a.ratio), _fmt_ratio_ci(a.ratio_ci),
                     f"{a.windows - a.failed}/{a.windows}", _fmt(a.foreign_cores, 2), _fmt(a.steal_cores, 2)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    head = f"workload: {res.workload}"
    if res.comparison:
        c = res.comparison
        head += f"   (comparison: {c.get('rounds')} interleaved rounds; {c.get('stop_reason')})"
    lines = [head]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(r)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    base = res.arms.get("default")
    for n in ("deployed", "oracle"):
        a = res.arms.get(n)
        if a is not None and base is not None:
            diff = {k: v for k, v in a.config.items() if base.config.get(k) != v}
            lines.append(f"{n}: " + (", ".join(f"{k}={v}" for k, v in diff.items()) or "kernel defaults (kept)"))
    lines.append("p50/p99: medians over rounds; J = the policy's objective per window, geometric mean over rounds; "
                 "CIs 95 % on the log scale; J/default paired per round")
    lines.append(f"verdict: {res.tuning.get('reason', '')}")
    fc = [a.foreign_cores for a in res.arms.values() if math.isfinite(a.foreign_cores)]
    if fc and max(fc) > 0.1:
        lines.append(f"note: other processes used up to {max(fc):.2f} cores during the comparison: "
                     "latency numbers are disturbed (compare within this run only)")
    lines.append(f"took {res.duration_s:.0f} s (tuning {_fmt(res.tuning_s, 0)} s); "
                 f"knobs restored: {'yes' if res.restored else 'NO'}")
    return "\n".join(lines)

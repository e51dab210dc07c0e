"""Trial report: one PNG with three views of a tuning run.

1. the objective J over trials (failed/aborted windows marked), with the running best;
2. latency vs CPU of every trial window, with the Pareto front (lower-left is better on both);
3. per-knob partial dependence: for each knob, J against the knob's value (log-J scatter plus the
   median J per distinct value), i.e. the marginal effect averaged over the other knobs as sampled.

``draw_report(trials, path)`` accepts a sequence of mappings, one per measurement window, with:
  ``config``    dict knob -> value (required)
  ``objective`` float or None (None = failed/unusable window)
  latency and CPU either flat (``p99_us`` / ``latency_us`` and ``cpu_cores``) or inside a
  ``window`` dict as written by Window.to_json() (``latency.p99``, ``cpu_cores``);
  ``phase`` (optional: baseline/tune/confirm/compare...).
The bench passes its window log; ``polltuned report`` can pass rows rebuilt from the study.
matplotlib (Agg) is imported lazily.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from polltuned.errors import UsageError


@dataclass(frozen=True)
class Point:
    index: int
    config: dict[str, object]
    objective: float | None
    latency_us: float | None
    cpu_cores: float | None
    phase: str


def _f(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def to_points(trials: Sequence[Mapping[str, object]], statistic: str = "p99") -> list[Point]:
    """Pure: normalise the accepted row shapes into Points."""
    pts: list[Point] = []
    for i, t in enumerate(trials):
        cfg = t.get("config")
        if not isinstance(cfg, Mapping):
            raise UsageError(f"report: trial {i} has no 'config' mapping")
        lat = _f(t.get(f"{statistic}_us")) or _f(t.get("latency_us"))
        cpu = _f(t.get("cpu_cores"))
        w = t.get("window")
        if isinstance(w, Mapping):
            wl = w.get("latency")
            if lat is None and isinstance(wl, Mapping):
                lat = _f(wl.get(statistic))
            if cpu is None:
                cpu = _f(w.get("cpu_cores"))
            if w.get("ok") is False:
                lat = None
        pts.append(Point(i, dict(cfg), _f(t.get("objective")), lat, cpu, str(t.get("phase", ""))))
    return pts


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Pure: the non-dominated points (minimise both coordinates), sorted by the first."""
    front: list[tuple[float, float]] = []
    best_y = math.inf
    for x, y in sorted(points):
        if y < best_y:
            front.append((x, y))
            best_y = y
    return front


def _numeric(v: object) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        return float(v)
    try:
        return float(str(v))
    except ValueError:
        return None


def draw_report(trials: Sequence[Mapping[str, object]], path: str | Path, *, title: str = "polltuned",
                statistic: str = "p99") -> Path:
    """Draw the three views into ``path`` (PNG). Returns the path."""
    pts = to_points(trials, statistic)
    if not pts:
        raise UsageError("report: no trials to draw")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    knobs = sorted({k for p in pts for k in p.config if len({str(q.config.get(k)) for q in pts}) > 1})
    ncols = 3
    nrows = 1 + max(1, math.ceil(len(knobs) / ncols))
    fig = plt.figure(figsize=(15, 4.2 * nrows))
    gs = fig.add_gridspec(nrows, ncols)

    ax1 = fig.add_subplot(gs[0, :2])
    good: list[tuple[Point, float]] = [(p, p.objective) for p in pts if p.objective is not None]
    bad = [p for p in pts if p.objective is None]
    for ph in sorted({p.phase for p, _ in good}):
        sel = [(p, j) for p, j in good if p.phase == ph]
        ax1.scatter([p.index for p, _ in sel], [j for _, j in sel], s=18, label=ph or "window")
    if good:
        run_best: list[float] = []
        cur = math.inf
        for _, j in good:
            cur = min(cur, j)
            run_best.append(cur)
        ax1.step([p.index for p, _ in good], run_best, where="post", color="k", lw=1, label="running best")
        for p in bad:
            ax1.axvline(p.index, color="r", alpha=0.25, lw=1)
        if min(j for _, j in good) > 0:
            ax1.set_yscale("log")
    ax1.set_xlabel("window")
    ax1.set_ylabel("objective J (lower is better)")
    ax1.set_title(f"{title}: objective over trials ({len(bad)} failed windows in red)")
    ax1.legend(fontsize=8)

    ax2 = fig.add_subplot(gs[0, 2])
    lc = [(p.cpu_cores, p.latency_us) for p in pts if p.cpu_cores is not None and p.latency_us is not None]
    if lc:
        xs = [c for c, _ in lc]
        ys = [lat for _, lat in lc]
        ax2.scatter(xs, ys, s=16, alpha=0.7, label="windows")
        front = pareto_front([(c, lat) for c, lat in lc])  # type: ignore[misc]
        ax2.plot([c for c, _ in front], [lat for _, lat in front], "r-o", ms=4, label="Pareto front")
        if min(ys) > 0:
            ax2.set_yscale("log")
        ax2.legend(fontsize=8)
    ax2.set_xlabel("CPU cores")
    ax2.set_ylabel(f"{statistic} latency (µs)")
    ax2.set_title("latency vs CPU")

    for i, k in enumerate(knobs):
        ax = fig.add_subplot(gs[1 + i // ncols, i % ncols])
        rows = [(v, j) for p, j in good if (v := _numeric(p.config.get(k))) is not None]
        if rows:
            ax.scatter([v for v, _ in rows], [j for _, j in rows], s=14, alpha=0.6)
            by: dict[float, list[float]] = {}
            for v, j in rows:
                by.setdefault(v, []).append(j)
            xs2 = sorted(by)
            ax.plot(xs2, [statistics.median(by[x]) for x in xs2], "k-", lw=1, label="median J")
            if min(j for _, j in rows) > 0:
                ax.set_yscale("log")
            pos = [x for x in xs2 if x > 0]
            if len(xs2) > 2 and min(xs2) >= 0 and pos and max(xs2) > 100 * min(pos):
                ax.set_xscale("symlog", linthresh=min(pos))
        ax.set_title(k, fontsize=9)
        ax.set_ylabel("J")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out

"""Load points: ``polltuned bench --workload memcached --rates 20%,60%,90%`` (issue 15.3).

The ranking of settings changes with load (deferral helps at a high rate and hurts at a low one),
and a closed-loop client only ever measures the one rate it happens to reach. So:

1. **capacity**: under the kernel defaults, a short closed-loop saturation run (the workload's own
   closed-loop client, :data:`CAPACITY_WINDOWS` windows); its median throughput is the capacity
   that percentages refer to (absolute rates, ``--rates 5000,20000``, skip it when none is relative);
2. **per rate**, from the defaults: the engine tunes with the open-loop probe at that rate
   (``probes.command.open_loop``: requests sent on schedule, latency from the intended send time),
   then the usual interleaved final comparison (default / static / deployed) at that rate;
3. **closed loop side by side**: the same arms measured with the closed-loop client,
   :data:`CLOSED_ROUNDS` interleaved rounds, so the table shows what a closed-loop benchmark would
   have reported for the very configurations compared open-loop.

Every rate is one block of the table; the last lines say which configuration is best at each rate
and whether that changes with rate. Only workloads measured by a ``command`` probe whose client has
an open-loop mode (memcached's kvclient, nginx's httpclient) take ``--rates``.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from polltuned.bench.comparison import ARMS, compare_interleaved
from polltuned.bench.run import tune_and_compare, wait_if_asked
from polltuned.bench.session import BenchSettings, bench_session, load_oracle
from polltuned.bench.table import BenchResult, render_table
from polltuned.bench.world import get_workload
from polltuned.clock import Clock
from polltuned.errors import HostError, UsageError
from polltuned.host.fs import Host
from polltuned.policy.schema import CommandProbe
from polltuned.probes.command import open_loop
from polltuned.records import KnobValue, Window

#: closed-loop windows under the defaults that measure the capacity
CAPACITY_WINDOWS = 3
#: interleaved closed-loop rounds per rate for the side-by-side column
CLOSED_ROUNDS = 3


@dataclass(frozen=True)
class RateSpec:
    """One load point: an absolute rate (requests/s) or a percentage of the measured capacity."""

    value: float
    relative: bool
    text: str

    def resolve(self, capacity_rps: float | None) -> float:
        if not self.relative:
            return self.value
        if capacity_rps is None or not capacity_rps > 0:
            raise HostError(f"--rates {self.text}: no capacity measured to take a percentage of")
        return self.value / 100.0 * capacity_rps


def parse_rates(text: str) -> tuple[RateSpec, ...]:
    """Pure: ``20%,60%,90%`` (of capacity, 0 < p <= 100) or ``5000,20000`` (requests/s, <= 1e6),
    or a mix; at least one, no duplicates. Raises UsageError."""
    out: list[RateSpec] = []
    for raw in text.split(","):
        t = raw.strip()
        if not t:
            raise UsageError(f"--rates: empty entry in {text!r}", hint="e.g. --rates 20%,60%,90% or 5000,20000")
        rel = t.endswith("%")
        try:
            v = float(t[:-1] if rel else t)
        except ValueError:
            raise UsageError(f"--rates: {t!r} is neither a percentage nor a rate",
                             hint="e.g. --rates 20%,60%,90% or 5000,20000") from None
        if not math.isfinite(v) or v <= 0 or (rel and v > 100) or (not rel and v > 1e6):
            raise UsageError(f"--rates: {t!r} out of range (0 < percent <= 100, 0 < requests/s <= 1000000)")
        spec = RateSpec(v, rel, f"{v:g}%" if rel else f"{v:g}/s")
        if spec in out:
            raise UsageError(f"--rates: {t!r} given twice")
        out.append(spec)
    return tuple(out)


def capacity_of(windows: Sequence[Window]) -> float:
    """Pure: the median throughput of the successful closed-loop windows (raises HostError if none)."""
    tps = [w.throughput_pps for w in windows if w.ok and w.throughput_pps is not None and w.throughput_pps > 0]
    if not tps:
        errs = "; ".join(sorted({w.error or "no throughput" for w in windows}))
        raise HostError(f"capacity: no closed-loop window reported a throughput ({errs})")
    return float(statistics.median(tps))


def median_stat(windows: Sequence[Window], stat: str) -> float:
    xs = [v for w in windows if w.ok and (v := w.stat(stat)) is not None]
    return float(statistics.median(xs)) if xs else math.nan


@dataclass
class RatePoint:
    """One load point's block: the rate, its whole bench result (tuning + open-loop comparison) and
    the same arms' closed-loop p99 and throughput."""

    spec: RateSpec
    rate_rps: float
    result: BenchResult
    closed_p99: dict[str, float] = field(default_factory=dict)
    closed_rps: dict[str, float] = field(default_factory=dict)

    def best(self) -> str:
        """The arm with the lowest J at this rate (deployed / static / default / oracle)."""
        arms = {n: a.objective for n, a in self.result.arms.items() if math.isfinite(a.objective)}
        return min(arms, key=lambda n: arms[n]) if arms else "-"

    def to_json(self) -> dict[str, Any]:
        def f(x: float) -> float | None:
            return round(x, 3) if math.isfinite(x) else None

        d = self.result.to_json()
        d.pop("trials", None)
        return {"rate": self.spec.text, "rate_rps": round(self.rate_rps, 1), "best": self.best(),
                "closed_loop_p99_us": {n: f(v) for n, v in self.closed_p99.items()},
                "closed_loop_rps": {n: f(v) for n, v in self.closed_rps.items()},
                "result": d, "trials": self.result.trials}


@dataclass
class RatesResult:
    workload: str
    policy: str
    capacity_rps: float | None
    points: list[RatePoint]
    duration_s: float = 0.0
    restored: bool = False

    def to_json(self) -> dict[str, Any]:
        best = {p.spec.text: p.best() for p in self.points}
        return {"v": 1, "workload": self.workload, "policy": self.policy,
                "capacity_rps": None if self.capacity_rps is None else round(self.capacity_rps, 1),
                "capacity": f"median throughput of {CAPACITY_WINDOWS} closed-loop windows under the defaults",
                "rates": [p.to_json() for p in self.points], "best_by_rate": best,
                "best_changes_with_rate": len(set(best.values())) > 1,
                "deployed_by_rate": {p.spec.text: _changed(p.result) for p in self.points},
                "duration_s": round(self.duration_s, 1), "restored": self.restored}


def _changed(res: BenchResult) -> dict[str, KnobValue]:
    dep, base = res.arms.get("deployed"), res.arms.get("default")
    if dep is None or base is None:
        return {}
    return {k: v for k, v in dep.config.items() if base.config.get(k) != v}


def _fmt(x: float, nd: int = 1) -> str:
    return f"{x:.{nd}f}" if math.isfinite(x) else "-"


def render_rates_table(res: RatesResult) -> str:
    """One block per rate (the bench table at that rate, then open- vs closed-loop p99 per arm), and
    which configuration is best at each rate."""
    cap = f"capacity {res.capacity_rps:.0f} req/s (closed loop, defaults)" if res.capacity_rps else "absolute rates"
    lines = [f"workload: {res.workload} at {len(res.points)} load points; {cap}", ""]
    for p in res.points:
        lines.append(f"=== rate {p.spec.text} = {p.rate_rps:.0f} req/s (open loop, "
                     f"{p.result.comparison.get('rounds')} rounds) ===")
        lines.append(render_table(p.result))
        head = ("config", "open-loop p99 µs", "closed-loop p99 µs", "achieved req/s", "closed-loop req/s")
        rows = [head]
        for n in ARMS:
            a = p.result.arms.get(n)
            if a is None:
                continue
            rows.append((n, _fmt(a.p99), _fmt(p.closed_p99.get(n, math.nan)), _fmt(a.throughput, 0),
                         _fmt(p.closed_rps.get(n, math.nan), 0)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        for i, r in enumerate(rows):
            lines.append("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(r)))
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines.append(f"closed loop: medians of {CLOSED_ROUNDS} interleaved rounds of the same arms")
        lines.append("")
    lines.append("best configuration by rate (lowest J): "
                 + ", ".join(f"{p.spec.text}: {p.best()}" for p in res.points))
    for p in res.points:
        ch = _changed(p.result)
        lines.append(f"  tuned at {p.spec.text}: " + (", ".join(f"{k}={v}" for k, v in ch.items())
                                                       or "kernel defaults (kept)"))
    dep = {str(sorted(_changed(p.result).items())) for p in res.points}
    lines.append("the deployed configuration " + ("changes" if len(dep) > 1 else "does not change") + " with rate")
    lines.append(f"took {res.duration_s:.0f} s; knobs restored: {'yes' if res.restored else 'NO'}")
    return "\n".join(lines)


#: JSON paths of the shipped clients' output (polltuned.host.openloop's document)
_CLIENT_JSON = {"p50": "$.latency_us.p50", "p90": "$.latency_us.p90", "p99": "$.latency_us.p99",
                "p999": "$.latency_us.p999", "mean": "$.latency_us.mean", "max": "$.latency_us.max",
                "throughput": "$.throughput_rps"}


def open_loop_client(cfg: CommandProbe) -> CommandProbe:
    """A closed-loop probe turned into one that can send on a schedule. ``wrk`` (the nginx world's
    client) has no open-loop mode and would reject ``--rate``: at a set rate the same URL is loaded
    by polltuned's HTTP client (polltuned.host.httpclient) over the same number of keep-alive
    connections; every other argv is left as it is (the shipped kvclient takes ``--rate`` itself)."""
    argv = cfg.argv
    if os.path.basename(argv[0]) != "wrk":
        return cfg
    url = next((a for a in argv if a.startswith(("http://", "https://"))), None)
    if url is None:
        raise UsageError("--rates: the wrk probe names no http:// URL to load open-loop")
    conns = argv[argv.index("-c") + 1] if "-c" in argv[:-1] else "1"
    new = ["{python}", "-m", "polltuned.host.httpclient", "--url", url, "--connections", conns,
           "--duration", "{window_s}"]
    return CommandProbe.model_validate({**cfg.model_dump(), "argv": new, "regex": None, "json_path": None,
                                        "statistic_map": dict(_CLIENT_JSON),
                                        "histogram_path": "$.histogram.encoded"})


def run_rates(settings: BenchSettings, rates: Sequence[RateSpec], *, host: Host, clock: Clock,
              progress: Callable[[str], None] = lambda s: None) -> RatesResult:
    """The bench at several load points on the real host (see the module docstring). Needs root;
    hold /tmp/polltuned-realkernel.lock around it."""
    workload = get_workload(settings.workload)
    if workload.app == "sockperf":
        raise UsageError(f"--rates: workload {workload.name} is measured by sockperf ping-pong (closed loop)",
                         hint="--rates needs an open-loop client: --workload memcached or nginx")
    if not rates:
        raise UsageError("--rates: no load point given")
    oracle_cfg: Mapping[str, KnobValue] | None = (load_oracle(settings.oracle, settings.workload)
                                                  if settings.oracle is not None else None)
    quiet = wait_if_asked(settings, host=host, clock=clock, progress=progress)
    t_start = clock.monotonic()
    owner_pid = os.getpid()
    points: list[RatePoint] = []
    capacity: float | None = None
    with contextlib.ExitStack() as stack:
        try:
            sess = stack.enter_context(bench_session(settings, host=host, clock=clock, progress=progress))
            closed_cfg = sess.policy.probe
            if not isinstance(closed_cfg, CommandProbe) or sess.make_env is None:
                raise UsageError(f"--rates: policy {sess.policy.name} has no command probe to run open-loop")
            env = sess.env
            defaults = env.current()
            idx = 0
            if any(r.relative for r in rates):
                env.phase = "capacity"
                env.apply(defaults)
                ws = []
                for _ in range(CAPACITY_WINDOWS):
                    ws.append(env.measure(idx))
                    idx += 1
                capacity = capacity_of(ws)
                progress(f"capacity under the defaults (closed loop): {capacity:.0f} req/s")
            for spec in rates:
                rate = spec.resolve(capacity)
                progress(f"=== load point {spec.text}: {rate:.0f} req/s open loop ({closed_cfg.arrivals} arrivals) ===")
                pol = sess.policy.model_copy(update={"probe": open_loop(open_loop_client(closed_cfg), rate,
                                                                         closed_cfg.arrivals)})
                env_r = sess.make_env(pol)
                env_r.apply(defaults)
                res = tune_and_compare(sess, env_r, pol, defaults, settings=settings, clock=clock,
                                       progress=progress, oracle_cfg=oracle_cfg, quiet=quiet)
                aliases = res.comparison.get("aliases", {})
                measured = {n: a.config for n, a in res.arms.items()
                            if not (isinstance(aliases, dict) and n in aliases)}
                env.phase = f"closed@{spec.text}"
                wins = compare_interleaved(env, measured, CLOSED_ROUNDS, first_index=100_000 + idx)
                idx += CLOSED_ROUNDS * len(measured)
                point = RatePoint(spec, rate, res)
                for n in res.arms:
                    src = aliases.get(n, n) if isinstance(aliases, dict) else n
                    point.closed_p99[n] = median_stat(wins.get(src, []), "p99")
                    tps = [w.throughput_pps for w in wins.get(src, []) if w.ok and w.throughput_pps is not None]
                    point.closed_rps[n] = float(statistics.median(tps)) if tps else math.nan
                points.append(point)
        finally:
            if os.getpid() == owner_pid:
                progress("restoring the host: every knob back, servers stopped, namespaces removed")
    out = RatesResult(sess.workload.name, sess.policy.name, capacity, points,
                      duration_s=clock.monotonic() - t_start, restored=sess.restored)
    for p in points:
        p.result.restored = sess.restored
    return out

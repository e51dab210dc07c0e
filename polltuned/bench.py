"""``polltuned bench``: tune this host's real knobs on the embedded netns + veth world.

Workloads (polltuned/worlds/default.py): sockperf ping-pong layouts (single, parallel, shared-cpu,
cpu-hog; a fresh sockperf server per window) and real applications started once per run (nginx +
a fresh ``wrk --latency`` per window; memcached + a fresh ``polltuned.host.kvclient`` per window),
measured through the ``command`` probe of their policies (bench-nginx, bench-memcached).

Order of operations (each step undone in ``finally``, also on SIGINT/SIGTERM; :func:`bench_session`):

1. journal + actuator on the real host; if a crashed run left the journal dirty, roll it back first;
2. world: remove a crashed run's leftovers (``ptb-*`` namespaces and what runs in them, the
   application directory), create the namespaces, the veth pair with NAPI active, the workload's
   CPU hog if any, and its application server if any;
3. the workload's policy resolved to the world's nic (``ptb-s/ptbs``), knobs this host lacks dropped,
   the probe pointed at the world with the workload's layout;
4. the engine (``engine.driver.drive``) over a HostEnv (wrapped to add guest idle-poll CPU, foreign
   CPU and steal, and to record windows);
5. final comparison, interleaved round by round in a rotating order: the kernel defaults (the host's
   values at start), tuned's static network-latency values (busy_read = busy_poll = 50), the
   configuration polltuned deployed and, with ``--oracle``, the oracle's best (benchmarks/oracle.py);
   at least ``--rounds`` rounds, more until every arm's J has a 95 % CI within ±15 %, at most
   ``--max-rounds``; J per arm as a geometric mean with a log-scale CI, and paired per-round
   ratios to the default (see "comparison statistics" below);
6. actuator.rollback() (every knob back), servers stopped, world.teardown(), and a check that every
   knob reads back its original value.

Why guest idle polling is added to CPU: with ``guest_halt_poll_ns`` the vCPU spins in the cpuidle
POLL state, which /proc/stat counts as idle (vm-bench.md §8); without the correction the tuner
would see that knob as free.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import IO, Any

from polltuned.clock import Clock
from polltuned.engine.env import TrialEnv
from polltuned.errors import HostError, PolltunedError, UsageError
from polltuned.host.fs import Host
from polltuned.objective import score
from polltuned.policy.schema import Objective, Policy
from polltuned.records import Config, KnobValue, Window
from polltuned.worlds.default import Workload

log = logging.getLogger("polltuned.bench")

#: tuned's network-latency profile (static): busy_read = busy_poll = 50 µs
STATIC_OVERRIDES: dict[str, KnobValue] = {"net.core.busy_read": 50, "net.core.busy_poll": 50}
ARMS = ("default", "static", "deployed", "oracle")


# ---------------------------------------------------------------------------- idle-poll CPU


def parse_cpuidle_poll_us(names_times: Sequence[tuple[str, str]]) -> float:
    """Pure: total µs spent in cpuidle states named ``POLL``, from (name, time) file contents
    (/sys/devices/system/cpu/cpuN/cpuidle/stateM/{name,time}; time is cumulative µs)."""
    total = 0.0
    for name, t in names_times:
        if name.strip() == "POLL":
            try:
                total += float(t.strip())
            except ValueError:
                continue
    return total


def read_cpuidle_poll_us(host: Host) -> float | None:
    pairs: list[tuple[str, str]] = []
    for cpu in host.glob("/sys/devices/system/cpu", "cpu[0-9]*"):
        base = f"/sys/devices/system/cpu/{cpu}/cpuidle"
        for st in host.glob(base, "state[0-9]*"):
            try:
                pairs.append((host.read_text(f"{base}/{st}/name"), host.read_text(f"{base}/{st}/time")))
            except HostError:
                continue
    return parse_cpuidle_poll_us(pairs) if pairs else None


def read_steal_ticks(host: Host) -> int | None:
    """Steal ticks (USER_HZ) of all CPUs from /proc/stat; None when unreadable."""
    from polltuned.counters.stat import parse_stat

    try:
        return int(parse_stat(host.read_text("/proc/stat")).total.steal)
    except (PolltunedError, ValueError):
        return None


def foreign_cores(before: Mapping[int, float], after: Mapping[int, float], elapsed_s: float) -> float:
    """Pure: cores used by other processes over a window (pids present at both ends)."""
    if elapsed_s <= 0:
        return 0.0
    return sum(max(0.0, after[p] - before[p]) for p in before.keys() & after.keys()) / elapsed_s


def busy_cores(before: Any, after: Any, elapsed_s: float) -> float:
    """Pure: cores busy (every /proc/stat field but idle and iowait) between two parsed /proc/stat
    records (polltuned.counters.stat.StatRecord) ``elapsed_s`` apart."""
    from polltuned.counters.stat import USER_HZ

    if elapsed_s <= 0:
        return 0.0

    def busy(t: Any) -> int:
        return int(t.user + t.nice + t.system + t.irq + t.softirq + t.steal)

    return max(0, busy(after.total) - busy(before.total)) / USER_HZ / elapsed_s


def wait_for_quiet(host: Host, clock: Clock, *, max_cores: float = 0.15, hold_s: float = 10.0,
                   timeout_s: float = 900.0, progress: Callable[[str], None] = lambda s: None) -> tuple[bool, float]:
    """Block until the whole machine used at most ``max_cores`` for ``hold_s`` seconds in a row
    (1 s samples of /proc/stat), or ``timeout_s`` passed. Returns (quiet, seconds waited). For
    measurements on a shared host: other processes' CPU disturbs latency (vm-bench.md §0)."""
    from polltuned.counters.stat import parse_stat

    t0 = clock.monotonic()
    quiet_since: float | None = None
    prev = parse_stat(host.read_text("/proc/stat"))
    t_prev = t0
    last_note = t0
    while True:
        clock.sleep(1.0)
        now = clock.monotonic()
        cur = parse_stat(host.read_text("/proc/stat"))
        cores = busy_cores(prev, cur, now - t_prev)
        prev, t_prev = cur, now
        if cores <= max_cores:
            quiet_since = now if quiet_since is None else quiet_since
            if now - quiet_since >= hold_s:
                return True, now - t0
        else:
            quiet_since = None
        if now - t0 >= timeout_s:
            progress(f"the machine did not get quiet within {timeout_s:.0f} s (last second: {cores:.2f} cores busy); "
                     "measuring anyway")
            return False, now - t0
        if now - last_note >= 30:
            progress(f"waiting for a quiet machine: {cores:.2f} cores busy (want <= {max_cores:.2f} for "
                     f"{hold_s:.0f} s)")
            last_note = now


# ---------------------------------------------------------------------------- recording env


@dataclass
class WindowLog:
    """Every window measured in this run: (phase, config, window)."""

    entries: list[tuple[str, dict[str, KnobValue], Window]] = field(default_factory=list)


class BenchEnv:
    """A TrialEnv wrapper: adds idle-poll CPU, logs every window, and writes ``--record`` lines."""

    def __init__(self, inner: TrialEnv, *, host: Host, clock: Clock, workload: str,
                 record: IO[str] | None = None, log_: WindowLog | None = None,
                 foreign: Callable[[], Mapping[int, float]] | None = None) -> None:
        self.inner = inner
        self.host = host
        self.clock = clock
        self.workload = workload
        self.record = record
        self.windows = log_ or WindowLog()
        self.phase = "tune"
        self._config: dict[str, KnobValue] = {}
        self._foreign = foreign

    def current(self) -> dict[str, KnobValue]:
        cur = self.inner.current()
        if not self._config:
            self._config = dict(cur)
        return cur

    def apply(self, config: Config) -> None:
        raise_if_interrupted()
        self.inner.apply(config)
        self._config = {**self._config, **dict(config)}

    def describe(self) -> Mapping[str, object]:
        return self.inner.describe()

    def measure(self, window_index: int) -> Window:
        raise_if_interrupted()
        p0 = read_cpuidle_poll_us(self.host)
        s0 = read_steal_ticks(self.host)
        f0 = self._foreign() if self._foreign is not None else None
        t0 = self.clock.monotonic()
        w = self.inner.measure(window_index)
        elapsed = self.clock.monotonic() - t0
        p1 = read_cpuidle_poll_us(self.host)
        s1 = read_steal_ticks(self.host)
        f1 = self._foreign() if self._foreign is not None else None
        if w.ok and elapsed > 0:
            extra = dict(w.extra)
            cpu = w.cpu_cores
            if p0 is not None and p1 is not None:
                poll = max(0.0, (p1 - p0) / 1e6 / elapsed)
                extra["idle_poll_cores"] = poll
                cpu = None if cpu is None else cpu + poll
            if f0 is not None and f1 is not None:
                extra["foreign_cores"] = foreign_cores(f0, f1, elapsed)
            if s0 is not None and s1 is not None:
                from polltuned.counters.stat import USER_HZ

                extra["steal_cores"] = max(0, s1 - s0) / USER_HZ / elapsed
            w = replace(w, cpu_cores=cpu, extra=extra)
        cfg = dict(self._config)
        self.windows.entries.append((self.phase, cfg, w))
        if self.record is not None:
            self.record.write(json.dumps({"v": 1, "workload": self.workload, "config": cfg,
                                          "window": w.to_json(), "phase": self.phase},
                                         sort_keys=True, default=str) + "\n")
            self.record.flush()
        return w


# ---------------------------------------------------------------------------- comparison statistics
#
# The final comparison measures every arm once per round, interleaved in a rotating order, so slow
# drift of the host spreads over all arms. J > 0, and windows vary multiplicatively (a disturbed
# window doubles p99, it does not add 20 µs), so everything is computed on log J:
#   * an arm's J is the geometric mean over its rounds, its 95 % CI the Student-t interval of the
#     mean of log J mapped back with exp (so a positive quantity never gets a negative bound);
#   * the paired ratio arm/default uses, per round, log J_arm - log J_default of the two windows of
#     that round (pairs cancel what the round shares), its CI the t interval of those differences;
#   * stopping rule: at least ``min_rounds`` rounds; then stop as soon as every arm's CI half-width
#     is within ``rel_halfwidth`` of its J; never more than ``max_rounds`` rounds.


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


def _t_quantile(level: float, dof: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, dof))


def mean_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Student-t confidence interval of the mean (nan for fewer than 2 samples). Can go below zero:
    use :func:`log_ci` for positive quantities."""
    if len(xs) < 2:
        return (math.nan, math.nan)
    m = statistics.fmean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs))
    h = _t_quantile(level, len(xs) - 1) * se
    return (m - h, m + h)


def geo_mean(xs: Sequence[float]) -> float:
    """Geometric mean of the positive finite values (nan when there is none)."""
    pos = [x for x in xs if math.isfinite(x) and x > 0]
    return math.exp(statistics.fmean(math.log(x) for x in pos)) if pos else math.nan


def log_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Pure: CI of the geometric mean of positive values: exp of the t interval of mean(log x).
    Both bounds are > 0 whenever defined; nan for fewer than 2 positive finite values."""
    logs = [math.log(x) for x in xs if math.isfinite(x) and x > 0]
    lo, hi = mean_ci(logs, level)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return (math.nan, math.nan)
    return (math.exp(lo), math.exp(hi))


def nonneg_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """CI for a quantity that cannot be negative but may be 0 (CPU cores): on the log scale when
    every value is positive, else the t interval clipped at 0."""
    if xs and all(math.isfinite(x) and x > 0 for x in xs):
        return log_ci(xs, level)
    lo, hi = mean_ci(xs, level)
    return (max(0.0, lo), hi) if math.isfinite(lo) else (lo, hi)


def rel_halfwidth(ci: tuple[float, float], center: float) -> float:
    """Half the CI's width relative to ``center`` (inf when undefined)."""
    lo, hi = ci
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(center)) or center <= 0:
        return math.inf
    return (hi - lo) / 2 / center


def paired_log_ratios(arm: Sequence[float | None], base: Sequence[float | None]) -> list[float]:
    """Pure: per round, log(J_arm / J_base) where both windows of the round scored (> 0)."""
    out: list[float] = []
    for a, b in zip(arm, base):
        if a is not None and b is not None and a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b):
            out.append(math.log(a / b))
    return out


def ratio_ci(log_ratios: Sequence[float], level: float = 0.95) -> tuple[float, tuple[float, float]]:
    """Pure: the paired ratio exp(mean log ratio) and its CI exp(t interval); nan when empty."""
    if not log_ratios:
        return math.nan, (math.nan, math.nan)
    r = math.exp(statistics.fmean(log_ratios))
    if len(log_ratios) >= 2 and statistics.stdev(log_ratios) == 0:
        return r, (r, r)
    lo, hi = mean_ci(log_ratios, level)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return r, (math.nan, math.nan)
    return r, (math.exp(lo), math.exp(hi))


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
    """Pure: medians of the per-window latency statistics, mean CPU, geometric-mean J with its
    log-scale CI, and (with ``baseline``, the default arm's windows of the same rounds) the paired
    ratio to it."""
    ok = [w for w in windows if w.ok]

    def med(stat: str) -> float:
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


# ---------------------------------------------------------------------------- result


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


# ---------------------------------------------------------------------------- signals


class BenchInterrupted(KeyboardInterrupt):
    """SIGTERM during a bench: unwinds like Ctrl-C so every finally block restores the host."""


_interrupted: list[int] = []  # signals received inside signals_raise(), cleared when it exits


def raise_if_interrupted() -> None:
    """A checkpoint on the forward path (each window's apply and measure; never the undo path).

    A signal handler's exception is *swallowed* by the interpreter when the signal lands while an
    at-fork callback runs (logging's ``_releaseLock`` after every subprocess or pyroute2 fork prints
    "Exception ignored" and carries on): without this checkpoint such a Ctrl-C or SIGTERM was lost
    and the bench ran to the end."""
    if _interrupted:
        raise BenchInterrupted(f"signal {_interrupted[0]}")


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise BenchInterrupted (a KeyboardInterrupt) in this process only.

    pyroute2 opens sockets inside a named netns from a forked child and stops that child with
    SIGTERM (and Ctrl-C reaches the whole process group); the child inherits this handler. Raising
    there would unwind the *parent's* copied stack in the child (running its finally/undo code
    against the real host), so a child exits at once. The signal is also remembered, so that
    :func:`raise_if_interrupted` raises it at the next window if the first raise was swallowed."""
    owner = os.getpid()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner:
            os._exit(0)
        _interrupted.append(signum)
        raise BenchInterrupted(f"signal {signum}")

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        _interrupted.clear()


# ---------------------------------------------------------------------------- orchestration


@dataclass(frozen=True)
class BenchSettings:
    workload: str = "single"
    #: None: the workload's own policy (bench, bench-nginx, bench-memcached)
    policy: str | None = None
    budget: int | None = None
    window_s: float | None = None
    #: final comparison: at least this many interleaved rounds ...
    compare_rounds: int = 8
    #: ... at most this many (None: 2 x compare_rounds) ...
    max_rounds: int | None = None
    #: ... stopping once every arm's 95 % CI half-width is within this fraction of its J
    rel_halfwidth: float = 0.15
    confirm_pairs: int | None = None
    seed: int | None = None
    state_dir: Path = Path("/var/lib/polltuned")
    record: Path | None = None
    report: Path | None = None
    #: remove every ``seeds`` entry from the policy (judge the engine without domain hints)
    no_seeds: bool = False
    #: an oracle JSON (benchmarks/oracle.py): its best configuration for this workload is measured
    #: as a fourth arm of the final comparison
    oracle: Path | None = None
    #: before starting, wait at most this many seconds for the machine to be quiet (<= 0.15 cores
    #: busy for 10 s); None: start at once
    wait_quiet_s: float | None = None

    def stop_rule(self) -> StopRule:
        mx = self.max_rounds if self.max_rounds is not None else 2 * self.compare_rounds
        return StopRule(min_rounds=self.compare_rounds, max_rounds=max(mx, self.compare_rounds),
                        rel_halfwidth=self.rel_halfwidth)


def supported_knobs(actuator: Any, policy: Any) -> tuple[Any, dict[str, str]]:
    """The policy with only the knobs this host has and the probe can see (narrowed to what its
    kernel accepts), and the dropped knobs with the reason: the engine's one preparation step
    (:func:`polltuned.engine.builder.prepare_policy`, over :func:`polltuned.knobs.compat.detect`)."""
    from polltuned.engine.builder import prepare_policy

    return prepare_policy(policy, actuator)


def recover(state_dir: Path, *, host: Host, clock: Clock,
            progress: Callable[[str], None] = lambda s: None) -> tuple[bool, list[str]]:
    """Undo what a crashed bench left: roll back its journal (every knob it changed) while the
    world's devices may still exist, then remove ``ptb-*`` namespaces and what runs in them
    (sockperf, nginx, memcached, clients) and the application directory.
    Returns (knobs were dirty, namespaces removed). Safe to call when nothing is left."""
    from polltuned.actuator import Actuator
    from polltuned.host.exec import SubprocessRunner
    from polltuned.journal import Journal
    from polltuned.worlds.default import DefaultWorld

    state_dir.mkdir(parents=True, exist_ok=True)
    actuator = Actuator(host, Journal(state_dir, clock=clock), clock=clock)
    dirty = bool(actuator.is_dirty())
    if dirty:
        progress("a previous run left knobs changed: rolling them back first")
        rep = actuator.rollback()
        log.warning("bench: rolled back a previous run's knobs: %s", rep)
    world = DefaultWorld(host, SubprocessRunner(), clock, state_dir)
    removed = world.cleanup_leftovers()
    if removed:
        progress(f"removed leftovers of a crashed run: {', '.join(removed)}")
    return dirty, removed


def strip_seeds(policy: Policy) -> Policy:
    """Pure: ``policy`` with every knob's ``seeds`` removed (``--no-seeds``)."""
    return policy.model_copy(update={"knobs": {k: v.model_copy(update={"seeds": []})
                                               for k, v in policy.knobs.items()}})


def bench_probe_config(policy: Policy, workload: Workload, world: Any) -> Any:
    """Pure: the policy's probe pointed at the world: sockperf gets the target, namespaces, sessions
    and a fresh server per window; a command probe runs in the client namespace on the client CPUs.
    The probe kind must fit the workload (sockperf for the sockperf workloads, command for the
    long-running application servers)."""
    from polltuned.policy.schema import CommandProbe as CommandConfig
    from polltuned.policy.schema import SockperfProbe as SockperfConfig

    cfg = policy.probe
    c = world.config
    if workload.app == "sockperf":
        if not isinstance(cfg, SockperfConfig):
            raise UsageError(f"policy {policy.name}: workload {workload.name} needs a sockperf probe (got {cfg.kind})",
                             hint=f"use --policy {workload.policy}")
        return cfg.model_copy(update={
            "target": c.server_addr, "port": c.port, "netns": c.client_ns, "server_netns": c.server_ns,
            "sessions": workload.sessions, "restart_server": True})
    if not isinstance(cfg, CommandConfig):
        raise UsageError(f"policy {policy.name}: workload {workload.name} runs {workload.app}, measured by a "
                         f"command probe (got {cfg.kind})", hint=f"use --policy {workload.policy}")
    return cfg.model_copy(update={"netns": c.client_ns, "cpus": list(world.client_cpus)})


def load_oracle(path: Path, workload: str) -> dict[str, KnobValue]:
    """The best configuration ``benchmarks/oracle.py`` found for ``workload`` (raises UsageError)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"--oracle: cannot read {path}: {e}") from e
    try:
        best = doc["workloads"][workload]["best"]["config"]
    except (KeyError, TypeError):
        raise UsageError(f"--oracle: {path} has no best configuration for workload {workload!r}",
                         hint="run benchmarks/oracle.py --workload " + workload) from None
    if not isinstance(best, dict) or not all(isinstance(v, int | float | str) for v in best.values()):
        raise UsageError(f"--oracle: {path}: workloads.{workload}.best.config is not a knob -> value table")
    return {str(k): v for k, v in best.items()}


@dataclass
class BenchSession:
    """What :func:`bench_session` builds: the world, the policy fitted to it, and the recording env."""

    workload: Workload
    world: Any
    policy: Policy
    env: BenchEnv
    actuator: Any
    probe: Any
    knobs: list[str]
    dropped: dict[str, str]
    restored: bool = False


@contextlib.contextmanager
def bench_session(settings: BenchSettings, *, host: Host, clock: Clock,
                  progress: Callable[[str], None] = lambda s: None) -> Iterator[BenchSession]:
    """Set up the real-kernel bench world and everything around it; on exit (also on failure,
    Ctrl-C and SIGTERM) roll every knob back, stop the probe and the servers, remove the world.
    ``session.restored`` tells after the block whether the rollback was complete.
    Needs root; hold /tmp/polltuned-realkernel.lock around it."""
    from polltuned.engine.builder import build_actuator
    from polltuned.host.exec import SubprocessRunner, foreign_cpu_seconds
    from polltuned.policy.loader import load_policy
    from polltuned.probes.factory import make_probe, probe_opens_fresh_sockets
    from polltuned.worlds.default import DefaultWorld, get_workload

    workload = get_workload(settings.workload)
    runner = SubprocessRunner()
    state_dir = Path(settings.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    ncpus = max(1, len(host.glob("/sys/devices/system/cpu", "cpu[0-9]*")))
    world = DefaultWorld(host, runner, clock, state_dir, workload=workload, ncpus=ncpus)
    policy = load_policy(settings.policy or workload.policy, nic=world.config.nic)
    if settings.no_seeds:
        policy = strip_seeds(policy)
    probe_cfg = bench_probe_config(policy, workload, world)
    tuning_upd: dict[str, object] = {}
    if settings.budget is not None:
        tuning_upd["budget"] = settings.budget
    if settings.window_s is not None:
        tuning_upd["window_s"] = settings.window_s
    if settings.seed is not None:
        tuning_upd["seed"] = settings.seed

    actuator: Any = None
    owner_pid = os.getpid()
    probe: Any = None
    record_fh: IO[str] | None = None
    session: BenchSession | None = None
    with signals_raise():
        try:
            recover(state_dir, host=host, clock=clock, progress=progress)
            actuator = build_actuator(host, state_dir, policy, clock)
            progress(f"creating the world ({workload.name}: {workload.description})")
            world.setup()
            fitted, dropped = supported_knobs(actuator, policy.model_copy(update={"probe": probe_cfg}))
            for k, why in dropped.items():
                progress(f"knob {k} not tuned here, dropped: {why}")
            knobs = dict(fitted.knobs)
            upd: dict[str, object] = {"knobs": knobs, "probe": probe_cfg,
                                      "tuning": policy.tuning.model_copy(update=tuning_upd)}
            if settings.confirm_pairs is not None:
                upd["confirm"] = policy.confirm.model_copy(update={"pairs": settings.confirm_pairs})
            policy = policy.model_copy(update=upd)
            if workload.app != "sockperf" and probe_opens_fresh_sockets(probe_cfg):
                progress(f"{workload.app} runs for the whole bench: its accepted sockets predate every knob change, "
                         "so net.core.busy_read reaches only the client's fresh sockets; busy_poll acts on both")
            probe = make_probe(probe_cfg, host, clock=clock, runner=runner,
                               client_cpus=world.client_cpus, server_cpus=world.server_cpus)
            probe.start()
            record_fh = open(settings.record, "a", encoding="utf-8") if settings.record else None  # noqa: SIM115
            env = BenchEnv(_host_env(policy, actuator, probe, host, clock), host=host, clock=clock,
                           workload=workload.name, record=record_fh,
                           foreign=lambda: foreign_cpu_seconds(owner_pid))
            session = BenchSession(workload=workload, world=world, policy=policy, env=env, actuator=actuator,
                                   probe=probe, knobs=list(knobs), dropped=dropped)
            yield session
        finally:
            if os.getpid() != owner_pid:
                # a forked child (pyroute2 netns helpers) unwinding: the host is not its to restore
                os._exit(1)
            restored = False
            try:
                if actuator is not None:
                    rep = actuator.rollback()
                    restored = bool(getattr(rep, "ok", True))
                    if not restored:
                        log.error("bench: rollback incomplete: %s", rep)
            finally:
                if session is not None:
                    session.restored = restored
                if record_fh is not None:
                    record_fh.close()
                if probe is not None:
                    with contextlib.suppress(PolltunedError, OSError):
                        probe.close()
                world.teardown()


def _window_line(w: Window) -> str:
    if not w.ok:
        return f"failed: {w.error}"
    return (f"p99={w.latency.get('p99', math.nan):.1f}us cpu={w.cpu_cores or math.nan:.2f} "
            f"foreign={w.extra.get('foreign_cores', math.nan):.2f} steal={w.extra.get('steal_cores', math.nan):.2f}")


def run_bench(settings: BenchSettings, *, host: Host, clock: Clock,
              progress: Callable[[str], None] = lambda s: None) -> BenchResult:
    """The whole bench on the real host. Needs root; hold /tmp/polltuned-realkernel.lock around it."""
    from polltuned.engine.builder import build_engine
    from polltuned.engine.driver import drive
    from polltuned.engine.phases import Event
    from polltuned.study import Study

    oracle_cfg = load_oracle(settings.oracle, settings.workload) if settings.oracle is not None else None
    rule = settings.stop_rule()
    quiet: bool | None = None
    if settings.wait_quiet_s is not None:
        quiet, waited = wait_for_quiet(host, clock, timeout_s=settings.wait_quiet_s, progress=progress)
        progress(f"machine {'quiet' if quiet else 'still busy'} after {waited:.0f} s of waiting")
    t_start = clock.monotonic()
    owner_pid = os.getpid()
    with contextlib.ExitStack() as stack:
        try:
            sess = stack.enter_context(bench_session(settings, host=host, clock=clock, progress=progress))
            policy, env = sess.policy, sess.env
            defaults = env.current()
            engine = build_engine(policy, env, Study.memory(policy), clock, dropped=sess.dropped)

            def show(ev: Event) -> None:
                if ev.phase in ("MEASURE", "CONFIRM", "SCORE", "DONE", "ROLLBACK", "APPLY"):
                    progress(f"[{ev.phase}] {ev.message}")

            result = drive(engine, env, on_event=show)
            assert result is not None
            tuning_s = clock.monotonic() - t_start
            deployed = {k: result.deployed.get(k, defaults[k]) for k in defaults}
            static = {**defaults, **{k: v for k, v in STATIC_OVERRIDES.items() if k in defaults}}
            arms: dict[str, Config] = {"default": defaults, "static": static}
            deployed_is_default = all(deployed[k] == defaults[k] for k in defaults)
            if not deployed_is_default:
                arms["deployed"] = deployed
            oracle_is_default = False
            if oracle_cfg is not None:
                unknown = sorted(k for k in oracle_cfg if k not in defaults)
                if unknown:
                    progress(f"oracle knobs not tuned in this run, left out of the oracle arm: {', '.join(unknown)}")
                oracle = {**defaults, **{k: v for k, v in oracle_cfg.items() if k in defaults}}
                oracle_is_default = all(oracle[k] == defaults[k] for k in defaults)
                if not oracle_is_default:
                    arms["oracle"] = oracle
            env.phase = "compare"
            progress(f"final comparison: {', '.join(arms)} interleaved, {rule.min_rounds}..{rule.max_rounds} rounds "
                     f"(stops once every J's 95% CI is within ±{rule.rel_halfwidth:.0%})")
            wins, why = run_comparison(
                env, arms, policy.objective, rule, first_index=result.windows_used + 1000,
                on_window=lambda n, r, w: progress(f"[COMPARE] round {r + 1} {n}: {_window_line(w)}"))
            rounds = max((len(v) for v in wins.values()), default=0)
            summaries = summarise_comparison(arms, wins, policy.objective, level=rule.level)
            d = summaries["default"]
            if deployed_is_default:
                summaries["deployed"] = replace(d, name="deployed")
            if oracle_cfg is not None and oracle_is_default:
                summaries["oracle"] = replace(d, name="oracle")
            trials: list[dict[str, object]] = [{"phase": ph, "config": cfg, "window": w.to_json(),
                       "objective": (s.value if (s := score(w, policy.objective)).ok else None)}
                      for ph, cfg, w in env.windows.entries]
            comparison: dict[str, object] = {
                "rounds": rounds, "min_rounds": rule.min_rounds, "max_rounds": rule.max_rounds,
                "rel_halfwidth_target": rule.rel_halfwidth, "level": rule.level, "stop_reason": why,
                "order": "rotating per round", "arms_measured": list(arms),
                "aliases": {**({"deployed": "default"} if deployed_is_default else {}),
                            **({"oracle": "default"} if oracle_cfg is not None and oracle_is_default else {})},
                "oracle_file": str(settings.oracle) if settings.oracle is not None else None}
            res = BenchResult(
                workload=sess.workload.name, arms=summaries, tuning=result.to_json(), trials=trials,
                duration_s=0.0, restored=False, knobs=sess.knobs, dropped_knobs=sess.dropped,
                world=sess.world.describe(), deployed_is_default=deployed_is_default, comparison=comparison,
                policy=policy.name, tuning_s=tuning_s, started_quiet=quiet)
        finally:
            if os.getpid() == owner_pid:
                progress("restoring the host: every knob back, servers stopped, namespaces removed")

    res.restored = sess.restored
    res.duration_s = clock.monotonic() - t_start
    if settings.report is not None:
        from polltuned.report import draw_report

        draw_report(res.trials, settings.report)
    return res


def _host_env(policy: Any, actuator: Any, probe: Any, host: Host, clock: Clock) -> TrialEnv:
    from polltuned.counters.sampler import Sampler
    from polltuned.engine.env import HostEnv

    sampler = Sampler(host, clock=clock)
    env: TrialEnv = HostEnv(policy, actuator, probe, clock=clock, sampler=sampler)
    return env

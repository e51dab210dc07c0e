"""``polltuned bench``: tune this host's real knobs on the embedded netns + veth + sockperf world.

Order of operations (each step undone in ``finally``, also on SIGINT/SIGTERM):

1. journal + actuator on the real host; if a crashed run left the journal dirty, roll it back first;
2. world: remove a crashed run's leftovers (``ptb-*`` namespaces and what runs in them), create the
   namespaces, the veth pair with NAPI active, and the workload's CPU hog if any;
3. policy ``bench`` resolved to the world's nic (``ptb-s/ptbs``), knobs this host lacks dropped,
   the sockperf probe pointed at the world with the workload's layout;
4. ``Tuner.run()`` over a HostEnv (wrapped to add guest idle-poll CPU and to record windows);
5. final comparison, interleaved round by round (A/B/C, A/B/C, ...): the kernel defaults (the host's
   values at start), tuned's static network-latency values (busy_read = busy_poll = 50) and the
   configuration polltuned deployed;
6. actuator.rollback() (every knob back), world.teardown(), and a check that every knob reads back
   its original value.

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
from polltuned.errors import HostError, PolltunedError
from polltuned.host.fs import Host
from polltuned.objective import score
from polltuned.policy.schema import Objective
from polltuned.records import Config, KnobValue, Window

log = logging.getLogger("polltuned.bench")

#: tuned's network-latency profile (static): busy_read = busy_poll = 50 µs
STATIC_OVERRIDES: dict[str, KnobValue] = {"net.core.busy_read": 50, "net.core.busy_poll": 50}
ARMS = ("default", "static", "deployed")


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


def foreign_cores(before: Mapping[int, float], after: Mapping[int, float], elapsed_s: float) -> float:
    """Pure: cores used by other processes over a window (pids present at both ends)."""
    if elapsed_s <= 0:
        return 0.0
    return sum(max(0.0, after[p] - before[p]) for p in before.keys() & after.keys()) / elapsed_s


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
        self.inner.apply(config)
        self._config = {**self._config, **dict(config)}

    def describe(self) -> Mapping[str, object]:
        return self.inner.describe()

    def measure(self, window_index: int) -> Window:
        p0 = read_cpuidle_poll_us(self.host)
        f0 = self._foreign() if self._foreign is not None else None
        t0 = self.clock.monotonic()
        w = self.inner.measure(window_index)
        elapsed = self.clock.monotonic() - t0
        p1 = read_cpuidle_poll_us(self.host)
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
            w = replace(w, cpu_cores=cpu, extra=extra)
        cfg = dict(self._config)
        self.windows.entries.append((self.phase, cfg, w))
        if self.record is not None:
            self.record.write(json.dumps({"v": 1, "workload": self.workload, "config": cfg,
                                          "window": w.to_json(), "phase": self.phase},
                                         sort_keys=True, default=str) + "\n")
            self.record.flush()
        return w


# ---------------------------------------------------------------------------- comparison


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
    objective: float
    objective_ci: tuple[float, float]
    p99_ci: tuple[float, float]
    values: tuple[float, ...]
    foreign_cores: float = math.nan
    cpu_ci: tuple[float, float] = (math.nan, math.nan)

    def to_json(self) -> dict[str, object]:
        def f(x: float) -> float | None:
            return round(x, 4) if math.isfinite(x) else None

        return {"config": dict(self.config), "windows": self.windows, "failed": self.failed,
                "p50_us": f(self.p50), "p99_us": f(self.p99), "p999_us": f(self.p999),
                "cpu_cores": f(self.cpu_cores), "objective": f(self.objective),
                "objective_ci95": [f(self.objective_ci[0]), f(self.objective_ci[1])],
                "p99_ci95": [f(self.p99_ci[0]), f(self.p99_ci[1])],
                "foreign_cores": f(self.foreign_cores),
                "cpu_ci95": [f(self.cpu_ci[0]), f(self.cpu_ci[1])],
                "objective_samples": [f(v) for v in self.values]}


def mean_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Student-t confidence interval of the mean (nan for fewer than 2 samples)."""
    if len(xs) < 2:
        return (math.nan, math.nan)
    from scipy import stats

    m = statistics.fmean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs))
    h = float(stats.t.ppf(0.5 + level / 2, len(xs) - 1)) * se
    return (m - h, m + h)


def summarise_arm(name: str, config: Mapping[str, KnobValue], windows: Sequence[Window],
                  objective: Objective) -> ArmSummary:
    """Pure: medians of the per-window statistics, mean CPU, median J and 95 % CIs."""
    ok = [w for w in windows if w.ok]

    def med(stat: str) -> float:
        xs = [v for w in ok if (v := w.stat(stat)) is not None]
        return statistics.median(xs) if xs else math.nan

    cpus = [w.cpu_cores for w in ok if w.cpu_cores is not None]
    js = [s.value for w in ok if (s := score(w, objective)).ok and math.isfinite(s.value)]
    p99s = [v for w in ok if (v := w.stat("p99")) is not None]
    foreign = [w.extra["foreign_cores"] for w in ok if "foreign_cores" in w.extra]
    return ArmSummary(
        name=name, config=dict(config), windows=len(windows), failed=len(windows) - len(ok),
        p50=med("p50"), p99=med("p99"), p999=med("p999"),
        cpu_cores=statistics.fmean(cpus) if cpus else math.nan,
        objective=statistics.median(js) if js else math.nan,
        objective_ci=mean_ci(js), p99_ci=mean_ci(p99s), values=tuple(js),
        foreign_cores=statistics.fmean(foreign) if foreign else math.nan, cpu_ci=mean_ci(cpus))


def compare_interleaved(env: TrialEnv, arms: Mapping[str, Config], rounds: int, *, first_index: int,
                        on_window: Callable[[str, int, Window], None] | None = None,
                        stop: Callable[[], bool] = lambda: False) -> dict[str, list[Window]]:
    """Measure every arm once per round, in a rotating order (A/B/C, B/C/A, ...) so drift spreads."""
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
    return out


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

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"v": 1, "workload": self.workload, "world": dict(self.world),
                             "knobs": self.knobs, "dropped_knobs": self.dropped_knobs}
        for n in ARMS:
            if n in self.arms:
                d[n] = self.arms[n].to_json()
        d["deployed_is_default"] = self.deployed_is_default
        d["tuning"] = self.tuning
        d["trials"] = self.trials
        d["duration_s"] = round(self.duration_s, 1)
        d["restored"] = self.restored
        return d


def _fmt(x: float, nd: int = 1) -> str:
    return f"{x:.{nd}f}" if math.isfinite(x) else "-"


def _fmt_ci(ci: tuple[float, float], nd: int = 1) -> str:
    return f"[{_fmt(ci[0], nd)}, {_fmt(ci[1], nd)}]" if all(map(math.isfinite, ci)) else "-"


def render_table(res: BenchResult) -> str:
    rows = [("config", "p50 µs", "p99 µs", "p99.9 µs", "CPU cores", "objective J", "J 95% CI", "p99 95% CI", "n",
             "foreign CPU")]
    for n in ARMS:
        a = res.arms.get(n)
        if a is None:
            continue
        rows.append((n, _fmt(a.p50), _fmt(a.p99), _fmt(a.p999), _fmt(a.cpu_cores, 2), _fmt(a.objective),
                     _fmt_ci(a.objective_ci), _fmt_ci(a.p99_ci), f"{a.windows - a.failed}/{a.windows}",
                     _fmt(a.foreign_cores, 2)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"workload: {res.workload}"]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(r)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    dep = res.arms.get("deployed")
    base = res.arms.get("default")
    if dep is not None and base is not None:
        diff = {k: v for k, v in dep.config.items() if base.config.get(k) != v}
        lines.append("deployed: " + (", ".join(f"{k}={v}" for k, v in diff.items()) or "kernel defaults (kept)"))
    lines.append(f"verdict: {res.tuning.get('reason', '')}")
    fc = [a.foreign_cores for a in res.arms.values() if math.isfinite(a.foreign_cores)]
    if fc and max(fc) > 0.1:
        lines.append(f"note: other processes used up to {max(fc):.2f} cores during the comparison: "
                     "latency numbers are disturbed (compare within this run only)")
    lines.append(f"took {res.duration_s:.0f} s; knobs restored: {'yes' if res.restored else 'NO'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- signals


class BenchInterrupted(KeyboardInterrupt):
    """SIGTERM during a bench: unwinds like Ctrl-C so every finally block restores the host."""


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM raises BenchInterrupted in this process only.

    pyroute2 opens sockets inside a named netns from a forked child and stops that child with
    SIGTERM; the child inherits this handler. Raising there would unwind the *parent's* copied stack
    in the child (running its finally/undo code against the real host), so a child exits at once."""
    owner = os.getpid()

    def on_term(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner:
            os._exit(0)
        raise BenchInterrupted(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


# ---------------------------------------------------------------------------- orchestration


@dataclass(frozen=True)
class BenchSettings:
    workload: str = "single"
    policy: str = "bench"
    budget: int | None = None
    window_s: float | None = None
    compare_rounds: int = 3
    confirm_pairs: int | None = None
    seed: int | None = None
    state_dir: Path = Path("/var/lib/polltuned")
    record: Path | None = None
    report: Path | None = None


def supported_knobs(actuator: Any, policy: Any) -> tuple[Any, dict[str, str]]:
    """The policy with only the knobs this host has and the probe can see (narrowed to what its
    kernel accepts), and the dropped knobs with the reason: the engine's one preparation step
    (:func:`polltuned.engine.builder.prepare_policy`, over :func:`polltuned.knobs.compat.detect`)."""
    from polltuned.engine.builder import prepare_policy

    return prepare_policy(policy, actuator)


def recover(state_dir: Path, *, host: Host, clock: Clock,
            progress: Callable[[str], None] = lambda s: None) -> tuple[bool, list[str]]:
    """Undo what a crashed bench left: roll back its journal (every knob it changed) while the
    world's devices may still exist, then remove ``ptb-*`` namespaces and what runs in them.
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


def run_bench(settings: BenchSettings, *, host: Host, clock: Clock,
              progress: Callable[[str], None] = lambda s: None) -> BenchResult:
    """The whole bench on the real host. Needs root; hold /tmp/polltuned-realkernel.lock around it."""
    from polltuned.engine.builder import build_actuator, build_tuner
    from polltuned.host.exec import SubprocessRunner
    from polltuned.policy.loader import load_policy
    from polltuned.probes.factory import make_probe
    from polltuned.study import Study
    from polltuned.worlds.default import DefaultWorld, get_workload

    t_start = clock.monotonic()
    workload = get_workload(settings.workload)
    runner = SubprocessRunner()
    state_dir = Path(settings.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    ncpus = max(1, len(host.glob("/sys/devices/system/cpu", "cpu[0-9]*")))
    world = DefaultWorld(host, runner, clock, state_dir, workload=workload, ncpus=ncpus)
    policy = load_policy(settings.policy, nic=world.config.nic)
    probe_cfg = policy.probe
    from polltuned.policy.schema import SockperfProbe as SockperfConfig

    if not isinstance(probe_cfg, SockperfConfig):
        raise PolltunedError(f"policy {settings.policy}: the bench needs a sockperf probe (got {probe_cfg.kind})")
    probe_cfg = probe_cfg.model_copy(update={
        "target": world.config.server_addr, "port": world.config.port, "netns": world.config.client_ns,
        "server_netns": world.config.server_ns, "sessions": workload.sessions, "restart_server": True})
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
    restored = False
    with signals_raise():
        try:
            recover(state_dir, host=host, clock=clock, progress=progress)
            actuator = build_actuator(host, state_dir, policy, clock)
            progress(f"creating the world ({workload.name}: {workload.description})")
            world.setup()
            prepared, dropped = supported_knobs(actuator, policy.model_copy(update={"probe": probe_cfg}))
            for k, why in dropped.items():
                progress(f"knob {k} not tuned here, dropped: {why}")
            knobs = dict(prepared.knobs)
            upd: dict[str, object] = {"knobs": knobs, "probe": probe_cfg,
                                      "tuning": policy.tuning.model_copy(update=tuning_upd)}
            if settings.confirm_pairs is not None:
                upd["confirm"] = policy.confirm.model_copy(update={"pairs": settings.confirm_pairs})
            policy = policy.model_copy(update=upd)
            probe = make_probe(probe_cfg, host, clock=clock, runner=runner,
                               client_cpus=world.client_cpus, server_cpus=world.server_cpus)
            probe.start()
            record_fh = open(settings.record, "a", encoding="utf-8") if settings.record else None  # noqa: SIM115
            from polltuned.host.exec import foreign_cpu_seconds

            env = BenchEnv(_host_env(policy, actuator, probe, host, clock), host=host, clock=clock,
                           workload=workload.name, record=record_fh,
                           foreign=lambda: foreign_cpu_seconds(owner_pid))
            defaults = env.current()
            tuner = build_tuner(policy, env, Study.memory(policy), clock, dropped=dropped)
            for ev in tuner.run():
                if ev.phase in ("MEASURE", "CONFIRM", "SCORE", "DONE", "ROLLBACK") or (
                        ev.phase == "APPLY"):
                    progress(f"[{ev.phase}] {ev.message}")
            result = tuner.result
            assert result is not None
            deployed = {k: result.deployed.get(k, defaults[k]) for k in defaults}
            static = {**defaults, **{k: v for k, v in STATIC_OVERRIDES.items() if k in defaults}}
            arms: dict[str, Config] = {"default": defaults, "static": static}
            deployed_is_default = all(deployed[k] == defaults[k] for k in defaults)
            if not deployed_is_default:
                arms["deployed"] = deployed
            env.phase = "compare"
            rounds = settings.compare_rounds
            progress(f"final comparison: {rounds} interleaved rounds of {', '.join(arms)}")
            wins = compare_interleaved(
                env, arms, rounds, first_index=result.windows_used + 1000,
                on_window=lambda n, r, w: progress(
                    f"[COMPARE] round {r + 1}/{rounds} {n}: "
                    + (f"p99={w.latency.get('p99', math.nan):.1f}us cpu={w.cpu_cores or math.nan:.2f} "
                       f"foreign={w.extra.get('foreign_cores', math.nan):.2f}"
                       if w.ok else f"failed: {w.error}")))
            summaries = {n: summarise_arm(n, arms[n], wins[n], policy.objective) for n in arms}
            if deployed_is_default:
                summaries["deployed"] = replace(summaries["default"], name="deployed")
            trials: list[dict[str, object]] = [{"phase": ph, "config": cfg, "window": w.to_json(),
                       "objective": (s.value if (s := score(w, policy.objective)).ok else None)}
                      for ph, cfg, w in env.windows.entries]
            res = BenchResult(
                workload=workload.name, arms=summaries, tuning=result.to_json(), trials=trials,
                duration_s=0.0, restored=False, knobs=list(knobs), dropped_knobs=dropped,
                world=world.describe(), deployed_is_default=deployed_is_default)
        finally:
            if os.getpid() != owner_pid:
                # a forked child (pyroute2 netns helpers) unwinding: the host is not its to restore
                os._exit(1)
            try:
                if actuator is not None:
                    rep = actuator.rollback()
                    restored = bool(getattr(rep, "ok", True))
                    if not restored:
                        log.error("bench: rollback incomplete: %s", rep)
            finally:
                if record_fh is not None:
                    record_fh.close()
                if probe is not None:
                    with contextlib.suppress(PolltunedError, OSError):
                        probe.close()
                world.teardown()
    res.restored = restored
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

"""The bench's setup and teardown around a run: settings, crash recovery, the world, the policy
fitted to it, the probe pointed at it, the recording env (:func:`bench_session`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from polltuned.actuator import build_actuator
from polltuned.bench.comparison import StopRule
from polltuned.bench.env import BenchEnv
from polltuned.bench.signals import signals_raise
from polltuned.bench.world import DefaultWorld, Workload, get_workload
from polltuned.clock import Clock
from polltuned.counters.sampler import Sampler
from polltuned.engine.builder import prepare_policy
from polltuned.engine.env import HostEnv, TrialEnv
from polltuned.errors import PolltunedError, UsageError
from polltuned.host.exec import SubprocessRunner, foreign_cpu_seconds
from polltuned.host.fs import Host
from polltuned.metrics.context import app_by_command, host_context_meter, rate_mode_for
from polltuned.metrics.cpu_scope import make_cpu_scope
from polltuned.policy.edits import strip_seeds
from polltuned.policy.loader import load_policy
from polltuned.policy.schema import CommandProbe as CommandConfig
from polltuned.policy.schema import Policy
from polltuned.policy.schema import SockperfProbe as SockperfConfig
from polltuned.probes.factory import make_probe, probe_opens_fresh_sockets
from polltuned.records import KnobValue

log = logging.getLogger("polltuned.bench")


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


def recover(state_dir: Path, *, host: Host, clock: Clock,
            progress: Callable[[str], None] = lambda s: None) -> tuple[bool, list[str]]:
    """Undo what a crashed bench left: roll back its journal (every knob it changed) while the
    world's devices may still exist, then remove ``ptb-*`` namespaces and what runs in them
    (sockperf, nginx, memcached, clients) and the application directory.
    Returns (knobs were dirty, namespaces removed). Safe to call when nothing is left."""
    state_dir.mkdir(parents=True, exist_ok=True)
    actuator = build_actuator(host, state_dir, clock)
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


def bench_probe_config(policy: Policy, workload: Workload, world: Any) -> Any:
    """Pure: the policy's probe pointed at the world: sockperf gets the target, namespaces, sessions
    and a fresh server per window; a command probe runs in the client namespace on the client CPUs.
    The probe kind must fit the workload (sockperf for the sockperf workloads, command for the
    long-running application servers)."""

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
    #: a recording env like ``env`` for the same world and actuator under another policy (its own
    #: probe, e.g. the open-loop probe of one load point; closed with the session)
    make_env: Callable[[Policy], BenchEnv] | None = None


@contextlib.contextmanager
def bench_session(settings: BenchSettings, *, host: Host, clock: Clock,
                  progress: Callable[[str], None] = lambda s: None) -> Iterator[BenchSession]:
    """Set up the real-kernel bench world and everything around it; on exit (also on failure,
    Ctrl-C and SIGTERM) roll every knob back, stop the probe and the servers, remove the world.
    ``session.restored`` tells after the block whether the rollback was complete.
    Needs root; hold /tmp/polltuned-realkernel.lock around it."""

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
    more_probes: list[Any] = []
    record_fh: IO[str] | None = None
    session: BenchSession | None = None
    with signals_raise():
        try:
            recover(state_dir, host=host, clock=clock, progress=progress)
            actuator = build_actuator(host, state_dir, clock, app_cpus=policy.app_cpus)
            progress(f"creating the world ({workload.name}: {workload.description})")
            world.setup()
            fitted, dropped = prepare_policy(policy.model_copy(update={"probe": probe_cfg}), actuator)
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
            env = BenchEnv(host_env(policy, actuator, probe, host, clock, context_app=(workload, world)),
                           host=host, clock=clock,
                           workload=workload.name, record=record_fh,
                           foreign=lambda: foreign_cpu_seconds(owner_pid))

            def make_env(pol: Policy) -> BenchEnv:
                p = make_probe(pol.probe, host, clock=clock, runner=runner,
                               client_cpus=world.client_cpus, server_cpus=world.server_cpus)
                more_probes.append(p)
                p.start()
                return BenchEnv(host_env(pol, actuator, p, host, clock, context_app=(workload, world)),
                                host=host, clock=clock,
                                workload=workload.name, record=record_fh,
                                foreign=lambda: foreign_cpu_seconds(owner_pid))

            session = BenchSession(workload=workload, world=world, policy=policy, env=env, actuator=actuator,
                                   probe=probe, knobs=list(knobs), dropped=dropped, make_env=make_env)
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
                for pr in [probe, *more_probes]:
                    if pr is not None:
                        with contextlib.suppress(PolltunedError, OSError):
                            pr.close()
                world.teardown()


def bench_context_settings(policy: Any, workload: Any, world: Any) -> dict[str, Any]:
    """Pure: how the bench world's context is measured (polltuned.metrics.context): the server's
    CPUs are the application's, the server (the poller) is excluded from ``runnable_others``, and
    the offered rate is the rate sockperf under-load sets (ping-pong, wrk and kvclient are
    closed-loop: no rate); only the bench's own processes count as peers (other users' jobs on a
    shared machine are its foreign-CPU column)."""
    words = {"sockperf": ("sockperf", "server"), "nginx": ("nginx",), "memcached": ("memcached",)}[workload.app]
    mode, rate = rate_mode_for(policy.probe)
    return {"app_cpus": list(world.server_cpus), "is_app": app_by_command(*words), "rate_mode": mode,
            "set_rate": rate, "descendants_of": os.getpid(),
            "within_s": policy.tuning.window_s if workload.app == "sockperf" else None}


def host_env(policy: Policy, actuator: Any, probe: Any, host: Host, clock: Clock,
             context_app: tuple[Any, Any] | None = None) -> TrialEnv:
    """The bench's HostEnv: CPU through the daemon's own CPU account (polltuned.metrics.cpu_scope,
    idle polling included), so the bench and the daemon count the same cores for the same window;
    with ``context_app`` (workload, world) its windows carry the load context
    (polltuned.metrics.context)."""
    sampler = Sampler(host, clock=clock)
    scope = make_cpu_scope(policy, host, sampler, sampler.nics, clock=clock)
    meter = None
    if context_app is not None:
        meter = host_context_meter(clock=clock, sampler=sampler,
                                   **bench_context_settings(policy, context_app[0], context_app[1]))
    env: TrialEnv = HostEnv(policy, actuator, probe, clock=clock, cpu_scope=scope, context=meter)
    return env

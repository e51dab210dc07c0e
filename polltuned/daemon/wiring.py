"""Builds the daemon from its configuration: the one place where every part is constructed.

host (FsHost at --host-root) -> journal + actuator -> probe (policy) -> sampler (counters)
-> HostEnv -> engine factory (Study per policy: resume + warm start) -> Watcher (HOLD verification,
link events) -> Controller -> Service.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polltuned.actuator import Actuator, build_actuator
from polltuned.clock import Clock
from polltuned.counters import Sampler
from polltuned.daemon.controller import Controller, EngineLike
from polltuned.daemon.watch import Watcher
from polltuned.engine.builder import build_engine, prepare_policy
from polltuned.engine.builder import build_env as engine_env
from polltuned.engine.env import TrialEnv
from polltuned.errors import PolltunedError
from polltuned.host.fs import FsHost, Host
from polltuned.host.identity import host_fingerprint
from polltuned.host.netlink import open_link_events
from polltuned.metrics.context import ContextMeter, host_context_meter, rate_mode_for
from polltuned.metrics.cpu_scope import CpuScope, make_cpu_scope
from polltuned.metrics.window import rates
from polltuned.policy.loader import load_policy
from polltuned.policy.schema import Policy
from polltuned.probes.factory import make_probe
from polltuned.records import Config, KnobValue, Window
from polltuned.study import Study
from polltuned.study.config import StudyConfig
from polltuned.study.select import open_for_host

log = logging.getLogger("polltuned.daemon")


class CountersView:
    """Per-CPU summary for status, and the workload signals HOLD watches for drift."""

    def __init__(self, host: Host, clock: Clock, nic: str | None) -> None:
        self.clock = clock
        self._sampler: Any = None
        self._prev: Any = None
        self._begin: Any = None
        self.last_json: dict[str, Any] = {}
        try:
            self._sampler = Sampler(host, clock=clock, nic=nic)
        except PolltunedError as e:
            log.warning("counters disabled: %s", e.message)
            with contextlib.suppress(PolltunedError):
                self._sampler = Sampler(host, clock=clock)

    def summary(self) -> dict[str, Any]:
        """Rates since the previous call (at least 1 s apart), as a small JSON block."""
        if self._sampler is None:
            return {"cpus": [], "unavailable": {"counters": "no sampler"}}

        try:
            snap = self._sampler.sample()
        except PolltunedError as e:
            return {"cpus": [], "unavailable": {"counters": e.message}}
        if self._prev is None or snap.t - self._prev.t < 1.0:
            if self._prev is None:
                self._prev = snap
            return self.last_json
        r = rates(self._prev, snap)
        self._prev = snap
        cpus = []
        for cpu in sorted(r.cpu):
            c = r.cpu[cpu]
            cpus.append({
                "cpu": cpu, "net_rx_per_s": c.net_rx_per_s, "irqs_per_s": c.irqs_per_s, "softirq": c.softirq,
                "system": c.system,
                "runq_wait_ms_per_s": None if c.runq_wait_s_per_s is None else c.runq_wait_s_per_s * 1000,
            })
        self.last_json = {"interval_s": r.interval_s, "cpus": cpus, "unavailable": dict(r.unavailable)}
        return self.last_json

    # WorkloadMeter protocol (HOLD): NET_RX/s and softirq load over one window
    def begin(self) -> None:
        self._begin = self._sampler.sample() if self._sampler is not None else None

    def end(self) -> dict[str, float]:
        if self._sampler is None or self._begin is None:
            return {}

        r = rates(self._begin, self._sampler.sample())
        out: dict[str, float] = {}
        rx = [c.net_rx_per_s for c in r.cpu.values() if c.net_rx_per_s is not None]
        if rx:
            out["net_rx_per_s"] = float(sum(rx))
        si = [c.softirq for c in r.cpu.values() if c.softirq is not None]
        if si:
            out["softirq_cores"] = float(sum(si))
        return out


@dataclass
class WindowCounts:
    """Measurement windows since the daemon started (tuning rounds and HOLD), for status and metrics."""

    measured: int = 0
    failed: int = 0


class CountingEnv:
    """A TrialEnv that counts the windows it measures and the failed ones; everything else is the
    wrapped env's (attributes too, e.g. ``cpu_scope``)."""

    def __init__(self, env: TrialEnv, counts: WindowCounts) -> None:
        self.env = env
        self.counts = counts

    def current(self) -> dict[str, KnobValue]:
        return self.env.current()

    def apply(self, config: Config) -> None:
        self.env.apply(config)

    def measure(self, window_index: int) -> Window:
        self.counts.measured += 1
        try:
            w = self.env.measure(window_index)
        except PolltunedError:
            self.counts.failed += 1
            raise
        if not w.ok:
            self.counts.failed += 1
        return w

    def describe(self) -> Mapping[str, object]:
        return self.env.describe()

    def __getattr__(self, name: str) -> Any:
        if name == "env":   # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)


@dataclass
class Daemon:
    policy: Policy
    host: FsHost
    actuator: Actuator
    controller: Controller
    counters: CountersView
    state_dir: Path
    #: knobs of the policy not tuned here (key -> reason): the host lacks them, or the probe cannot
    #: see them (polltuned.engine.builder.prepare_policy)
    dropped_knobs: dict[str, str] = field(default_factory=dict)
    windows: WindowCounts = field(default_factory=WindowCounts)
    #: the study store of the current tuning round ([study] in the config; status shows it)
    study: Study | None = None
    #: HOLD's verification of the deployed knobs (polltuned.daemon.watch); status shows its last one
    watcher: Watcher | None = None
    #: fitted policy (JSON) -> the policy as asked for: the study's key (build_daemon)
    requested: dict[str, Policy] = field(default_factory=dict)

    def fit(self, policy: Policy) -> Policy:
        """The policy restricted to what this host and its probe support (one log line per dropped
        knob); for reloads."""
        pol, self.dropped_knobs = prepare_policy(policy, self.actuator)
        self.requested[pol.model_dump_json()] = policy
        return pol


def daemon_cpu_scope(policy: Policy, host: Host, counters: CountersView, clock: Clock) -> CpuScope:
    """The objective's CPU account (polltuned.metrics.cpu_scope, idle polling included) over the
    daemon's own counters sampler: the same module, and so the same cores, as the bench's."""
    sampler = counters._sampler
    return make_cpu_scope(policy, host, sampler, sampler.nics if sampler is not None else None, clock=clock)


def build_env(policy: Policy, host: FsHost, actuator: Actuator, clock: Clock, counters: CountersView) -> TrialEnv:
    """The prepared policy's probe and a HostEnv (the engine's builder)."""

    probe = make_probe(policy.probe, host, clock=clock, policy=policy, seed=policy.tuning.seed)
    probe.start()
    if policy.probe.kind == "sim":  # the simulated world reports its own CPU
        return engine_env(policy, actuator, probe, clock)
    return engine_env(policy, actuator, probe, clock, cpu_scope=daemon_cpu_scope(policy, host, counters, clock),
                      context=_context_meter(policy, host, clock))


def _context_meter(policy: Policy, host: FsHost, clock: Clock) -> Any:
    """The window's load context (polltuned.metrics.context) on the live host: offered rate and
    flows from the probe; runnable peers on the policy's app_cpus only on the real root (the
    process list is the live host's) and only when app_cpus are set. The poller cannot be told
    apart by pid here, so it is counted too: as one busy task whether it spins or sleeps-and-wakes
    at >= 5 % of a core (approximate)."""
    mode, rate = rate_mode_for(policy.probe)
    if host.is_real and policy.app_cpus:
        return host_context_meter(clock=clock, app_cpus=list(policy.app_cpus), is_app=lambda t: False,
                                  rate_mode=mode, set_rate=rate)
    return ContextMeter(monotonic=clock.monotonic, rate_mode=mode, set_rate=rate)


#: optimisers the daemon runs in a model worker process instead (polltuned.optimiser.proxy)
IN_WORKER = {"skopt": "skopt-worker"}


def model_in_worker(policy: Policy) -> Policy:
    """The policy the daemon's engine runs: its GP in a model worker process (``skopt`` ->
    ``skopt-worker``, the same answers), so the daemon's own process never loads scikit-optimize,
    scikit-learn, scipy or numpy (issue 14: ~110 MB of the 162 MB it had while tuning). The study
    stays keyed by the policy as asked for (its fingerprint does not include the optimiser)."""
    name = IN_WORKER.get(policy.tuning.optimiser)
    if name is None:
        return policy
    return policy.model_copy(update={"tuning": policy.tuning.model_copy(update={"optimiser": name})})


def build_daemon(*, policy: Policy, host_root: str, state_dir: str, clock: Clock,
                 max_rounds: int | None = None, observe: bool = False,
                 study: StudyConfig | None = None) -> Daemon:

    host = FsHost(host_root)
    sd = Path(state_dir)
    sd.mkdir(mode=0o700, parents=True, exist_ok=True)
    actuator = build_actuator(host, sd, clock, app_cpus=policy.app_cpus)
    asked = policy
    policy, dropped = prepare_policy(policy, actuator)
    #: the policy as asked for, by the fitted policy (its JSON): the study is keyed by what the
    #: policy asks for, not by what this host offers today (polltuned.study.base.fingerprint)
    requested: dict[str, Policy] = {policy.model_dump_json(): asked}
    counters = CountersView(host, clock, policy.nic_device)
    windows = WindowCounts()
    env: TrialEnv = CountingEnv(build_env(policy, host, actuator, clock, counters), windows)
    built: dict[str, TrialEnv] = {policy.model_dump_json(): env}
    rounds = {"n": 0}

    def make_engine(pol: Policy, _env: TrialEnv) -> EngineLike:
        key = pol.model_dump_json()
        if key not in built:
            built.clear()
            built[key] = CountingEnv(build_env(pol, host, actuator, clock, counters), windows)
            controller.env = built[key]  # HOLD measures under the new policy's probe too
        rounds["n"] += 1
        if daemon.study is not None:
            daemon.study.close()
        daemon.study = open_for_host(study, sd, daemon.requested.get(key, pol), host, clock=clock)
        if daemon.dropped_knobs:
            log.info("study %s kept for the policy as written; not tuned here: %s", daemon.study.fingerprint,
                     ", ".join(sorted(daemon.dropped_knobs)))
        # the first round of a run may re-apply a confirmed deployment instead of searching again
        return build_engine(model_in_worker(pol), built[key], daemon.study, clock,
                            host_fingerprint=host_fingerprint(host, pol.nic), resume=rounds["n"] == 1,
                            observe=observe, dropped=daemon.dropped_knobs, follow=True)


    watcher = Watcher(actuator, clock, open_events=lambda: open_link_events(host))
    controller = Controller(policy=policy, actuator=actuator, env=env, make_engine=make_engine, clock=clock,
                            max_rounds=max_rounds,
                            watcher=watcher)
    daemon = Daemon(policy, host, actuator, controller, counters, sd, dropped, windows, watcher=watcher,
                    requested=requested)
    return daemon


def load_daemon_policy(policy_ref: str, nic: str | None) -> Policy:
    return load_policy(policy_ref, nic=nic)

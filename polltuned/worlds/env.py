"""TrialEnv implementations.

``HostEnv`` is the one used by the daemon, ``polltuned sim`` and the real bench: knobs through the
Actuator (journal first, verify, transactional), latency from a Probe, CPU from the counters
sampler when the probe does not report it.

``ScenarioEnv`` is a lightweight in-process world for the tuner-quality benchmark and unit tests:
it keeps the configuration in a dict and calls the scenario directly (no files, no journal), so
thousands of runs stay cheap. It reproduces the same measurement stream as HostEnv+SimProbe for
the same seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from polltuned.clock import Clock
from polltuned.errors import PolltunedError
from polltuned.policy.schema import Policy
from polltuned.probes.base import Probe
from polltuned.records import Config, KnobValue, Window
from polltuned.worlds.scenario import Scenario, to_window


class ActuatorLike(Protocol):
    def read(self, keys: Sequence[str]) -> Mapping[str, Any]: ...
    def apply(self, assignment: Config, *, reason: str = "") -> Any: ...


class RatesLike(Protocol):
    def busy_cores(self, cpus: Sequence[int] | None = None,
                   fields: tuple[str, ...] = ("system", "softirq", "irq")) -> float: ...


class CpuSampler(Protocol):
    """``polltuned.counters.Sampler`` as seen from here: ``sample()`` returns a snapshot that
    ``polltuned.metrics.window.rates(a, b)`` turns into per-CPU rates."""

    def sample(self) -> Any: ...


def _rates(a: Any, b: Any) -> RatesLike:
    from polltuned.metrics.window import rates  # lazy: the observation layer

    r: RatesLike = rates(a, b)
    return r


def _value(v: Any) -> KnobValue:
    """Actuator.read returns KnobValue (or a record carrying .value); normalise to a plain value."""
    if isinstance(v, (int, float, str)):
        return v
    inner = getattr(v, "value", v)
    if isinstance(inner, (int, float, str)):
        return inner
    return str(inner)


class HostEnv:
    def __init__(self, policy: Policy, actuator: ActuatorLike, probe: Probe, *, clock: Clock,
                 sampler: CpuSampler | None = None, cpus: Sequence[int] | None = None) -> None:
        self.policy = policy
        self.actuator = actuator
        self.probe = probe
        self.clock = clock
        self.sampler = sampler
        self.cpus = list(cpus) if cpus is not None else None

    def current(self) -> dict[str, KnobValue]:
        keys = list(self.policy.knobs)
        got = self.actuator.read(keys)
        return {k: _value(got[k]) for k in keys if k in got}

    def apply(self, config: Config) -> None:
        self.actuator.apply(config, reason="trial")

    def measure(self, window_index: int) -> Window:
        self.clock.sleep(self.policy.tuning.settle_s)
        self.probe.restart()
        s0 = None
        if self.sampler is not None:
            try:
                s0 = self.sampler.sample()
            except PolltunedError as e:
                return Window.failed(f"cpu sampler failed: {e.message}")
        w = self.probe.measure(self.policy.tuning.window_s, window_index)
        if self.sampler is not None and w.ok and w.cpu_cores is None:
            try:
                s1 = self.sampler.sample()
                cores = _rates(s0, s1).busy_cores(self.cpus)
            except (PolltunedError, ValueError, ZeroDivisionError) as e:
                return Window.failed(f"cpu sampler failed: {e}", w.duration_s)
            w = Window(ok=True, latency=w.latency, cpu_cores=cores, throughput_pps=w.throughput_pps,
                       drops_per_s=w.drops_per_s, observations=w.observations, duration_s=w.duration_s,
                       extra=w.extra)
        return w

    def describe(self) -> Mapping[str, object]:
        return {"probe": getattr(self.probe, "name", "?"), "policy": self.policy.name,
                "cpus": self.cpus}


class ScenarioEnv:
    """In-process world: config in a dict, windows from ``scenario.measure``; optional failures."""

    def __init__(self, policy: Policy, scenario: Scenario, *, seed: int,
                 baseline: Mapping[str, KnobValue] | None = None, fail_windows: Sequence[int] = (),
                 fail_apply: Sequence[Mapping[str, KnobValue]] = ()) -> None:
        self.policy = policy
        self.scenario = scenario
        self.rng = np.random.default_rng(seed)
        self.config: dict[str, KnobValue] = dict(baseline) if baseline is not None else default_config(policy)
        self.fail_windows = set(fail_windows)
        self.fail_apply = [dict(c) for c in fail_apply]
        self.applied: list[dict[str, KnobValue]] = []
        self.measured: list[dict[str, KnobValue]] = []

    def current(self) -> dict[str, KnobValue]:
        return dict(self.config)

    def apply(self, config: Config) -> None:
        c = dict(config)
        for bad in self.fail_apply:
            if all(c.get(k) == v for k, v in bad.items()):
                raise PolltunedError(f"simulated apply failure for {bad}")
        self.config.update(c)
        self.applied.append(dict(self.config))

    def measure(self, window_index: int) -> Window:
        self.measured.append(dict(self.config))
        m = self.scenario.measure(self.config, self.rng, window=window_index)
        if window_index in self.fail_windows:
            return Window.failed("simulated probe gap")
        return to_window(m, self.policy.tuning.window_s)

    def describe(self) -> Mapping[str, object]:
        return {"scenario": self.scenario.name}


#: kernel defaults of the knobs polltuned knows (the value a fresh host has)
KERNEL_DEFAULTS: dict[str, KnobValue] = {
    "net.core.busy_read": 0,
    "net.core.busy_poll": 0,
    "net.core.gro_normal_batch": 8,
    "net.core.netdev_budget": 300,
    "net.core.netdev_budget_usecs": 8000,
    "kernel.timer_migration": 1,
    "napi_defer_hard_irqs": 0,
    "gro_flush_timeout": 0,
    "threaded": 0,
    "napi:irq-suspend-timeout": 0,
    "irq_affinity": "spread",
    "module:haltpoll:guest_halt_poll_ns": 200000,
    "module:kvm:halt_poll_ns": 200000,
}


def default_value(key: str) -> KnobValue:
    if key in KERNEL_DEFAULTS:
        return KERNEL_DEFAULTS[key]
    if ":" in key and not key.startswith("module:"):
        suffix = key.split(":", 1)[1]
        if suffix in KERNEL_DEFAULTS:
            return KERNEL_DEFAULTS[suffix]
    return 0


def default_config(policy: Policy) -> dict[str, KnobValue]:
    """Kernel defaults for every knob of the policy (what a fresh host, and a fake tree, start with)."""
    out: dict[str, KnobValue] = {}
    for k, spec in policy.knobs.items():
        v = default_value(k)
        if spec.type == "categorical" and spec.values and v not in spec.values:
            v = spec.values[0]
        out[k] = v
    return out

"""The in-process simulated world, and the kernel defaults of the knobs polltuned knows.

(The live-host TrialEnv, ``HostEnv``, is the engine's: polltuned.engine.env.)

``ScenarioEnv`` is a lightweight in-process world for the tuner-quality benchmark and unit tests:
it keeps the configuration in a dict and calls the scenario directly (no files, no journal), so
thousands of runs stay cheap. It reproduces the same measurement stream as HostEnv+SimProbe for
the same seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from polltuned.errors import PolltunedError
from polltuned.knobs.keys import key_suffix
from polltuned.policy.schema import Policy
from polltuned.records import Config, KnobValue, Window
from polltuned.worlds.scenario import Scenario, to_window


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
    return KERNEL_DEFAULTS.get(key_suffix(key), 0)


def default_config(policy: Policy) -> dict[str, KnobValue]:
    """Kernel defaults for every knob of the policy (what a fresh host, and a fake tree, start with)."""
    out: dict[str, KnobValue] = {}
    for k, spec in policy.knobs.items():
        v = default_value(k)
        if spec.type == "categorical" and spec.values and v not in spec.values:
            v = spec.values[0]
        out[k] = v
    return out

"""The ``sim`` probe: one window = one call of a scenario's ``measure`` on the live knob values.

Each window reads the knob values back from the host (a fake /proc + /sys tree written by the real
Actuator), so the simulated world sees exactly what the engine applied, through the same code
path as a real host. ``make_fake_host_tree`` creates such a tree with the kernel defaults.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from polltuned.clock import Clock
from polltuned.errors import PolltunedError
from polltuned.host.fs import Host
from polltuned.knobs.keys import knob_file
from polltuned.knobs.registry import KnobRegistry
from polltuned.policy.schema import Policy
from polltuned.policy.schema import SimProbe as SimProbeConfig
from polltuned.records import KnobValue, Window
from polltuned.worlds.env import default_value
from polltuned.worlds.scenario import Scenario, load_scenario, to_window


class SimProbe:
    name = "sim"

    def __init__(self, host: Host, policy: Policy | None, scenario: str | Path | Scenario, seed: int = 0, *,
                 clock: Clock | None = None, knob_keys: Sequence[str] | None = None) -> None:
        self.host = host
        self.scenario = scenario if isinstance(scenario, Scenario) else load_scenario(str(scenario))
        self.rng = np.random.default_rng(seed)
        self.clock = clock
        self.registry = KnobRegistry(host)
        if knob_keys is not None:
            self.keys = list(knob_keys)
        elif policy is not None:
            self.keys = list(policy.knobs)
        else:
            # no policy (built by the probe factory): every file-backed knob of the host; never the
            # per-NAPI netlink ones, which would open a real socket
            self.keys = [k for k in self.registry.catalogue_keys() if ":napi:" not in k]
        self.windows = 0

    def start(self) -> None:
        return None

    def restart(self) -> None:
        return None

    def read_config(self) -> dict[str, KnobValue]:
        cfg: dict[str, KnobValue] = {}
        for k in self.keys:
            try:
                cfg[k] = self.registry.get(k).read()
            except PolltunedError:
                continue  # a knob this (fake) host does not have: the scenario uses its default
        return cfg

    def measure(self, duration_s: float, window_index: int) -> Window:
        try:
            cfg = self.read_config()
            m = self.scenario.measure(cfg, self.rng, window=window_index)
        except PolltunedError as e:
            return Window.failed(f"sim: {e.message}", duration_s)
        if not all(math.isfinite(m.get(k, math.nan)) for k in ("p99_us", "cpu_cores")):
            return Window.failed("sim: scenario returned a non-finite p99_us/cpu_cores", duration_s)
        if self.clock is not None:
            self.clock.sleep(duration_s)
        self.windows += 1
        return to_window(m, duration_s)

    def close(self) -> None:
        return None


def make_sim_probe(cfg: SimProbeConfig, host: Host, *, clock: Clock, policy: Policy | None = None,
                   seed: int = 0) -> SimProbe:
    """Factory entry point (``polltuned.probes.factory``): the scenario named by the probe config."""
    return SimProbe(host, policy, cfg.scenario, seed, clock=clock)


def make_fake_host_tree(root: Path, knob_keys: Iterable[str]) -> None:
    """Create the knob files of ``knob_keys`` under ``root`` with kernel default values
    (sysctls under proc/sys, device attributes under sys/class/net/DEV, module parameters under
    sys/module/NAME/parameters). Existing files are left as they are (a restart keeps state)."""
    for key in knob_keys:
        p = knob_file(key)
        if p is None:
            continue
        f = root / p.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        if not f.exists():
            f.write_text(f"{default_value(key)}\n")
        if p.startswith("/sys/class/net/"):
            dev = p[len("/sys/class/net/"):].rsplit("/", 1)[0]
            ifx = root / "sys/class/net" / dev / "ifindex"
            if not ifx.exists():
                n = 2 + sum(1 for _ in (root / "sys/class/net").iterdir())
                ifx.write_text(f"{n}\n")

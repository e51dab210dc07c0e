"""The boundary between the tuning engine and the world it tunes.

The engine (polltuned.tuner) only ever talks to a TrialEnv. Implementations:
  * the live host (daemon wiring): Actuator for knobs + a Probe + counters for CPU;
  * the simulated world (polltuned sim): Actuator on a fake /proc+/sys tree + a scenario file;
  * the embedded default world (polltuned bench): real knobs + netns/veth + sockperf.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from polltuned.records import Config, KnobValue, Window


class TrialEnv(Protocol):
    def current(self) -> dict[str, KnobValue]:
        """Live values of every knob in the search space (the baseline when tuning starts)."""
        ...

    def apply(self, config: Config) -> None:
        """Apply a whole assignment as one transaction (journal first, verify, undo on failure).
        Raises PolltunedError when it could not be applied; the host is then unchanged."""
        ...

    def measure(self, window_index: int) -> Window:
        """Settle, restart the probe (fresh sockets) and measure one window under the applied config."""
        ...

    def describe(self) -> Mapping[str, object]:
        """Facts for reports: host, nic, probe, workload."""
        ...

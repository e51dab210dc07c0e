"""The probe interface."""

from __future__ import annotations

from typing import Protocol

from polltuned.records import Window


class Probe(Protocol):
    """One latency source.

    ``measure`` blocks for about ``duration_s`` and returns a Window. It never raises for a
    measurement failure: a probe that fails, times out or sees no traffic returns
    ``Window.failed(reason)`` (never a fake number) and logs one clear line.
    ``restart`` is called after every knob change, before the next window: probes that own
    their sockets (sockperf) must create fresh sockets so that socket-creation-time knobs
    (net.core.busy_read) take effect.
    """

    name: str

    def start(self) -> None: ...
    def restart(self) -> None: ...
    def measure(self, duration_s: float, window_index: int) -> Window: ...
    def close(self) -> None: ...

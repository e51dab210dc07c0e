"""Frozen records shared between layers (probes, engine, daemon, CLI)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

KnobValue = int | float | str
Config = Mapping[str, KnobValue]

#: Latency statistics a probe may report, in microseconds, keyed as in Window.latency.
LATENCY_STATS = ("p50", "p90", "p99", "p999", "mean", "max")


@dataclass(frozen=True)
class Window:
    """Result of one measurement window.

    ``ok`` is False when the probe failed, timed out or the window had a gap; such a window
    carries ``error`` and must never be scored as a good number.
    latency: statistic name (see LATENCY_STATS) -> microseconds.
    cpu_cores: cores spent in system+softirq+irq (+ workload system time) over the window.
    histogram: see polltuned.histogram; where there is one, the objective's percentile comes from it.
    """

    ok: bool
    latency: Mapping[str, float] = field(default_factory=dict)
    cpu_cores: float | None = None
    throughput_pps: float | None = None
    drops_per_s: float | None = None
    observations: int = 0
    duration_s: float = 0.0
    error: str | None = None
    extra: Mapping[str, float] = field(default_factory=dict)
    #: what the load looked like during the window (signal name -> value), chosen so that the
    #: knobs' own effects do not move it: the contextual model's inputs (empty when unknown)
    context: Mapping[str, float] = field(default_factory=dict)
    #: the window's latency histogram when the probe gives one (polltuned.histogram: HdrHistogram
    #: V2 compressed base64 text, ns): windows, rounds and hosts merge by adding it
    histogram: str | None = None

    @staticmethod
    def failed(error: str, duration_s: float = 0.0) -> Window:
        return Window(ok=False, error=error, duration_s=duration_s)

    def stat(self, name: str) -> float | None:
        v = self.latency.get(name)
        if v is None or not math.isfinite(v):
            return None
        return v

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "latency": dict(self.latency),
            "cpu_cores": self.cpu_cores,
            "throughput_pps": self.throughput_pps,
            "drops_per_s": self.drops_per_s,
            "observations": self.observations,
            "duration_s": self.duration_s,
            "error": self.error,
            "extra": dict(self.extra),
            "context": dict(self.context),
            **({"histogram": self.histogram} if self.histogram is not None else {}),
        }

    @staticmethod
    def from_json(d: Mapping[str, object]) -> Window:
        def f(x: object) -> float | None:
            return None if x is None else float(x)  # type: ignore[arg-type]

        lat = d.get("latency") or {}
        extra = d.get("extra") or {}
        ctx = d.get("context") or {}
        hist = d.get("histogram")
        return Window(
            ok=bool(d.get("ok")),
            latency={str(k): float(v) for k, v in lat.items()},  # type: ignore[attr-defined]
            cpu_cores=f(d.get("cpu_cores")),
            throughput_pps=f(d.get("throughput_pps")),
            drops_per_s=f(d.get("drops_per_s")),
            observations=int(d.get("observations") or 0),  # type: ignore[call-overload]
            duration_s=float(d.get("duration_s") or 0.0),  # type: ignore[arg-type]
            error=None if d.get("error") is None else str(d.get("error")),
            extra={str(k): float(v) for k, v in extra.items()},  # type: ignore[attr-defined]
            context={str(k): float(v) for k, v in ctx.items()},  # type: ignore[attr-defined]
            histogram=hist if isinstance(hist, str) and hist else None,
        )

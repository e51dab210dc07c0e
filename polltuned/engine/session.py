"""The typed state of one tuning session, and what it produces."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from polltuned.engine.hold import HoldState
from polltuned.engine.phases import Phase, WindowKind
from polltuned.engine.reference import ReferenceSeries
from polltuned.optimiser import Optimiser
from polltuned.records import KnobValue
from polltuned.safety import Verdict
from polltuned.study.base import SessionLog


@dataclass(frozen=True)
class TrialRecord:
    index: int
    config: dict[str, KnobValue]
    status: str                      # ok | failed | aborted
    values: tuple[float, ...]        # J of each usable window
    reason: str = ""

    def to_json(self) -> dict[str, object]:
        return {"index": self.index, "config": dict(self.config), "status": self.status,
                "values": list(self.values), "reason": self.reason}


@dataclass(frozen=True)
class TuningResult:
    baseline_config: dict[str, KnobValue]
    baseline_value: float
    best_config: dict[str, KnobValue]
    best_value: float
    trials: tuple[TrialRecord, ...]
    verdict: Verdict | None
    deployed: dict[str, KnobValue]
    deployed_is_baseline: bool
    reason: str
    guard_events: tuple[str, ...]
    windows_used: int
    stopped: bool = False
    mode: str = "search"             # search | resume | observe
    noise_sd: float = math.nan       # window-to-window sd of log J measured on the references
    dropped_knobs: tuple[tuple[str, str], ...] = ()
    would_try: tuple[dict[str, KnobValue], ...] = ()

    def to_json(self) -> dict[str, object]:
        def f(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "baseline_config": dict(self.baseline_config),
            "baseline_value": f(self.baseline_value),
            "best_config": dict(self.best_config),
            "best_value": f(self.best_value),
            "trials": [t.to_json() for t in self.trials],
            "counts": {s: sum(1 for t in self.trials if t.status == s) for s in ("ok", "failed", "aborted")},
            "confirmation": self.verdict.to_json() if self.verdict else None,
            "deployed": dict(self.deployed),
            "deployed_is_baseline": self.deployed_is_baseline,
            "reason": self.reason,
            "guard_events": list(self.guard_events),
            "windows_used": self.windows_used,
            "stopped": self.stopped,
            "mode": self.mode,
            "noise_sd": f(self.noise_sd),
            "dropped_knobs": {k: why for k, why in self.dropped_knobs},
            "would_try": [dict(c) for c in self.would_try],
        }


@dataclass(frozen=True)
class WindowObs:
    """One usable window of the current regime, as the model sees it."""

    index: int
    config: dict[str, KnobValue]
    log_j: float
    reference: bool                  # a baseline window of the reference series
    aborted: bool = False            # broke the guard (told capped)
    infeasible: bool = False         # broke a constraint (told capped, + margin)
    context: Mapping[str, float] = field(default_factory=dict)   # the load the window saw


@dataclass
class Trace:
    """What the benchmark needs to score exploration: the config measured in each window, and the
    recommendation after each trial (keyed by windows used)."""

    windows: list[tuple[WindowKind, dict[str, KnobValue]]] = field(default_factory=list)
    recommendations: list[tuple[int, dict[str, KnobValue]]] = field(default_factory=list)


@dataclass
class SessionState:
    """Everything one session knows: the engine keeps no state beside it (the phase handlers of
    polltuned.engine.core read and write it, the phase field says which handler runs next)."""

    session: str
    baseline: dict[str, KnobValue]   # the kernel's original values when the session started
    base_key: str
    optimiser: Optimiser
    mode: str = "search"             # search | resume | observe
    phase: Phase = Phase.IDLE        # the next phase handler to run (IDLE: not started)
    stop: bool = False               # a stop was requested (acted on between windows)
    result: TuningResult | None = None
    resume: bool = False             # check a confirmed deployment on record before searching
    resumed: SessionLog | None = None  # the unfinished session this one continues (replayed at start)
    index: int = 0                   # the next window's index (every window: budget, confirm, hold)
    context: Mapping[str, float] = field(default_factory=dict)  # the load the last window saw
    budget_end: int = 0              # the search phase ends when windows_used reaches it
    follow: bool = False             # after the first decision: HOLD (follow the load) instead of DONE
    hold: HoldState | None = None    # HOLD's regions, table and counters (None until the first decision)
    #: observations of earlier regimes (before a region search re-based the references), with the
    #: told value they had then and their context: the model keeps learning from them
    frozen: list[tuple[dict[str, KnobValue], float, Mapping[str, float]]] = field(default_factory=list)
    refs: ReferenceSeries = field(default_factory=ReferenceSeries)
    obs: list[WindowObs] = field(default_factory=list)
    prior: list[tuple[dict[str, KnobValue], float]] = field(default_factory=list)
    shared: list[tuple[dict[str, KnobValue], float]] = field(default_factory=list)
    in_class: bool = False           # the store's workload class accepted this host (fleet)
    trials: list[TrialRecord] = field(default_factory=list)
    guard_events: list[str] = field(default_factory=list)
    windows_used: int = 0
    trial_no: int = 0
    since_ref: int = 0               # trial windows measured since the last reference window
    base_drops: float | None = None
    consecutive_failures: int = 0
    best_known: dict[str, KnobValue] = field(default_factory=dict)

    @property
    def j_ref(self) -> float:
        lv = self.refs.mean_level()
        return math.exp(lv) if lv is not None else math.nan

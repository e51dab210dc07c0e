"""The engine's phases and the events it reports.

One enum for the whole state machine of DESIGN.md: the tuning session's own phases (BASELINE …
CONFIRM, RESUME, OBSERVE, DONE) and the daemon controller's (RECOVER, HOLD, ROLLBACK, STOPPED,
IDLE), so the controller relays the engine's phases without translating strings.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Phase(enum.StrEnum):
    IDLE = "IDLE"
    RECOVER = "RECOVER"
    RELOAD = "RELOAD"
    RESUME = "RESUME"
    OBSERVE = "OBSERVE"
    BASELINE = "BASELINE"
    PROPOSE = "PROPOSE"
    APPLY = "APPLY"
    SETTLE = "SETTLE"
    MEASURE = "MEASURE"
    SCORE = "SCORE"
    CONFIRM = "CONFIRM"
    HOLD = "HOLD"
    ROLLBACK = "ROLLBACK"
    DONE = "DONE"
    STOPPED = "STOPPED"


class WindowKind(enum.StrEnum):
    REFERENCE = "reference"   # the session's baseline (the kernel's originals), interleaved with trials
    TRIAL = "trial"           # the first window of a configuration the optimiser proposed
    REPEAT = "repeat"         # another window of the same visit (the noise demanded it)
    CONFIRM = "confirm"       # interleaved A/B pairs: baseline against the candidate
    RESUME = "resume"         # the short check of a deployment on record, at start
    HOLD = "hold"             # watching the active deployment
    CHALLENGE = "challenge"   # a challenger against the active deployment, in pairs
    FALLBACK = "fallback"     # the active deployment against the originals, after a jump


#: study records written before window kinds existed named the reference windows "baseline"
LEGACY_PHASES = {"baseline": WindowKind.REFERENCE}


def window_kind(phase: str) -> WindowKind | None:
    """The kind of a study window record (old files: ``baseline`` = reference); None if unknown."""
    if phase in LEGACY_PHASES:
        return LEGACY_PHASES[phase]
    try:
        return WindowKind(phase)
    except ValueError:
        return None


class EventKind(enum.StrEnum):
    PHASE = "phase"           # progress: a phase change or a window measured
    WINDOW = "window"         # a window's outcome
    GUARD = "guard"           # the guard fired (a trial aborted, an apply failed, the baseline put back)
    SHIFT = "shift"           # the workload shifted under the search
    DEPLOY = "deploy"         # a configuration was deployed
    KEEP = "keep"             # the baseline (or the active entry) was kept
    SWITCH = "switch"         # HOLD switched to another table entry
    CHALLENGE = "challenge"   # a challenger started / was decided
    FALLBACK = "fallback"     # HOLD measured the active entry against the originals
    STOP = "stop"             # the session ended on request


@dataclass(frozen=True)
class Event:
    """What the engine reports after every phase change and every window."""

    phase: Phase
    message: str
    trial: int | None = None
    window: int | None = None
    value: float | None = None
    kind: EventKind = EventKind.PHASE

    def to_json(self) -> dict[str, object]:
        return {"phase": self.phase.value, "message": self.message, "trial": self.trial,
                "window": self.window, "value": self.value, "kind": self.kind.value}

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


@dataclass(frozen=True)
class Event:
    """What the engine reports after every phase change and every window."""

    phase: Phase
    message: str
    trial: int | None = None
    window: int | None = None
    value: float | None = None

    def to_json(self) -> dict[str, object]:
        return {"phase": self.phase.value, "message": self.message, "trial": self.trial,
                "window": self.window, "value": self.value}

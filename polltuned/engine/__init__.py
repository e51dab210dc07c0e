"""The tuning engine: an ask/tell state machine over one session (polltuned.engine.core.Engine:
``next_action() -> Apply | Measure | Done``, ``observe(window)``), the actions and typed kinds
(polltuned.engine.actions), the one driver loop (polltuned.engine.driver.drive), the world it talks
to (polltuned.engine.env), the reference series that measures through drift
(polltuned.engine.reference), the fitting of a policy to the host (polltuned.engine.compat), and
the one builder the daemon, ``sim`` and ``bench`` use (polltuned.engine.builder)."""

from polltuned.engine.phases import Event, EventKind, Phase, WindowKind
from polltuned.engine.session import TrialRecord, TuningResult

__all__ = ["Event", "EventKind", "Phase", "TrialRecord", "TuningResult", "WindowKind"]

"""The tuning engine: one session of baseline, search, confirmation (polltuned.engine.tuner), the
world it talks to (polltuned.engine.env), the reference series that measures through drift
(polltuned.engine.reference), and the one builder the daemon, ``sim`` and ``bench`` use
(polltuned.engine.builder)."""

from polltuned.engine.phases import Event, Phase
from polltuned.engine.session import TrialRecord, TuningResult

__all__ = ["Event", "Phase", "TrialRecord", "TuningResult"]

"""What the engine asks its driver to do, and the typed kinds of windows and events.

The engine (polltuned.engine.core.Engine) never touches the world itself: ``next_action()``
returns an :class:`Apply` (write this whole configuration), a :class:`Measure` (measure one window
under what is applied now, then hand it to ``observe``) or :class:`Done`. Every window carries a
:class:`WindowKind` (what it is for) instead of a magic trial number, and every event an
:class:`EventKind` (what happened) instead of a message to grep.
"""

from __future__ import annotations

from dataclasses import dataclass

from polltuned.engine.phases import LEGACY_PHASES, EventKind, WindowKind, window_kind
from polltuned.engine.session import TuningResult
from polltuned.records import Config

__all__ = ["LEGACY_PHASES", "Action", "Apply", "Done", "EventKind", "Measure", "WindowKind", "window_kind"]


@dataclass(frozen=True)
class Apply:
    """Apply ``config`` as one transaction; on PolltunedError call ``engine.apply_failed``."""

    config: Config
    kind: WindowKind
    reason: str = ""


@dataclass(frozen=True)
class Measure:
    """Measure window ``index`` under the applied configuration; hand it to ``engine.observe``."""

    index: int
    kind: WindowKind
    trial: int | None = None


@dataclass(frozen=True)
class Done:
    result: TuningResult


Action = Apply | Measure | Done

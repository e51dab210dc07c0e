"""The one driver loop: ``polltuned sim``, the bench, benchmarks/tuner_quality.py and
benchmarks/fleet.py run the engine through :func:`drive` (the daemon's controller drives the same
``next_action``/``observe`` API itself, between its watchdog pings and status updates)."""

from __future__ import annotations

from collections.abc import Callable

from polltuned.engine.actions import Apply, Done, Measure
from polltuned.engine.core import Engine
from polltuned.engine.env import TrialEnv
from polltuned.engine.phases import Event
from polltuned.engine.session import TuningResult
from polltuned.errors import PolltunedError


def perform(engine: Engine, env: TrialEnv, action: Apply | Measure) -> bool:
    """Carry out one Apply or Measure against ``env`` and answer the engine; True for a window."""
    if isinstance(action, Apply):
        try:
            env.apply(action.config)
        except PolltunedError as e:
            engine.apply_failed(e)  # the actuator left the host unchanged
        return False
    engine.observe(env.measure(action.index))
    return True


def drive(engine: Engine, env: TrialEnv, *, on_event: Callable[[Event], None] | None = None,
          should_stop: Callable[[], bool] | None = None, max_windows: int | None = None) -> TuningResult | None:
    """Run ``engine`` against ``env`` until it is done; its result. ``should_stop`` is asked before
    every action; after ``max_windows`` measured windows the engine is asked to stop (it then
    finishes what it must: putting a configuration back, maybe one more window of a pair)."""
    windows = 0
    while True:
        if (should_stop is not None and should_stop()) or (max_windows is not None and windows >= max_windows):
            engine.request_stop()
        action = engine.next_action()
        for ev in engine.drain_events():
            if on_event is not None:
                on_event(ev)
        if isinstance(action, Done):
            return action.result
        windows += perform(engine, env, action)

"""Test helpers over the engine's ask/tell API: build an engine for a ScenarioEnv-like world, and
step it event by event (what a test that stops half-way, or runs two hosts in lockstep, needs)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from polltuned.clock import FakeClock
from polltuned.engine.actions import Done
from polltuned.engine.core import Engine
from polltuned.engine.driver import perform
from polltuned.engine.env import TrialEnv
from polltuned.engine.phases import Event
from polltuned.engine.session import TuningResult
from polltuned.policy.schema import Policy
from polltuned.records import KnobValue
from polltuned.study import Study


def engine_for(p: Policy, env: TrialEnv, store: Study, **kw: Any) -> Engine:
    """An engine whose baseline is ``env``'s current values (what the builder does)."""
    kw.setdefault("clock", FakeClock())
    return Engine(p, store, current=env.current(), **kw)


def events(engine: Engine, env: TrialEnv) -> Generator[Event, None, None]:
    """The engine's events, one at a time, performing its actions against ``env`` in between."""
    while True:
        action = engine.next_action()
        yield from engine.drain_events()
        if isinstance(action, Done):
            return
        perform(engine, env, action)


def result_with(deployed: dict[str, KnobValue], *, baseline_value: float = 1.0) -> TuningResult:
    """A finished round's result that deployed ``deployed`` (for fake engines)."""
    return TuningResult(baseline_config={}, baseline_value=baseline_value, best_config=dict(deployed),
                        best_value=baseline_value, trials=(), verdict=None, deployed=dict(deployed),
                        deployed_is_baseline=False, reason="deployed (fake)", guard_events=(), windows_used=0)

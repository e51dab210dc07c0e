"""Durable trial history: resume an unfinished study, warm-start a new one, tolerate a torn tail."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from polltuned.clock import FakeClock
from polltuned.errors import JournalError
from polltuned.optimiser import Recommendation
from polltuned.optimiser.baselines import RandomOptimiser
from polltuned.optimiser.space import Space
from polltuned.policy.loader import load_policy
from polltuned.policy.schema import Policy
from polltuned.records import KnobValue
from polltuned.study import Study, fingerprint, parse_study
from polltuned.tuner import Tuner
from polltuned.worlds.env import ScenarioEnv, default_config
from polltuned.worlds.scenario import load_scenario


def policy(budget: int = 12, warm: bool = True) -> Policy:
    p = load_policy("sim-default")
    return p.model_copy(update={"tuning": p.tuning.model_copy(update={"budget": budget, "warm_start": warm,
                                                                      "optimiser": "random"})})


class SpyOptimiser(RandomOptimiser):
    def __init__(self, space: Space, baseline: Mapping[str, KnobValue], seed: int) -> None:
        super().__init__(space, baseline, seed=seed)
        self.told: list[tuple[dict[str, KnobValue], float]] = []

    def tell(self, config: Mapping[str, KnobValue], y: float) -> None:
        self.told.append((dict(config), y))
        super().tell(config, y)

    def best(self) -> Recommendation | None:
        return super().best()


def test_resume_continues_the_unfinished_session(tmp_path: Path) -> None:
    p = policy(budget=12)
    sc = load_scenario("busypoll_split")
    env = ScenarioEnv(p, sc, seed=0)
    study = Study.open(tmp_path, p)
    t1 = Tuner(p, env, study, clock=FakeClock())
    gen = t1.run()
    for ev in gen:  # "crash" after the 6th window
        if ev.window is not None and ev.window >= 5 and ev.phase == "MEASURE":
            break
    gen.close()
    s = study.sessions()
    assert len(s) == 1 and not s[0].ended
    done_before = len([w for w in s[0].windows if w.phase in ("baseline", "trial")])
    assert done_before == 6  # journalled before the event that reported it

    env2 = ScenarioEnv(p, sc, seed=1, baseline=default_config(p))
    spy = SpyOptimiser(Space.from_policy(p), env2.current(), seed=0)
    t2 = Tuner(p, env2, Study.open(tmp_path, p), clock=FakeClock(), optimiser=spy)
    list(t2.run())
    assert t2.result is not None and t2.result.windows_used == 12
    # only the remaining 6 windows were measured during the search, the baseline was not re-measured
    assert len([w for w in t2.trace.windows if w[0] != "confirm"]) == 12 - done_before
    assert all(c != ("baseline", default_config(p)) for c in t2.trace.windows)
    assert len(spy.told) >= done_before  # old windows replayed into the fresh optimiser
    s2 = Study.open(tmp_path, p).sessions()
    assert len(s2) == 1 and s2[0].ended and s2[0].session == s[0].session


def test_warm_start_tells_earlier_sessions(tmp_path: Path) -> None:
    p = policy(budget=8)
    sc = load_scenario("epoll_busypoll")
    t1 = Tuner(p, ScenarioEnv(p, sc, seed=0), Study.open(tmp_path, p), clock=FakeClock())
    list(t1.run())
    env = ScenarioEnv(p, sc, seed=1)
    spy = SpyOptimiser(Space.from_policy(p), env.current(), seed=1)
    gen = Tuner(p, env, Study.open(tmp_path, p), clock=FakeClock(), optimiser=spy).run()
    first = next(gen)
    assert "warm start" in first.message
    assert len(spy.told) >= 8  # before a single new window was measured
    gen.close()

    cold = policy(budget=8, warm=False)
    spy2 = SpyOptimiser(Space.from_policy(cold), env.current(), seed=1)
    gen2 = Tuner(cold, ScenarioEnv(cold, sc, seed=1), Study.open(tmp_path, cold), clock=FakeClock(),
                 optimiser=spy2).run()
    next(gen2)
    assert spy2.told == []
    gen2.close()


def test_fingerprint_separates_policies() -> None:
    p = policy()
    q = p.model_copy(update={"objective": p.objective.model_copy(update={"cpu_weight": 1.0})})
    assert fingerprint(p) != fingerprint(q)
    assert fingerprint(p) == fingerprint(policy(budget=99))  # the budget does not change the function


def test_torn_tail_is_ignored_but_corruption_in_the_middle_is_an_error() -> None:
    good = json.dumps({"v": 1, "kind": "session", "session": "a", "baseline": {"x": 1}, "seed": 0})
    win = json.dumps({"v": 1, "kind": "window", "session": "a", "trial": 0, "phase": "trial",
                      "config": {"x": 2}, "status": "ok", "y": -0.1})
    s = parse_study(good + "\n" + win + "\n" + '{"v": 1, "kind": "wi')
    assert len(s) == 1 and len(s[0].windows) == 1 and s[0].windows[0].y == -0.1
    with pytest.raises(JournalError):
        parse_study(good + "\n{broken\n" + win + "\n")
    with pytest.raises(JournalError, match="version"):
        parse_study(json.dumps({"v": 99, "kind": "session", "session": "a"}) + "\n")

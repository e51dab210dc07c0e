"""Durable trial history: resume an unfinished study, warm-start a new one (on every store backend:
JSON lines, SQLite, PostgreSQL, the fleet store), tolerate a torn tail."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from polltuned.engine.driver import drive
from polltuned.errors import JournalError
from polltuned.optimiser import Context, Recommendation
from polltuned.optimiser.baselines import RandomOptimiser
from polltuned.optimiser.space import Space
from polltuned.policy.loader import load_policy
from polltuned.policy.schema import Policy
from polltuned.records import KnobValue
from polltuned.study import fingerprint, parse_study
from polltuned.worlds.env import ScenarioEnv, default_config
from polltuned.worlds.scenario import load_scenario
from tests.engine_run import engine_for
from tests.engine_run import events as steps


def policy(budget: int = 12, warm: bool = True) -> Policy:
    p = load_policy("sim-default")
    return p.model_copy(update={"tuning": p.tuning.model_copy(update={"budget": budget, "warm_start": warm,
                                                                      "optimiser": "random"})})


class SpyOptimiser(RandomOptimiser):
    def __init__(self, space: Space, baseline: Mapping[str, KnobValue], seed: int) -> None:
        super().__init__(space, baseline, seed=seed)
        self.told: list[tuple[dict[str, KnobValue], float]] = []
        self.retold: list[tuple[dict[str, KnobValue], float]] = []

    def tell(self, config: Mapping[str, KnobValue], y: float, *, context: Context | None = None) -> None:
        self.told.append((dict(config), y))
        super().tell(config, y, context=context)

    def retell(self, observations: Sequence[tuple[Mapping[str, KnobValue], float]], *,
               contexts: Sequence[Context | None] | None = None) -> None:
        self.retold = [(dict(c), y) for c, y in observations]
        super().retell(observations, contexts=contexts)

    def best(self) -> Recommendation | None:
        return super().best()


def test_resume_continues_the_unfinished_session(store_factory: Any) -> None:
    p = policy(budget=12)
    sc = load_scenario("busypoll_split")
    env = ScenarioEnv(p, sc, seed=0)
    study = store_factory(p)
    t1 = engine_for(p, env, study)
    gen = steps(t1, env)
    for ev in gen:  # "crash" after the 6th window
        if ev.window is not None and ev.window >= 5 and ev.phase == "MEASURE":
            break
    gen.close()
    s = study.sessions()
    assert len(s) == 1 and not s[0].ended
    done_before = len([w for w in s[0].windows if w.phase in ("reference", "trial", "repeat")])
    assert done_before == 6  # journalled before the event that reported it

    env2 = ScenarioEnv(p, sc, seed=1, baseline=default_config(p))
    spy = SpyOptimiser(Space.from_policy(p), env2.current(), seed=0)
    t2 = engine_for(p, env2, store_factory(p), optimiser=spy)
    drive(t2, env2)
    assert t2.result is not None and t2.result.windows_used == 12
    # only the remaining 6 windows were measured during the search
    assert len([w for w in t2.trace.windows if w[0] in ("reference", "trial", "repeat")]) == 12 - done_before
    assert t2.trace.windows[0][0] == "trial"  # the baseline phase is not repeated
    # the old windows were replayed into the fresh optimiser as log-ratios to their references
    assert len(spy.retold) >= done_before
    assert all(abs(y) < 5 for _, y in spy.retold)
    s2 = store_factory(p).sessions()
    assert len(s2) == 1 and s2[0].ended and s2[0].session == s[0].session


def test_warm_start_tells_comparable_values_only(store_factory: Any) -> None:
    p = policy(budget=8)
    sc = load_scenario("epoll_busypoll")
    base = default_config(p)
    env1 = ScenarioEnv(p, sc, seed=0)
    drive(engine_for(p, env1, store_factory(p)), env1)
    first_session = store_factory(p).sessions()[0]
    expected = [(w.config, w.y) for w in first_session.windows
                if w.y is not None and w.phase in ("reference", "trial", "repeat") and w.status in ("ok", "aborted")]
    assert expected and all(w.ratio for w in first_session.windows if w.phase == "reference" and w.y is not None)
    # an old-format session (a baseline window's raw J stored in y) and a session that started from
    # another baseline are on file too: neither may reach the optimiser
    other = {**base, "net.core.busy_poll": 50}
    st = store_factory(p)
    for rec in ({"kind": "session", "session": "old", "baseline": base, "seed": 0},
                {"kind": "window", "session": "old", "trial": -1, "phase": "baseline", "config": base,
                 "status": "ok", "y": 233.2, "value": 233.2},
                {"kind": "window", "session": "old", "trial": 0, "phase": "trial", "config": other,
                 "status": "ok", "y": -0.19},
                {"kind": "end", "session": "old", "result": {}},
                {"kind": "session", "session": "elsewhere", "baseline": other, "seed": 0},
                {"kind": "window", "session": "elsewhere", "trial": 0, "phase": "trial", "config": base,
                 "status": "ok", "y": 0.4},
                {"kind": "end", "session": "elsewhere", "result": {}}):
        fields = {k: v for k, v in rec.items() if k != "kind"}
        st.append(str(rec["kind"]), **fields)
    env = ScenarioEnv(p, sc, seed=1)
    spy = SpyOptimiser(Space.from_policy(p), env.current(), seed=1)
    gen = steps(engine_for(p, env, store_factory(p), optimiser=spy), env)
    first = next(gen)
    assert "warm start" in first.message
    for _ in range(3):  # the first baseline window of the new session: priors are told with it
        next(gen)
    told = [(c, y) for c, y in spy.retold]
    prior = told[: len(expected) + 1]
    assert [y for _, y in prior] == [y for _, y in expected] + [-0.19]   # exactly these values
    assert all(y != 233.2 and y != 0.4 for _, y in told)
    gen.close()

    cold = policy(budget=8, warm=False)
    spy2 = SpyOptimiser(Space.from_policy(cold), env.current(), seed=1)
    env_cold = ScenarioEnv(cold, sc, seed=1)
    gen2 = steps(engine_for(cold, env_cold, store_factory(cold), optimiser=spy2), env_cold)
    for _ in range(3):
        next(gen2)
    assert spy2.told == [] and all(c == default_config(cold) for c, _ in spy2.retold)
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

"""The tuning loop: baseline first, budget in windows, guard + rollback, failed windows, confirmation."""

from __future__ import annotations

from pathlib import Path

import pytest

from polltuned.engine.core import Engine
from polltuned.engine.driver import drive
from polltuned.optimiser import make_optimiser
from polltuned.optimiser.space import Space
from polltuned.policy.loader import load_policy
from polltuned.policy.schema import Policy
from polltuned.study import Study, memory_study
from polltuned.worlds.env import ScenarioEnv, default_config
from polltuned.worlds.scenario import load_scenario
from tests.engine_run import engine_for
from tests.engine_run import events as steps


def policy(**tuning: object) -> Policy:
    p = load_policy("sim-default")
    return p.model_copy(update={"tuning": p.tuning.model_copy(update=tuning)})


def run(p: Policy, scenario: str, *, seed: int = 0, optimiser: str | None = None,
        env: ScenarioEnv | None = None, study: Study | None = None) -> tuple[Engine, ScenarioEnv]:
    sc = load_scenario(scenario)
    env = env or ScenarioEnv(p, sc, seed=seed)
    opt = None
    if optimiser is not None:
        opt = make_optimiser(optimiser, Space.from_policy(p), env.current(), seed=seed)
    t = engine_for(p, env, study or memory_study(p), optimiser=opt)
    events = list(steps(t, env))
    assert events[-1].phase == "DONE"
    assert all(e.to_json()["phase"] == e.phase for e in events)
    return t, env


def test_baseline_first_and_budget_counted_in_windows() -> None:
    p = policy(budget=14)
    t, env = run(p, "busypoll_split", optimiser="random")
    base = default_config(p)
    assert env.measured[0] == base and env.measured[1] == base
    search = [w for w in t.trace.windows if w[0] != "confirm"]
    assert len(search) == 14
    assert t.result is not None and t.result.windows_used == 14


def test_finds_and_deploys_a_real_gain() -> None:
    t, env = run(policy(budget=20), "busypoll_split", seed=1)
    r = t.result
    assert r is not None and r.verdict is not None
    assert r.verdict.deploy and not r.deployed_is_baseline
    assert 20 <= int(r.deployed["net.core.busy_read"]) <= 120
    assert env.config["net.core.busy_read"] == r.deployed["net.core.busy_read"]  # left applied
    assert len(r.verdict.baseline_samples) >= 6  # interleaved pairs measured


def test_keeps_the_baseline_when_nothing_helps() -> None:
    t, env = run(policy(budget=16), "nothing_helps", seed=2, optimiser="random")
    r = t.result
    assert r is not None and r.deployed_is_baseline
    assert env.config == default_config(policy())
    assert "baseline" in r.reason


def test_guard_aborts_a_harmful_trial_and_rolls_back() -> None:
    # busy polling on a shared CPU: the busy_read seed is +500 %; the guard must abort it after
    # one window and put the best known assignment back before anything else happens
    t, env = run(policy(budget=12), "busypoll_shared", seed=0)
    r = t.result
    assert r is not None
    aborted = [tr for tr in r.trials if tr.status == "aborted"]
    assert aborted and all(len(tr.values) == 1 for tr in aborted)
    assert any("net.core.busy_read" in g or "objective" in g for g in r.guard_events)
    bad = aborted[0].config
    i = env.applied.index({**default_config(policy()), **bad})
    assert env.applied[i + 1]["net.core.busy_read"] == 0  # rolled back
    assert int(r.deployed["net.core.busy_read"]) == 0 and int(r.deployed["net.core.busy_poll"]) == 0


def test_failed_windows_are_recorded_failed_and_never_told() -> None:
    p = policy(budget=10)
    sc = load_scenario("busypoll_split")
    env = ScenarioEnv(p, sc, seed=0, fail_windows=[2, 3])
    opt = make_optimiser("random", Space.from_policy(p), env.current(), seed=0)
    t = engine_for(p, env, memory_study(p), optimiser=opt)
    drive(t, env)
    r = t.result
    assert r is not None
    failed = [tr for tr in r.trials if tr.status == "failed"]
    assert len(failed) >= 1 and failed[0].values == ()
    told = opt.hist.order  # type: ignore[attr-defined]
    sp = Space.from_policy(p)
    assert all(k != sp.key_of(failed[0].config) for k, _ in told)


def test_apply_failure_is_a_failed_trial_not_a_crash() -> None:
    p = policy(budget=8)
    sc = load_scenario("busypoll_split")
    env = ScenarioEnv(p, sc, seed=0, fail_apply=[{"kernel.timer_migration": 0}])
    t = engine_for(p, env, memory_study(p))
    drive(t, env)
    r = t.result
    assert r is not None
    assert any(tr.status == "failed" and "apply failed" in tr.reason for tr in r.trials)


def test_request_stop_restores_the_baseline() -> None:
    p = policy(budget=20)
    sc = load_scenario("busypoll_split")
    env = ScenarioEnv(p, sc, seed=0)
    t = engine_for(p, env, memory_study(p))
    for ev in steps(t, env):
        if ev.phase == "SCORE" and ev.trial == 2:
            t.request_stop()
    r = t.result
    assert r is not None and r.stopped and r.deployed_is_baseline
    assert env.config == default_config(p)
    assert r.windows_used < 20


def test_workload_change_is_caught_by_confirmation() -> None:
    # busy polling wins before window 16 and is a disaster after: never deploy it
    t, _ = run(policy(budget=30), "workload_shift", seed=3)
    r = t.result
    assert r is not None
    assert int(r.deployed.get("net.core.busy_read", 0)) == 0


def test_result_json_round_trip(tmp_path: Path) -> None:
    import json

    t, _ = run(policy(budget=8), "epoll_busypoll", optimiser="grid")
    assert t.result is not None
    d = json.loads(json.dumps(t.result.to_json()))
    assert d["windows_used"] == 8 and set(d["counts"]) == {"ok", "failed", "aborted"}


@pytest.mark.parametrize("name", ["random", "grid"])
def test_baseline_optimisers_run_through_the_same_engine(name: str) -> None:
    t, _ = run(policy(budget=10), "timer_migration", optimiser=name)
    assert t.result is not None and t.optimiser.name == name

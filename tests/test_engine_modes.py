"""The engine's other entries and rules: observe (nothing written), resume at boot (a confirmed
configuration re-applied and re-checked), knob semantics (a knob the probe cannot see is not tuned),
the reference series (measuring through drift) and the ranking rule."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from polltuned.clock import FakeClock
from polltuned.daemon.render import render_status
from polltuned.daemon.statusdoc import build_status
from polltuned.daemon.wiring import build_daemon
from polltuned.engine.builder import inert_knobs, prepare_policy
from polltuned.engine.driver import drive
from polltuned.engine.phases import Phase
from polltuned.engine.reference import ReferenceSeries
from polltuned.knobs.keys import Effect, parse_key
from polltuned.policy.loader import load_policy, policy_from_dict
from polltuned.policy.schema import Policy
from polltuned.probes.factory import probe_opens_fresh_sockets
from polltuned.probes.sim import make_fake_host_tree
from polltuned.study import Study, memory_study, open_local
from polltuned.worlds.env import ScenarioEnv, default_config
from polltuned.worlds.scenario import load_scenario
from tests.engine_run import engine_for
from tests.engine_run import events as steps

REPO = Path(__file__).resolve().parents[1]


def policy(**tuning: object) -> Policy:
    p = load_policy("sim-default")
    return p.model_copy(update={"tuning": p.tuning.model_copy(update=tuning)})


# ---------------------------------------------------------------- observe
def test_observe_measures_the_baseline_and_writes_nothing() -> None:
    p = policy(budget=20).model_copy(update={"mode": "observe"})
    env = ScenarioEnv(p, load_scenario("busypoll_split"), seed=0)
    t = engine_for(p, env, memory_study(p))
    events = list(steps(t, env))
    r = t.result
    assert r is not None and r.mode == "observe"
    assert env.applied == []                       # not one knob written, not even the baseline's
    assert len(env.measured) >= 2 and all(c == default_config(p) for c in env.measured)
    assert r.deployed_is_baseline and len(r.would_try) >= 1
    assert any(c != default_config(p) for c in ({**default_config(p), **w} for w in r.would_try))
    assert any(e.phase is Phase.OBSERVE and "would try" in e.message for e in events)


# ---------------------------------------------------------------- resume at boot
def _deploying_session(tmp_path: Path, p: Policy, host: str) -> Study:
    study = open_local(tmp_path, p)
    env = ScenarioEnv(p, load_scenario("busypoll_split"), seed=0)
    t = engine_for(p, env, study, host_fingerprint=host)
    drive(t, env)
    assert t.result is not None and not t.result.deployed_is_baseline, t.result.reason
    return study


def test_resume_reapplies_the_confirmed_configuration_first(tmp_path: Path) -> None:
    p = policy(budget=24)
    study = _deploying_session(tmp_path, p, "host-a")
    deployed = study.sessions()[-1].result["deployed"]  # type: ignore[index]
    env = ScenarioEnv(p, load_scenario("busypoll_split"), seed=1)
    t = engine_for(p, env, open_local(tmp_path, p), host_fingerprint="host-a", resume=True)
    events = list(steps(t, env))
    r = t.result
    assert r is not None and r.mode == "resume", r.reason
    # the very first window measured the deployed values (B A B A), and the check was short
    assert env.measured[0] == {**default_config(p), **deployed}
    assert r.windows_used <= 4 and env.config == {**default_config(p), **deployed}
    assert any(e.phase is Phase.RESUME for e in events)


def test_resume_needs_the_same_host_fingerprint(tmp_path: Path) -> None:
    p = policy(budget=12)
    _deploying_session(tmp_path, p, "host-a")
    env = ScenarioEnv(p, load_scenario("busypoll_split"), seed=1)
    t = engine_for(p, env, open_local(tmp_path, p), host_fingerprint="host-b", resume=True)
    drive(t, env)
    assert t.result is not None and t.result.mode == "search"


def test_resume_searches_again_when_the_configuration_no_longer_helps(tmp_path: Path) -> None:
    p = policy(budget=12)
    _deploying_session(tmp_path, p, "host-a")
    # the workload changed: busy polling now hurts (client and server share a CPU)
    env = ScenarioEnv(p, load_scenario("busypoll_shared"), seed=1)
    t = engine_for(p, env, open_local(tmp_path, p), host_fingerprint="host-a", resume=True)
    events = list(steps(t, env))
    assert t.result is not None and t.result.mode == "search"
    assert any(e.phase is Phase.RESUME and "searching again" in e.message for e in events)


def test_daemon_resumes_at_boot_and_status_says_so(tmp_path: Path) -> None:
    pol_file = tmp_path / "p.toml"
    pol_file.write_text(f'include = ["{REPO}/policies/sim-default.toml"]\nname = "boot"\n'
                        "[tuning]\nbudget = 20\n[confirm]\npairs = 4\n[hold]\ninterval_s = 1\n")
    pol = load_policy(str(pol_file))
    root = tmp_path / "root"
    make_fake_host_tree(root, pol.knobs)
    first = build_daemon(policy=pol, host_root=str(root), state_dir=str(tmp_path / "state"), clock=FakeClock(),
                         max_rounds=1)
    list(first.controller.steps())
    assert first.controller.result is not None and not first.controller.result.deployed_is_baseline
    second = build_daemon(policy=pol, host_root=str(root), state_dir=str(tmp_path / "state"), clock=FakeClock(),
                          max_rounds=1)
    windows_before_deployed: int | None = None
    for phase in second.controller.steps():
        if phase == Phase.RESUME and windows_before_deployed is None and "deployed:" in second.controller.message:
            windows_before_deployed = second.windows.measured - 1
    assert windows_before_deployed == 0          # the first window after READY measured the deployment
    doc = build_status(second, second.controller)
    assert doc["result"]["mode"] == "resume"     # type: ignore[index]
    assert "resumed a confirmed configuration" in render_status(doc, running=True, dirty=None)


# ---------------------------------------------------------------- knob semantics
def test_busy_read_is_not_tuned_when_the_probe_cannot_see_new_sockets() -> None:
    assert parse_key("net.core.busy_read").effect is Effect.NEW_SOCKETS
    assert parse_key("net.core.busy_poll").effect is Effect.IMMEDIATE
    assert parse_key("eth0:napi:irq-suspend-timeout").effect is Effect.NEXT_NAPI_CYCLE
    assert parse_key("eth0:irq_affinity").effect is Effect.AFTER_AFFINITY
    base = {"name": "x", "nic": "eth0",
            "knobs": {"net.core.busy_read": {"min": 0, "max": 200, "zero_is_off": True},
                      "net.core.busy_poll": {"min": 0, "max": 200, "zero_is_off": True}}}
    rtt = policy_from_dict({**base, "probe": {"kind": "tcp_rtt", "port": 443}})
    assert not probe_opens_fresh_sockets(rtt.probe)
    assert set(inert_knobs(rtt)) == {"net.core.busy_read"}
    kept, dropped = prepare_policy(rtt)
    assert set(kept.knobs) == {"net.core.busy_poll"} and "sockets created afterwards" in dropped["net.core.busy_read"]
    fresh = policy_from_dict({**base, "probe": {"kind": "sockperf"}})
    assert probe_opens_fresh_sockets(fresh.probe) and inert_knobs(fresh) == {}
    stale = policy_from_dict({**base, "probe": {"kind": "sockperf", "restart_server": False}})
    assert set(inert_knobs(stale)) == {"net.core.busy_read"}


# ---------------------------------------------------------------- measuring through drift
def test_reference_level_follows_drift_and_averages_when_there_is_none() -> None:
    rng = np.random.default_rng(0)
    drifting = ReferenceSeries()
    flat = ReferenceSeries()
    for i in range(0, 40, 3):
        drifting.add(i, math.log(100.0) + 0.03 * i + float(rng.normal(0, 0.02)))
        flat.add(i, math.log(100.0) + float(rng.normal(0, 0.1)))
    # with drift, the level at a window is its neighbours' (small bandwidth); a trial measured at
    # t=20 exactly at the drifted baseline has y ~ 0, not the +0.6 a start-of-run baseline would give
    assert drifting.bandwidth() <= 4
    y = drifting.y(20, math.log(100.0) + 0.03 * 20)
    assert y is not None and abs(y) < 0.05
    assert drifting.interval() == 2          # references as often as the drift demands
    # without drift every reference helps: a wide bandwidth and a sparser cadence
    assert flat.bandwidth() >= 16 and flat.interval() == 6
    assert 0.06 < flat.noise_sd() < 0.16


def test_a_workload_shift_is_seen_in_the_references() -> None:
    r = ReferenceSeries()
    for i, v in enumerate([100, 104, 98, 101, 99, 160, 165]):
        r.add(3 * i, math.log(v))
    assert r.shift() == 15
    r2 = ReferenceSeries()
    for i, v in enumerate([100, 104, 98, 101, 99, 160, 97]):  # one outlier is not a shift
        r2.add(3 * i, math.log(v))
    assert r2.shift() is None


def test_trials_are_told_relative_to_the_baseline_of_their_time() -> None:
    """A world whose latency doubles over the run (drift) and a knob worth 20 %: every told value
    of the good knob is about log 0.8, wherever in the run it was measured."""
    p = policy(budget=30)

    class Drifting:
        name = "drifting"
        nonstationary = False

        def measure(self, config: dict[str, object], rng: np.random.Generator, window: int = 0) -> dict[str, float]:
            good = 0.8 if config.get("kernel.timer_migration") == 0 else 1.0
            return {"p99_us": 100.0 * (1 + window / 30) * good * math.exp(rng.normal(0, 0.02)), "cpu_cores": 0.3}

        def expected(self, config: dict[str, object]) -> dict[str, float]:
            return self.measure(config, np.random.default_rng(0), 0)

    from polltuned.worlds.scenario import Scenario

    w = Drifting()
    sc = Scenario("drifting", REPO, "", w.measure, w.expected, True)
    env = ScenarioEnv(p, sc, seed=0)
    t = engine_for(p, env, memory_study(p))
    drive(t, env)
    st = t.state
    told = [t._told(st, o) for o in st.obs if not o.reference and o.config.get("kernel.timer_migration") == 0
            and not o.aborted]
    assert told, "the design never tried timer_migration = 0"
    assert all(abs(y - math.log(0.8)) < 0.12 for y in told), told

"""The scenario contract: shipped scenarios, user files, window keyword, replay."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from polltuned.errors import UsageError
from polltuned.objective import value_of
from polltuned.policy.loader import load_policy
from polltuned.worlds.env import default_config
from polltuned.worlds.scenario import ReplayScenario, knob, load_scenario, shipped_names

SHIPPED = shipped_names()


def test_all_promised_scenarios_ship() -> None:
    for name in ("busypoll_split", "busypoll_shared", "spin_sessions60", "spin_sessions10", "timer_migration",
                 "epoll_busypoll", "gro_batch", "nothing_helps", "cliff", "workload_shift", "replay"):
        assert name in SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_scenario_honours_the_contract(name: str) -> None:
    pol = load_policy("sim-default")
    sc = load_scenario(name)
    base = default_config(pol)
    e = sc.expected(base)
    assert e["p99_us"] > 0 and e["cpu_cores"] >= 0
    a = sc.measure(base, np.random.default_rng(7), window=0)
    b = sc.measure(base, np.random.default_rng(7), window=0)
    assert a == b  # all randomness from rng
    assert set(a) >= {"p99_us", "cpu_cores"}
    assert sc.doc  # documented


def test_effects_the_scenarios_model() -> None:
    pol = load_policy("sim-default")
    base = default_config(pol)

    def J(name: str, **over: int) -> float:
        cfg = {**base, **{k.replace("__", "."): v for k, v in over.items()}}
        return value_of(load_scenario(name).expected(cfg), pol.objective)

    assert J("busypoll_split", net__core__busy_read=50) < 0.2 * J("busypoll_split")
    assert J("busypoll_shared", net__core__busy_read=50) > 3 * J("busypoll_shared")
    assert J("epoll_busypoll", net__core__busy_poll=50) < 0.6 * J("epoll_busypoll")
    assert J("epoll_busypoll", net__core__busy_read=50) == J("epoll_busypoll")
    assert J("timer_migration", kernel__timer_migration=0) < 0.9 * J("timer_migration")
    assert J("cliff", net__core__busy_read=180) > 5 * J("cliff")


def test_window_keyword_drives_a_workload_change() -> None:
    sc = load_scenario("workload_shift")
    assert sc.takes_window and sc.nonstationary
    cfg = {"net.core.busy_read": 50}
    before = np.median([sc.measure(cfg, np.random.default_rng(i), window=0)["p99_us"] for i in range(9)])
    after = np.median([sc.measure(cfg, np.random.default_rng(i), window=40)["p99_us"] for i in range(9)])
    assert after > 20 * before


def test_user_scenario_without_window_and_device_independent_knob(tmp_path: Path) -> None:
    f = tmp_path / "mine.py"
    f.write_text(
        "from polltuned.worlds.scenario import knob\n"
        "def expected(config):\n"
        "    return {'p99_us': 10.0 + knob(config, 'gro_flush_timeout') / 1000, 'cpu_cores': 1.0}\n"
        "def measure(config, rng):\n"
        "    return expected(config)\n")
    sc = load_scenario(str(f))
    assert not sc.takes_window
    assert sc.measure({"eth7:gro_flush_timeout": 5000}, np.random.default_rng(0), window=3)["p99_us"] == 15.0
    assert knob({"net.core.busy_read": "50"}, "net.core.busy_read") == 50.0


def test_broken_scenarios_are_humane_errors(tmp_path: Path) -> None:
    f = tmp_path / "bad.py"
    f.write_text("def expected(config):\n    return {'p99_us': 1.0}\ndef measure(config, rng):\n"
                 "    return {'p99_us': 1.0}\n")
    with pytest.raises(UsageError, match="cpu_cores"):
        load_scenario(str(f)).expected({})
    with pytest.raises(UsageError, match="not a file"):
        load_scenario("no_such_scenario")
    g = tmp_path / "empty.py"
    g.write_text("x = 1\n")
    with pytest.raises(UsageError, match="must define"):
        load_scenario(str(g))


def test_replay_resamples_the_nearest_recorded_configuration(tmp_path: Path) -> None:
    rec = tmp_path / "rec.jsonl"
    lines = []
    for br, p99 in ((0, 100.0), (0, 110.0), (50, 20.0), (50, 22.0)):
        w = {"ok": True, "latency": {"p99": p99}, "cpu_cores": 0.5 + br / 100}
        lines.append(json.dumps({"v": 1, "workload": "pp", "config": {"net.core.busy_read": br,
                                                                          "vb:gro_flush_timeout": 0},
                                 "window": w}))
    rec.write_text("\n".join(lines) + "\n")
    sc = ReplayScenario.from_file(rec)
    rng = np.random.default_rng(0)
    near50 = {sc.measure({"net.core.busy_read": 60, "eth0:gro_flush_timeout": 0}, rng)["p99_us"] for _ in range(20)}
    assert near50 == {20.0, 22.0}
    assert sc.expected({"net.core.busy_read": 0})["p99_us"] == pytest.approx(105.0)
    with pytest.raises(UsageError, match="no usable records"):
        ReplayScenario.from_file(rec, workload="other")

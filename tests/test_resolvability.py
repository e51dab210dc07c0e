"""benchmarks/resolvability.py: the windows any tuner needs to *show* within 5 % of a load's optimum."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks._load import load
from polltuned.optimiser.space import Space
from polltuned.policy.loader import load_policy
from polltuned.worlds.env import default_config

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "policies" / "sim-default.toml"
SCEN = "family-moving:8117:25"   # quiet: busy_read ~30 plus timer_migration = 0 (7.6 %) within 5 %


R: Any = load("resolvability")


def test_windows_to_show_is_the_design_formula() -> None:
    r = R
    d, sd = math.log(1.10), 0.2
    assert r.windows_to_show(d, sd, 0.5) == pytest.approx(1.6448536 ** 2 * 0.04 / d ** 2, rel=1e-6)
    assert r.windows_to_show(d, sd, 0.8) == pytest.approx((1.6448536 + 0.8416212) ** 2 * 0.04 / d ** 2, rel=1e-6)
    # both arms measured: twice the windows for twice the variance of a difference of two means
    assert r.windows_to_show(d, sd, 0.5, sd) == pytest.approx(4 * r.windows_to_show(d, sd, 0.5), rel=1e-9)
    assert r.windows_to_show(0.0, sd, 0.5) == math.inf and r.windows_to_show(-0.1, sd, 0.5) == math.inf
    assert r.windows_to_show(5.0, 0.01, 0.5) == 1.0


def test_minimal_configuration_is_within_5_pct_and_cannot_lose_another_knob() -> None:
    r = R
    pol = load_policy(str(POLICY))
    space, base = Space.from_policy(pol), default_config(pol)
    sc = r.TQ.load_scenario(SCEN)
    t = r.TQ.first_windows(sc, 300)["quiet"]
    at = r.TQ._AtWindow(sc, t)
    j_star, c_star = r.TQ.optimum(at, pol, base)
    cmin = r.minimal_config(at, pol, space, base, c_star, j_star)
    assert r.TQ.J(at, pol, cmin) <= j_star * 1.05
    changed = [k for k in space.keys if cmin[k] != base[k]]
    assert 1 <= len(changed) < len([k for k in space.keys if {**base, **c_star}[k] != base[k]])
    for k in changed:   # greedy's fixed point: putting back any one more knob leaves the 5 % band
        assert r.TQ.J(at, pol, {**base, **space.canonical({**cmin, k: base[k]})}) > j_star * 1.05
    assert cmin["kernel.timer_migration"] == 0 and cmin["net.core.busy_read"] > 0


def test_load_need_scales_with_the_window_noise() -> None:
    r = R
    pol = load_policy(str(POLICY))
    one = r.load_need(r.TQ.scenario_with_noise(SCEN, 1.0), pol, 0, 0.8)
    two = r.load_need(r.TQ.scenario_with_noise(SCEN, 2.0), pol, 0, 0.8)
    tm = "kernel.timer_migration"
    assert one["gain"] > 0.05 and tm in one["needed"] and one["needed"][tm]["windows"] > 1
    assert one["needed"][tm]["effect"] == pytest.approx(two["needed"][tm]["effect"])   # the model is unchanged
    ratio = two["needed"][tm]["windows"] / one["needed"][tm]["windows"]
    assert 3.0 < ratio < 5.0     # twice the log-sd, four times the windows
    assert one["need_windows"] == max(v["windows"] for v in one["needed"].values())


def test_summary_and_cli(capsys: pytest.CaptureFixture[str]) -> None:
    r = R
    no_gain = {"need_windows": 0.0, "needed": {}}
    hard = {"need_windows": 50.0, "needed": {"(gain)": {"effect": 0.3, "windows": 2.0},
                                              "k": {"effect": 0.06, "windows": 50.0}}}
    res = [{"loads": {"a": no_gain, "b": hard}, "checkpoint_load": {"150": "a", "300": "b"}},
           {"loads": {"b": hard}, "checkpoint_load": {"150": "b", "300": "b"}}]
    sm = r.summary(res)
    assert sm["checkpoints"]["150"]["12"] == 0.5 and sm["checkpoints"]["150"]["60"] == 1.0
    assert sm["checkpoints"]["300"]["30"] == 0.0 and sm["checkpoints"]["300"]["allowed"] == 1.0
    assert sm["checkpoints"]["150"]["no_gain"] == 0.5 and sm["smallest_needed_effect_median"] == 0.06
    assert r.main(["--family", "1", "--family-seed", "8117", "--moving", "--horizon", "160", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["landscapes"][0]["scenario"] == "family-moving:8117:0" and "150" in out["summary"]["checkpoints"]
    assert "300" not in out["summary"]["checkpoints"]

"""The moving-load family, the scenario contract's context output and ScenarioEnv's Window.context."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from polltuned.errors import UsageError
from polltuned.optimiser.space import Space
from polltuned.policy.loader import load_policy
from polltuned.worlds.env import ScenarioEnv, default_config
from polltuned.worlds.family import make_landscape, make_moving_landscape, parse_moving_name
from polltuned.worlds.scenario import load_scenario, to_window

BR, BP = "net.core.busy_read", "net.core.busy_poll"


def test_same_seed_and_index_give_the_same_moving_world() -> None:
    a, b = make_moving_landscape(3, 4), make_moving_landscape(3, 4)
    assert a == b and a.describe() == b.describe()
    assert make_moving_landscape(3, 5) != a
    # the stationary family is not touched by it (own stream)
    assert make_landscape(1, 0).describe() == make_landscape(1, 0).describe()


def test_load_moves_between_two_or_three_levels_at_least_three_times() -> None:
    for i in range(40):
        ls = make_moving_landscape(1, i)
        assert 2 <= len(ls.loads) <= 3
        ch = ls.changes(300)
        assert len(ch) >= 3, (i, ch)
        for c in ch:
            assert ls.load_index(c - 1) != ls.load_index(c)
        seen = {ls.load_at(w) for w in range(300)}
        assert len(seen) >= 2
        assert all(25 <= b - a <= 90 for a, b in zip(ls.starts, ls.starts[1:]))


def _best_busy(ls, load: int) -> float:
    """busy value (both knobs) with the lowest expected p99 x (1 + cpu) at load ``load``."""
    vals = [0.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0]
    js = []
    for v in vals:
        e = ls.expected_at({BR: v, BP: v}, ls.starts[ls.segment_load.index(load)])
        js.append(e["p99_us"] * (1 + 0.1 * e["cpu_cores"]))
    return vals[int(np.argmin(js))]


def test_the_optimum_moves_with_the_load() -> None:
    moved = 0
    for i in range(30):
        ls = make_moving_landscape(2, i)
        quiet, shared = _best_busy(ls, 0), _best_busy(ls, 1)
        assert shared <= quiet, i            # a runnable peer never makes more busy polling better
        moved += quiet != shared
    assert moved >= 24                       # >= 80 % of the worlds want other values per load


def test_measure_exposes_the_load_as_context_not_the_knobs() -> None:
    ls = make_moving_landscape(1, 0)
    rng = np.random.default_rng(0)
    w = ls.changes()[0]
    a = ls.measure({BR: 0}, rng, window=w)
    b = ls.measure({BR: 100}, rng, window=w)
    for k in ("context:flows", "context:runnable_others"):
        assert a[k] == b[k]
    assert abs(np.log(a["context:offered_rate"] / b["context:offered_rate"])) < 0.5
    before = ls.measure({BR: 0}, rng, window=w - 1)
    assert before["context:flows"] != a["context:flows"] or before["context:offered_rate"] != a["context:offered_rate"]


def test_scenario_env_puts_the_context_in_the_window() -> None:
    pol = load_policy("sim-default")
    sc = load_scenario("family-moving:1:2")
    assert sc.nonstationary and sc.has_loads
    env = ScenarioEnv(pol, sc, seed=0)
    w = env.measure(0)
    assert set(w.context) == {"offered_rate", "flows", "runnable_others"}
    old = ScenarioEnv(pol, load_scenario("busypoll_split"), seed=0)
    assert dict(old.measure(0).context) == {}
    assert load_scenario("busypoll_split").load_at(5) == "final"
    base = default_config(pol)
    assert load_scenario("busypoll_split").expected_at(base, 5) == load_scenario("busypoll_split").expected(base)


def test_context_keys_pass_the_contract_check_and_junk_is_dropped() -> None:
    w = to_window({"p99_us": 10.0, "cpu_cores": 0.1, "context:flows": 3.0}, 1.0)
    assert dict(w.context) == {"flows": 3.0}
    sc = load_scenario("moving_load")
    got = sc.measure({BR: 0}, np.random.default_rng(0), window=80)
    assert got["context:flows"] == 4.0 and got["context:runnable_others"] == 2.0


def test_shipped_moving_load_scenario_schedule_and_optima() -> None:
    sc = load_scenario("moving_load")
    labels = [sc.load_at(w) for w in range(300)]
    changes = [w for w in range(1, 300) if labels[w] != labels[w - 1]]
    assert changes == [70, 130, 210, 250]
    quiet = sc.expected_at({BR: 50}, 0)["p99_us"] / sc.expected_at({BR: 0}, 0)["p99_us"]
    shared = sc.expected_at({BR: 50}, 80)["p99_us"] / sc.expected_at({BR: 0}, 80)["p99_us"]
    assert quiet < 0.2 and shared > 3.0


def test_moving_names_parse_or_fail_clearly() -> None:
    assert parse_moving_name("family-moving:7:3") == (7, 3)
    assert parse_moving_name("family:7:3") is None
    with pytest.raises(UsageError, match="family-moving:SEED:INDEX"):
        parse_moving_name("family-moving:x")
    with pytest.raises(UsageError):
        make_moving_landscape(-1, 0)


def _bench():  # benchmarks/tuner_quality.py as a module (one per process, shared with the other scripts)
    from benchmarks._load import load

    return load("tuner_quality")


def test_horizon_json_per_scenario_and_method(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    bench = _bench()
    rc = bench.main(["--horizon", "60", "--family", "1", "--moving", "--family-seed", "5", "--seeds", "1",
                     "--budget", "12", "--methods", "polltuned,random", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["horizon"] == 60
    s = out["scenarios"][0]
    assert s["scenario"] == "family-moving:5:0" and 1 <= len(s["loads"]) <= 3
    assert all(0 < c < 60 for c in s["changes"]) and len(s["loads"]) <= len(s["changes"]) + 1
    for m in ("polltuned", "random"):
        d = s["methods"][m]
        assert set(d["within5_at"]) == {"50"}          # 150 and 300 lie beyond a 60-window horizon
        assert 0.0 <= d["explore_share_after_100"] <= 1.0
        assert d["deployments"] >= d["worse_than_baseline_deployments"] >= d["worse_than_baseline_deployments_5pct"]
        assert d["rounds_mean"] >= 1
        assert "per_run" not in d
        assert set(d["measured_within5_at"]) == {"50"} and 0.0 <= d["measured_within5_at"]["50"] <= 1.0
        # within 5 % implies within 10 % implies within 20 % (the same runs, wider bands)
        assert d["within5_at"]["50"] <= d["within10_at"]["50"] <= d["within20_at"]["50"]
        assert 0.0 <= d["severe_window_share"] <= 1.0
        kc, ki = d["knobs_changed_per_deployment"], d["inert_knobs_per_deployment"]
        assert (kc is None) == (ki is None) == (d["deployments"] == 0)
        assert kc is None or 0.0 <= ki <= kc <= len(Space.from_policy(load_policy("sim-default")).keys)
    agg = out["aggregate"]["methods"]["polltuned"]
    assert set(agg["captured_at"]) == {"50"} and set(agg["within20_at"]) == {"50"}
    cap = agg["captured_at"]["50"]
    assert cap["runs"] in (0, 1) and (cap["median"] is None) == (cap["runs"] == 0)
    assert agg["severe_window_share"] <= agg["severe_window_share_worst_run"]
    bands = agg["by_available_gain"]["50"]      # every run's checkpoint falls in exactly one band
    assert sum(c["runs"] for c in bands.values()) == agg["runs"]
    assert all(0.0 <= c["within5"] <= c["within10"] <= 1.0 for c in bands.values())
    g5, g10 = agg["within5_at_gain"]["50"], agg["within10_at_gain"]["50"]
    assert (g5 is None) == (g10 is None) == ("<=1.05" in bands)   # one run: its load has gain or not
    assert g5 is None or 0.0 <= g5 <= g10 <= 1.0
    assert all(0.0 <= ld["space_within5"] <= 1.0 for ld in s["loads"].values())
    assert out["aggregate"]["methods"]["polltuned"]["runs"] == 1
    assert out["noise_scale"] == 1.0 and "space_within5_median" in out["aggregate"]


def test_measured_within_counts_only_a_near_optimal_window_at_the_checkpoint_load() -> None:
    """The search's coverage: a checkpoint counts when an earlier window measured, at the load of
    the checkpoint's window, a configuration within 5 % of that load's optimum; the same
    configuration measured at another load, or after the checkpoint, does not count."""
    bench = _bench()
    pol = load_policy("sim-default")
    name = "family-moving:5:0"
    sc = load_scenario(name)
    labels = [sc.load_at(t) for t in range(150)]
    base = default_config(pol)
    optima = bench.load_optima(name, pol, 150)
    load = labels[99]
    star = bench.optimum(bench._AtWindow(sc, 99), pol, base)[1]
    assert bench.J(bench._AtWindow(sc, 99), pol, base) > optima[load][1] * 1.05   # the defaults are not enough
    same = next(t for t in range(99) if labels[t] == load)
    other = next(t for t in range(99) if labels[t] != load)
    later = next(t for t in range(100, 150) if labels[t] == load) if load in labels[100:] else None

    def runs(at: int | None) -> dict[str, bool]:
        cfgs = [dict(base) for _ in range(150)]
        if at is not None:
            cfgs[at] = dict(star)
        return bench.measured_within(sc, pol, cfgs, labels, optima, (100,))

    assert runs(same) == {"100": True}
    assert runs(other) == {"100": False}
    assert runs(None) == {"100": False}
    if later is not None:
        assert runs(later) == {"100": False}
    # a checkpoint past the windows measured is not reached
    assert bench.measured_within(sc, pol, [dict(base)] * 50, labels, optima, (100,)) == {"100": False}


def test_noise_scale_narrows_the_windows_and_keeps_the_model() -> None:
    bench = _bench()
    pol = load_policy("sim-default")
    cfg = default_config(pol)
    name = "family-moving:5:1"
    plain, quiet = load_scenario(name), bench.scenario_with_noise(name, 0.05)
    assert plain.expected(cfg) == quiet.expected(cfg)

    def spread(sc) -> float:
        rng = np.random.default_rng(3)
        xs = [np.log(sc.measure(cfg, rng, 10)["p99_us"]) for _ in range(200)]
        return float(np.std(xs))

    assert spread(quiet) * 5 < spread(plain)
    same = bench.scenario_with_noise(name, 1.0)   # scale 1: the landscape as it is, window for window
    assert [same.measure(cfg, np.random.default_rng(4), t) for t in range(5)] == \
        [plain.measure(cfg, np.random.default_rng(4), t) for t in range(5)]
    with pytest.raises(SystemExit, match="not a family landscape"):
        bench.scenario_with_noise("moving_load", 0.5)


def test_horizon_run_measures_every_window_on_one_clock() -> None:
    """One clock for the whole horizon: the load follows the window count across engine rounds,
    and every window has a kind and a configuration in force."""
    bench = _bench()
    pol = load_policy("sim-default")
    pol = pol.model_copy(update={"tuning": pol.tuning.model_copy(update={"budget": 12})})
    r = bench.run_horizon("moving_load", pol, "polltuned", 0, 90)
    assert r["windows"] == 90 and len(r["kinds"]) == 90 and len(r["in_force"]) == 90
    # the engine follows the load itself (one round for the whole horizon): the change at window 70
    # (quiet -> shared) is answered by windows that are not plain HOLD (fallback / region search)
    assert r["rounds"] == 1
    assert any(k != "hold" for k in r["kinds"][70:90]), r["kinds"][60:90]
    assert "hold" in r["kinds"]
    assert bench._drifted({"flows": 1.0}, {"flows": 4.0}) and not bench._drifted({"flows": 4.0}, {"flows": 4.2})


def _moving_world(bench: Any, n: int = 60) -> tuple[Any, ...]:
    """One moving family landscape over ``n`` windows, for the hand-built runs below: the policy,
    scenario name and object, the defaults, ``n``, the load label of each window, the optimum per
    load and the policy's search space."""
    pol = load_policy("sim-default")
    name = "family-moving:5:0"
    sc = load_scenario(name)
    labels = [sc.load_at(t) for t in range(n)]
    return (pol, name, sc, default_config(pol), n, labels, bench.load_optima(name, pol, n),
            Space.from_policy(pol))


def test_gain_captured_and_severe_windows_count_what_users_feel() -> None:
    """captured: 1 at the optimum, 0 on the defaults, negative when worse, None where nothing is to
    be had. severe: a window whose *measured* configuration has more than 2x the defaults' J counts,
    even when the configuration in force (what HOLD would keep) is the defaults."""
    bench = _bench()
    assert bench.gain_captured((200.0, 100.0), 100.0) == 1.0
    assert bench.gain_captured((200.0, 100.0), 200.0) == 0.0
    assert bench.gain_captured((200.0, 100.0), 150.0) == 0.5
    assert bench.gain_captured((200.0, 100.0), 300.0) == -1.0
    assert bench.gain_captured((102.0, 100.0), 100.0) is None      # under NO_EFFECT: nothing to capture
    # the headline shares without the loads where the defaults are already optimal
    flags = [{"50": True, "150": True}, {"50": False, "150": True}, {"50": True, "150": False}]
    avail = [{"50": 1.0, "150": 1.5}, {"50": 1.5, "150": 1.02}, {"50": 3.0, "150": 1.04}]
    assert bench._with_gain(flags, avail) == {"50": 0.5, "150": 1.0}
    assert bench._with_gain(flags, [{"50": 1.0, "150": 1.0}] * 3) == {"50": None, "150": None}

    pol, name, sc, base, n, labels, optima, space = _moving_world(bench)
    # a configuration more than 2x the defaults' J at window 10's load (busy polling where it hurts)
    at10 = bench._AtWindow(sc, 10)
    bad = next(({**base, **c} for c in space.sample_uniform(np.random.default_rng(0), 2000)
                if bench.J(at10, pol, {**base, **c}) > 2.5 * optima[labels[10]][0]), None)
    assert bad is not None
    configs = [dict(base) for _ in range(n)]
    configs[10] = bad
    run = {"kinds": ["hold"] * n, "configs": configs, "in_force": [dict(base)] * n,
           "rounds": 1, "cpu_s": 0.0, "windows": n}
    s = bench.summarise_horizon(name, pol, {"polltuned": [run]}, n)["methods"]["polltuned"]
    assert s["severe_window_share"] == pytest.approx(1 / n)
    assert s["worse_than_baseline_window_share"] == 0.0          # in force: the defaults throughout
    assert s["within20_at"]["50"] >= s["within5_at"]["50"]


def test_window_shares_per_span_and_long_horizon_checkpoints() -> None:
    """The long horizon's view: per span of windows (0-50, 50-150, 150-300, 300-1000, then to the
    end), the share of windows within 5 % of the optimum over every run; checkpoints 600 and 1000
    exist only where the runs reach them, and regret spans past 300 only then."""
    bench = _bench()
    # two runs of 1200 windows: one within 5 % from window 100 on, one only in the last 200
    a = [0.5] * 100 + [0.01] * 1100
    b = [0.5] * 1000 + [0.05] * 200
    got = bench._window_shares([a, b])
    assert list(got) == ["0-50", "50-150", "150-300", "300-1000", "1000-1200"]
    assert got["0-50"] == 0.0
    assert got["50-150"] == pytest.approx(50 / 200)      # run a: windows 100-149
    assert got["150-300"] == pytest.approx(0.5)
    assert got["300-1000"] == pytest.approx(0.5)
    assert got["1000-1200"] == pytest.approx(1.0)        # exactly 5 % counts as within
    assert list(bench._window_shares([[0.0] * 120])) == ["0-50", "50-120"]
    assert bench._window_shares([]) == {}

    pol = load_policy("sim-default")
    name = "family-moving:5:0"
    base = default_config(pol)
    for n, spans, at in ((300, ["0-50", "50-150", "150-300"], ["50", "150", "300"]),
                         (620, ["0-50", "50-150", "150-300", "300-620"], ["50", "150", "300", "600"])):
        run = {"kinds": ["hold"] * n, "configs": [dict(base)] * n, "in_force": [dict(base)] * n,
               "rounds": 1, "cpu_s": 0.0, "windows": n}
        s = bench.summarise_horizon(name, pol, {"polltuned": [run]}, n)["methods"]["polltuned"]
        assert list(s["regret_median"]) == spans
        assert list(s["within5_window_share"]) == spans
        assert list(s["within5_at"]) == at
        agg = bench.aggregate_horizon([{"methods": {"polltuned": s}, "loads": {}}])
        assert list(agg["methods"]["polltuned"]["within5_window_share"]) == [
            "0-50", "50-150", "150-300"] + (["300-620"] if n > 300 else [])


def test_every_change_in_force_is_a_deployment_judged_at_its_load() -> None:
    """A deployment is any change of the configuration in force while holding (a region's decision,
    a switch, a challenger's win, a fallback), judged at the load of the first window it held:
    worse than the defaults there counts (and, by more than 5 %, in ``..._5pct``); going back to the
    defaults never does. (Before, only a round's end was counted, and the daemon's one long round
    never ended inside the horizon: zero by construction.)"""
    bench = _bench()
    pol, name, sc, base, n, labels, optima, space = _moving_world(bench)
    at30 = bench._AtWindow(sc, 30)
    jb = optima[labels[30]][0]
    draws = [{**base, **c} for c in space.sample_uniform(np.random.default_rng(1), 3000)]
    bad = next(c for c in draws if bench.J(at30, pol, c) > 1.5 * jb)
    slight = next((c for c in draws if jb * 1.001 < bench.J(at30, pol, c) < jb * 1.05), None)
    assert slight is not None
    in_force = [dict(base)] * 30 + [bad] * 5 + [dict(base)] * 5 + [slight] * 5 + [dict(base)] * 15
    assert bench.put_in_force(in_force) == [(30, bad), (35, base), (40, slight), (45, base)]
    assert bench.put_in_force([dict(base)] * 5) == []
    # the windows 40-44 sit at window 30's load only if the load did not change: judge them there
    assert labels[30] == labels[40] == labels[44], "pick a scenario whose load holds over windows 30-44"
    run = {"kinds": ["hold"] * n, "configs": in_force, "in_force": in_force, "rounds": 1, "cpu_s": 0.0,
           "windows": n}
    s = bench.summarise_horizon(name, pol, {"polltuned": [run]}, n)["methods"]["polltuned"]
    assert s["deployments"] == 4
    assert s["worse_than_baseline_deployments"] == 2
    assert s["worse_than_baseline_deployments_5pct"] == 1
    assert s["worse_than_baseline_window_share"] == pytest.approx(10 / n)


def test_deployed_knobs_counts_the_changes_and_those_that_do_not_matter_at_the_load() -> None:
    """"Deploy only what matters", judged with what the world knows: every knob a deployment changes
    from the defaults counts; it is inert when putting it back alone moves the true J at that load by
    less than INERT (1 %). The optimum's busy knob is never inert; a knob the world ignores is."""
    bench = _bench()
    pol, name, sc, base, n, _labels, _optima, space = _moving_world(bench)
    at = bench._AtWindow(sc, 30)
    _, best = bench.optimum(at, pol, base)
    best = {**base, **best}
    assert bench.deployed_knobs(at, pol, base, base) == (0, 0)
    def values(k: str) -> list[Any]:
        d = space.dim(k)
        return list(d.choices) if d.kind == "cat" else [int(d.lo), int(d.hi)]

    # a change the optimum does not make and this world ignores (J moves < 0.1 %)
    j_best = bench.J(at, pol, best)
    k_idle, other = next(((k, v) for k in space.keys for v in values(k) if best[k] == base[k] != v
                          and abs(bench.J(at, pol, {**best, k: v}) / j_best - 1.0) < 1e-3), (None, None))
    assert k_idle is not None, "pick a world with a knob it ignores"
    ch0, in0 = bench.deployed_knobs(at, pol, base, best)
    ch1, in1 = bench.deployed_knobs(at, pol, base, {**best, k_idle: other})
    assert (ch1, in1) == (ch0 + 1, in0 + 1)
    busy = max((k for k in (BR, BP) if best[k] != base[k]),
               key=lambda k: bench.J(at, pol, {**best, k: base[k]}))
    assert bench.J(at, pol, {**best, busy: base[busy]}) > 1.01 * bench.J(at, pol, best)
    assert in0 < ch0                                  # the busy knob that carries the gain counts, not inert
    # the horizon summary averages them over every deployment
    in_force = [dict(base)] * 30 + [best] * 10 + [{**best, k_idle: other}] * (n - 40)
    run = {"kinds": ["hold"] * n, "configs": in_force, "in_force": in_force, "rounds": 1, "cpu_s": 0.0,
           "windows": n}
    s = bench.summarise_horizon(name, pol, {"polltuned": [run]}, n)["methods"]["polltuned"]
    want = [bench.deployed_knobs(bench._AtWindow(sc, t), pol, base, c) for t, c in bench.put_in_force(in_force)]
    assert s["knobs_changed_per_deployment"] == pytest.approx(sum(c for c, _ in want) / len(want))
    assert s["inert_knobs_per_deployment"] == pytest.approx(sum(i for _, i in want) / len(want))


def test_kernel_compare_checkpoints_count_runs_within_5pct_and_variants_filter(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    bench = _bench()
    # the aggregation, on excess series we choose: run 0 is within 5 % at window 4 only, run 1 at 2 and 4
    series = {0: [0.5, 0.5, 0.5, 0.01, 0.2, 0.2], 1: [0.2, 0.05, 0.3, 0.04, 0.04, 0.06]}
    monkeypatch.setattr(bench, "kernel_compare_run", lambda path, pol, variant, seed, windows:
                        {"excess": series[seed][:windows], "cpu_per_step": 0.1})
    pol = load_policy("sim-default")
    out = bench.kernel_compare(pol, ["family-moving:5:0"], 2, 6, 1, ("product",))
    assert set(out) == {"product"}
    d = out["product"]
    assert d["runs"] == 2
    assert d["within5_at"] == {"6": 0.0}                 # 50 and later lie beyond 6 windows; W itself counts
    # windows 2..5 (after W/3): 0.5 0.01 0.2 0.2 | 0.3 0.04 0.04 0.06 -> 3 of 8 within 5 %
    assert d["within5_share_after_third"] == pytest.approx(3 / 8)
    monkeypatch.undo()
    # the real loop through the CLI, one variant only
    rc = bench.main(["--family", "1", "--moving", "--family-seed", "5", "--seeds", "1", "--kernel-compare", "8",
                     "--kernel-variants", "product", "--jobs", "1"])
    assert rc == 0
    got = json.loads(capsys.readouterr().out)
    assert set(got) == {"product"} and got["product"]["runs"] == 1
    assert set(got["product"]["within5_at"]) == {"8"} and got["product"]["within5_at"]["8"] in (0.0, 1.0)
    with pytest.raises(SystemExit):
        bench.main(["--family", "1", "--moving", "--kernel-compare", "8", "--kernel-variants", "bogus"])
    assert "unknown variant 'bogus'" in capsys.readouterr().err


def test_explore_share_reaches_the_daemon_cycle_and_is_checked(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``--explore-share X`` runs the horizon with the policy's hold.explore_share = X (every run
    sees it, the JSON says it); outside --horizon or outside 0..0.5 it is a usage error."""
    import json

    bench = _bench()
    seen: list[float] = []
    real = bench.run_horizon

    def spy(sc_path, pol, method, seed, horizon, noise_scale=1.0):  # type: ignore[no-untyped-def]
        seen.append(pol.hold.explore_share)
        return real(sc_path, pol, method, seed, horizon, noise_scale)

    monkeypatch.setattr(bench, "run_horizon", spy)
    rc = bench.main(["--horizon", "60", "--family", "1", "--moving", "--family-seed", "5", "--seeds", "1",
                     "--methods", "polltuned", "--explore-share", "0.5", "--jobs", "1", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert seen == [0.5] and out["explore_share"] == 0.5
    pol = load_policy("sim-default")
    q = bench.with_explore_share(pol, 0.2)
    assert q.hold.explore_share == 0.2 and pol.hold.explore_share == 0.05
    assert q.model_dump()["knobs"] == pol.model_dump()["knobs"] and q.confirm == pol.confirm
    for bad, why in ((["--horizon", "40", "--explore-share", "0.6"], "less than or equal to 0.5"),
                     (["--horizon", "40", "--explore-share", "nan"], "finite number"),
                     (["--explore-share", "0.2"], "with --horizon only")):
        with pytest.raises(SystemExit):
            bench.main(["--family", "1", "--moving", *bad])
        assert why in capsys.readouterr().err


def test_oracle_methods_replace_only_the_pick_with_what_the_world_knows() -> None:
    """The diagnostics ``oracle-pick`` / ``oracle-measured`` run the daemon's own cycle with the pick
    replaced: the first deploys the optimum of a load of the world (within 5 % of that load's J*),
    the second only configurations the engine measured before its decision; ``oracle-pick-simplified``
    hands the optimum to the engine's simplification first."""
    bench = _bench()
    pol = load_policy("sim-default")
    name, n = "family-moving:8117:8", 100
    sc = load_scenario(name)
    space = Space.from_policy(pol)
    optima = bench.load_optima(name, pol, n)
    first = bench.first_windows(sc, n)
    r = bench.run_horizon(name, pol, "oracle-pick", 0, n)
    deployed = [d for d in r["decisions"] if d["deployed"]]
    assert deployed, r["decisions"]
    for d in deployed:
        ratio = min(bench.J(bench._AtWindow(sc, first[lab]), pol, d["config"]) / optima[lab][1] for lab in optima)
        assert ratio <= 1.05, (d, ratio)
    r = bench.run_horizon(name, pol, "oracle-measured", 0, n)
    deployed = [d for d in r["decisions"] if d["deployed"]]
    assert deployed, r["decisions"]
    for d in deployed:
        seen = {space.key_of(c) for c in r["configs"][:d["window"]]}
        assert space.key_of(d["config"]) in seen, d
    # the same optimum given to the engine's own simplification: on this world it reverts knobs the
    # model never measured, and what is deployed is no longer any load's optimum
    r = bench.run_horizon(name, pol, "oracle-pick-simplified", 0, n)
    deployed = [d for d in r["decisions"] if d["deployed"]]
    assert deployed, r["decisions"]
    assert any(min(bench.J(bench._AtWindow(sc, first[lab]), pol, d["config"]) / optima[lab][1] for lab in optima)
               > 1.05 for d in deployed)


def test_a_gain_that_needs_two_seeded_knobs_together_is_found_at_a_load_seen_later() -> None:
    """Family landscape moving:7741:0 starts on a shared load (busy polling costs there: each busy
    seed alone is 1.8x the defaults) and moves to a quiet one at window 81, whose gain needs
    busy_read AND busy_poll on (each alone is worse than the defaults there; 50/50 together is
    2.7x better). The region search for the quiet load measures the seeds together and deploys
    busy polling before the load moves back at 135; without that trial it kept the defaults."""
    bench = _bench()
    pol = load_policy("sim-default")
    name = "family-moving:7741:0"
    sc = load_scenario(name)
    base = default_config(pol)
    assert [sc.load_at(t) for t in (80, 81, 134, 135)] == ["shared", "quiet", "quiet", "shared"]
    quiet = bench._AtWindow(sc, 100)
    j0 = bench.J(quiet, pol, base)
    assert bench.J(quiet, pol, {**base, BR: 50}) > j0 and bench.J(quiet, pol, {**base, BP: 50}) > j0
    assert bench.J(quiet, pol, {**base, BR: 50, BP: 50}) < 0.5 * j0
    r = bench.run_horizon(name, pol, "polltuned", 0, 135)
    held = r["in_force"][134]
    assert int(held[BR]) > 0 and int(held[BP]) > 0, held
    assert bench.J(quiet, pol, held) < 0.6 * j0
    joint = Space.from_policy(pol).joint_seed(base)
    assert joint is not None
    assert any(c == joint for t, c in enumerate(r["configs"]) if 81 <= t < 135), "the seeds together never ran at quiet"

"""`polltuned bench --workload mix` without the real kernel: the client's phase file and window,
the daemon's policy, the timeline analysis (exploring, held configuration, switch delay), the
arms, whole-run J, targets, table and JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from polltuned.bench.mix import (
    LAYOUTS,
    ArmStats,
    ClientWindow,
    MixPaths,
    MixResult,
    PhaseComparison,
    PhaseSpan,
    StatusSample,
    analyse_timeline,
    attribute_windows,
    best_label,
    build_arms,
    client_argv,
    daemon_cmdline_matches,
    daemon_policy_toml,
    evaluate_targets,
    first_deployment,
    is_exploring,
    parse_client_log,
    parse_schedule,
    render_mix_table,
    status_sample,
    whole_run,
)
from polltuned.errors import UsageError
from polltuned.host.exec import ExecResult
from polltuned.host.mixclient import (
    MixClientError,
    PhaseLoad,
    log_line,
    parse_phase,
    run_window,
    write_phase,
)
from polltuned.policy.loader import load_policy
from polltuned.records import KnobValue

REPO = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures" / "sockperf"
DEF = {"net.core.busy_read": 0, "net.core.busy_poll": 0}
BR = {"net.core.busy_read": 50, "net.core.busy_poll": 0}


# ---------------------------------------------------------------------------- the client


def test_phase_file_round_trip_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "phase.json"
    load = PhaseLoad(phase=2, layout="shared", sessions=3, client_cpus=(1,))
    write_phase(str(p), load)
    assert parse_phase(p.read_text()) == load
    assert not (tmp_path / "phase.json.tmp").exists()
    assert [load.cpu_of(i) for i in range(3)] == [1, 1, 1]
    assert PhaseLoad(0, "x", 4, (0, 1)).cpu_of(3) == 1
    for bad, why in (("{", "not JSON"), ("[]", "not a JSON object"), ('{"phase": 0}', "missing"),
                     ('{"phase": -1, "layout": "a", "sessions": 1, "client_cpus": []}', "phase"),
                     ('{"phase": 0, "layout": "a", "sessions": 0, "client_cpus": []}', "sessions"),
                     ('{"phase": 0, "layout": "a", "sessions": 1, "client_cpus": [true]}', "client_cpus")):
        with pytest.raises(MixClientError, match=why):
            parse_phase(bad)


class _Proc:
    def __init__(self, argv: Sequence[str], out: str, rc: int) -> None:
        self.argv = tuple(argv)
        self._res = ExecResult(self.argv, rc, out, "")

    @property
    def pid(self) -> int:
        return 1

    def running(self) -> bool:
        return False

    def wait(self, timeout_s: float) -> ExecResult:
        return self._res

    def stop(self, grace_s: float = 1.0) -> ExecResult:
        return self._res


class _Runner:
    def __init__(self, out: str, rc: int = 0) -> None:
        self.out, self.rc = out, rc
        self.spawned: list[tuple[tuple[str, ...], Sequence[int] | None]] = []

    def spawn(self, argv: Sequence[str], *, netns: str | None = None, cpus: Sequence[int] | None = None) -> _Proc:
        assert netns is None  # the probe already runs the client inside ptb-c
        self.spawned.append((tuple(argv), cpus))
        return _Proc(argv, self.out, self.rc)


def test_client_window_runs_the_phase_sessions_on_their_cpus() -> None:
    out = (FIX / "ping_pong_udp.txt").read_text()
    r = _Runner(out)
    doc = run_window(PhaseLoad(1, "shared", 3, (1,)), server="198.18.230.2", port=11211, duration_s=2.4, runner=r)
    assert len(r.spawned) == 3 and all(c == [1] for _, c in r.spawned)
    argv = r.spawned[0][0]
    assert argv[:2] == ("sockperf", "ping-pong") and argv[argv.index("-t") + 1] == "2" and "--full-rtt" in argv
    lat = doc["latency_us"]
    assert isinstance(lat, dict) and lat["p99"] == pytest.approx(97.264) and doc["sessions"] == 3
    # no phase, no layout: the daemon is told nothing
    assert set(doc) == {"v", "latency_us", "throughput_rps", "observations", "sessions"}
    r1 = _Runner(out)
    run_window(PhaseLoad(0, "single", 1, (0,)), server="s", port=1, duration_s=0.2, runner=r1)
    argv1 = r1.spawned[0][0]
    assert len(r1.spawned) == 1 and r1.spawned[0][1] == [0] and argv1[argv1.index("-t") + 1] == "1"
    with pytest.raises(MixClientError, match="session 0 failed"):
        run_window(PhaseLoad(0, "single", 1, (0,)), server="s", port=1, duration_s=1, runner=_Runner(out, rc=1))
    with pytest.raises(MixClientError, match="no messages"):
        run_window(PhaseLoad(0, "single", 1, (0,)), server="s", port=1, duration_s=1,
                   runner=_Runner((FIX / "no_server.txt").read_text()))


def test_client_log_line_round_trips_through_the_bench_parser() -> None:
    load = PhaseLoad(3, "shared", 3, (1,))
    ok = log_line(load, 100.0, 103.5, {"latency_us": {"p50": 20.0, "p99": 80.5}, "throughput_rps": 9000.0}, None)
    bad = log_line(None, 104.0, 104.1, None, "phase file: missing 'phase'")
    text = json.dumps(ok) + "\n" + "garbage\n" + json.dumps(bad) + "\n"
    ws = parse_client_log(text)
    assert ws == [ClientWindow(100.0, 103.5, 3, "shared", 80.5, True),
                  ClientWindow(104.0, 104.1, None, None, None, False)]
    assert ws[0].mid == pytest.approx(101.75)


# ---------------------------------------------------------------------------- schedule, policy, recovery


def test_parse_schedule() -> None:
    assert parse_schedule("single, shared,single") == ("single", "shared", "single")
    for bad, why in (("single", "at least 2"), ("single,nope", "unknown load"), ("single,single", "consecutive")):
        with pytest.raises(UsageError, match=why):
            parse_schedule(bad)
    assert LAYOUTS["shared"].client_cpus == (1,) and LAYOUTS["single"].client_cpus == (0,)
    # the two loads are further apart than the engine's default region radius (log(1 + flows))
    assert math.log1p(LAYOUTS["shared"].sessions) - math.log1p(LAYOUTS["single"].sessions) > 0.7


def test_daemon_policy_points_the_shipped_policy_at_this_runs_files(tmp_path: Path) -> None:
    paths = MixPaths(tmp_path / "mix")
    argv = client_argv(paths, "198.18.230.2", 11211, paths.client_log)
    f = tmp_path / "policy.toml"
    f.write_text(daemon_policy_toml(REPO / "policies" / "bench-mix.toml", argv, "ptb-c", budget=7, window_s=1.5))
    pol = load_policy(str(f), nic="ptb-s/ptbs")
    assert pol.name == "bench-mix" and pol.tuning.budget == 7 and pol.tuning.window_s == 1.5
    assert pol.probe.kind == "command" and pol.probe.netns == "ptb-c" and pol.probe.fresh_sockets
    assert pol.probe.argv[pol.probe.argv.index("--phase-file") + 1] == str(paths.phase_file)
    assert pol.probe.argv[pol.probe.argv.index("--log") + 1] == str(paths.client_log)
    assert pol.probe.statistic_map["p99"] == "$.latency_us.p99"
    assert pol.probe.statistic_map["sessions"] == "$.sessions"   # the load's size (context: flows)
    assert "ptb-s/ptbs:napi_defer_hard_irqs" in pol.knobs and not any("haltpoll" in k for k in pol.knobs)
    assert pol.on_exit == "restore"
    plain = load_policy(str(REPO / "policies" / "bench-mix.toml"), nic="ptb-s/ptbs")
    assert plain.tuning.budget == 16 and plain.hold.interval_s == 3
    assert client_argv(paths, "a", 1, None)[-2:] == ["--duration", "{window_s}"]


def test_leftover_daemon_is_recognised_only_by_its_command_line(tmp_path: Path) -> None:
    run = tmp_path / "mix" / "run"
    cmd = "\0".join(["/usr/bin/python3", "-m", "polltuned", "--run-dir", str(run), "run", "--policy", "p"]) + "\0"
    assert daemon_cmdline_matches(cmd, run)
    assert not daemon_cmdline_matches(cmd, tmp_path / "other")
    assert not daemon_cmdline_matches("bash\0-c\0sleep 1\0", run)


# ---------------------------------------------------------------------------- the timeline


def test_status_sample_and_exploring() -> None:
    doc = {"phase": "HOLD", "knobs": [{"key": "net.core.busy_read", "current": 50}, {"key": "x", "current": None},
                                      {"key": "y", "current": True}], "hold": {"role": "challenger"}}
    s = status_sample(doc, 5.0)
    assert s.config == {"net.core.busy_read": 50} and s.role == "challenger" and s.t == 5.0
    assert is_exploring(s)
    assert not is_exploring(StatusSample(0, "HOLD", {}, None))
    assert not is_exploring(StatusSample(0, "HOLD", {}, "hold"))
    assert is_exploring(StatusSample(0, "HOLD", {}, "hold"), role="fallback")
    assert not is_exploring(StatusSample(0, "HOLD", {}, "challenge"), role="hold")
    assert is_exploring(StatusSample(0, "MEASURE", {}, None)) and is_exploring(None)


def _timeline() -> tuple[list[PhaseSpan], list[StatusSample], list[ClientWindow]]:
    """Phase 1 (single): 4 search windows, then HOLD on BR. Phase 2 (shared): HOLD BR for 2 windows,
    2 re-tune windows, then HOLD on the defaults. Phase 3 (single): 1 HOLD window on the defaults,
    then HOLD on BR. Phase 4 (shared): never in HOLD."""
    spans = [PhaseSpan(0, "single", 0, 100), PhaseSpan(1, "shared", 100, 200), PhaseSpan(2, "single", 200, 300),
             PhaseSpan(3, "shared", 300, 400)]
    plan: list[tuple[int, float, str, dict[str, int], float]] = []
    for k in range(4):
        plan.append((0, 10 + 10 * k, "MEASURE", BR if k % 2 else DEF, 40.0))
    plan += [(0, 60, "HOLD", BR, 20.0), (0, 80, "HOLD", BR, 21.0)]
    plan += [(1, 110, "HOLD", BR, 90.0), (1, 120, "HOLD", BR, 95.0), (1, 130, "MEASURE", DEF, 30.0),
             (1, 140, "CONFIRM", BR, 92.0), (1, 150, "HOLD", DEF, 31.0), (1, 170, "HOLD", DEF, 29.0)]
    plan += [(2, 210, "HOLD", DEF, 40.0), (2, 220, "HOLD", BR, 20.0), (2, 240, "HOLD", BR, 19.0)]
    plan += [(3, 310, "MEASURE", DEF, 30.0), (3, 320, "MEASURE", BR, 90.0)]
    samples = [StatusSample(t - 1, ph, dict(cfg)) for _, t, ph, cfg, _ in plan]
    windows = [ClientWindow(t, t + 3, p, spans[p].layout, p99, True) for p, t, _, _, p99 in plan]
    return spans, samples, windows


def test_a_windows_role_is_the_one_reported_after_it() -> None:
    """status.hold.role names the kind of the window the daemon observed last: a challenger window
    is known as one from the sample after it, not from the one in its middle."""
    ws = [ClientWindow(10, 13, 0, "single", 20.0, True), ClientWindow(16, 19, 0, "single", 25.0, True),
          ClientWindow(22, 25, 0, "single", 21.0, True)]
    samples = [StatusSample(11, "HOLD", dict(BR), "hold"), StatusSample(14, "HOLD", dict(BR), "hold"),
               StatusSample(17, "HOLD", dict(DEF), "hold"), StatusSample(20, "HOLD", dict(BR), "challenge"),
               StatusSample(23, "HOLD", dict(BR), "challenge"), StatusSample(26, "HOLD", dict(BR), "hold")]
    dws = attribute_windows(ws, samples)
    assert [w.exploring for w in dws] == [False, True, False]
    assert dws[1].config == DEF


def test_timeline_held_exploring_and_switch_delay() -> None:
    spans, samples, windows = _timeline()
    dws = attribute_windows([*windows, ClientWindow(1, 2, None, None, None, False)], samples)
    assert len(dws) == len(windows)
    assert first_deployment(dws) == BR
    r = analyse_timeline(spans, dws, DEF)
    assert [p.windows for p in r] == [6, 6, 3, 2]
    assert [p.exploring for p in r] == [4, 2, 0, 2]
    assert [p.held for p in r] == [BR, DEF, BR, None]
    assert [p.follow for p in r] == [BR, DEF, BR, BR]  # phase 4 never held: the previous deployment stands in
    assert r[0].switch_windows is None
    assert (r[1].switch_windows, r[1].switch_s) == (4, 50.0)   # BR, BR, search, confirm, then the defaults
    assert (r[2].switch_windows, r[2].switch_s) == (1, 20.0)
    assert r[3].switch_windows is None and "never in HOLD" in r[3].note
    # before its first deployment the originals stand in
    early = analyse_timeline(spans[:1], [w for w in dws if w.exploring and w.phase == 0], DEF)
    assert early[0].held is None and early[0].follow == DEF and "originals" in early[0].note
    assert r[1].live_p99_median == pytest.approx(60.5) and r[1].hold_p99_median == pytest.approx(60.5)
    assert r[2].live_p99_median == pytest.approx(20.0)
    # a phase that keeps what the previous one held from its first window on switches in 0 windows
    kept = analyse_timeline([PhaseSpan(0, "single", 0, 100), PhaseSpan(1, "shared", 100, 200)],
                            attribute_windows([windows[4], ClientWindow(110, 113, 1, "shared", 50.0, True)],
                                              [samples[4], StatusSample(109, "HOLD", dict(BR))]), DEF)
    assert (kept[1].switch_windows, kept[1].switch_s) == (0, 0.0) and "kept" in kept[1].note


# ---------------------------------------------------------------------------- arms, whole run, targets, output


def test_arms_are_deduplicated_and_complete() -> None:
    defaults: dict[str, KnobValue] = {"net.core.busy_read": 0, "net.core.busy_poll": 0, "kernel.timer_migration": 1}
    arms = build_arms(defaults, {"net.core.busy_read": 50}, [{"net.core.busy_read": 50}, None, defaults],
                      sweep=({"net.core.busy_read": 50}, {"net.core.busy_read": 100, "not.tuned": 3}))
    assert arms.labels["first"] == arms.labels["follow@1"] == arms.labels["sweep:busy_read=50"]
    assert arms.labels["follow@3"] == arms.labels["default"] and "follow@2" not in arms.labels
    assert len(arms.configs) == 4   # default, static, busy_read=50, busy_read=100
    assert arms.configs[arms.labels["static"]] == {**defaults, "net.core.busy_read": 50, "net.core.busy_poll": 50}
    assert all(set(c) == set(defaults) for c in arms.configs.values())


def _st(j: float, p99: float) -> ArmStats:
    return ArmStats(objective=j, objective_ci=(j * 0.9, j * 1.1), p99=p99, cpu=0.5, windows=6, failed=0, foreign=0.0)


def _result() -> MixResult:
    spans, samples, windows = _timeline()
    dws = attribute_windows(windows, samples)
    reports = analyse_timeline(spans, dws, DEF)
    arms = build_arms(DEF, first_deployment(dws), [p.follow for p in reports], sweep=())
    d, s, b = arms.labels["default"], arms.labels["static"], arms.labels["first"]
    per = {"single": {d: _st(40.0, 30.0), s: _st(22.0, 16.0), b: _st(20.0, 15.0)},
           "shared": {d: _st(30.0, 25.0), s: _st(95.0, 80.0), b: _st(90.0, 75.0)}}
    schedule = ("single", "shared", "single", "shared")
    follow_ids = [arms.labels[f"follow@{i + 1}"] for i in range(4)]
    singles, fol = whole_run(per, schedule, follow_ids)
    comps = []
    for p in reports:
        st = per[p.layout]
        best = best_label(arms, st)
        comps.append(PhaseComparison(p.index, p.layout, st[d], st[s], st[b], st[follow_ids[p.index]],
                                     st[arms.labels[best]], best))
    res = MixResult(schedule=schedule, phase_s=100, policy="bench-mix", knobs=list(DEF), dropped_knobs={},
                    defaults=dict(DEF), arms=arms, per_layout=per, phases=reports, comparisons=comps, singles=singles,
                    follow_whole=fol, explore_after_cycle=(2, 5), rounds={"single": 6, "shared": 6},
                    stop_reasons={"single": "ok", "shared": "ok"}, daemon_exit=0, daemon_restored=True,
                    restored=True, duration_s=900, run_s=400, foreign_cores_run=0.05, samples=len(samples),
                    windows_total=len(dws))
    res.targets = evaluate_targets(res)
    return res


def test_whole_run_and_targets() -> None:
    res = _result()
    # following: single 20, shared 30 (phase 2 held the defaults), single 20, shared 90 (phase 4 fell back to BR)
    assert res.follow_whole == pytest.approx(math.exp((2 * math.log(20) + math.log(30) + math.log(90)) / 4))
    assert min(res.singles.values()) == pytest.approx(math.sqrt(40 * 30))   # the defaults are the best single one
    t = res.targets
    assert t["every_phase_p99_le_default"] is False          # phase 4 held busy polling on the shared load
    assert t["every_phase_J_le_1.15x_oracle"] is False
    assert t["whole_run_J_le_0.8x_best_single"] is False     # 36.6 vs 34.6
    assert t["switch_le_3_windows_to_a_seen_load"] is False  # phase 4 never switched
    assert t["explore_le_10pct_after_first_cycle"] is False  # 2 of 5


def test_table_and_json_are_well_formed() -> None:
    res = _result()
    doc = json.loads(json.dumps(res.to_json()))
    assert doc["workload"] == "mix" and doc["schedule"] == ["single", "shared", "single", "shared"]
    assert [p["switch_windows"] for p in doc["phases"]] == [None, 4, 1, None]
    assert doc["comparison"][1]["follow"]["objective"] == 30.0 and doc["comparison"][1]["oracle_arm"] == "default"
    assert doc["whole_run"]["best_single"].startswith("default") and doc["restored"] is True
    assert set(doc["targets"]) == {"every_phase_p99_le_default", "every_phase_J_le_1.15x_oracle",
                                   "whole_run_J_le_0.8x_best_single", "switch_le_3_windows_to_a_seen_load",
                                   "explore_le_10pct_after_first_cycle"}
    table = render_mix_table(res)
    assert "4 win / 50 s" in table and "never in HOLD" in table and "NOT met" in table
    assert table.count("\n") >= 15 and "J follow" in table and "busy_read=50" in table


# ---------------------------------------------------------------------------- the memcached mix


def test_memcached_phases_round_trip_and_their_errors(tmp_path: Path) -> None:
    from polltuned.bench.mix import phase_load, schedule_app

    p = tmp_path / "phase.json"
    load = phase_load(3, "kv-high")
    assert load.app == "memcached" and load.rate == LAYOUTS["kv-high"].rate and load.sessions == 8
    write_phase(str(p), load)
    assert parse_phase(p.read_text()) == load
    # a sockperf phase file of the previous format (no app, no rate) still reads as sockperf
    assert parse_phase('{"phase": 0, "layout": "single", "sessions": 1, "client_cpus": [0]}').app == "sockperf"
    base = '{"phase": 0, "layout": "kv", "sessions": 1, "client_cpus": [0]'
    for bad, why in ((base + ', "app": "redis", "rate": 10}', "app must be one of"),
                     (base + ', "app": "memcached"}', "needs its rate"),
                     (base + ', "app": "memcached", "rate": 0}', "rate must be"),
                     (base + ', "app": "memcached", "rate": true}', "rate must be")):
        with pytest.raises(MixClientError, match=why):
            parse_phase(bad)
    assert parse_schedule("kv-low,kv-high,kv-low") == ("kv-low", "kv-high", "kv-low")
    assert schedule_app(("kv-low", "kv-high")) == "memcached" and schedule_app(("single", "shared")) == "sockperf"
    with pytest.raises(UsageError, match="one server for the whole run"):
        parse_schedule("single,kv-high")
    # both context signals the daemon sees (flows, rate) are further apart than the region radius
    lo, hi = LAYOUTS["kv-low"], LAYOUTS["kv-high"]
    assert lo.rate is not None and hi.rate is not None
    assert math.log1p(hi.sessions) - math.log1p(lo.sessions) > 0.7 and math.log1p(hi.rate) - math.log1p(lo.rate) > 0.7


def test_a_memcached_window_runs_one_open_loop_client_on_the_phase_cpu() -> None:
    kv = {"v": 1, "mode": "open", "requests": 11987, "throughput_rps": 5993.5, "rate_rps": 6000.0,
          "latency_us": {"p50": 61.0, "p90": 88.0, "p99": 240.5, "p999": 900.0, "mean": 70.2, "max": 1500.0,
                         "min": 30.0}, "histogram": {"encoded": "x"}}
    r = _Runner(json.dumps(kv))
    load = PhaseLoad(2, "kv-high", 8, (0,), app="memcached", rate=6000.0)
    doc = run_window(load, server="198.18.230.2", port=11211, duration_s=2.0, runner=r)
    assert len(r.spawned) == 1 and r.spawned[0][1] == [0]
    argv = r.spawned[0][0]
    assert argv[1:3] == ("-m", "polltuned.host.kvclient")
    assert argv[argv.index("--rate") + 1] == "6000" and argv[argv.index("--connections") + 1] == "8"
    assert argv[argv.index("--duration") + 1] == "2" and "--preload" in argv
    assert doc["latency_us"] == {"p50": 61.0, "p90": 88.0, "p99": 240.5, "p999": 900.0, "mean": 70.2, "max": 1500.0}
    assert doc["throughput_rps"] == 5993.5 and doc["observations"] == 11987 and doc["sessions"] == 8
    # the daemon is told nothing but latencies, rate and the load's size
    assert set(doc) == {"v", "latency_us", "throughput_rps", "observations", "sessions"}
    with pytest.raises(MixClientError, match="memcached client failed"):
        run_window(load, server="s", port=1, duration_s=1, runner=_Runner("", rc=1))
    with pytest.raises(MixClientError, match="unreadable output"):
        run_window(load, server="s", port=1, duration_s=1, runner=_Runner("not json"))
    with pytest.raises(MixClientError, match="no requests"):
        run_window(load, server="s", port=1, duration_s=1, runner=_Runner(json.dumps({**kv, "requests": 0})))

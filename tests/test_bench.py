"""Bench pieces without the kernel: comparison, summaries, recording env, table; and the real e2e run."""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from polltuned.bench.comparison import ArmSummary, compare_interleaved, summarise_arm
from polltuned.bench.cpu import foreign_cores
from polltuned.bench.env import BenchEnv
from polltuned.bench.table import BenchResult, render_table
from polltuned.clock import FakeClock
from polltuned.host.fs import FsHost
from polltuned.metrics.cpu_scope import parse_cpuidle_poll_us
from polltuned.policy.schema import Objective
from polltuned.records import Config, KnobValue, Window
from polltuned.stats import mean_ci


class FakeEnv:
    def __init__(self, clock: FakeClock | None = None, host_root: Path | None = None) -> None:
        self.cfg: dict[str, KnobValue] = {"net.core.busy_read": 0}
        self.seen: list[dict[str, KnobValue]] = []
        self.clock = clock
        self.root = host_root

    def current(self) -> dict[str, KnobValue]:
        return dict(self.cfg)

    def apply(self, config: Config) -> None:
        self.cfg.update(config)

    def measure(self, window_index: int) -> Window:
        self.seen.append(dict(self.cfg))
        if self.clock is not None:
            self.clock.advance(4.0)
        if self.root is not None:  # the guest polled 1 s on cpu0 during this window
            t = self.root / "sys/devices/system/cpu/cpu0/cpuidle/state0/time"
            t.write_text(str(int(t.read_text()) + 1_000_000))
        br = float(self.cfg["net.core.busy_read"])
        return Window(ok=True, latency={"p50": 10.0, "p99": 20.0 if br else 200.0, "p999": 400.0},
                      cpu_cores=1.0 if br else 0.25)

    def describe(self) -> Mapping[str, object]:
        return {}


def test_compare_interleaved_rotates_order() -> None:
    env = FakeEnv()
    arms: dict[str, Config] = {"default": {"net.core.busy_read": 0}, "static": {"net.core.busy_read": 50},
                               "deployed": {"net.core.busy_read": 25}}
    seen: list[tuple[str, int]] = []
    out = compare_interleaved(env, arms, 3, first_index=0, on_window=lambda n, r, w: seen.append((n, r)))
    assert [n for n, _ in seen] == ["default", "static", "deployed", "static", "deployed", "default",
                                    "deployed", "default", "static"]
    assert all(len(v) == 3 for v in out.values())
    assert [c["net.core.busy_read"] for c in env.seen[:3]] == [0, 50, 25]


def test_summarise_arm_and_ci() -> None:
    obj = Objective(statistic="p99", combine="latency_x_cpu", cpu_weight=0.5)
    ws = [Window(ok=True, latency={"p50": 10, "p99": p, "p999": 50}, cpu_cores=1.0) for p in (20.0, 22.0, 24.0)]
    ws.append(Window.failed("probe timeout"))
    s = summarise_arm("static", {"x": 1}, ws, obj)
    assert s.windows == 4 and s.failed == 1
    assert s.p99 == 22.0 and s.cpu_cores == 1.0
    assert s.objective == pytest.approx(1.5 * (20.0 * 22.0 * 24.0) ** (1 / 3))   # geometric mean of J
    assert s.objective_median == pytest.approx(22.0 * 1.5)
    assert s.values == (30.0, 33.0, 36.0, None)
    lo, hi = s.objective_ci
    assert 0 < lo < s.objective < hi
    assert math.isnan(mean_ci([1.0])[0])
    lo2, hi2 = mean_ci([1.0, 2.0, 3.0])
    assert lo2 == pytest.approx(2.0 - 4.303 * 1.0 / math.sqrt(3), rel=1e-3)
    assert hi2 == pytest.approx(2.0 + 4.303 * 1.0 / math.sqrt(3), rel=1e-3)


def test_foreign_cores() -> None:
    assert foreign_cores({1: 1.0, 2: 5.0}, {1: 3.0, 2: 4.0, 3: 100.0}, 2.0) == pytest.approx(1.0)
    assert foreign_cores({}, {}, 0.0) == 0.0


def test_parse_cpuidle_poll() -> None:
    assert parse_cpuidle_poll_us([("POLL\n", "1500\n"), ("haltpoll\n", "999999\n"), ("POLL", "500")]) == 2000.0


def test_bench_env_records_windows_and_adds_foreign_cpu(tmp_path: Path) -> None:
    # idle polling is the CPU scope's (tests/test_cpu_scope.py): BenchEnv leaves the window's CPU alone
    for cpu in (0, 1):
        for st, name in ((0, "POLL"), (1, "haltpoll")):
            d = tmp_path / f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state{st}"
            d.mkdir(parents=True)
            (d / "name").write_text(name + "\n")
            (d / "time").write_text("0\n")
    clock = FakeClock()
    rec = io.StringIO()
    samples = iter([{10: 5.0, 11: 1.0}, {10: 7.0, 12: 9.0}])
    env = BenchEnv(FakeEnv(clock, tmp_path), host=FsHost(tmp_path), clock=clock, workload="single", record=rec,
                   foreign=lambda: next(samples))
    env.current()
    env.apply({"net.core.busy_read": 50})
    w = env.measure(0)
    assert "idle_poll_cores" not in w.extra and w.cpu_cores == pytest.approx(1.0)
    assert w.extra["foreign_cores"] == pytest.approx(0.5)  # pid 10 used 2 s of CPU in 4 s
    line = json.loads(rec.getvalue().splitlines()[0])
    assert line["v"] == 1 and line["workload"] == "single"
    assert line["config"] == {"net.core.busy_read": 50}
    assert Window.from_json(line["window"]).latency["p99"] == 20.0
    assert env.windows.entries[0][1] == {"net.core.busy_read": 50}


def _arm(name: str, p99: float, j: float) -> ArmSummary:
    return ArmSummary(name, {"net.core.busy_read": 0 if name == "default" else 50}, 3, 0, 10.0, p99, 500.0,
                      0.5, j, (j * 0.9, j * 1.1), (p99 * 0.9, p99 * 1.1), (j, j, j))


def test_render_table_and_json() -> None:
    res = BenchResult("single", {"default": _arm("default", 200.0, 230.0), "static": _arm("static", 17.0, 25.0),
                                 "deployed": _arm("deployed", 16.0, 24.0)},
                      {"reason": "deployed: gain +90%"}, [], 180.0, True, ["net.core.busy_read"], {}, {}, False)
    t = render_table(res)
    assert "default" in t and "static" in t and "deployed: net.core.busy_read=50" in t
    assert "knobs restored: yes" in t
    assert "other processes used" not in t
    res.arms["static"] = ArmSummary(**{**res.arms["static"].__dict__, "foreign_cores": 1.5})
    assert "other processes used up to 1.50 cores" in render_table(res)
    d = res.to_json()
    for arm in ("default", "static", "deployed"):
        assert isinstance(d[arm]["objective"], float)
    assert d["workload"] == "single" and d["restored"] is True


# ---------------------------------------------------------------------------- comparison statistics


def test_log_ci_is_positive_where_the_t_interval_goes_negative() -> None:
    from polltuned.stats import geo_mean, log_ci, nonneg_ci

    xs = [1.0, 50.0, 2.0]                      # very noisy: the plain t interval dips below zero
    assert mean_ci(xs)[0] < 0
    lo, hi = log_ci(xs)
    assert 0 < lo < geo_mean(xs) < hi
    assert geo_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert math.isnan(log_ci([5.0])[0]) and math.isnan(log_ci([0.0, -1.0])[0])
    assert nonneg_ci([0.0, 0.1, 0.5])[0] == 0.0            # a zero CPU reading: clipped, not log
    assert nonneg_ci([0.2, 0.4])[0] > 0


@given(hst.lists(hst.floats(min_value=1e-6, max_value=1e9, allow_nan=False), min_size=2, max_size=30))
@settings(max_examples=200, deadline=None)
def test_log_ci_never_negative_property(xs: list[float]) -> None:
    from polltuned.stats import geo_mean, log_ci

    lo, hi = log_ci(xs)
    g = geo_mean(xs)
    assert lo > 0 and hi > 0
    assert lo <= g * (1 + 1e-9) and g <= hi * (1 + 1e-9)


def test_paired_ratios_cancel_round_effects() -> None:
    from polltuned.stats import paired_log_ratios, ratio_ci

    # round effects x1, x3, x0.5 hit both arms; the arm is always half the default
    base = [100.0, 300.0, 50.0, 80.0]
    arm: list[float | None] = [50.0, 150.0, 25.0, None]     # last round's window failed: no pair
    lr = paired_log_ratios(arm, base)
    assert len(lr) == 3 and all(x == pytest.approx(math.log(0.5)) for x in lr)
    r, (lo, hi) = ratio_ci(lr)
    assert r == pytest.approx(0.5) and lo == pytest.approx(0.5) and hi == pytest.approx(0.5)
    # unpaired, the same data would be hopeless: the arm's spread covers the default's
    r2, (lo2, hi2) = ratio_ci(paired_log_ratios([50.0, 110.0, 25.0], [100.0, 100.0, 50.0]))
    assert 0 < lo2 < r2 < hi2
    assert math.isnan(ratio_ci([])[0])


def test_stopping_rule() -> None:
    from polltuned.bench.comparison import StopRule, comparison_done

    rule = StopRule(min_rounds=3, max_rounds=6, rel_halfwidth=0.15)
    tight = {"default": [100.0, 101.0, 99.0], "static": [50.0, 50.5, 49.5]}
    assert comparison_done({k: v[:2] for k, v in tight.items()}, rule)[0] is False     # below min_rounds
    ok, why = comparison_done(tight, rule)
    assert ok and "every arm" in why
    noisy: dict[str, list[float | None]] = {"default": [100.0, 101.0, 99.0], "static": [10.0, 80.0, 30.0]}
    ok, why = comparison_done(noisy, rule)
    assert not ok and why.startswith("static")
    capped: dict[str, list[float | None]] = {"default": [100.0] * 6, "static": [10.0, 80.0, 30.0, 5.0, 90.0, 20.0]}
    ok, why = comparison_done(capped, rule)
    assert ok and "hard cap of 6" in why and "static" in why
    failed: dict[str, list[float | None]] = {"default": [100.0, 100.0, 100.0], "static": [None, None, None]}
    assert comparison_done(failed, rule)[0] is False                      # no J at all is not "tight"
    with pytest.raises(ValueError):
        StopRule(min_rounds=5, max_rounds=4)


class NoisyEnv(FakeEnv):
    """busy_read 50 gives p99 ~20, default ~200; ``noise`` multiplies every window of one round."""

    def __init__(self, factors: list[float]) -> None:
        super().__init__()
        self.factors = factors
        self.n = 0

    def measure(self, window_index: int) -> Window:
        w = super().measure(window_index)
        f = self.factors[(self.n // 2) % len(self.factors)]
        self.n += 1
        return Window(ok=True, latency={k: v * f for k, v in w.latency.items()}, cpu_cores=w.cpu_cores)


def test_run_comparison_stops_early_when_tight_and_caps_when_noisy() -> None:
    from polltuned.bench.comparison import StopRule, run_comparison, summarise_comparison

    obj = Objective(statistic="p99", combine="latency", cpu_weight=0.0)
    arms: dict[str, Config] = {"default": {"net.core.busy_read": 0}, "static": {"net.core.busy_read": 50}}
    rule = StopRule(min_rounds=3, max_rounds=8, rel_halfwidth=0.15)
    wins, why = run_comparison(NoisyEnv([1.0, 1.02, 0.98]), arms, obj, rule, first_index=0)
    assert all(len(v) == 3 for v in wins.values()) and "every arm" in why
    wins2, why2 = run_comparison(NoisyEnv([1.0, 3.0, 0.4, 2.0]), arms, obj, rule, first_index=0)
    assert all(len(v) == 8 for v in wins2.values()) and "hard cap of 8" in why2
    # round effects are shared by both arms of a round: the paired ratio stays exact (rounds 2.. rotate order,
    # so a round's two windows see the same factor only per pair of measurements; the env pairs them by count)
    s = summarise_comparison(arms, wins2, obj)
    assert s["default"].ratio == pytest.approx(1.0) and s["default"].ratio_ci == (1.0, 1.0)
    assert s["static"].pairs == 8 and s["static"].ratio == pytest.approx(0.1, rel=1e-6)
    assert s["static"].ratio_ci[0] == pytest.approx(0.1, rel=1e-6)
    lo, hi = s["default"].objective_ci
    assert lo > 0 and (hi - lo) / 2 / s["default"].objective > 0.15      # each arm alone is noisy


def test_strip_seeds_and_probe_fit() -> None:
    from types import SimpleNamespace

    from polltuned.bench.session import bench_probe_config
    from polltuned.bench.world import WORKLOADS, WorldConfig
    from polltuned.policy.edits import strip_seeds
    from polltuned.policy.loader import load_policy
    from polltuned.policy.schema import CommandProbe, SockperfProbe

    pol = load_policy("bench", nic="ptb-s/ptbs")
    assert pol.knobs["net.core.busy_read"].seeds == [50]
    assert all(not k.seeds for k in strip_seeds(pol).knobs.values())
    world = SimpleNamespace(config=WorldConfig(), client_cpus=(0,), server_cpus=(1,))
    sp = bench_probe_config(pol, WORKLOADS["parallel"], world)
    assert isinstance(sp, SockperfProbe) and sp.sessions == 4 and sp.netns == "ptb-c" and sp.restart_server
    ng = load_policy("bench-nginx", nic="ptb-s/ptbs")
    cp = bench_probe_config(ng, WORKLOADS["nginx"], world)
    assert isinstance(cp, CommandProbe) and cp.netns == "ptb-c" and cp.cpus == [0]
    from polltuned.errors import UsageError

    with pytest.raises(UsageError, match="needs a sockperf probe"):
        bench_probe_config(ng, WORKLOADS["single"], world)
    with pytest.raises(UsageError, match="command probe"):
        bench_probe_config(pol, WORKLOADS["memcached"], world)


def test_table_shows_ratios_and_oracle() -> None:
    d = _arm("default", 200.0, 230.0)
    o = ArmSummary(**{**_arm("oracle", 15.0, 20.0).__dict__, "config": {"net.core.busy_read": 25},
                      "ratio": 0.087, "ratio_ci": (0.07, 0.11), "throughput": 91642.4})
    res = BenchResult("nginx", {"default": d, "static": _arm("static", 17.0, 25.0),
                                "deployed": _arm("deployed", 16.0, 24.0), "oracle": o},
                      {"reason": "x"}, [], 10.0, True, ["net.core.busy_read"], {}, {}, False,
                      comparison={"rounds": 8, "stop_reason": "every arm's J within ±15%"})
    t = render_table(res)
    assert "oracle: net.core.busy_read=25" in t and "[0.07, 0.11]" in t and "0.087" in t and "8 interleaved rounds" in t
    assert "req/s" in t and "91642" in t
    assert "req/s" not in render_table(BenchResult("single", {"default": d}, {}, [], 1.0, True, [], {}, {}, True))
    j = res.to_json()
    assert j["arms"] == ["default", "static", "deployed", "oracle"]
    assert j["oracle"]["ratio_ci95"] == [0.07, 0.11] and j["comparison"]["rounds"] == 8
    json.dumps(j)


class StatHost:
    """/proc/stat whose busy ticks grow by the next value of ``busy_per_s`` per read (1 s apart)."""

    def __init__(self, busy_per_s: list[float]) -> None:
        self.busy = list(busy_per_s)
        self.user = 0
        self.idle = 0

    def read_text(self, path: str) -> str:
        assert path == "/proc/stat"
        step = self.busy.pop(0) if self.busy else 0.0
        self.user += round(step * 100)
        self.idle += round((2 - step) * 100)
        return (f"cpu  {self.user} 0 0 {self.idle} 0 0 0 0 0 0\ncpu0 {self.user} 0 0 {self.idle} 0 0 0 0 0 0\n"
                "ctxt 1\nprocs_running 1\nprocs_blocked 0\n")


def test_wait_for_quiet() -> None:
    from polltuned.bench.cpu import wait_for_quiet

    clock = FakeClock()
    host = StatHost([0.0] + [1.5] * 5 + [0.05] * 30)       # busy for 5 s, then quiet
    quiet, waited = wait_for_quiet(host, clock, max_cores=0.15, hold_s=10, timeout_s=100)  # type: ignore[arg-type]
    assert quiet and 14 <= waited <= 17
    notes: list[str] = []
    quiet, waited = wait_for_quiet(StatHost([0.0] + [1.0] * 200), FakeClock(), hold_s=10,  # type: ignore[arg-type]
                                   timeout_s=45, progress=notes.append)
    assert not quiet and 45 <= waited <= 47
    assert any("did not get quiet" in n for n in notes) and any("waiting for a quiet machine" in n for n in notes)


def test_bench_table_checks_the_issue_targets() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_workloads import verdicts

    def arm(j: float, p99: float) -> dict[str, object]:
        return {"objective": j, "p99_us": p99, "cpu_cores": 0.5}

    good = {"default": arm(100, 90), "static": arm(10, 9), "deployed": arm(11, 10), "oracle": arm(10, 9)}
    v = verdicts(good)
    assert v["no_regression"] == "yes" and "met" in v["vs_best"] and "MISSED" not in v["vs_best"]
    assert "96 %" in v["gain_share"] and "met" in v["gain_share"] and "(<= 1.2: met)" in v["vs_oracle"]
    bad = {"default": arm(100, 90), "static": arm(10, 9), "deployed": arm(40, 95)}
    w = verdicts(bad)
    assert w["no_regression"] == "NO" and "MISSED" in w["vs_best"] and "MISSED" in w["gain_share"]
    assert w["vs_oracle"] == "no oracle arm"
    harmful = {"default": arm(100, 90), "static": arm(300, 250), "deployed": arm(100, 90)}
    assert "not >= 2x" in verdicts(harmful)["gain_share"] and "met" in verdicts(harmful)["vs_best"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_swallowed_interrupt_is_raised_at_the_next_window() -> None:
    """A signal that lands in an at-fork callback or a __del__ has its exception swallowed by the
    interpreter ("Exception ignored in ..."): the bench must still stop at the next checkpoint."""
    import gc
    import signal
    import time

    from polltuned.bench.signals import BenchInterrupted, raise_if_interrupted, signals_raise

    class SignalledWhileFinalising:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler runs here, inside __del__: its exception is ignored

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with signals_raise():
        raise_if_interrupted()  # nothing pending yet
        obj = SignalledWhileFinalising()
        del obj
        gc.collect()
        with pytest.raises(BenchInterrupted, match="signal 15"):
            raise_if_interrupted()
    raise_if_interrupted()  # cleared once the bench's signal scope is left
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before

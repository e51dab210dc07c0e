"""Bench pieces without the kernel: comparison, summaries, recording env, table; and the real e2e run."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from pathlib import Path

import pytest

from polltuned.bench import (
    ArmSummary,
    BenchEnv,
    BenchResult,
    compare_interleaved,
    foreign_cores,
    mean_ci,
    parse_cpuidle_poll_us,
    render_table,
    summarise_arm,
)
from polltuned.clock import FakeClock
from polltuned.host.fs import FsHost
from polltuned.policy.schema import Objective
from polltuned.records import Config, KnobValue, Window


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
    assert s.objective == pytest.approx(22.0 * 1.5)
    lo, hi = s.objective_ci
    assert lo < 33.0 < hi
    assert math.isnan(mean_ci([1.0])[0])
    lo2, hi2 = mean_ci([1.0, 2.0, 3.0])
    assert lo2 == pytest.approx(2.0 - 4.303 * 1.0 / math.sqrt(3), rel=1e-3)
    assert hi2 == pytest.approx(2.0 + 4.303 * 1.0 / math.sqrt(3), rel=1e-3)


def test_foreign_cores() -> None:
    assert foreign_cores({1: 1.0, 2: 5.0}, {1: 3.0, 2: 4.0, 3: 100.0}, 2.0) == pytest.approx(1.0)
    assert foreign_cores({}, {}, 0.0) == 0.0


def test_parse_cpuidle_poll() -> None:
    assert parse_cpuidle_poll_us([("POLL\n", "1500\n"), ("haltpoll\n", "999999\n"), ("POLL", "500")]) == 2000.0


def test_bench_env_records_windows_and_adds_idle_poll(tmp_path: Path) -> None:
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
    assert w.extra["idle_poll_cores"] == pytest.approx(0.25)  # 1 s of POLL over a 4 s window
    assert w.cpu_cores == pytest.approx(1.25)
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

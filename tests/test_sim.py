"""`polltuned sim`: the real engine (Actuator + Journal + HostEnv + SimProbe) on a fake kernel tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polltuned.actuator import Actuator
from polltuned.cli.main import main
from polltuned.clock import FakeClock
from polltuned.engine.env import HostEnv
from polltuned.host.fs import FsHost
from polltuned.journal import Journal
from polltuned.metrics.cpu_scope import CpuReading
from polltuned.metrics.window import MetricUnavailable
from polltuned.policy.loader import load_policy
from polltuned.probes.sim import SimProbe, make_fake_host_tree
from polltuned.records import Window


def test_fake_tree_has_kernel_defaults(tmp_path: Path) -> None:
    pol = load_policy("sim-default")
    make_fake_host_tree(tmp_path, pol.knobs)
    assert (tmp_path / "proc/sys/net/core/busy_read").read_text() == "0\n"
    assert (tmp_path / "proc/sys/net/core/gro_normal_batch").read_text() == "8\n"
    assert (tmp_path / "proc/sys/kernel/timer_migration").read_text() == "1\n"
    assert (tmp_path / "sys/class/net/sim0/gro_flush_timeout").read_text() == "0\n"
    make_fake_host_tree(tmp_path, ["module:haltpoll:guest_halt_poll_ns"])
    assert (tmp_path / "sys/module/haltpoll/parameters/guest_halt_poll_ns").exists()


def test_sim_probe_sees_what_the_actuator_wrote(tmp_path: Path) -> None:
    pol = load_policy("sim-default")
    make_fake_host_tree(tmp_path / "root", pol.knobs)
    host, clock = FsHost(tmp_path / "root"), FakeClock()
    act = Actuator(host, Journal(tmp_path / "state", clock=clock), clock=clock)
    probe = SimProbe(host, pol, "busypoll_split", 0, clock=clock)
    env = HostEnv(pol, act, probe, clock=clock)
    base = env.current()
    slow = env.measure(0)
    env.apply({**base, "net.core.busy_read": 50})
    assert probe.read_config()["net.core.busy_read"] == 50
    fast = env.measure(1)
    assert slow.ok and fast.ok and fast.latency["p99"] < 0.3 * slow.latency["p99"]
    assert clock.slept[0] == pol.tuning.settle_s and pol.tuning.window_s in clock.slept
    act.rollback()
    assert probe.read_config()["net.core.busy_read"] == 0


class FakeProbe:
    name = "fake"

    def __init__(self, cpu: float | None) -> None:
        self.cpu = cpu
        self.restarts = 0

    def start(self) -> None: ...
    def restart(self) -> None:
        self.restarts += 1

    def measure(self, duration_s: float, window_index: int) -> Window:
        return Window(ok=True, latency={"p99": 10.0}, cpu_cores=self.cpu)

    def close(self) -> None: ...


class FakeScope:
    """A CPU scope (polltuned.metrics.cpu_scope) reporting fixed cores, or failing like a scope does."""

    def __init__(self, cores: float, poll: float | None = None, fail: bool = False) -> None:
        self.cores, self.poll, self.fail = cores, poll, fail
        self.begun = 0

    def begin(self) -> None:
        if self.fail:
            raise MetricUnavailable("cpu: cannot read /proc/stat")
        self.begun += 1

    def end(self) -> CpuReading:
        return CpuReading(self.cores, "fake", (0,), self.poll)

    def describe(self) -> str:
        return "fake"


def test_host_env_fills_cpu_from_the_cpu_scope() -> None:
    pol = load_policy("sim-default")
    probe = FakeProbe(cpu=None)
    scope = FakeScope(0.75, poll=0.25)
    env = HostEnv(pol, act_stub(), probe, clock=FakeClock(), cpu_scope=scope)
    w = env.measure(0)
    assert w.ok and w.cpu_cores == 0.75 and probe.restarts == 1 and scope.begun == 1
    assert w.extra["idle_poll_cores"] == 0.25
    # a probe that reports CPU itself wins
    own = HostEnv(pol, act_stub(), FakeProbe(cpu=0.2), clock=FakeClock(), cpu_scope=FakeScope(0.75))
    assert own.measure(0).cpu_cores == 0.2
    # no scope: the probe's CPU only (the simulated world reports its own)
    assert HostEnv(pol, act_stub(), FakeProbe(cpu=None), clock=FakeClock()).measure(0).cpu_cores is None
    # a scope failure is a failed window, never a number
    bad = HostEnv(pol, act_stub(), FakeProbe(cpu=None), clock=FakeClock(), cpu_scope=FakeScope(1, fail=True)).measure(0)
    assert not bad.ok and "/proc/stat" in (bad.error or "")


class act_stub:
    def read(self, keys: Any) -> dict[str, Any]:
        return {k: 0 for k in keys}

    def apply(self, assignment: Any, *, reason: str = "") -> None:
        return None


def test_cli_sim_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--state-dir", str(tmp_path / "st"), "sim", "--scenario", "epoll_busypoll", "--trials", "14",
               "--seed", "2", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["windows_used"] == 14 and out["scenario"] == "epoll_busypoll"
    assert out["expected_J"]["deployed"] <= out["expected_J"]["baseline"]
    assert out["events"][0]["phase"] == "BASELINE"
    # the journal and the study were written by the real engine
    assert (tmp_path / "st" / "studies").is_dir() and any((tmp_path / "st" / "studies").iterdir())


def test_cli_sim_list_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--list"]) == 0
    assert "cliff" in capsys.readouterr().out
    assert main(["sim", "--scenario", "nothing_helps", "--trials", "8", "--quiet"]) == 0
    assert "baseline" in capsys.readouterr().out


def test_cli_sim_refuses_the_real_root() -> None:
    assert main(["--host-root", "/tmp/../", "sim", "--scenario", "cliff", "--trials", "3"]) != 0

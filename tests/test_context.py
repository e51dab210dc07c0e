"""Context signals (polltuned.metrics.context) and HostEnv filling Window.context."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from polltuned.clock import FakeClock
from polltuned.engine.env import HostEnv
from polltuned.errors import HostError
from polltuned.metrics.context import (
    SIGNALS,
    ContextMeter,
    Task,
    app_by_command,
    busy_peers,
    flows_of,
    offered_rate_of,
    rate_mode_for,
    steady_runnable_others,
    tasks_from,
)
from polltuned.policy.loader import load_policy
from polltuned.records import Window

W = Window(ok=True, latency={"p99": 20.0}, throughput_pps=5000.0, extra={"sessions": 4.0})


def _t(pid: int, cpu: int, s: float, cmd: str = "x") -> Task:
    return Task(pid, cpu, "R", s, cmd)


def test_runnable_others_counts_busy_peers_on_the_app_cpus_only() -> None:
    before = {1: _t(1, 0, 0.0, "sockperf server"), 2: _t(2, 0, 0.0), 3: _t(3, 1, 0.0), 4: _t(4, 0, 0.0),
              5: _t(5, 0, 5.0)}
    after = {1: _t(1, 0, 0.9, "sockperf server"),   # the poller: excluded
             2: _t(2, 0, 0.3),                       # a busy peer on CPU0
             3: _t(3, 1, 0.9),                       # busy, but on another CPU
             4: _t(4, 0, 0.01),                      # 1 % of a core: not runnable enough
             5: _t(5, 0, 1.0),                       # cpu time went down: pid reused, skipped
             6: _t(6, 0, 0.5)}                       # not there at the start
    n = busy_peers(before, after, app_cpus=[0], is_app=app_by_command("sockperf", "server"), interval_s=1.0)
    assert n == {2}
    # a spinning poller takes CPU from the peer: its share falls but it is still counted once
    squeezed = {**after, 2: _t(2, 0, 0.08)}
    assert busy_peers(before, squeezed, app_cpus=[0], is_app=app_by_command("sockperf", "server"),
                      interval_s=1.0) == {2}
    with pytest.raises(ValueError):
        busy_peers(before, after, app_cpus=[0], is_app=lambda t: False, interval_s=0.0)


def _inside_samples() -> list[dict[int, Task]]:
    """Six samples 0.2 s apart inside one window: client 7 starts after the first and runs to the
    end on CPU0; 8 passes through CPU0 in one interval only (a command starting up); 9 is busy on
    CPU1 throughout (not an app CPU); the server (the poller) spins on CPU0."""
    out: list[dict[int, Task]] = []
    for k in range(6):
        tasks = {1: _t(1, 0, 0.15 * k, "sockperf server"), 9: _t(9, 1, 0.1 * k)}
        if k >= 1:
            tasks[7] = _t(7, 0, 0.05 * (k - 1))
        if k in (2, 3):
            tasks[8] = _t(8, 0, 0.02 * k, "ip netns exec c taskset -c 0 sockperf ping-pong")
        out.append(tasks)
    return out


def test_a_peer_busy_in_one_interval_of_the_window_is_not_the_load() -> None:
    samples = _inside_samples()
    pairs = [(a, b, 0.2) for a, b in itertools.pairwise(samples)]
    server = app_by_command("sockperf", "server")
    per_interval = [busy_peers(a, b, app_cpus=[0], is_app=server, interval_s=t) for a, b, t in pairs]
    assert per_interval == [set(), {7}, {7, 8}, {7}, {7}]   # the largest count would say 2
    assert steady_runnable_others(pairs, app_cpus=[0], is_app=server) == 1.0
    # not a share of the intervals: a client that runs only in the last intervals still counts
    idle = [({1: _t(1, 0, 0.0, "sockperf server")}, {1: _t(1, 0, 0.0, "sockperf server")}, 0.2)] * 10
    assert steady_runnable_others(idle + pairs, app_cpus=[0], is_app=server) == 1.0
    # one interval alone is busy_peers' count; no interval at all is an error
    assert steady_runnable_others(pairs[2:3], app_cpus=[0], is_app=server) == 2.0
    with pytest.raises(ValueError):
        steady_runnable_others([], app_cpus=[0], is_app=server)
    with pytest.raises(ValueError):
        steady_runnable_others(pairs, app_cpus=[0], is_app=server, min_intervals=0)

    # the meter's helper thread samples inside the window and uses the same rule
    clock = FakeClock()
    seq = list(samples)
    drained = threading.Event()

    def tasks() -> Mapping[int, Task]:
        if not seq:
            drained.set()
            raise HostError("no more samples")          # later passes fail: left out, never a pair
        clock.advance(0.2)
        return seq.pop(0)

    m = ContextMeter(monotonic=clock.monotonic, app_cpus=[0], tasks=tasks, is_app=server, within_s=1.0,
                     sleep=lambda s: time.sleep(0.001))
    m.begin()
    assert drained.wait(10)
    out = m.end(Window(ok=True, latency={"p99": 1.0}))
    assert out.context["runnable_others"] == 1.0


def test_flows_and_rate_come_from_the_probe_by_mode() -> None:
    assert flows_of(W) == 4.0
    assert flows_of(Window(ok=True, extra={"sockets": 7.0})) == 7.0
    assert flows_of(Window(ok=True), sockets=3) == 3.0
    assert flows_of(Window(ok=True)) is None
    assert offered_rate_of(W, mode="closed", nic_rx_pps=10.0) is None
    assert offered_rate_of(W, mode="open") == 5000.0
    assert offered_rate_of(Window(ok=True), mode="open", nic_rx_pps=10.0) == 10.0
    assert offered_rate_of(W, mode="set", set_rate=2000.0) == 2000.0


def test_rate_mode_per_probe_kind() -> None:
    p = load_policy("bench", nic="ptb-s/ptbs").probe
    assert rate_mode_for(p) == ("closed", None)
    under = p.model_copy(update={"mode": "under-load", "rate_mps": 3000, "sessions": 2})
    assert rate_mode_for(under) == ("set", 6000.0)
    assert rate_mode_for(type("P", (), {"kind": "prometheus"})()) == ("open", None)


def test_every_signal_says_why_the_knobs_do_not_move_it() -> None:
    prim = {k for k, s in SIGNALS.items() if s.primary}
    assert prim == {"flows", "offered_rate", "runnable_others"}
    for s in SIGNALS.values():
        assert s.invariance and s.exactness and s.source
        assert s.primary or s.invariance.startswith("NOT invariant")


class _Sampler:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def sample(self) -> Any:
        if self.fail:
            raise HostError("no /proc/stat")
        return object()


def test_meter_fills_the_context_and_survives_a_failing_source() -> None:
    clock = FakeClock()
    seq: list[Mapping[int, tuple[int, str, float, str]]] = [{9: (0, "R", 1.0, "hog")}, {9: (0, "R", 2.0, "hog")},
                                                            {9: (0, "R", 2.0, "hog")}]

    def tasks() -> Mapping[int, Task]:
        clock.advance(0.5)
        return tasks_from(seq.pop(0))

    def sockets() -> int:
        raise HostError("sock_diag refused")

    m = ContextMeter(monotonic=clock.monotonic, app_cpus=[0], tasks=tasks, sampler=_Sampler(fail=True),
                     rate_mode="open", sockets=sockets)
    m.begin()
    out = m.end(Window(ok=True, latency={"p99": 1.0}, throughput_pps=100.0))
    assert out.ok and dict(out.context) == {"offered_rate": 100.0, "runnable_others": 1.0}
    failed = Window.failed("probe gap")
    m.begin()
    assert m.end(failed) is failed


class _Probe:
    name = "fake"

    def start(self) -> None: ...
    def restart(self) -> None: ...
    def close(self) -> None: ...

    def measure(self, duration_s: float, window_index: int) -> Window:
        return Window(ok=True, latency={"p99": 10.0}, cpu_cores=0.5, extra={"sessions": 2.0})


class _Meter:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def begin(self) -> None:
        self.calls.append("begin")

    def end(self, w: Window) -> Window:
        self.calls.append("end")
        from dataclasses import replace
        return replace(w, context={"flows": float(w.extra["sessions"])})


class _Actuator:
    def read(self, keys: Any) -> dict[str, Any]:
        return {}

    def apply(self, assignment: Any, *, reason: str = "") -> None:
        return None


def test_host_env_measure_fills_window_context() -> None:
    pol = load_policy("sim-default")
    meter = _Meter()
    env = HostEnv(pol, actuator=_Actuator(), probe=_Probe(), clock=FakeClock(), context=meter)
    w = env.measure(0)
    assert meter.calls == ["begin", "end"]
    assert dict(w.context) == {"flows": 2.0} and w.cpu_cores == 0.5
    plain = HostEnv(pol, actuator=_Actuator(), probe=_Probe(), clock=FakeClock())
    assert dict(plain.measure(0).context) == {}


def test_bench_context_settings_name_the_server_and_its_cpus() -> None:
    from polltuned.bench.session import bench_context_settings
    from polltuned.bench.world import get_workload

    class World:
        server_cpus = (0,)

    pol = load_policy("bench", nic="ptb-s/ptbs")
    s = bench_context_settings(pol, get_workload("parallel"), World())
    assert s["app_cpus"] == [0] and s["rate_mode"] == "closed" and s["within_s"] == pol.tuning.window_s
    assert s["is_app"](Task(1, 0, "R", 0.0, "sockperf server -i 198.18.230.2"))
    assert not s["is_app"](Task(2, 0, "R", 0.0, "sockperf ping-pong -i 198.18.230.2"))

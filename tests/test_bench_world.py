"""The default bench world with a scripted runner: commands, NAPI check, failures, leftovers."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from polltuned.bench.world import (
    MARKER,
    WORKLOADS,
    DefaultWorld,
    WorldConfig,
    clamp_cpus,
    get_workload,
    parse_napi_packets,
)
from polltuned.clock import FakeClock
from polltuned.errors import HostError, UsageError
from polltuned.host.exec import ExecResult
from polltuned.host.fs import FsHost

ETHTOOL_S = """NIC statistics:
     peer_ifindex: 2
     rx_queue_0_xdp_packets: {n}
     rx_queue_0_xdp_bytes: 1234
     rx_queue_1_xdp_packets: 0
     tx_queue_0_xdp_xmit: 0
"""


class Proc:
    def __init__(self, argv: Sequence[str], alive: bool = True) -> None:
        self.argv = tuple(argv)
        self.alive = alive

    @property
    def pid(self) -> int:
        return 1

    def running(self) -> bool:
        return self.alive

    def wait(self, timeout_s: float) -> ExecResult:
        return ExecResult(self.argv, 0, "", "")

    def stop(self, grace_s: float = 1.0) -> ExecResult:
        self.alive = False
        return ExecResult(self.argv, 0, "", "")


class ScriptRunner:
    """Plays a tiny kernel: ``ip netns add/del`` create/remove files under the fake /run/netns."""

    def __init__(self, root: Path, *, napi_delta: int = 40, fail_on: str | None = None) -> None:
        self.root = root
        self.calls: list[tuple[tuple[str, ...], str | None]] = []
        self.spawned: list[tuple[Proc, str | None, Sequence[int] | None]] = []
        self.napi = 0
        self.napi_delta = napi_delta
        self.fail_on = fail_on
        (root / "run" / "netns").mkdir(parents=True, exist_ok=True)

    def run(self, argv: Sequence[str], *, timeout_s: float, netns: str | None = None,
            cpus: Sequence[int] | None = None, check: bool = False) -> ExecResult:
        a = tuple(argv)
        self.calls.append((a, netns))
        out = ""
        if self.fail_on and self.fail_on in " ".join(a):
            res = ExecResult(a, 2, "", "RTNETLINK answers: Operation not permitted")
            if check:
                raise HostError(res.describe())
            return res
        if a[:3] == ("ip", "netns", "add"):
            (self.root / "run" / "netns" / a[3]).touch()
        elif a[:3] == ("ip", "netns", "del"):
            (self.root / "run" / "netns" / a[3]).unlink()
        elif a[:3] == ("ip", "netns", "pids"):
            out = "777\n"
        elif a[:2] == ("ethtool", "-S"):
            out = ETHTOOL_S.format(n=self.napi)
        elif a[:2] == ("sockperf", "ping-pong"):
            self.napi += self.napi_delta
            out = "sockperf: Summary: Round trip is 50.0 usec"
        elif a[0] == "ss":
            out = "LISTEN 0 511 198.18.230.2:8080 0.0.0.0:*\nLISTEN 0 1024 198.18.230.2:11211 0.0.0.0:*\n"
        return ExecResult(a, 0, out, "")

    def spawn(self, argv: Sequence[str], *, netns: str | None = None,
              cpus: Sequence[int] | None = None) -> Proc:
        p = Proc(argv)
        self.spawned.append((p, netns, cpus))
        return p


def _world(tmp_path: Path, runner: ScriptRunner, workload: str = "single",
           killed: list[int] | None = None) -> DefaultWorld:
    sink = killed if killed is not None else []
    return DefaultWorld(FsHost(tmp_path), runner, FakeClock(), tmp_path / "state",
                        workload=get_workload(workload), kill=lambda pid, sig: sink.append(pid))


def test_setup_builds_napi_world_and_teardown_removes_it(tmp_path: Path) -> None:
    r = ScriptRunner(tmp_path)
    w = _world(tmp_path, r)
    w.setup()
    cmds = [" ".join(a) for a, _ in r.calls]
    assert "ip netns add ptb-c" in cmds and "ip netns add ptb-s" in cmds
    assert any("type veth peer name ptbs netns ptb-s" in c for c in cmds)
    gro = [(a, ns) for a, ns in r.calls if a[:2] == ("ethtool", "-K")]
    assert {ns for _, ns in gro} == {"ptb-c", "ptb-s"}
    assert all(a[2:] == ("gro", "on", "tso", "off") or a[3:] == ("gro", "on", "tso", "off") for a, _ in gro)
    assert any("198.18.230.2/24" in c for c in cmds)
    marker = json.loads((tmp_path / "state" / MARKER).read_text())
    assert marker["namespaces"] == ["ptb-c", "ptb-s"]
    assert sorted(w.leftovers()) == ["ptb-c", "ptb-s"]
    w.teardown()
    assert w.leftovers() == []
    assert not (tmp_path / "state" / MARKER).exists()


def test_no_napi_fails_setup_and_cleans_up(tmp_path: Path) -> None:
    r = ScriptRunner(tmp_path, napi_delta=0)
    w = _world(tmp_path, r)
    with pytest.raises(HostError, match="veth NAPI is not in use"):
        w.setup()
    assert w.leftovers() == []


def test_failed_command_cleans_up(tmp_path: Path) -> None:
    r = ScriptRunner(tmp_path, fail_on="type veth")
    w = _world(tmp_path, r)
    with pytest.raises(HostError, match="Operation not permitted"):
        w.setup()
    assert w.leftovers() == []


def test_leftovers_of_a_crashed_run_are_removed_first(tmp_path: Path) -> None:
    r = ScriptRunner(tmp_path)
    (tmp_path / "run" / "netns" / "ptb-s").touch()
    (tmp_path / "run" / "netns" / "ptother").touch()  # not ours: must stay
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / MARKER).write_text("{}")
    killed: list[int] = []
    w = _world(tmp_path, r, killed=killed)
    assert w.cleanup_leftovers() == ["ptb-s"]
    assert killed == [777]
    assert (tmp_path / "run" / "netns" / "ptother").exists()
    assert not (tmp_path / "state" / MARKER).exists()


def test_cpu_hog_workload_starts_and_stops_stress_ng(tmp_path: Path) -> None:
    r = ScriptRunner(tmp_path)
    w = _world(tmp_path, r, "cpu-hog")
    w.setup()
    hogs = [(p, ns, c) for p, ns, c in r.spawned if p.argv[0] == "stress-ng"]
    assert len(hogs) == 1 and hogs[0][1] == "ptb-c" and list(hogs[0][2] or []) == [0]
    w.teardown()
    assert not hogs[0][0].alive


def test_teardown_is_a_noop_in_a_forked_child(tmp_path: Path) -> None:
    r = ScriptRunner(tmp_path)
    w = _world(tmp_path, r)
    w.setup()
    w._owner_pid = os.getpid() + 1  # as seen from a child that inherited the object
    w.teardown()
    assert sorted(w.leftovers()) == ["ptb-c", "ptb-s"]
    w._owner_pid = os.getpid()
    w.teardown()
    assert w.leftovers() == []


def test_layouts_and_checks() -> None:
    assert set(WORKLOADS) == {"single", "parallel", "shared-cpu", "cpu-hog", "nginx", "memcached"}
    assert WORKLOADS["parallel"].sessions == 4
    assert WORKLOADS["shared-cpu"].client_cpus == WORKLOADS["shared-cpu"].server_cpus == (0,)
    assert clamp_cpus((0, 1), 1) == (0,)
    assert clamp_cpus((1, 0), 2) == (1, 0)
    with pytest.raises(UsageError, match=r"outside 198\.18\.0\.0/15"):
        WorldConfig(server_addr="10.0.0.2").check()
    with pytest.raises(UsageError, match="must start with"):
        WorldConfig(client_ns="foo").check()
    with pytest.raises(UsageError, match="unknown workload"):
        get_workload("nope")
    assert WorldConfig().nic == "ptb-s/ptbs"


def test_parse_napi_packets() -> None:
    assert parse_napi_packets(ETHTOOL_S.format(n=17)) == 17
    with pytest.raises(HostError, match="xdp_packets"):
        parse_napi_packets("NIC statistics:\n     rx_packets: 5\n")


@pytest.mark.parametrize("workload", ["nginx", "memcached"])
def test_application_workload_setup_and_teardown(tmp_path: Path, workload: str) -> None:
    """setup() checks NAPI with sockperf first, then starts the server once, in ptb-s on CPU1, and
    waits until it listens; teardown() stops it and removes its directory and the namespaces."""
    r = ScriptRunner(tmp_path)
    w = _world(tmp_path, r, workload)
    w.setup()
    names = [p.argv[0] for p, _, _ in r.spawned]
    assert names == ["sockperf", workload]                 # the NAPI check's server, then the app
    app, netns, cpus = r.spawned[1]
    assert netns == "ptb-s" and list(cpus or []) == [1] and app.alive
    assert any(a[0] == "ss" for a, _ in r.calls)
    marker = json.loads((tmp_path / "state" / MARKER).read_text())
    assert marker["app_dir"] == str(tmp_path / "state" / "bench-app")
    assert w.describe()["app"] == workload and w.describe()["app_port"] in (8080, 11211)
    w.teardown()
    assert not app.alive and w.leftovers() == []
    assert not (tmp_path / "state" / "bench-app").exists() and not (tmp_path / "state" / MARKER).exists()

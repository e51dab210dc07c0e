"""A tiny `polltuned bench --workload mix` on the real kernel (root; holds the real-kernel lock).

Two short phases (single, shared) with the real daemon (`polltuned run` subprocess) and a one-round
comparison. Asserts: the phases really alternate — the client ran each phase's load, and the
server's side saw it change (with the clients on the server's CPU1, the packets the server receives
are processed there: veth hands a packet to the NAPI of the sending CPU, so CPU0's share of NET_RX
falls); the daemon exited by itself with its journal clean; every knob and namespace is back; the
JSON and the table are well formed.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from polltuned.bench.mix import MixPaths, MixSettings, parse_client_log, render_mix_table, run_mix
from polltuned.clock import SystemClock
from polltuned.host.fs import FsHost

from .test_bench_realkernel import _snapshot


def _mix_host(server: str) -> FsHost:
    """The real host, or a skip naming what a mix run on it lacks (the server, tools, 2 CPUs)."""
    for tool in (server, "ethtool", "ip", "taskset"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    host = FsHost("/")
    if len(host.glob("/sys/devices/system/cpu", "cpu[0-9]*")) < 2:
        pytest.skip("the mix loads need 2 CPUs")
    return host


def _net_rx_per_cpu() -> list[int]:
    for line in Path("/proc/softirqs").read_text().splitlines():
        if line.strip().startswith("NET_RX:"):
            return [int(x) for x in line.split()[1:]]
    raise AssertionError("no NET_RX line in /proc/softirqs")


@pytest.mark.realkernel
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_real_mix_short(real_kernel: None, tmp_path: Path) -> None:
    host = _mix_host("sockperf")
    before = _snapshot(host, bench_netns=False)
    samples: list[tuple[float, list[int]]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.time(), _net_rx_per_cpu()))
            stop.wait(0.5)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    state = tmp_path / "state"
    settings = MixSettings(schedule=("single", "shared"), phase_s=30.0, budget=4, window_s=1.0, compare_rounds=1,
                           max_rounds=1, state_dir=state, stop_timeout_s=45.0)
    try:
        res = run_mix(settings, host=host, clock=SystemClock())
    finally:
        stop.set()
        th.join(5)

    after = _snapshot(host, bench_netns=False)
    assert after == before, "a knob or namespace was not restored"
    assert not host.glob("/run/netns", "ptb-*")
    assert res.restored and res.daemon_restored and res.daemon_exit == 0

    # the client ran each phase's load, in order
    windows = parse_client_log(MixPaths(state / "mix").client_log.read_text())
    by_phase = {p: [w for w in windows if w.phase == p] for p in (0, 1)}
    assert len(by_phase[0]) >= 2 and len(by_phase[1]) >= 2, [(w.phase, w.layout) for w in windows]
    assert {w.layout for w in by_phase[0]} == {"single"} and {w.layout for w in by_phase[1]} == {"shared"}
    assert max(w.t0 for w in by_phase[0]) < min(w.t0 for w in by_phase[1])

    # the server side saw the change: CPU0's share of NET_RX per phase
    doc = json.loads(json.dumps(res.to_json()))
    shares = []
    for ph in doc["phases"]:
        inside = [(t, v) for t, v in samples if ph["t_start"] <= t <= ph["t_end"]]
        assert len(inside) >= 4
        d = [b - a for a, b in zip(inside[0][1], inside[-1][1])]
        assert sum(d[:2]) > 0
        shares.append(d[0] / max(1, d[0] + d[1]))
    assert shares[0] > 0.25 and shares[1] < shares[0] / 2, shares

    assert [p["load"] for p in doc["phases"]] == ["single", "shared"]
    assert all(p["windows"] >= 2 for p in doc["phases"])
    for c in doc["comparison"]:
        for arm in ("default", "static", "first", "oracle"):
            assert c[arm]["objective"] is not None and c[arm]["objective"] > 0 and c[arm]["p99_us"] > 0
    assert doc["configs"][doc["arms"]["static"]]["net.core.busy_read"] == 50
    assert set(doc["per_load"]) == {"single", "shared"}
    assert set(doc["targets"]) >= {"every_phase_p99_le_default", "explore_le_10pct_after_first_cycle"}
    table = render_mix_table(res)
    assert "J follow" in table and "single" in table and "shared" in table and "knobs restored: yes" in table


@pytest.mark.realkernel
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_real_mix_memcached_short(real_kernel: None, tmp_path: Path) -> None:
    """The memcached variant: one memcached for the whole run, the open-loop client's rate moves."""
    host = _mix_host("memcached")
    before = _snapshot(host, bench_netns=False)
    state = tmp_path / "state"
    settings = MixSettings(schedule=("kv-low", "kv-high"), phase_s=30.0, budget=4, window_s=1.0, compare_rounds=1,
                           max_rounds=1, state_dir=state, stop_timeout_s=45.0)
    res = run_mix(settings, host=host, clock=SystemClock())
    after = _snapshot(host, bench_netns=False)
    assert after == before, "a knob or namespace was not restored"
    assert not host.glob("/run/netns", "ptb-*")
    assert res.restored and res.daemon_restored and res.daemon_exit == 0
    lines = [json.loads(x) for x in MixPaths(state / "mix").client_log.read_text().splitlines()]
    by_phase = {p: [x for x in lines if x["phase"] == p and x["ok"]] for p in (0, 1)}
    assert len(by_phase[0]) >= 2 and len(by_phase[1]) >= 2, lines[-3:]
    assert {x["layout"] for x in by_phase[0]} == {"kv-low"} and {x["layout"] for x in by_phase[1]} == {"kv-high"}
    # the achieved rate follows the phase's schedule (open loop: within 20 % of 1000 and 6000 req/s)
    for p, want in ((0, 1000.0), (1, 6000.0)):
        rates = sorted(x["rate"] for x in by_phase[p])
        assert abs(rates[len(rates) // 2] / want - 1) < 0.2, (p, rates)
    doc = json.loads(json.dumps(res.to_json()))
    assert [p["load"] for p in doc["phases"]] == ["kv-low", "kv-high"]
    assert set(doc["per_load"]) == {"kv-low", "kv-high"}
    for c in doc["comparison"]:
        for arm in ("default", "static", "first", "oracle"):
            assert c[arm]["objective"] is not None and c[arm]["objective"] > 0 and c[arm]["p99_us"] > 0

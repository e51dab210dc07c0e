"""Real kernel (root, namespaces, serialised by the real_kernel lock): kvclient against a real
memcached over a veth between two namespaces of this test's own (ptm-c / ptm-s, 198.18.41.0/24).

* open loop at set rates up to 80 % of the capacity the closed loop measures first: the achieved
  rate is within 2 % of the target;
* a 20 ms server stall every 300 ms (SIGSTOP / SIGCONT of memcached, a bounded loop) at 2000 req/s:
  the open-loop p99, timed from each request's intended send time, shows the stall (at least half
  its length, and twice the closed loop's p99 of the same run); the closed loop's p99 stays under
  half the stall. With one connection and one request in flight, the same run's latencies timed from
  the actual send (``service_latency_us``) hide most of it (p99 under a third of the open loop's):
  a client measuring from the actual send would fail this test (coordinated omission).

The client and memcached run SCHED_FIFO (see RT). No kernel knob is written; the namespaces,
their veth and memcached are removed in ``finally``.
Run: ``pytest -q -s -m realkernel tests/test_openloop_realkernel.py`` (prints the numbers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from polltuned.host import netns as nsh

REPO = Path(__file__).resolve().parents[1]
NS_C, NS_S = "ptm-c", "ptm-s"
ADDR_C, ADDR_S = "198.18.41.1", "198.18.41.2"
PORT = 11411
STALL_S, PERIOD_S = 0.020, 0.300
#: the machine is shared (2 vCPUs, other users' CPU-heavy work): at normal priority the client and
#: server wait for a CPU for milliseconds (measured at load 7 on loopback: closed-loop p99 6.9 ms at
#: nice 0, 5.4 ms at nice -15, 0.10 ms at SCHED_FIFO), which is the machine's contention, not what
#: this test measures. So both run SCHED_FIFO priority 5 for the runs' few seconds (the kernel's RT
#: throttling, sched_rt_runtime_us, still leaves other tasks 5 % of each CPU).
RT = ("chrt", "-f", "5")

pytestmark = pytest.mark.realkernel


@dataclass
class World:
    memcached: subprocess.Popen[bytes]


def _cleanup() -> None:
    for ns in (NS_C, NS_S):
        r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for p in r.stdout.split():
            if p.isdigit() and int(p) != os.getpid():
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(int(p), sig)
                    except ProcessLookupError:
                        pass
        nsh.del_netns(ns)


@pytest.fixture
def world(real_kernel: None) -> Iterator[World]:
    if subprocess.run(["sh", "-c", "command -v memcached"], capture_output=True).returncode != 0:
        pytest.skip("memcached is not installed (config/install.sh installs it)")
    _cleanup()
    mc: subprocess.Popen[bytes] | None = None
    try:
        nsh.add_netns(NS_C)
        nsh.add_netns(NS_S)
        nsh.add_veth_pair(NS_C, "ptmc", ADDR_C, NS_S, "ptms", ADDR_S)
        # ip netns exec and taskset exec memcached: the Popen pid is memcached's (SIGSTOP reaches it)
        mc = subprocess.Popen(["ip", "netns", "exec", NS_S, *RT, "taskset", "-c", "1", "memcached", "-u", "nobody",
                               "-l", ADDR_S, "-p", str(PORT), "-U", "0", "-t", "1", "-c", "1024", "-m", "64"])
        for _ in range(150):
            r = subprocess.run(["ip", "netns", "exec", NS_S, "ss", "-Hltn", "sport", "=", f":{PORT}"],
                               capture_output=True, text=True)
            if "LISTEN" in r.stdout:
                break
            if mc.poll() is not None:
                pytest.fail(f"memcached exited with {mc.returncode}")
            time.sleep(0.1)
        else:
            pytest.fail("memcached did not listen within 15 s")
        yield World(mc)
    finally:
        if mc is not None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    mc.send_signal(sig)
                except ProcessLookupError:
                    pass
            mc.wait(10)
        _cleanup()
        left = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
        assert not [n for n in left if n in (NS_C, NS_S)], left


def kv(*args: str, preload: bool = False) -> dict[str, object]:
    argv = ["ip", "netns", "exec", NS_C, *RT, "taskset", "-c", "0", sys.executable, "-m", "polltuned.host.kvclient",
            "--server", ADDR_S, "--port", str(PORT), "--keys", "1000", "--value-size", "64", *args]
    if preload:
        argv.append("--preload")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert isinstance(doc, dict)
    return doc


def _lat(doc: dict[str, object], key: str = "latency_us") -> dict[str, float]:
    v = doc[key]
    assert isinstance(v, dict)
    return v


def test_open_loop_achieves_its_rate_up_to_80_percent_of_capacity(world: World) -> None:
    closed = kv("--connections", "4", "--duration", "2", "--warmup", "0.3", preload=True)
    capacity = float(closed["throughput_rps"])  # type: ignore[arg-type]
    print(f"\ncapacity (closed loop, 4 connections): {capacity:.0f} req/s, p99 {_lat(closed)['p99']:.0f} µs")
    misses = []
    for share in (0.2, 0.5, 0.8):
        rate = round(capacity * share)
        doc = kv("--connections", "4", "--duration", "3", "--warmup", "0.3", "--rate", str(rate))
        achieved = float(doc["achieved_rps"])  # type: ignore[arg-type]
        print(f"  {share:.0%}: target {rate} achieved {achieved:.0f} ({achieved / rate - 1:+.2%}) "
              f"behind schedule {doc['behind_schedule']} of {doc['offered']}, send lag p99 "
              f"{_lat(doc, 'send_lag_us')['p99']:.0f} µs, p99 {_lat(doc)['p99']:.0f} µs "
              f"(from the actual send {_lat(doc, 'service_latency_us')['p99']:.0f} µs)")
        if abs(achieved / rate - 1) > 0.02:
            misses.append((share, rate, achieved))
        assert doc["unanswered"] == 0 and doc["misses"] == 0
    assert not misses, misses


def _stalls(pid: int, stop: threading.Event, limit: int) -> list[float]:
    """SIGSTOP ``pid`` for STALL_S every PERIOD_S until ``stop`` (at most ``limit`` times); the
    stall lengths achieved."""
    out: list[float] = []
    # this thread too runs SCHED_FIFO (pid 0: the calling thread): at normal priority on the shared
    # machine its 3 ms sleeps overran to 6 ms
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(6))
    nxt = time.monotonic()
    try:
        while not stop.is_set() and len(out) < limit:
            t = time.monotonic()
            os.kill(pid, signal.SIGSTOP)
            time.sleep(STALL_S)
            os.kill(pid, signal.SIGCONT)
            out.append(time.monotonic() - t)
            nxt += PERIOD_S
            stop.wait(max(0.0, nxt - time.monotonic()))
    finally:
        os.kill(pid, signal.SIGCONT)
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    return out


@pytest.mark.parametrize(("connections", "depth"), [("1", "1"), ("4", "64")])
def test_a_periodic_stall_shows_in_the_open_loop_p99_only(world: World, connections: str, depth: str) -> None:
    kv("--connections", "1", "--duration", "0.2", preload=True)
    stop = threading.Event()
    lengths: list[float] = []
    t = threading.Thread(target=lambda: lengths.extend(_stalls(world.memcached.pid, stop, 600)), daemon=True)
    t.start()
    try:
        closed = kv("--connections", "1", "--duration", "4")
        open_ = kv("--connections", connections, "--depth", depth, "--duration", "4", "--rate", "2000",
                   "--arrivals", "poisson")
    finally:
        stop.set()
        t.join(5)
    lengths.sort()
    c99, o99, s99 = _lat(closed)["p99"], _lat(open_)["p99"], _lat(open_, "service_latency_us")["p99"]
    print(f"\nstalls: {len(lengths)}, median {lengths[len(lengths) // 2] * 1e3:.2f} ms; "
          f"connections {connections} depth {depth}: closed p99 {c99:.0f} µs (max {_lat(closed)['max']:.0f}), "
          f"open p99 {o99:.0f} µs = {o99 / c99:.1f}x, from the actual send {s99:.0f} µs = {s99 / c99:.1f}x; "
          f"achieved {open_['achieved_rps']} behind {open_['behind_schedule']}")
    assert len(lengths) >= 20 and lengths[len(lengths) // 2] >= STALL_S
    # The thresholds are the stall's own length, not a multiple of the closed loop's p99: that p99 is
    # the machine's wake-up latency (idle vCPUs halt: on this VM, quiet, a closed loop without any
    # stall measured p50 80-300 µs and p99 0.6-1.2 ms), which moved a "10x the closed p99" rule
    # across its line from one run to the next with a 3 ms stall, and came within 1.3x of half a
    # 10 ms one. Against a 20 ms stall: closed p99 0.4-2.2 ms, open p99 18-190 ms in 4 runs.
    half_stall_us = STALL_S * 1e6 / 2
    assert o99 >= half_stall_us, "the open-loop p99 (from the intended send time) must show the stall"
    assert c99 < half_stall_us, "the closed loop samples the stall once per stall: its p99 must not show it"
    assert o99 >= 2 * c99, "the open loop must report a clearly worse tail than the closed loop on the same stall"
    if depth == "1":
        # one request in flight: requests wait in the client while the server is stopped; timed
        # from their actual send they hide most of the stall (what coordinated omission reports)
        assert s99 < o99 / 3, "timed from the actual send, the same requests must hide the stall"

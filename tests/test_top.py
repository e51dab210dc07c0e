"""``polltuned top``: text and JSON on the recorded VM tree, and agreement with a manual
/proc/softirqs delta on the real kernel (read-only; loopback traffic only)."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from polltuned.cli.main import main
from polltuned.cli.top import loop
from polltuned.clock import FakeClock
from polltuned.counters import Sampler
from polltuned.counters.softirqs import parse_softirqs
from polltuned.host.fs import FsHost

VM = Path(__file__).parent / "fixtures" / "vm"
REPO = Path(__file__).resolve().parent.parent


def test_top_once_json_on_fixture(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--host-root", str(VM / "snap1"), "top", "--once", "--json", "--interval", "0.01"])
    assert rc == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    d = json.loads(out[0])
    assert set(d["cpu"]) == {"0", "1"}
    assert d["cpu"]["0"]["net_rx_per_s"] == 0.0            # same tree twice: zero, not n/a
    assert d["cpu"]["0"]["runq_wait_s_per_s"] is None
    assert d["unavailable"]["schedstat"] == "absent on this kernel: /proc/schedstat"
    assert d["nic_map"]["eth0"]["irqs"][0] == {"irq": 38, "queue": "rx-0", "name": "virtio2-input.0"}


def test_top_text_rows_with_fake_clock() -> None:
    clock = FakeClock()
    buf = io.StringIO()
    s = Sampler(FsHost(VM / "snap1"), clock=clock)
    assert loop(s, clock, interval=0.5, count=3, as_json=False, out=buf, clear=False) == 0
    text = buf.getvalue()
    assert clock.slept == [0.5, 0.5, 0.5]
    assert text.count("polltuned top") == 3
    assert "   0 " in text and "   1 " in text and "n/a" in text
    assert "rx-0(irq 38)" in text and "no hardware IRQs" in text


def test_top_rejects_bad_interval(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--host-root", str(VM / "snap1"), "top", "--once", "--interval", "0"]) == 2
    assert "--interval: must be > 0" in capsys.readouterr().err


def _traffic(stop: threading.Event) -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(0.5)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        while not stop.is_set():
            for _ in range(20):
                tx.sendto(b"p" * 32, rx.getsockname())
                rx.recv(64)
            time.sleep(0.01)       # ~2000 datagrams/s, steady
    finally:
        rx.close()
        tx.close()


Sample = tuple[float, float, dict[int, int]]   # (monotonic before read, after read, NET_RX per CPU)


def _poll_softirqs(stop: threading.Event, out: list[Sample]) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        text = Path("/proc/softirqs").read_text()
        t1 = time.monotonic()
        out.append((t0, t1, parse_softirqs(text).for_cpu("NET_RX")))
        time.sleep(0.004)


@pytest.mark.skipif(not Path("/proc/softirqs").exists(), reason="needs a real /proc")
def test_top_once_json_agrees_with_manual_proc_softirqs_delta() -> None:
    """The test reads /proc/softirqs itself every ~5 ms around a real ``polltuned top --once
    --json --interval 1``; the samples just outside and just inside the tool's two reads bracket
    the tool's per-CPU NET_RX count (CLOCK_MONOTONIC is shared between processes)."""
    stop = threading.Event()
    samples: list[Sample] = []
    threads = [threading.Thread(target=_traffic, args=(stop,), daemon=True),
               threading.Thread(target=_poll_softirqs, args=(stop, samples), daemon=True)]
    for th in threads:
        th.start()
    try:
        time.sleep(0.2)
        env = dict(os.environ, PYTHONPATH=str(REPO))
        res = subprocess.run([sys.executable, "-m", "polltuned", "top", "--once", "--json", "--interval", "1"],
                             capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
        time.sleep(0.1)
    finally:
        stop.set()
        for th in threads:
            th.join(5)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    interval = d["interval_s"]
    assert 0.9 < interval < 3.0
    assert d["t_end"] - d["t_start"] == pytest.approx(interval)
    # a tool read happened within read_s/2 of its midpoint t
    e0, e1 = d["read_s"][0] / 2 + 1e-4, d["read_s"][1] / 2 + 1e-4
    lo0, hi0 = d["t_start"] - e0, d["t_start"] + e0
    lo1, hi1 = d["t_end"] - e1, d["t_end"] + e1
    before_start = [s for s in samples if s[1] <= lo0]       # surely before the tool's first read
    after_start = [s for s in samples if s[0] >= hi0]
    before_end = [s for s in samples if s[1] <= lo1]
    after_end = [s for s in samples if s[0] >= hi1]
    assert before_start and after_start and before_end and after_end, "poller did not bracket the tool"
    # the tolerance is the poller's resolution: how far apart in time the bracketing reads are
    # (~5 ms when idle; other helpers' netns traffic makes the *counts* in that gap vary, not this)
    gaps = (after_start[0][0] - before_start[-1][1], after_end[0][0] - before_end[-1][1])
    assert max(gaps) < 0.25, gaps
    outer0, inner0 = before_start[-1][2], after_start[0][2]
    inner1, outer1 = before_end[-1][2], after_end[0][2]
    tool_total = 0.0
    for c, row in d["cpu"].items():
        cpu = int(c)
        tool = row["net_rx_per_s"] * interval
        tool_total += tool
        inner = inner1[cpu] - inner0[cpu]
        outer = outer1[cpu] - outer0[cpu]
        assert inner - 0.5 <= tool <= outer + 0.5, (cpu, inner, tool, outer)
    assert tool_total > 500        # the loopback traffic is visible

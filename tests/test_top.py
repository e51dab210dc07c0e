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


@pytest.mark.skipif(not Path("/proc/softirqs").exists(), reason="needs a real /proc")
def test_top_once_json_agrees_with_manual_proc_softirqs_delta() -> None:
    stop = threading.Event()
    th = threading.Thread(target=_traffic, args=(stop,), daemon=True)
    th.start()
    try:
        time.sleep(0.2)
        t0 = time.monotonic()
        before = parse_softirqs(Path("/proc/softirqs").read_text())
        env = dict(os.environ, PYTHONPATH=str(REPO))
        res = subprocess.run([sys.executable, "-m", "polltuned", "top", "--once", "--json", "--interval", "1"],
                             capture_output=True, text=True, timeout=30, env=env, cwd=REPO)
        after = parse_softirqs(Path("/proc/softirqs").read_text())
        t1 = time.monotonic()
    finally:
        stop.set()
        th.join(5)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    interval = d["interval_s"]
    assert 0.9 < interval < 2.0
    b_rx, a_rx = before.for_cpu("NET_RX"), after.for_cpu("NET_RX")
    tool_total = 0.0
    for c, row in d["cpu"].items():
        manual = a_rx[int(c)] - b_rx[int(c)]
        tool_count = row["net_rx_per_s"] * interval
        tool_total += tool_count
        # the test's own reads bracket the tool's interval: the tool cannot see more events
        assert tool_count <= manual + 1, (c, tool_count, manual)
        manual_rate = manual / (t1 - t0)
        assert abs(row["net_rx_per_s"] - manual_rate) <= 0.5 * manual_rate + 100, (c, row, manual_rate)
    assert tool_total > 500        # the loopback traffic is visible

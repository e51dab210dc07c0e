"""Open-loop clients (polltuned.host.openloop, kvclient --rate): the schedule, the memcached reply
parser, and runs against a loopback fake server, including one that stalls: the intended-time
latency must show the stall for every request scheduled during it, the actual-send one must not
(coordinated omission)."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from polltuned.histogram import LatencyHistogram
from polltuned.host.kvclient import KvError, parse_get_replies
from polltuned.host.kvclient import main as kv_main
from polltuned.host.openloop import MAX_REQUESTS, check_schedule, schedule_ns

REPO = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------- schedule (pure)


def test_uniform_schedule_is_exactly_periodic() -> None:
    s = schedule_ns(2000.0, 0.5, "uniform", random.Random(0), start_ns=10)
    assert len(s) == 1000 and s[0] == 10 and s[1] - s[0] == 500_000 and s[-1] == 10 + 999 * 500_000


def test_poisson_schedule_has_the_exact_count_and_exponential_gaps() -> None:
    s = schedule_ns(10_000.0, 2.0, "poisson", random.Random(7))
    assert len(s) == 20_000 and s == sorted(s) and s[0] >= 0 and s[-1] < 2_000_000_000
    gaps = [b - a for a, b in itertools.pairwise(s)]
    mean = sum(gaps) / len(gaps)
    assert mean == pytest.approx(100_000, rel=0.02)
    # exponential: sd == mean, and P(gap > mean) = 1/e (a uniform schedule has sd 0, P = 0 or 1)
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps))
    assert sd == pytest.approx(mean, rel=0.05)
    assert sum(g > mean for g in gaps) / len(gaps) == pytest.approx(math.exp(-1), abs=0.02)
    assert schedule_ns(10_000.0, 2.0, "poisson", random.Random(7)) == s  # seeded: same schedule


def test_schedule_bounds() -> None:
    for rate, dur in ((0.0, 1.0), (-1.0, 1.0), (math.inf, 1.0), (math.nan, 1.0), (1.0, math.nan), (1e7, 1.0)):
        with pytest.raises(ValueError):
            check_schedule(rate, dur)
    with pytest.raises(ValueError, match="more than"):
        schedule_ns(1e6, MAX_REQUESTS / 1e6 + 1, "uniform", random.Random(0))
    with pytest.raises(ValueError, match="unknown arrivals"):
        schedule_ns(10.0, 1.0, "bursty", random.Random(0))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- reply parser (pure)


def test_get_reply_parser_handles_pipelined_partial_and_missing_replies() -> None:
    hit = b"VALUE k1 0 5\r\nhello\r\nEND\r\n"
    tricky = b"VALUE k2 0 7\r\nEND\r\nab\r\nEND\r\n"  # the value itself contains END\r\n
    buf = hit + b"END\r\n" + tricky + hit[:9]
    flags, used = parse_get_replies(buf)
    assert flags == [False, True, False] and used == len(buf) - 9
    assert parse_get_replies(b"VALUE k1 0 5\r\nhel") == ([], 0)
    assert parse_get_replies(b"EN") == ([], 0)
    with pytest.raises(KvError, match="SERVER_ERROR"):
        parse_get_replies(b"END\r\nSERVER_ERROR out of memory\r\n")
    with pytest.raises(KvError, match="expected END"):
        parse_get_replies(b"VALUE k1 0 1\r\nx\r\nVALUE k2 0 1\r\ny\r\nEND\r\n")


# ------------------------------------------------------------------------------- against a loopback server


@dataclass
class Fake:
    port: int
    gets: list[int] = field(default_factory=list)
    #: the n-th get (1-based, over all connections) is answered only after this many seconds
    stall_at: int = 0
    stall_s: float = 0.0


@pytest.fixture
def fake_kv() -> Iterator[Fake]:
    """A memcached-text server on loopback (get, set noreply, version; pipelined requests) that can
    stall once before answering one get, as a SIGSTOPped server would."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    fake = Fake(srv.getsockname()[1])
    stop = threading.Event()
    lock = threading.Lock()

    def serve(conn: socket.socket) -> None:
        buf = b""
        with conn:
            while not stop.is_set():
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                out = b""
                while b"\r\n" in buf:
                    line, buf = buf.split(b"\r\n", 1)
                    parts = line.split()
                    if parts[:1] == [b"get"]:
                        with lock:
                            fake.gets.append(1)
                            n = len(fake.gets)
                        if n == fake.stall_at:
                            if out:
                                conn.sendall(out)
                                out = b""
                            stop.wait(fake.stall_s)  # the server is stopped: it answers nothing
                        out += b"VALUE %s 0 3\r\nabc\r\nEND\r\n" % parts[1]
                    elif parts[:1] == [b"version"]:
                        out += b"VERSION 1.6.18\r\n"
                if out:
                    conn.sendall(out)

    def accept() -> None:
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield fake
    finally:
        stop.set()
        srv.close()


def _kv(port: int, *args: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    """The client in its own process (as the command probe runs it): in this one it would share the
    GIL with the fake server's threads, which holds it for up to sys.getswitchinterval() (5 ms)."""
    res = subprocess.run([sys.executable, "-m", "polltuned.host.kvclient", "--server", "127.0.0.1", "--port",
                          str(port), "--keys", "50", *args], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert isinstance(doc, dict)
    return doc


def test_open_loop_sends_the_rate_it_is_asked(fake_kv: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _kv(fake_kv.port, "--rate", "2000", "--arrivals", "uniform", "--duration", "0.5", "--warmup", "0.1",
              "--connections", "2", capsys=capsys)
    assert doc["mode"] == "open" and doc["offered"] == 1000 and doc["requests"] == 1000
    assert doc["unanswered"] == 0 and doc["misses"] == 0
    # the rates over the 0.5 s window: a hiccup of the fake server (a thread of this test process)
    # just before the window opens moves up to ~25 ms of warm-up replies into it (CI saw 2072/s);
    # a client that ignored the rate would be off by far more than 5 %
    assert doc["achieved_rps"] == pytest.approx(2000, rel=0.05)
    assert doc["sent_rps"] == pytest.approx(2000, rel=0.05)
    assert len(fake_kv.gets) == 1200                       # warm-up requests went out too, unmeasured
    h = LatencyHistogram.decode(doc["histogram"]["encoded"])  # type: ignore[index]
    assert h.count == 1000
    lat = doc["latency_us"]
    assert isinstance(lat, dict)
    assert h.percentile_us(99) == pytest.approx(lat["p99"], rel=2 ** -9)


def test_open_loop_times_from_the_intended_send_time(fake_kv: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    """One connection, one request in flight: requests scheduled while the server stalls 60 ms wait
    in the client. From their intended time each carries its wait (p99 shows the stall); from the
    actual send only the one request the server held does (that p99 does not): coordinated
    omission, which the closed-loop client has too."""
    fake_kv.stall_at, fake_kv.stall_s = 100, 0.06
    doc = _kv(fake_kv.port, "--rate", "1000", "--arrivals", "uniform", "--duration", "0.5", "--connections", "1",
              "--depth", "1", capsys=capsys)
    lat, svc = doc["latency_us"], doc["service_latency_us"]
    assert isinstance(lat, dict) and isinstance(svc, dict)
    assert lat["p99"] > 30_000 and lat["max"] > 55_000          # the ~60 requests scheduled in the stall
    assert svc["p99"] < 10_000 and svc["max"] > 55_000           # the one request the server held
    assert doc["behind_schedule"] >= 40                          # those that waited in the client
    assert doc["requests"] == 500 and doc["unanswered"] == 0


def test_open_loop_with_pipelining_does_not_fall_behind_a_stall(fake_kv: Fake,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    fake_kv.stall_at, fake_kv.stall_s = 100, 0.04
    doc = _kv(fake_kv.port, "--rate", "1000", "--arrivals", "uniform", "--duration", "0.4", "--connections", "1",
              "--depth", "64", capsys=capsys)
    lat, svc = doc["latency_us"], doc["service_latency_us"]
    assert isinstance(lat, dict) and isinstance(svc, dict)
    # sent on time and queued in the server: the stall shows from the actual send too
    assert lat["p99"] > 20_000 and svc["p99"] > 15_000


def test_closed_loop_reports_its_histogram(fake_kv: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _kv(fake_kv.port, "--duration", "0.2", capsys=capsys)
    assert doc["mode"] == "closed"
    hist = doc["histogram"]
    assert isinstance(hist, dict) and hist["format"] == "hdrhistogram-v2-compressed" and hist["unit"] == "ns"
    assert LatencyHistogram.decode(hist["encoded"]).count == doc["requests"] == hist["count"]


def test_kvclient_rate_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--rate", "0"], ["--rate", "-5"], ["--rate", "nan"], ["--rate", "inf"],
                 ["--rate", "10", "--depth", "0"], ["--rate", "1000000", "--duration", "600"]):
        assert kv_main(["--server", "127.0.0.1", *args]) == 2, args
    assert "--rate" in capsys.readouterr().err


def test_open_loop_fails_when_nothing_answers(capsys: pytest.CaptureFixture[str]) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    assert kv_main(["--server", "127.0.0.1", "--port", str(port), "--rate", "100", "--duration", "0.2"]) == 1
    assert "kvclient: 127.0.0.1:" in capsys.readouterr().err

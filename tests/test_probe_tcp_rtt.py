"""tcp_rtt probe: filter/summary with a scripted dump, and a real loopback TCP connection via sock_diag."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from polltuned.clock import FakeClock
from polltuned.host.sockdiag import SockDiag, TcpSock
from polltuned.policy.schema import TcpRttProbe as Cfg
from polltuned.probes.tcp_rtt import TcpRttProbe, matches, summarise


def test_filter_sides() -> None:
    s = TcpSock("10.0.0.1", 443, "10.0.0.2", 5555, 100.0, 10.0)
    assert matches(Cfg(port=443, side="src"), s)
    assert not matches(Cfg(port=443, side="dst"), s)
    assert matches(Cfg(port=5555, side="any"), s)
    assert not matches(Cfg(port=443, address="10.9.9.9"), s)
    assert matches(Cfg(address="10.0.0.2"), s)


def test_window_over_samples() -> None:
    socks = [TcpSock("a", 443, "b", 1000 + i, float(10 * (i + 1)), 1.0) for i in range(10)]
    other = TcpSock("a", 22, "b", 9, 99999.0, 1.0)
    calls = []

    def dump() -> list[TcpSock]:
        calls.append(1)
        return [*socks, other]

    clock = FakeClock()
    w = TcpRttProbe(Cfg(port=443, side="src", sample_interval_s=0.5), clock=clock, dump=dump).measure(2.0, 0)
    assert w.ok
    assert len(calls) == 5  # t=0, .5, 1, 1.5, 2
    assert w.observations == 50
    assert w.latency["max"] == 100.0 and w.latency["p50"] == pytest.approx(55.0)
    assert w.extra["sockets"] == 10
    assert summarise([1.0, 2.0, 3.0])["mean"] == 2.0


def test_no_sockets_is_failed(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="polltuned.probes"):
        w = TcpRttProbe(Cfg(port=443, min_sockets=2), clock=FakeClock(),
                        dump=lambda: [TcpSock("a", 443, "b", 1, 5.0, 1.0)]).measure(1.0, 4)
    assert not w.ok and "1 established TCP socket(s)" in (w.error or "")
    assert any("probe tcp_rtt window 4 failed" in r.getMessage() for r in caplog.records)


@pytest.fixture
def loopback_pair() -> Iterator[int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    stop = threading.Event()

    def echo() -> None:
        while not stop.is_set():
            data = conn.recv(16)
            if not data:
                return
            conn.sendall(data)

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    for _ in range(20):
        cli.sendall(b"x")
        cli.recv(16)
    try:
        yield port
    finally:
        stop.set()
        cli.close()
        t.join(2)
        conn.close()
        srv.close()


def test_real_sock_diag_loopback(loopback_pair: int) -> None:
    diag = SockDiag()
    try:
        socks = [s for s in diag.established_tcp() if loopback_pair in (s.sport, s.dport)]
    finally:
        diag.close()
    assert len(socks) == 2
    assert all(0 < s.rtt_us < 1_000_000 for s in socks)
    w = TcpRttProbe(Cfg(port=loopback_pair, side="src", sample_interval_s=0.1), clock=FakeClock()).measure(0.3, 0)
    assert w.ok and w.extra["sockets"] == 1 and w.latency["p99"] > 0


def test_missing_netns_is_refused_not_created(caplog: pytest.LogCaptureFixture) -> None:
    import os

    name = "ptb-does-not-exist"
    with caplog.at_level("WARNING", logger="polltuned.probes"):
        w = TcpRttProbe(Cfg(port=1, netns=name), clock=FakeClock()).measure(0.1, 0)
    assert not w.ok and "does not exist" in (w.error or "")
    assert not os.path.exists(f"/run/netns/{name}")

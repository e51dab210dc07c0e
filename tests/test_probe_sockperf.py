"""sockperf probe: parser on recorded real outputs, merge, and the per-window process protocol."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from polltuned.clock import FakeClock
from polltuned.errors import ProbeError
from polltuned.host.exec import ExecResult
from polltuned.host.sockperf_output import merge_results, parse_sockperf
from polltuned.policy.schema import SockperfProbe as Cfg
from polltuned.probes.sockperf import SockperfProbe, result_to_window

FIX = Path(__file__).parent / "fixtures" / "sockperf"


def test_parse_ping_pong_udp_recorded() -> None:
    r = parse_sockperf((FIX / "ping_pong_udp.txt").read_text())
    assert r.mean_us == pytest.approx(59.037)
    assert r.stddev_us == pytest.approx(15.655)
    assert r.observations == 9317
    assert r.runtime_s == pytest.approx(0.550)
    assert r.received == 9317
    assert r.max_us == pytest.approx(996.578)
    assert r.min_us == pytest.approx(21.281)
    assert r.pct(99.0) == pytest.approx(97.264)
    assert r.pct(99.9) == pytest.approx(146.797)
    assert r.pct(50.0) == pytest.approx(54.851)
    assert r.msg_rate == pytest.approx(9317 / 0.55)
    w = result_to_window(r)
    assert w.ok and w.latency["p90"] == pytest.approx(73.008) and w.observations == 9317


def test_parse_under_load_and_tcp_recorded() -> None:
    ul = parse_sockperf((FIX / "under_load_udp.txt").read_text())
    assert ul.observations == 1100 and ul.pct(99.0) == pytest.approx(84.335)
    tcp = parse_sockperf((FIX / "ping_pong_tcp.txt").read_text())
    assert tcp.mean_us == pytest.approx(71.568) and tcp.max_us == pytest.approx(1388.98)


def test_parse_no_server_and_truncated() -> None:
    with pytest.raises(ProbeError, match="no messages were received"):
        parse_sockperf((FIX / "no_server.txt").read_text())
    text = (FIX / "ping_pong_udp.txt").read_text()
    cut = text[: text.index("---> <MAX>")]
    with pytest.raises(ProbeError, match="MAX"):
        parse_sockperf(cut)


def test_latency_without_full_rtt_is_parsed() -> None:
    text = (FIX / "ping_pong_udp.txt").read_text().replace("avg-rtt", "avg-latency").replace(
        "Round trip is", "Latency is")
    assert parse_sockperf(text).mean_us == pytest.approx(59.037)


def test_merge_sessions() -> None:
    a = parse_sockperf((FIX / "ping_pong_udp.txt").read_text())
    b = parse_sockperf((FIX / "ping_pong_tcp.txt").read_text())
    m = merge_results([a, b])
    assert m.observations == a.observations + b.observations
    assert m.max_us == max(a.max_us, b.max_us) and m.min_us == min(a.min_us, b.min_us)
    assert min(a.pct(99.0), b.pct(99.0)) < m.pct(99.0) < max(a.pct(99.0), b.pct(99.0))
    assert m.msg_rate == pytest.approx(a.msg_rate + b.msg_rate, rel=1e-3)


class FakeProc:
    def __init__(self, argv: Sequence[str], result: ExecResult | None, alive: bool = True) -> None:
        self.argv = tuple(argv)
        self._result = result
        self._alive = alive
        self.stopped = False

    @property
    def pid(self) -> int:
        return 4242

    def running(self) -> bool:
        return self._alive and not self.stopped

    def wait(self, timeout_s: float) -> ExecResult:
        assert self._result is not None
        return self._result

    def stop(self, grace_s: float = 1.0) -> ExecResult:
        self.stopped = True
        return ExecResult(self.argv, -15, "", "")


class FakeRunner:
    def __init__(self, client_out: str, *, rc: int = 0, timed_out: bool = False, server_alive: bool = True) -> None:
        self.client_out = client_out
        self.rc = rc
        self.timed_out = timed_out
        self.server_alive = server_alive
        self.spawned: list[tuple[FakeProc, str | None, Sequence[int] | None]] = []

    def run(self, argv: Sequence[str], *, timeout_s: float, netns: str | None = None,
            cpus: Sequence[int] | None = None, check: bool = False) -> ExecResult:
        raise AssertionError("sockperf probe only spawns")

    def spawn(self, argv: Sequence[str], *, netns: str | None = None,
              cpus: Sequence[int] | None = None) -> FakeProc:
        if argv[1] == "server":
            p = FakeProc(argv, None, alive=self.server_alive)
        else:
            p = FakeProc(argv, ExecResult(tuple(argv), None if self.timed_out else self.rc,
                                          self.client_out, "", timed_out=self.timed_out))
        self.spawned.append((p, netns, cpus))
        return p


def _cfg(**kw: object) -> Cfg:
    base: dict[str, object] = {"target": "198.18.230.2", "port": 11211, "netns": "ptb-c",
                               "server_netns": "ptb-s"}
    base.update(kw)
    return Cfg.model_validate(base)


def test_probe_fresh_server_and_client_every_window() -> None:
    out = (FIX / "ping_pong_udp.txt").read_text()
    runner = FakeRunner(out)
    p = SockperfProbe(_cfg(sessions=2), runner, clock=FakeClock(), client_cpus=[0, 1], server_cpus=[0])
    w1 = p.measure(2.0, 0)
    w2 = p.measure(2.0, 1)
    assert w1.ok and w2.ok and w1.latency["p99"] == pytest.approx(97.264)
    servers = [s for s, _, _ in runner.spawned if s.argv[1] == "server"]
    clients = [(s, ns, c) for s, ns, c in runner.spawned if s.argv[1] == "ping-pong"]
    assert len(servers) == 2 and all(s.stopped for s in servers)  # one fresh server per window, stopped
    assert len(clients) == 4
    assert [c for _, _, c in clients[:2]] == [[0], [1]]
    assert {ns for _, ns, _ in clients} == {"ptb-c"}
    ports = {c.argv[c.argv.index("-p") + 1] for c, _, _ in clients} | {s.argv[s.argv.index("-p") + 1] for s in servers}
    assert ports == {"11211"}  # parallel sessions share the server socket
    assert "--full-rtt" in clients[0][0].argv and clients[0][0].argv[clients[0][0].argv.index("-t") + 1] == "2"


def test_probe_under_load_tcp_argv() -> None:
    p = SockperfProbe(_cfg(mode="under-load", rate_mps=2000, protocol="tcp"), FakeRunner(""), clock=FakeClock())
    argv = p.client_argv(0, 3)
    assert argv[1] == "under-load" and "--mps" in argv and argv[argv.index("--mps") + 1] == "2000"
    assert "--tcp" in argv and "--tcp" in p.server_argv()


@pytest.mark.parametrize(
    ("runner", "needle"),
    [
        (FakeRunner("", timed_out=True), "timed out"),
        (FakeRunner("boom", rc=1), "failed"),
        (FakeRunner((FIX / "no_server.txt").read_text()), "no messages"),
        (FakeRunner("", server_alive=False), "server did not start"),
    ],
)
def test_probe_failures_are_failed_windows(runner: FakeRunner, needle: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    p = SockperfProbe(_cfg(), runner, clock=FakeClock())
    with caplog.at_level("WARNING", logger="polltuned.probes"):
        w = p.measure(1.0, 7)
    assert not w.ok and w.error is not None and needle in w.error
    assert not w.latency
    assert any("window 7" in r.getMessage() for r in caplog.records)
    assert all(s.stopped for s, _, _ in runner.spawned if s.argv[1] == "server")


# ------------------------------------------------------------------------------- per-sample histogram (issue 15)


def test_full_log_parses_every_sample() -> None:
    """Recorded: sockperf 3.x ``under-load --mps 2000 --reply-every 1 --full-rtt --full-log /dev/stdout``
    on loopback (a loaded machine: hence its tail): the summary, then one line per valid sample."""
    from polltuned.probes.sockperf import parse_full_log

    text = (FIX / "under_load_full_log.txt").read_text()
    r = parse_sockperf(text)
    samples = parse_full_log(text)
    assert len(samples) == r.observations == 1098
    assert abs(min(samples) - r.min_us * 1e3) <= 2 and abs(max(samples) - r.max_us * 1e3) <= 2  # ns: print rounding
    with pytest.raises(ProbeError, match="per-sample log"):
        parse_full_log((FIX / "ping_pong_udp.txt").read_text())


def test_probe_histogram_merges_sessions_exactly() -> None:
    import math

    from polltuned.histogram import RESOLUTION, LatencyHistogram
    from polltuned.probes.sockperf import parse_full_log

    text = (FIX / "under_load_full_log.txt").read_text()
    p = SockperfProbe(_cfg(mode="under-load", rate_mps=2000, sessions=2, histogram=True), FakeRunner(text),
                      clock=FakeClock())
    assert p.client_argv(0, 2)[-2:] == ["--full-log", "/dev/stdout"]
    w = p.measure(2.0, 0)
    assert w.ok and w.histogram is not None
    h = LatencyHistogram.decode(w.histogram)
    samples = sorted(parse_full_log(text) * 2)            # the two sessions' samples together
    assert h.count == len(samples)
    exact = samples[math.ceil(0.99 * len(samples)) - 1] / 1e3
    assert exact <= w.latency["p99"] <= exact * (1 + RESOLUTION) + 1e-3
    plain = SockperfProbe(_cfg(mode="under-load", rate_mps=2000), FakeRunner(text), clock=FakeClock())
    assert "--full-log" not in plain.client_argv(0, 2) and plain.measure(2.0, 0).histogram is None


def test_a_child_printing_more_than_a_pipe_holds_is_waited_for() -> None:
    """sockperf's per-sample log is megabytes: waiting for the exit before reading the pipe would hang."""
    import sys

    from polltuned.host.exec import SubprocessRunner

    res = SubprocessRunner().spawn([sys.executable, "-c", "print('x' * 1_000_000)"]).wait(20.0)
    assert res.ok and not res.timed_out and len(res.stdout) == 1_000_001

"""sockperf probe: an active ping-pong (or under-load at a set rate) against a sockperf server.

Every window starts a fresh server and fresh client(s): ``net.core.busy_read`` is copied into a
socket when it is created, so a long-lived server would silently keep measuring the old value
(vm-bench.md §10). With ``sessions > 1`` the probe runs that many clients in parallel against the
one server socket (as a real service sees many peers on one port; vm-bench.md §6 "n4/n16") and
merges the per-session statistics (see :func:`merge_results`).

The output parser is a pure function of sockperf's text (3.x, ``--full-rtt``).

``mode = "under-load"`` sends at ``rate_mps`` messages/s whatever the replies do (``--mps``,
``--reply-every 1``): the load point is set by the workload, not by the round-trip time. sockperf
times each message from its actual send; it paces its own sends, so it falls behind only when the
client's CPU cannot keep up.

``histogram = true`` adds ``--full-log /dev/stdout``: sockperf then appends one line per valid
sample (``packet, txTime(sec), rxTime(sec), rtt(usec)``) after its summary; the probe builds the
window's latency histogram (polltuned.histogram) from them, and parallel sessions merge exactly
by adding histograms instead of averaging their percentiles. Cheap enough: ~40 bytes per message
(2 MB for a 2 s window at 25 000 round trips/s), parsed in ~50 ms.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from polltuned.clock import Clock
from polltuned.errors import ProbeError
from polltuned.histogram import LatencyHistogram
from polltuned.host.exec import ExecResult, Runner, Spawned
from polltuned.policy.schema import SockperfProbe as SockperfConfig
from polltuned.records import Window

log = logging.getLogger("polltuned.probes")

_ANSI = re.compile(r"\x1b\[[0-9;]*m|\[[0-9;]*m")
# sockperf 3.x client summary (src/client.cpp, print_average_results / print_log_percentile):
#   sockperf: [Valid Duration] RunTime=0.550 sec; SentMessages=9317; ReceivedMessages=9317
#   sockperf: ====> avg-rtt=59.037 (std-dev=15.655)           (avg-latency=... without --full-rtt)
#   sockperf: # dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0
#   sockperf: Summary: Round trip is 59.037 usec               ("Latency is" without --full-rtt)
#   sockperf: Total 9317 observations; each percentile contains 93.17 observations
#   sockperf: ---> <MAX> observation =  996.578
#   sockperf: ---> percentile 99.999 =  996.578   ... down to 25.000
#   sockperf: ---> <MIN> observation =   21.281
_VALID = re.compile(
    r"\[Valid Duration\]\s*RunTime=([\d.]+)\s*sec;\s*SentMessages=(\d+);\s*ReceivedMessages=(\d+)"
)
_AVG = re.compile(r"avg-(?:rtt|latency)=([\d.]+)\s*\(std-dev=([\d.]+)\)")
_DROPPED = re.compile(r"#\s*dropped messages\s*=\s*(\d+)")
_SUMMARY = re.compile(r"Summary:\s*(?:Round trip|Latency) is\s*([\d.]+)\s*usec")
_TOTAL = re.compile(r"Total\s+(\d+)\s+observations")
_PCT = re.compile(r"--->\s*percentile\s+([\d.]+)\s*=\s*([\d.]+)")
_MAX = re.compile(r"--->\s*<MAX> observation\s*=\s*([\d.]+)")
_MIN = re.compile(r"--->\s*<MIN> observation\s*=\s*([\d.]+)")
_NO_REPLY = "No messages were received from the server"
# --full-log (src/client.cpp, print_log): a header, then "seq, txTime, rxTime, rtt" per valid sample
_FULL_LOG_HEADER = "packet, txTime(sec), rxTime(sec), rtt(usec)"


@dataclass(frozen=True)
class SockperfResult:
    """One sockperf client run. Latencies in µs (round trip with --full-rtt)."""

    mean_us: float
    stddev_us: float
    observations: int
    runtime_s: float
    sent: int
    received: int
    dropped: int
    max_us: float
    min_us: float
    percentiles: dict[float, float] = field(default_factory=dict)

    @property
    def msg_rate(self) -> float:
        return self.received / self.runtime_s if self.runtime_s > 0 else 0.0

    def pct(self, q: float) -> float:
        """The reported percentile ``q`` (e.g. 99.0); the nearest reported one above if absent."""
        if q in self.percentiles:
            return self.percentiles[q]
        above = sorted(k for k in self.percentiles if k >= q)
        if above:
            return self.percentiles[above[0]]
        return self.max_us


def parse_sockperf(text: str) -> SockperfResult:
    """Parse a sockperf client's stdout+stderr. Raises ProbeError naming what is missing."""
    clean = _ANSI.sub("", text)
    if _NO_REPLY in clean:
        raise ProbeError("sockperf: no messages were received from the server (is the server down?)")
    m_valid = _VALID.search(clean)
    m_avg = _AVG.search(clean)
    m_total = _TOTAL.search(clean)
    m_max = _MAX.search(clean)
    m_min = _MIN.search(clean)
    pcts = {float(q): float(v) for q, v in _PCT.findall(clean)}
    missing = [
        name
        for name, m in (("[Valid Duration]", m_valid), ("avg-rtt", m_avg), ("Total N observations", m_total),
                        ("<MAX> observation", m_max), ("<MIN> observation", m_min))
        if m is None
    ]
    if not pcts:
        missing.append("percentile lines (run with --full-rtt)")
    if missing:
        last = (clean.strip().splitlines() or ["<no output>"])[-1]
        raise ProbeError(f"sockperf output lacks {', '.join(missing)}; last line: {last.strip()!r}")
    assert m_valid and m_avg and m_total and m_max and m_min
    mean = float(m_avg.group(1))
    m_sum = _SUMMARY.search(clean)
    if m_sum is not None:
        mean = float(m_sum.group(1))
    m_drop = _DROPPED.search(clean)
    return SockperfResult(
        mean_us=mean,
        stddev_us=float(m_avg.group(2)),
        observations=int(m_total.group(1)),
        runtime_s=float(m_valid.group(1)),
        sent=int(m_valid.group(2)),
        received=int(m_valid.group(3)),
        dropped=int(m_drop.group(1)) if m_drop else 0,
        max_us=float(m_max.group(1)),
        min_us=float(m_min.group(1)),
        percentiles=pcts,
    )


def parse_full_log(text: str) -> list[int]:
    """Pure: the per-sample round trips (ns) sockperf ``--full-log`` printed after its header line
    (``packet, txTime(sec), rxTime(sec), rtt(usec)``). Raises ProbeError when there is no such log."""
    clean = _ANSI.sub("", text)
    at = clean.find(_FULL_LOG_HEADER)
    if at < 0:
        raise ProbeError("sockperf output has no per-sample log (--full-log)")
    out: list[int] = []
    for line in clean[at + len(_FULL_LOG_HEADER):].splitlines():
        parts = line.split(",")
        if len(parts) != 4:
            continue  # the closing ----- line, blank lines
        try:
            out.append(round(float(parts[3]) * 1e3))
        except ValueError:
            continue
    if not out:
        raise ProbeError("sockperf per-sample log is empty")
    return out


def samples_histogram(per_session: Sequence[Sequence[int]]) -> str:
    """Pure: the encoded histogram of every session's samples (ns) together."""
    h = LatencyHistogram()
    for samples in per_session:
        for v in samples:
            h.record_ns(v)
    return h.encode()


def merge_results(results: Sequence[SockperfResult]) -> SockperfResult:
    """Merge parallel sessions.

    sockperf prints percentiles, not histograms, so the union's percentiles are approximated by the
    observation-weighted mean of each session's percentile (exact when sessions are alike); max/min
    are exact, rates add up.
    """
    if not results:
        raise ValueError("merge_results needs at least one result")
    if len(results) == 1:
        return results[0]
    n = sum(r.observations for r in results) or 1
    keys = set(results[0].percentiles)
    for r in results[1:]:
        keys &= set(r.percentiles)
    pcts = {q: sum(r.percentiles[q] * r.observations for r in results) / n for q in keys}
    runtime = max(r.runtime_s for r in results)
    return SockperfResult(
        mean_us=sum(r.mean_us * r.observations for r in results) / n,
        stddev_us=max(r.stddev_us for r in results),
        observations=sum(r.observations for r in results),
        runtime_s=runtime,
        # scale counts so that msg_rate is the sum of the per-session rates
        sent=sum(r.sent for r in results),
        received=round(sum(r.msg_rate for r in results) * runtime),
        dropped=sum(r.dropped for r in results),
        max_us=max(r.max_us for r in results),
        min_us=min(r.min_us for r in results),
        percentiles=pcts,
    )


def result_to_window(r: SockperfResult, sessions: int = 1, histogram: str | None = None) -> Window:
    """The Window of a (merged) result; with ``histogram`` (encoded, every session's samples), its
    percentiles come from the histogram and the window carries it."""
    w = _result_window(r, sessions)
    if histogram is None:
        return w
    hs = LatencyHistogram.decode(histogram).stats_us()
    lat = {**w.latency, **{k: hs[k] for k in ("p50", "p90", "p99", "p999", "max")}}
    return Window(ok=True, latency=lat, throughput_pps=w.throughput_pps, observations=w.observations,
                  duration_s=w.duration_s, extra=w.extra, histogram=histogram)


def _result_window(r: SockperfResult, sessions: int) -> Window:
    return Window(
        ok=True,
        latency={
            "p50": r.pct(50.0),
            "p90": r.pct(90.0),
            "p99": r.pct(99.0),
            "p999": r.pct(99.9),
            "mean": r.mean_us,
            "max": r.max_us,
        },
        throughput_pps=r.msg_rate,
        observations=r.observations,
        duration_s=r.runtime_s,
        extra={
            "p25": r.pct(25.0),
            "p75": r.pct(75.0),
            "p9999": r.pct(99.99),
            "min": r.min_us,
            "stddev": r.stddev_us,
            "dropped": float(r.dropped),
            "sessions": float(sessions),
        },
    )


class SockperfProbe:
    """Fresh sockperf server(s) + client(s) per window.

    ``client_cpus`` / ``server_cpus`` (one entry per session, cycled) override the policy's single
    ``cpu`` / ``server_cpu`` for layouts such as "clients alternate CPU0/CPU1".
    """

    name = "sockperf"

    def __init__(
        self,
        cfg: SockperfConfig,
        runner: Runner,
        *,
        clock: Clock,
        client_cpus: Sequence[int] | None = None,
        server_cpus: Sequence[int] | None = None,
        server_bind: str | None = None,
        server_ready_s: float = 0.3,
    ) -> None:
        self.cfg = cfg
        self._runner = runner
        self._clock = clock
        self._client_cpus = list(client_cpus) if client_cpus else ([cfg.cpu] if cfg.cpu is not None else [])
        self._server_cpus = list(server_cpus) if server_cpus else (
            [cfg.server_cpu] if cfg.server_cpu is not None else [])
        self._bind = server_bind or cfg.target
        self._ready_s = server_ready_s
        self._servers: list[Spawned] = []
        self.restarts = 0

    # -- Probe protocol -------------------------------------------------------------------------

    def start(self) -> None:
        """Nothing runs between windows; servers are started per window."""

    def restart(self) -> None:
        """Drop any server still running: the next window starts fresh sockets."""
        self._stop_servers()
        self.restarts += 1

    def close(self) -> None:
        self._stop_servers()

    def measure(self, duration_s: float, window_index: int) -> Window:
        t0 = self._clock.monotonic()
        try:
            result, hist = self._measure(duration_s)
        except ProbeError as e:
            log.warning("probe sockperf window %d failed: %s", window_index, e.message)
            return Window.failed(e.message, duration_s=self._clock.monotonic() - t0)
        finally:
            self._stop_servers()
        return result_to_window(result, self.cfg.sessions, hist)

    # -- internals ------------------------------------------------------------------------------

    def _cpu(self, cpus: list[int], i: int) -> list[int] | None:
        return [cpus[i % len(cpus)]] if cpus else None

    def server_argv(self) -> list[str]:
        argv = ["sockperf", "server", "-i", self._bind, "-p", str(self.cfg.port)]
        if self.cfg.protocol == "tcp":
            argv.append("--tcp")
        return argv

    def client_argv(self, session: int, seconds: int) -> list[str]:
        c = self.cfg
        mode = "ping-pong" if c.mode == "ping-pong" else "under-load"
        argv = ["sockperf", mode, "-i", c.target, "-p", str(c.port), "-m", str(c.msg_size),
                "-t", str(seconds), "--full-rtt"]
        if c.mode == "under-load":
            argv += ["--mps", str(c.rate_mps or 1000), "--reply-every", "1"]
        if c.protocol == "tcp":
            argv.append("--tcp")
        if c.histogram:
            argv += ["--full-log", "/dev/stdout"]
        return argv

    def _start_servers(self) -> None:
        self._stop_servers()
        self._servers.append(self._runner.spawn(
            self.server_argv(), netns=self.cfg.server_netns, cpus=self._cpu(self._server_cpus, 0)))
        self._clock.sleep(self._ready_s)
        for s in self._servers:
            if not s.running():
                res = s.stop(0.1)
                raise ProbeError(f"sockperf server did not start: {res.describe()}")

    def _stop_servers(self) -> None:
        servers, self._servers = self._servers, []
        for s in servers:
            s.stop(0.5)

    def _measure(self, duration_s: float) -> tuple[SockperfResult, str | None]:
        seconds = max(1, round(duration_s))
        if self.cfg.restart_server:
            self._start_servers()
        clients = [
            self._runner.spawn(self.client_argv(i, seconds), netns=self.cfg.netns,
                               cpus=self._cpu(self._client_cpus, i))
            for i in range(self.cfg.sessions)
        ]
        deadline = self._clock.monotonic() + seconds + self.cfg.timeout_s
        outs: list[ExecResult] = []
        for c in clients:
            outs.append(c.wait(max(0.1, deadline - self._clock.monotonic())))
        results: list[SockperfResult] = []
        samples: list[list[int]] = []
        for i, res in enumerate(outs):
            if res.timed_out:
                raise ProbeError(f"sockperf session {i} timed out after {seconds + self.cfg.timeout_s:.0f} s")
            if res.returncode != 0:
                raise ProbeError(f"sockperf session {i} failed: {res.describe()}")
            results.append(parse_sockperf(res.stdout + "\n" + res.stderr))
            if self.cfg.histogram:
                samples.append(parse_full_log(res.stdout))
        return merge_results(results), samples_histogram(samples) if self.cfg.histogram else None

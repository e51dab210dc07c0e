"""sockperf probe: an active ping-pong (or under-load at a set rate) against a sockperf server.

Every window starts a fresh server and fresh client(s): ``net.core.busy_read`` is copied into a
socket when it is created, so a long-lived server would silently keep measuring the old value
(vm-bench.md §10). With ``sessions > 1`` the probe runs that many clients in parallel against the
one server socket (as a real service sees many peers on one port; vm-bench.md §6 "n4/n16") and
merges the per-session statistics (see :func:`merge_results`).

The output parser is a pure function of sockperf's text (3.x, ``--full-rtt``), in
polltuned.host.sockperf_output (shared with the mix client).

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
from collections.abc import Sequence

from polltuned.clock import Clock
from polltuned.errors import ProbeError
from polltuned.histogram import LatencyHistogram
from polltuned.host.exec import ExecResult, Runner, Spawned
from polltuned.host.sockperf_output import (
    SockperfResult,
    merge_results,
    parse_full_log,
    parse_sockperf,
    samples_histogram,
)
from polltuned.policy.schema import SockperfProbe as SockperfConfig
from polltuned.records import Window

log = logging.getLogger("polltuned.probes")

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

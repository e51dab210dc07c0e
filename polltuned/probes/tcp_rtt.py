"""tcp_rtt probe: passive kernel RTT of the real traffic's established TCP sockets.

Every ``sample_interval_s`` during the window the probe dumps established TCP sockets through
sock_diag (polltuned.host.sockdiag), keeps those matching the port/address filter and records each
socket's smoothed RTT (``tcpi_rtt``, µs). The window's statistics are taken over all those samples.
A window in which fewer than ``min_sockets`` matching sockets were ever seen is a failed window:
there is no traffic to measure, and no number is invented.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np

from polltuned.clock import Clock
from polltuned.errors import HostError, ProbeError
from polltuned.host.sockdiag import SockDiag, TcpSock
from polltuned.policy.schema import TcpRttProbe as TcpRttConfig
from polltuned.records import Window

log = logging.getLogger("polltuned.probes")

Dump = Callable[[], Sequence[TcpSock]]


def matches(cfg: TcpRttConfig, s: TcpSock) -> bool:
    """Does socket ``s`` pass the policy's filter? ``side``: src = local port, dst = remote port."""
    if cfg.port is not None:
        if cfg.side == "src" and s.sport != cfg.port:
            return False
        if cfg.side == "dst" and s.dport != cfg.port:
            return False
        if cfg.side == "any" and cfg.port not in (s.sport, s.dport):
            return False
    return cfg.address is None or cfg.address in (s.src, s.dst)


def summarise(samples_us: Sequence[float]) -> dict[str, float]:
    """Pure: latency statistics over RTT samples (µs)."""
    a = np.asarray(samples_us, dtype=float)
    qs = np.percentile(a, [50, 90, 99, 99.9])
    return {"p50": float(qs[0]), "p90": float(qs[1]), "p99": float(qs[2]), "p999": float(qs[3]),
            "mean": float(a.mean()), "max": float(a.max())}


class TcpRttProbe:
    name = "tcp_rtt"

    def __init__(self, cfg: TcpRttConfig, *, clock: Clock, dump: Dump | None = None) -> None:
        self.cfg = cfg
        self._clock = clock
        self._dump = dump
        self._diag: object | None = None

    def start(self) -> None:
        if self._dump is None:
            diag = SockDiag(self.cfg.netns)
            self._diag = diag
            self._dump = diag.established_tcp

    def restart(self) -> None:
        """Passive probe: the application's sockets are not ours to restart."""

    def close(self) -> None:
        if isinstance(self._diag, SockDiag):
            self._diag.close()
        self._diag = None

    def measure(self, duration_s: float, window_index: int) -> Window:
        t0 = self._clock.monotonic()
        try:
            if self._dump is None:
                self.start()
            assert self._dump is not None
            samples: list[float] = []
            seen: set[tuple[str, int, str, int]] = set()
            polls = 0
            while True:
                for s in self._dump():
                    if matches(self.cfg, s):
                        samples.append(s.rtt_us)
                        seen.add((s.src, s.sport, s.dst, s.dport))
                polls += 1
                remaining = duration_s - (self._clock.monotonic() - t0)
                if remaining <= 0:
                    break
                self._clock.sleep(min(self.cfg.sample_interval_s, remaining))
            if len(seen) < self.cfg.min_sockets:
                raise ProbeError(
                    f"{len(seen)} established TCP socket(s) matched port={self.cfg.port} side={self.cfg.side} "
                    f"address={self.cfg.address} (need {self.cfg.min_sockets})")
            elapsed = self._clock.monotonic() - t0
            return Window(ok=True, latency=summarise(samples), observations=len(samples), duration_s=elapsed,
                          extra={"sockets": float(len(seen)), "polls": float(polls)})
        except (ProbeError, HostError) as e:
            log.warning("probe tcp_rtt window %d failed: %s", window_index, e.message)
            return Window.failed(e.message, duration_s=self._clock.monotonic() - t0)

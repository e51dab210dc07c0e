"""Throughput and drops of the policy's NIC over each probe window, for probes that do not measure them.

A policy whose objective needs throughput (``combine = "cpu_per_throughput"`` or
``constraints.throughput_floor_pps``) or drops (``constraints.max_drops_increase_per_s``) but whose
probe does not report them (``tcp_rtt`` never does; no probe reports drops) gets them from the
link statistics of its ``nic`` over the same window: rx + tx packets per second and rx + tx
dropped per second (``rtnl_link_stats64`` through the counters' ``links`` family: RTM_GETSTATS on
the real host, ``/sys/class/net/DEV/statistics`` on a fake tree).

This is the whole NIC's packet rate, not only the service's: on a throughput host that is what
"CPU per packet" means (the CPU side is every core's system+softirq+irq time too). A value the
probe reports itself is never overwritten. Only devices of the host network namespace are read.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Protocol

from polltuned.clock import Clock
from polltuned.counters.sampler import Sampler
from polltuned.errors import PolltunedError
from polltuned.host.fs import Host
from polltuned.metrics.window import rates
from polltuned.policy.schema import Objective, Policy
from polltuned.probes.base import Probe
from polltuned.records import Window

log = logging.getLogger("polltuned.probes")


class _Sampler(Protocol):
    def sample(self) -> Any: ...
    def close(self) -> None: ...


def needs_throughput(obj: Objective) -> bool:
    return obj.combine == "cpu_per_throughput" or obj.constraints.throughput_floor_pps is not None


def needs_drops(obj: Objective) -> bool:
    return obj.constraints.max_drops_increase_per_s is not None


class LinkRateProbe:
    """Wraps a probe: fills ``throughput_pps`` / ``drops_per_s`` of its windows from NIC link rates."""

    def __init__(self, inner: Probe, sampler: _Sampler, nic: str, *, throughput: bool, drops: bool) -> None:
        self.inner = inner
        self.name = inner.name
        self.nic = nic
        self.throughput = throughput
        self.drops = drops
        self._sampler = sampler
        self._warned = False

    def start(self) -> None:
        self.inner.start()

    def restart(self) -> None:
        self.inner.restart()

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self._sampler.close()

    def _warn(self, why: str) -> None:
        if not self._warned:
            log.warning("link statistics of %s unavailable for throughput/drops: %s", self.nic, why)
            self._warned = True

    def measure(self, duration_s: float, window_index: int) -> Window:
        try:
            s0 = self._sampler.sample()
        except PolltunedError as e:
            self._warn(e.message)
            s0 = None
        w = self.inner.measure(duration_s, window_index)
        if not w.ok or s0 is None:
            return w
        try:
            r = rates(s0, self._sampler.sample())
        except (PolltunedError, ValueError) as e:
            self._warn(str(e))
            return w
        nr = (r.nic or {}).get(self.nic)
        if nr is None or nr.packets_per_s is None:
            self._warn(r.unavailable.get(f"links.{self.nic}") or r.unavailable.get("links") or "no link counters")
            return w
        extra = {**w.extra, "nic_packets_per_s": nr.packets_per_s}
        tp, dr = w.throughput_pps, w.drops_per_s
        if self.throughput and tp is None:
            tp = nr.packets_per_s
        if self.drops and dr is None:
            dr = nr.drops_per_s
        if nr.drops_per_s is not None:
            extra["nic_drops_per_s"] = nr.drops_per_s
        return dataclasses.replace(w, throughput_pps=tp, drops_per_s=dr, extra=extra)


def with_link_rates(probe: Probe, host: Host, clock: Clock, policy: Policy) -> Probe:
    """``probe`` wrapped in a LinkRateProbe when the policy's objective needs throughput or drops
    and it has a host-netns nic; else ``probe`` itself. Sim probes report their own."""
    obj = policy.objective
    tp, dr = needs_throughput(obj), needs_drops(obj)
    nic = policy.nic_device
    if policy.probe.kind == "sim" or not (tp or dr) or nic is None:
        return probe

    return LinkRateProbe(probe, Sampler(host, clock=clock, nic=nic, families=("links",)), nic,
                         throughput=tp, drops=dr)

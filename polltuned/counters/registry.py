"""The explicit collector registry (no discovery by file name) and the multi-file collectors."""

from __future__ import annotations

import errno
from collections.abc import Mapping

from polltuned.counters.base import (
    Absent,
    Collector,
    FileCollector,
    Reader,
    SampleContext,
    TextSource,
    read_or_absent,
)
from polltuned.counters.interrupts import PATH as INTERRUPTS_PATH
from polltuned.counters.interrupts import parse_interrupts
from polltuned.counters.irq_percpu import IrqCounts, irq_path, parse_per_cpu_count
from polltuned.counters.links import LinksCollector
from polltuned.counters.loadavg import PATH as LOADAVG_PATH
from polltuned.counters.loadavg import parse_loadavg
from polltuned.counters.pressure import PressureRecord, parse_psi
from polltuned.counters.procs import ProcsCollector
from polltuned.counters.schedstat import PATH as SCHEDSTAT_PATH
from polltuned.counters.schedstat import parse_schedstat
from polltuned.counters.softirqs import PATH as SOFTIRQS_PATH
from polltuned.counters.softirqs import parse_softirqs
from polltuned.counters.softnet import PATH as SOFTNET_PATH
from polltuned.counters.softnet import parse_softnet
from polltuned.counters.stat import PATH as STAT_PATH
from polltuned.counters.stat import parse_stat
from polltuned.errors import HostError
from polltuned.host.fs import Host

PSI_CPU = "/proc/pressure/cpu"
PSI_IRQ = "/proc/pressure/irq"


class _IrqPercpuReader:
    def __init__(self, host: Host, irqs: list[int]) -> None:
        self._host = host
        self.stale = False            # a watched IRQ vanished: the Sampler re-reads the NIC map
        self._src: dict[int, TextSource | None] = {}
        for n in irqs:
            try:
                self._src[n] = TextSource(host, irq_path(n))
            except Absent:
                self._src[n] = None   # IRQ freed since discovery
                self.stale = True

    def read(self) -> Mapping[int, IrqCounts]:
        out: dict[int, IrqCounts] = {}
        for irq, src in self._src.items():
            if src is None:
                continue
            try:
                text = src.read()
            except (Absent, HostError) as e:
                if isinstance(e, HostError) and e.errno not in (errno.ENODEV, errno.ENOENT):
                    raise
                self.stale = True
                continue  # IRQ freed (driver reset, ethtool -L): its rate becomes unavailable
            out[irq] = parse_per_cpu_count(text, src.path, irq)
        return out

    def close(self) -> None:
        for src in self._src.values():
            if src is not None:
                src.close()


class IrqPercpuCollector:
    name = "irq_percpu"
    default = True
    doc = "the NIC queue IRQs' per-CPU counts from /sys/kernel/irq/N/per_cpu_count (cheap path)"

    def start(self, host: Host, ctx: SampleContext) -> Reader:
        irqs = sorted({q.irq for nic in ctx.nic_map.values() for q in nic.irqs})
        if irqs and not host.exists(irq_path(irqs[0])):
            raise Absent("/sys/kernel/irq/N/per_cpu_count (CONFIG_SPARSE_IRQ)")
        return _IrqPercpuReader(host, irqs)


class _PressureReader:
    def __init__(self, host: Host) -> None:
        self._host = host
        self._irq = True

    def read(self) -> PressureRecord:
        cpu = parse_psi(read_or_absent(self._host, PSI_CPU), PSI_CPU)
        irq = None
        if self._irq:
            try:
                irq = parse_psi(read_or_absent(self._host, PSI_IRQ), PSI_IRQ)
            except Absent:
                self._irq = False   # needs CONFIG_IRQ_TIME_ACCOUNTING; never appears later
        return PressureRecord(cpu, irq)

    def close(self) -> None:
        return None


class PressureCollector:
    name = "pressure"
    default = True
    doc = "PSI /proc/pressure/cpu (some/full total µs) and /proc/pressure/irq when present"

    def start(self, host: Host, ctx: SampleContext) -> Reader:
        return _PressureReader(host)


#: family name -> collector. ``default=False`` families are opt-in (Sampler(families=...)).
COLLECTORS: dict[str, Collector] = {
    "stat": FileCollector("stat", STAT_PATH, parse_stat, "per-CPU user/system/irq/softirq/idle ticks"),
    "softirqs": FileCollector("softirqs", SOFTIRQS_PATH, parse_softirqs,
                              "per-CPU softirq vector counts (NET_RX, NET_TX, ...)"),
    "interrupts": FileCollector("interrupts", INTERRUPTS_PATH, parse_interrupts,
                                "every IRQ x every online CPU; O(IRQs x CPUs) kernel cost: opt-in",
                                default=False),
    "irq_percpu": IrqPercpuCollector(),
    "schedstat": FileCollector("schedstat", SCHEDSTAT_PATH, parse_schedstat,
                               "per-CPU run-queue wait (CONFIG_SCHEDSTATS)"),
    "loadavg": FileCollector("loadavg", LOADAVG_PATH, parse_loadavg, "global procs_running and load"),
    "softnet": FileCollector("softnet", SOFTNET_PATH, parse_softnet,
                             "per-CPU packets processed, backlog drops, time_squeeze"),
    "pressure": PressureCollector(),
    "links": LinksCollector(),
    "procs": ProcsCollector(),
}

"""Counters: pure parsers for kernel counter files and the collectors that read them.

Public API::

    COLLECTORS: dict[str, Collector]   # "stat", "softirqs", "interrupts" (opt-in), "irq_percpu",
                                       # "schedstat", "loadavg", "softnet", "pressure", "links", "procs"
    Sampler(host, *, clock, nic=None, pids=None, families=None)
        .sample() -> Snapshot          # never raises for one broken family
        .nics -> {dev: NicInfo}        # queue -> IRQ map of the watched interfaces
        .refresh_nics()                # re-read it (done automatically when a queue IRQ vanishes)
        .disabled -> {family: reason}
        .close()
    Snapshot(t, families, unavailable, nics)   # typed accessors: .stat .softirqs .softnet ...

Every parser is a pure function ``parse_x(text, path) -> record`` raising
:class:`polltuned.errors.ParseError` (file, line, reason) on malformed input. The per-CPU files
(stat, softirqs, softnet_stat, schedstat, per_cpu_count) are decoded with one numpy call when
they have the exact kernel layout and fall back to a strict line-by-line parser otherwise; their
records keep the numbers as read-only int64 arrays (``StatRecord.ticks``, ``SoftirqsRecord.matrix``,
``SoftnetRecord.matrix``, ``SchedstatRecord.fields``, ``IrqCounts.counts``) with mapping views
(``.cpus``, ``.counts``, ``SoftnetRecord[cpu]``) for convenience. Rates between two snapshots
live in :mod:`polltuned.metrics.window`.
"""

from polltuned.counters.base import Absent, Collector, Reader, SampleContext
from polltuned.counters.nicmap import NicInfo, QueueIrq
from polltuned.counters.registry import COLLECTORS
from polltuned.counters.sampler import Sampler, Snapshot

__all__ = ["COLLECTORS", "Absent", "Collector", "NicInfo", "QueueIrq", "Reader", "SampleContext",
           "Sampler", "Snapshot"]

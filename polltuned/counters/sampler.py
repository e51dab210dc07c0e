"""Snapshot (one sample of every enabled family) and the Sampler that takes them.

The Sampler never raises for one broken family: a ParseError (malformed kernel file), HostError
or unexpected exception disables that family for the rest of the Sampler's life, logs exactly one
line on ``logging.getLogger("polltuned.counters")`` and records the reason in
``Snapshot.unavailable``; a missing interface (older kernel, config off) is reported as
"absent on this kernel: <path>". Metrics built from an unavailable family are reported
unavailable (None), never as zero.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, TypeVar

from polltuned.clock import Clock
from polltuned.counters.base import Absent, Collector, Reader, SampleContext
from polltuned.counters.interrupts import InterruptsRecord
from polltuned.counters.loadavg import LoadavgRecord
from polltuned.counters.nicmap import NicInfo, discover_nic, list_links
from polltuned.counters.pressure import PressureRecord
from polltuned.counters.registry import COLLECTORS
from polltuned.counters.schedstat import SchedstatRecord
from polltuned.counters.softirqs import SoftirqsRecord
from polltuned.counters.softnet import SoftnetRecord
from polltuned.counters.stat import StatRecord
from polltuned.errors import ParseError, PolltunedError, UsageError
from polltuned.host.fs import Host

if TYPE_CHECKING:
    from polltuned.counters.interrupts import InterruptsRecord
    from polltuned.counters.irq_percpu import IrqCounts
    from polltuned.counters.links import LinkStats
    from polltuned.counters.loadavg import LoadavgRecord
    from polltuned.counters.pressure import PressureRecord
    from polltuned.counters.procs import ProcTimes
    from polltuned.counters.schedstat import SchedstatRecord
    from polltuned.counters.softirqs import SoftirqsRecord
    from polltuned.counters.softnet import SoftnetRecord
    from polltuned.counters.stat import StatRecord

LOG_NAME = "polltuned.counters"
R = TypeVar("R")


@dataclass(frozen=True)
class Snapshot:
    """One sample: ``t`` is the monotonic time (midpoint of the reads), ``families`` maps a
    family name to its record, ``unavailable`` maps a family to the reason it is missing."""

    t: float
    families: Mapping[str, object]
    unavailable: Mapping[str, str]
    nics: Mapping[str, NicInfo] = field(default_factory=dict)
    read_s: float = 0.0              # time the reads took (clock seconds)

    def _get(self, name: str, kind: type[R]) -> R | None:
        v = self.families.get(name)
        return v if isinstance(v, kind) else None

    @property
    def stat(self) -> StatRecord | None:
        return self._get("stat", StatRecord)

    @property
    def softirqs(self) -> SoftirqsRecord | None:
        return self._get("softirqs", SoftirqsRecord)

    @property
    def interrupts(self) -> InterruptsRecord | None:
        return self._get("interrupts", InterruptsRecord)

    @property
    def irq_percpu(self) -> Mapping[int, IrqCounts] | None:
        v = self.families.get("irq_percpu")
        return v if isinstance(v, Mapping) else None

    @property
    def schedstat(self) -> SchedstatRecord | None:
        return self._get("schedstat", SchedstatRecord)

    @property
    def loadavg(self) -> LoadavgRecord | None:
        return self._get("loadavg", LoadavgRecord)

    @property
    def softnet(self) -> SoftnetRecord | None:
        return self._get("softnet", SoftnetRecord)

    @property
    def pressure(self) -> PressureRecord | None:
        return self._get("pressure", PressureRecord)

    @property
    def links(self) -> Mapping[str, LinkStats] | None:
        v = self.families.get("links")
        return v if isinstance(v, Mapping) else None

    @property
    def procs(self) -> Mapping[int, ProcTimes] | None:
        v = self.families.get("procs")
        return v if isinstance(v, Mapping) else None


class Sampler:
    """Takes Snapshots of the enabled families through ``host``.

    ``nic``: one interface name, several, or None for every non-loopback link.
    ``pids``: called at each sample for the workload's pids (per-process CPU, family "procs").
    ``families``: names from COLLECTORS; default: every collector with ``default=True``
    (``interrupts`` is opt-in: it costs O(IRQs x CPUs) in the kernel).
    Call ``close()`` (or use as a context manager) to release netlink sockets.
    """

    def __init__(
        self,
        host: Host,
        *,
        clock: Clock,
        nic: str | Sequence[str] | None = None,
        pids: Callable[[], Iterable[int]] | None = None,
        families: Iterable[str] | None = None,
        collectors: Mapping[str, Collector] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if collectors is None:
            collectors = COLLECTORS
        self._host = host
        self._clock = clock
        self._log = logger or logging.getLogger(LOG_NAME)
        if families is None:
            names = [n for n, c in collectors.items() if c.default]
        else:
            names = list(dict.fromkeys(families))
            unknown = [n for n in names if n not in collectors]
            if unknown:
                raise UsageError(
                    f"unknown counter family {unknown[0]!r}; known: {', '.join(sorted(collectors))}"
                )
        if pids is None and "procs" in names and families is None:
            names.remove("procs")
        self._collectors = {n: collectors[n] for n in names}
        self._nic_arg: list[str] | None = [nic] if isinstance(nic, str) else (None if nic is None else list(nic))
        self._pids = pids
        self._readers: dict[str, Reader] = {}
        self._disabled: dict[str, str] = {}
        self._started = False
        self._nics: dict[str, NicInfo] = {}

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(self._collectors)

    @property
    def nics(self) -> Mapping[str, NicInfo]:
        self._start()
        return MappingProxyType(self._nics)

    @property
    def disabled(self) -> Mapping[str, str]:
        return MappingProxyType(self._disabled)

    def _disable(self, name: str, reason: str, *, error: bool) -> None:
        self._disabled[name] = reason
        r = self._readers.pop(name, None)
        if r is not None:
            try:
                r.close()
            except Exception:  # closing a broken reader must not break the sample
                pass
        if error:
            self._log.warning("counter family %r disabled: %s", name, reason)
        else:
            self._log.info("counter family %r unavailable: %s", name, reason)

    def _discover(self) -> None:
        nics: dict[str, NicInfo] = {}
        devs = self._nic_arg if self._nic_arg is not None else list_links(self._host)
        for dev in devs:
            try:
                nics[dev] = discover_nic(self._host, dev)
            except PolltunedError as e:
                if self._nic_arg is not None:
                    raise UsageError(f"nic {dev!r}: {e.message}",
                                     hint="list interfaces with `ip -br link`") from e
                self._log.warning("interface %s skipped: %s", dev, e.message)
        self._nics = nics

    def _start_readers(self, names: Iterable[str]) -> None:
        ctx = SampleContext(nic_map=MappingProxyType(dict(self._nics)), pids=self._pids)
        for name in names:
            col = self._collectors[name]
            try:
                self._readers[name] = col.start(self._host, ctx)
            except Absent as e:
                self._disable(name, e.reason, error=False)
            except PolltunedError as e:
                self._disable(name, f"disabled after error: {e.message}", error=True)
            except Exception as e:
                self._disable(name, f"disabled after unexpected {type(e).__name__}: {e}", error=True)

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        import numpy  # noqa: F401  (the parsers' fast paths; imported here, outside the timed reads)

        self._discover()
        self._start_readers(self._collectors)

    def refresh_nics(self) -> None:
        """Re-read the queue -> IRQ map (after ``ethtool -L``, a driver reset, a new link) and
        restart the families that depend on it (irq_percpu, links). Called automatically before
        the next sample when a watched queue IRQ disappeared."""
        if not self._started:
            self._start()
            return
        self._discover()
        dependent = [n for n in ("irq_percpu", "links") if n in self._readers]
        for n in dependent:
            try:
                self._readers.pop(n).close()
            except Exception:
                pass
        self._start_readers(dependent)
        self._log.info("interface queue/IRQ map re-read: %s",
                       ", ".join(f"{d}: {len(i.irqs)} queue IRQs" for d, i in sorted(self._nics.items())))

    def sample(self) -> Snapshot:
        self._start()
        irq_reader = self._readers.get("irq_percpu")
        if irq_reader is not None and getattr(irq_reader, "stale", False):
            self.refresh_nics()
        t0 = self._clock.monotonic()
        out: dict[str, object] = {}
        for name, reader in list(self._readers.items()):
            try:
                out[name] = reader.read()
            except Absent as e:
                self._disable(name, e.reason, error=False)
            except ParseError as e:
                self._disable(name, f"disabled after parse error: {e.message}", error=True)
            except PolltunedError as e:
                self._disable(name, f"disabled after error: {e.message}", error=True)
            except Exception as e:
                self._disable(name, f"disabled after unexpected {type(e).__name__}: {e}", error=True)
        t1 = self._clock.monotonic()
        return Snapshot(
            t=(t0 + t1) / 2,
            families=MappingProxyType(out),
            unavailable=MappingProxyType(dict(self._disabled)),
            nics=MappingProxyType(dict(self._nics)),
            read_s=t1 - t0,
        )

    def close(self) -> None:
        for r in self._readers.values():
            try:
                r.close()
            except Exception:
                pass
        self._readers.clear()

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

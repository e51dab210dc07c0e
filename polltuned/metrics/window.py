"""Rates between two Snapshots: per-CPU and per-NIC, wrap-, reset- and hotplug-safe.

Public API::

    rates(a: Snapshot, b: Snapshot) -> Rates      # b taken after a
    Rates.interval_s
    Rates.cpu[n]: CpuRates        # user nice system idle iowait irq softirq steal: fraction of one core
                                  # (guest/guest_nice are already inside user/nice, kernel accounting);
                                  # net_rx_per_s, net_tx_per_s, softirqs_per_s (all vectors),
                                  # irqs_per_s (the watched NICs' queue IRQs on this CPU),
                                  # all_irqs_per_s (device IRQs from /proc/interrupts, opt-in),
                                  # runq_wait_s_per_s (schedstat Δrun_delay/Δt = avg waiting tasks),
                                  # rx_packets_per_s, backlog_drops_per_s, time_squeeze_per_s (softnet)
    Rates.cpu_column(name) -> (ids, values)   # the same numbers as numpy arrays (NaN = unavailable)
    Rates.nic[dev]: NicRates      # rx/tx packets/s, bytes/s, drops/s, errors/s; irqs_per_s per queue
    Rates.system: SystemRates     # procs_running (loadavg), psi cpu some / irq full (fraction of time)
    Rates.procs_cpu_cores         # user+system cores of the watched pids (None: family unavailable)
    Rates.unavailable             # "family" or "family.detail" -> reason
    Rates.busy_cores(cpus=None, fields=("system", "softirq", "irq")) -> float
    Rates.to_json() -> dict

Rules (every value is either right or None — never a silent zero):

* A metric whose family is unavailable in either snapshot is None and listed in ``unavailable``
  (families that were never asked for are None without being listed).
* 32-bit counters (softirqs, interrupts, per_cpu_count, softnet_stat) are differenced modulo
  2**32; a wrapped delta of 2**31 or more is implausible within one interval and is a reset.
* 64-bit counters (/proc/stat ticks, schedstat, link stats64, PSI totals) that went down were
  reset (device re-created, ...): that value's rate is None and the reset is reported.
* CPU hotplug: a CPU present in only one snapshot gets no rate (it is absent from ``cpu``); with
  /proc/stat available, only CPUs online in both snapshots appear.
* CPU shares are each CPU's tick deltas divided by the sum of its eight tick deltas (the kernel's
  own elapsed time for that CPU), which removes USER_HZ sampling jitter against the wall interval.

Per-CPU arithmetic is vectorised with numpy; ``Rates.cpu`` builds a CpuRates object the first
time a CPU is looked up.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING

from polltuned.counters.sampler import Snapshot
from polltuned.counters.stat import USER_HZ
from polltuned.errors import PolltunedError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    F64 = npt.NDArray[np.float64]
    I64 = npt.NDArray[np.int64]

_WRAP32 = 1 << 32


class MetricUnavailable(PolltunedError):
    """A metric asked for cannot be computed from these snapshots (family unavailable, reset)."""

    code = "metric-unavailable"


def delta32(a: int, b: int) -> int | None:
    """Counter delta for an ``unsigned int`` kernel counter; None when it looks like a reset."""
    d = b - a
    if d >= 0:
        return d
    d += _WRAP32
    return d if 0 <= d < (1 << 31) else None


def delta64(a: int, b: int) -> int | None:
    d = b - a
    return d if d >= 0 else None


def _d32(a: I64, b: I64) -> F64:
    """Vector delta32: float array, NaN where the counter was reset."""
    import numpy as np

    d = b - a
    wrapped = d < 0
    if not wrapped.any():
        return d.astype(np.float64)
    d = np.where(wrapped, d + _WRAP32, d)
    out = d.astype(np.float64)
    out[wrapped & (d >= (1 << 31))] = np.nan
    return out


def _d64(a: I64, b: I64) -> F64:
    import numpy as np

    d = (b - a).astype(np.float64)
    d[d < 0] = np.nan
    return d


@dataclass(frozen=True)
class CpuRates:
    user: float | None = None
    nice: float | None = None
    system: float | None = None
    idle: float | None = None
    iowait: float | None = None
    irq: float | None = None
    softirq: float | None = None
    steal: float | None = None
    net_rx_per_s: float | None = None
    net_tx_per_s: float | None = None
    softirqs_per_s: float | None = None
    irqs_per_s: float | None = None
    all_irqs_per_s: float | None = None
    runq_wait_s_per_s: float | None = None
    rx_packets_per_s: float | None = None
    backlog_drops_per_s: float | None = None
    time_squeeze_per_s: float | None = None

    def to_json(self) -> dict[str, float | None]:
        return {f: getattr(self, f) for f in CPU_COLUMNS}


CPU_COLUMNS = tuple(f.name for f in fields(CpuRates))
BUSY_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


class CpuTable(Mapping[int, CpuRates]):
    """cpu id -> CpuRates over numpy columns (NaN = unavailable); objects are built on lookup."""

    def __init__(self, ids: I64, columns: Mapping[str, F64]) -> None:
        self.ids = ids
        self.columns = columns
        self._index = {c: i for i, c in enumerate(ids.tolist())}
        self._cache: dict[int, CpuRates] = {}

    def __getitem__(self, cpu: int) -> CpuRates:
        got = self._cache.get(cpu)
        if got is None:
            i = self._index[cpu]     # KeyError for CPUs without rates, as a Mapping should
            kw = {}
            for name, col in self.columns.items():
                v = float(col[i])
                kw[name] = None if math.isnan(v) else v
            got = self._cache[cpu] = CpuRates(**kw)
        return got

    def __iter__(self) -> Iterator[int]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, cpu: object) -> bool:
        return cpu in self._index

    def to_json(self) -> dict[str, dict[str, float | None]]:
        """{"cpu id": {column: value or None}} straight from the columns (no CpuRates objects)."""
        names = list(self.columns)
        lists = [[None if v != v else v for v in self.columns[n].tolist()] for n in names]  # NaN -> None
        return {str(c): dict(zip(names, vals)) for c, vals in zip(self.ids.tolist(), zip(*lists))}


@dataclass(frozen=True)
class NicRates:
    rx_packets_per_s: float | None = None
    tx_packets_per_s: float | None = None
    rx_bytes_per_s: float | None = None
    tx_bytes_per_s: float | None = None
    rx_drops_per_s: float | None = None
    tx_drops_per_s: float | None = None
    rx_errors_per_s: float | None = None
    tx_errors_per_s: float | None = None
    irqs_per_s: Mapping[str, float | None] = field(default_factory=dict)  # queue label -> IRQs/s
    irq_numbers: Mapping[str, int] = field(default_factory=dict)         # queue label -> IRQ
    note: str | None = None

    @property
    def packets_per_s(self) -> float | None:
        if self.rx_packets_per_s is None or self.tx_packets_per_s is None:
            return None
        return self.rx_packets_per_s + self.tx_packets_per_s

    @property
    def drops_per_s(self) -> float | None:
        if self.rx_drops_per_s is None or self.tx_drops_per_s is None:
            return None
        return self.rx_drops_per_s + self.tx_drops_per_s

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        d["irqs_per_s"] = dict(self.irqs_per_s)
        d["irq_numbers"] = dict(self.irq_numbers)
        d["packets_per_s"] = self.packets_per_s
        d["drops_per_s"] = self.drops_per_s
        return d


@dataclass(frozen=True)
class SystemRates:
    procs_running: int | None = None          # instantaneous global count at the second snapshot
    load1: float | None = None
    psi_cpu_some: float | None = None          # fraction of the interval with >= 1 task waiting
    psi_irq_full: float | None = None          # fraction of the interval stalled by IRQ work
    ctxt_per_s: float | None = None

    def to_json(self) -> dict[str, float | int | None]:
        return asdict(self)


@dataclass(frozen=True)
class Rates:
    interval_s: float
    cpu: Mapping[int, CpuRates]
    nic: Mapping[str, NicRates] | None
    system: SystemRates
    procs_cpu_cores: float | None
    unavailable: Mapping[str, str]

    def cpu_column(self, name: str) -> tuple[list[int], list[float | None]]:
        """(cpu ids, values) of one CpuRates field for every CPU, in id order."""
        if name not in CPU_COLUMNS:
            raise MetricUnavailable(f"unknown per-CPU metric {name!r}; known: {', '.join(CPU_COLUMNS)}")
        ids = sorted(self.cpu)
        return ids, [getattr(self.cpu[c], name) for c in ids]

    def busy_cores(self, cpus: Sequence[int] | None = None,
                   fields: Sequence[str] = ("system", "softirq", "irq")) -> float:
        """Cores spent in ``fields`` summed over ``cpus`` (default: every CPU in both snapshots).
        Raises MetricUnavailable when /proc/stat was unavailable, a counter was reset or a CPU is
        missing."""
        bad = [f for f in fields if f not in BUSY_FIELDS]
        if bad:
            raise MetricUnavailable(f"busy_cores: unknown field {bad[0]!r}; known: {', '.join(BUSY_FIELDS)}")
        table = self.cpu
        if cpus is None and isinstance(table, CpuTable):
            total = 0.0
            for f in fields:
                s = float(table.columns[f].sum())
                if math.isnan(s):
                    raise MetricUnavailable(
                        f"busy_cores: {f} unavailable on some CPU ({self.unavailable.get('stat', 'counter reset')})")
                total += s
            return total
        wanted = sorted(table) if cpus is None else list(cpus)
        total = 0.0
        for c in wanted:
            r = table.get(c)
            if r is None:
                raise MetricUnavailable(f"busy_cores: no rates for cpu{c} (offline in one snapshot?)")
            for f in fields:
                v = getattr(r, f)
                if v is None:
                    why = self.unavailable.get("stat", "counter reset")
                    raise MetricUnavailable(f"busy_cores: cpu{c}.{f} unavailable ({why})")
                total += v
        return total

    def to_json(self) -> dict[str, object]:
        return {
            "interval_s": self.interval_s,
            "cpu": (self.cpu.to_json() if isinstance(self.cpu, CpuTable)
                    else {str(c): self.cpu[c].to_json() for c in sorted(self.cpu)}),
            "nic": None if self.nic is None else {n: r.to_json() for n, r in sorted(self.nic.items())},
            "system": self.system.to_json(),
            "procs_cpu_cores": self.procs_cpu_cores,
            "unavailable": dict(sorted(self.unavailable.items())),
        }


def _rate(d: int | None, dt: float) -> float | None:
    return None if d is None else d / dt


def _unavail(a: Snapshot, b: Snapshot, fam: str, out: dict[str, str]) -> None:
    """Record why ``fam`` is missing from a or b — unless it was never asked for."""
    if fam in a.families and fam in b.families:
        return
    requested = fam in a.families or fam in b.families or fam in a.unavailable or fam in b.unavailable
    if requested:
        out[fam] = b.unavailable.get(fam) or a.unavailable.get(fam) or "not collected"


def _common(ids_a: Sequence[int], ids_b: Sequence[int]) -> tuple[I64, I64, I64]:
    import numpy as np

    common, ia, ib = np.intersect1d(np.asarray(ids_a, dtype=np.int64), np.asarray(ids_b, dtype=np.int64),
                                    assume_unique=True, return_indices=True)
    return common, ia, ib


#: one family's per-CPU result: (cpu ids, {column: values})
_Part = tuple["I64", dict[str, "F64"]]


def _cpu_parts(a: Snapshot, b: Snapshot, dt: float, un: dict[str, str],
               irq_rates: dict[int, float | None]) -> tuple[I64 | None, list[_Part]]:
    """Per-CPU results of every family; fills ``irq_rates`` (IRQ -> IRQs/s over all CPUs)."""
    import numpy as np

    parts: list[_Part] = []
    online: I64 | None = None

    sa, sb = a.stat, b.stat
    if sa is not None and sb is not None:
        online, ia, ib = _common(sa.ids, sb.ids)
        d = (sb.ticks[ib, :8] - sa.ticks[ia, :8]).astype(np.float64)
        neg = d < 0
        if neg.any():
            for c in online[neg.any(axis=1)].tolist():
                un[f"stat.cpu{c}"] = "counter reset"
            d[neg] = np.nan
        tot = d.sum(axis=1)          # NaN where any field was reset
        denom = np.where(np.isnan(tot) | (tot <= 0), USER_HZ * dt, tot)
        shares = d / denom[:, None]
        parts.append((online, {f: shares[:, k] for k, f in enumerate(BUSY_FIELDS)}))
    else:
        _unavail(a, b, "stat", un)

    qa, qb = a.softirqs, b.softirqs
    if qa is not None and qb is not None:
        ids, ia, ib = _common(qa.cpus, qb.cpus)
        pos_a = {n: i for i, n in enumerate(qa.names)}
        rows = np.full((len(qb.names), len(ids)), np.nan)
        for j, name in enumerate(qb.names):
            i = pos_a.get(name)
            if i is not None:
                rows[j] = _d32(qa.matrix[i, ia], qb.matrix[j, ib]) / dt
        cols = {"softirqs_per_s": rows.sum(axis=0)}
        names = list(qb.names)
        nan = np.full(len(ids), np.nan)
        cols["net_rx_per_s"] = rows[names.index("NET_RX")] if "NET_RX" in names else nan
        cols["net_tx_per_s"] = rows[names.index("NET_TX")] if "NET_TX" in names else nan
        parts.append((ids, cols))
    else:
        _unavail(a, b, "softirqs", un)

    ina, inb = a.interrupts, b.interrupts
    if ina is not None and inb is not None:
        ids, ia, ib = _common(ina.cpus, inb.cpus)
        acc = np.zeros(len(ids))
        for k in ina.rows.keys() & inb.rows.keys():
            xa, xb = ina.rows[k], inb.rows[k]
            if xa.irq is None or xa.counts is None or xb.counts is None:
                continue
            acc += _d32(np.asarray(xa.counts, dtype=np.int64)[ia], np.asarray(xb.counts, dtype=np.int64)[ib])
        parts.append((ids, {"all_irqs_per_s": acc / dt}))
    else:
        _unavail(a, b, "interrupts", un)

    ka, kb = a.irq_percpu, b.irq_percpu
    if ka is not None and kb is not None:
        width = max((len(v.counts) for v in kb.values()), default=0)
        acc = np.zeros(width)
        for irq in ka.keys() & kb.keys():
            ca, cb = ka[irq].counts, kb[irq].counts
            n = min(len(ca), len(cb))
            d = _d32(ca[:n], cb[:n])
            acc[:n] += d
            tot = float(d.sum())
            irq_rates[irq] = None if math.isnan(tot) else tot / dt
        parts.append((np.arange(width, dtype=np.int64), {"irqs_per_s": acc / dt}))
    else:
        _unavail(a, b, "irq_percpu", un)

    ra, rb = a.schedstat, b.schedstat
    if ra is not None and rb is not None:
        ids, ia, ib = _common(ra.ids, rb.ids)
        parts.append((ids, {"runq_wait_s_per_s": _d64(ra.run_delay_ns[ia], rb.run_delay_ns[ib]) / 1e9 / dt}))
    else:
        _unavail(a, b, "schedstat", un)

    na, nb = a.softnet, b.softnet
    if na is not None and nb is not None:
        ids, ia, ib = _common(na.ids, nb.ids)
        cols = {}
        for out, col in (("rx_packets_per_s", 0), ("backlog_drops_per_s", 1), ("time_squeeze_per_s", 2)):
            cols[out] = _d32(na.matrix[ia, col], nb.matrix[ib, col]) / dt
        parts.append((ids, cols))
    else:
        _unavail(a, b, "softnet", un)
    return online, parts


def _cpu_table(online: I64 | None, parts: list[_Part]) -> CpuTable:
    import numpy as np

    if online is not None:
        universe = online
    elif parts:
        universe = np.unique(np.concatenate([ids for ids, _ in parts]))
    else:
        universe = np.zeros(0, dtype=np.int64)
    columns = {name: np.full(len(universe), np.nan) for name in CPU_COLUMNS}
    for ids, cols in parts:
        if not len(ids) or not len(universe):
            continue
        pos = np.searchsorted(universe, ids)
        pos_c = np.minimum(pos, len(universe) - 1)
        ok = universe[pos_c] == ids
        for name, vals in cols.items():
            columns[name][pos_c[ok]] = vals[ok]
    for col in columns.values():
        col.flags.writeable = False
    return CpuTable(universe, MappingProxyType(columns))


def rates(a: Snapshot, b: Snapshot) -> Rates:
    dt = b.t - a.t
    if not (dt > 0 and math.isfinite(dt)):
        raise MetricUnavailable(f"snapshots are not in time order (interval {dt!r} s)")
    un: dict[str, str] = {}
    nic_irq_rate: dict[int, float | None] = {}
    online, parts = _cpu_parts(a, b, dt, un, nic_irq_rate)
    table = _cpu_table(online, parts)

    # links + queue IRQs -> NicRates
    nic: dict[str, NicRates] | None = None
    la, lb = a.links, b.links
    links_ok = la is not None and lb is not None
    if not links_ok:
        _unavail(a, b, "links", un)
    if b.nics or links_ok:
        nic = {}
        names = set(b.nics) | (set(lb) if lb is not None else set())
        for dev in sorted(names):
            kw: dict[str, float | None] = {}
            if la is not None and lb is not None and dev in la and dev in lb:
                x, y = la[dev], lb[dev]
                for fld, out in (("rx_packets", "rx_packets_per_s"), ("tx_packets", "tx_packets_per_s"),
                                 ("rx_bytes", "rx_bytes_per_s"), ("tx_bytes", "tx_bytes_per_s"),
                                 ("rx_dropped", "rx_drops_per_s"), ("tx_dropped", "tx_drops_per_s"),
                                 ("rx_errors", "rx_errors_per_s"), ("tx_errors", "tx_errors_per_s")):
                    d = delta64(getattr(x, fld), getattr(y, fld))
                    if d is None:
                        un[f"links.{dev}"] = "counter reset"
                    kw[out] = _rate(d, dt)
            elif links_ok:
                un[f"links.{dev}"] = "interface missing in one snapshot"
            info = b.nics.get(dev)
            qrates: dict[str, float | None] = {}
            qnums: dict[str, int] = {}
            if info is not None:
                for q in info.irqs:
                    qnums[q.queue] = q.irq
                    qrates[q.queue] = nic_irq_rate.get(q.irq)
            nic[dev] = NicRates(**kw, irqs_per_s=MappingProxyType(qrates),
                                irq_numbers=MappingProxyType(qnums),
                                note=None if info is None else info.note)

    # global
    sys_kw: dict[str, float | int | None] = {}
    lv = b.loadavg
    if lv is not None:
        sys_kw["procs_running"] = lv.procs_running
        sys_kw["load1"] = lv.load1
    else:
        _unavail(a, b, "loadavg", un)
    sa, sb = a.stat, b.stat
    if sa is not None and sb is not None and sa.ctxt is not None and sb.ctxt is not None:
        sys_kw["ctxt_per_s"] = _rate(delta64(sa.ctxt, sb.ctxt), dt)
    pa_, pb_ = a.pressure, b.pressure
    if pa_ is not None and pb_ is not None:
        if pa_.cpu.some is not None and pb_.cpu.some is not None:
            d = delta64(pa_.cpu.some.total_us, pb_.cpu.some.total_us)
            sys_kw["psi_cpu_some"] = None if d is None else d / 1e6 / dt
        if pa_.irq is not None and pb_.irq is not None and pa_.irq.full and pb_.irq.full:
            d = delta64(pa_.irq.full.total_us, pb_.irq.full.total_us)
            sys_kw["psi_irq_full"] = None if d is None else d / 1e6 / dt
        else:
            un["pressure.irq"] = "absent on this kernel: /proc/pressure/irq"
    else:
        _unavail(a, b, "pressure", un)

    # workload processes
    procs_cores: float | None = None
    xa, xb = a.procs, b.procs
    if xa is not None and xb is not None:
        acc = 0.0
        for pid in xa.keys() & xb.keys():
            p0, p1 = xa[pid], xb[pid]
            if p0.start != p1.start:
                continue  # pid reused by another process
            dcpu = (p1.user_s + p1.system_s) - (p0.user_s + p0.system_s)
            if dcpu >= 0:
                acc += dcpu
        procs_cores = acc / dt
    else:
        _unavail(a, b, "procs", un)

    return Rates(
        interval_s=dt,
        cpu=table,
        nic=None if nic is None else MappingProxyType(nic),
        system=SystemRates(**sys_kw),  # type: ignore[arg-type]
        procs_cpu_cores=procs_cores,
        unavailable=MappingProxyType(un),
    )

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
    Rates.nic[dev]: NicRates      # rx/tx packets/s, bytes/s, drops/s, errors/s; irqs_per_s per queue
    Rates.system: SystemRates     # procs_running (loadavg), psi cpu some / irq full (fraction of time)
    Rates.procs_cpu_cores         # user+system cores of the watched pids (None: family unavailable)
    Rates.unavailable             # "family" or "family.detail" -> reason
    Rates.busy_cores(cpus=None, fields=("system", "softirq", "irq")) -> float
    Rates.to_json() -> dict

Rules (every value is either right or None — never a silent zero):

* A metric whose family is unavailable in either snapshot is None and listed in ``unavailable``.
* 32-bit counters (softirqs, interrupts, per_cpu_count, softnet_stat) are differenced modulo
  2**32; a wrapped delta above 2**31 is implausible within one interval and is treated as a reset.
* 64-bit counters (/proc/stat ticks, schedstat, link stats64, PSI totals) that went down were
  reset (device re-created, ...): that value's rate is None and the reset is reported.
* CPU hotplug: a CPU present in only one snapshot gets no rate (it is absent from ``cpu``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from types import MappingProxyType

from polltuned.counters.sampler import Snapshot
from polltuned.counters.stat import USER_HZ
from polltuned.errors import PolltunedError

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
        return asdict(self)


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


BUSY_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True)
class Rates:
    interval_s: float
    cpu: Mapping[int, CpuRates]
    nic: Mapping[str, NicRates] | None
    system: SystemRates
    procs_cpu_cores: float | None
    unavailable: Mapping[str, str]

    def busy_cores(self, cpus: Sequence[int] | None = None,
                   fields: Sequence[str] = ("system", "softirq", "irq")) -> float:
        """Cores spent in ``fields`` summed over ``cpus`` (default: every CPU in both snapshots).
        Raises MetricUnavailable when /proc/stat was unavailable or a CPU is missing."""
        bad = [f for f in fields if f not in BUSY_FIELDS]
        if bad:
            raise MetricUnavailable(f"busy_cores: unknown field {bad[0]!r}; known: {', '.join(BUSY_FIELDS)}")
        wanted = sorted(self.cpu) if cpus is None else list(cpus)
        total = 0.0
        for c in wanted:
            r = self.cpu.get(c)
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
            "cpu": {str(c): r.to_json() for c, r in sorted(self.cpu.items())},
            "nic": None if self.nic is None else {n: r.to_json() for n, r in sorted(self.nic.items())},
            "system": self.system.to_json(),
            "procs_cpu_cores": self.procs_cpu_cores,
            "unavailable": dict(sorted(self.unavailable.items())),
        }


def _rate(d: int | None, dt: float) -> float | None:
    return None if d is None else d / dt


def _unavail(a: Snapshot, b: Snapshot, fam: str, out: dict[str, str]) -> bool:
    """True (and the reason recorded) when ``fam`` is missing from either snapshot."""
    if fam in a.families and fam in b.families:
        return False
    requested = fam in a.families or fam in b.families or fam in a.unavailable or fam in b.unavailable
    if not requested:
        return True  # family not asked for: its metrics are None, but it is not "unavailable"
    out[fam] = b.unavailable.get(fam) or a.unavailable.get(fam) or "not collected"
    return True


def rates(a: Snapshot, b: Snapshot) -> Rates:
    dt = b.t - a.t
    if not (dt > 0 and math.isfinite(dt)):
        raise MetricUnavailable(f"snapshots are not in time order (interval {dt!r} s)")
    un: dict[str, str] = {}
    cpu: dict[int, dict[str, float | None]] = {}

    # /proc/stat: ticks -> fraction of one core. Shares are normalised by the CPU's own total tick
    # delta (all eight fields; guest is inside user), which removes USER_HZ tick-sampling jitter
    # against the wall interval; when no tick elapsed the wall interval is used.
    sa, sb = a.stat, b.stat
    if sa is not None and sb is not None:
        for c in sa.cpus.keys() & sb.cpus.keys():
            ta, tb = sa.cpus[c], sb.cpus[c]
            srow = cpu.setdefault(c, {})
            ds = [delta64(getattr(ta, f), getattr(tb, f)) for f in BUSY_FIELDS]
            known = [d for d in ds if d is not None]
            if len(known) != len(ds):
                un[f"stat.cpu{c}"] = "counter reset"
            denom = float(sum(known)) if len(known) == len(ds) and sum(known) > 0 else USER_HZ * dt
            for f, d in zip(BUSY_FIELDS, ds):
                srow[f] = None if d is None else d / denom
    else:
        _unavail(a, b, "stat", un)
    online = set(cpu) if sa is not None and sb is not None else None

    def row_for(c: int) -> dict[str, float | None] | None:
        # with /proc/stat available, only CPUs online in both snapshots get rates (hotplug)
        if online is not None and c not in online:
            return None
        return cpu.setdefault(c, {})

    # /proc/softirqs (possible CPUs; header names the columns)
    qa, qb = a.softirqs, b.softirqs
    if qa is not None and qb is not None:
        same = qa.cpus == qb.cpus
        ia, ib = {c: i for i, c in enumerate(qa.cpus)}, {c: i for i, c in enumerate(qb.cpus)}
        cols = [(c, ia[c], ib[c]) for c in qb.cpus if c in ia and (online is None or c in online)]
        per_vec: dict[str, list[float | None]] = {}
        for name, rb in qb.counts.items():
            ra = qa.counts.get(name)
            if ra is None:
                per_vec[name] = [None] * len(cols)
                continue
            full: list[int | None] = list(map(operator.sub, rb, ra)) if same else []
            if not same or min(full, default=0) < 0:  # type: ignore[type-var]
                full = [None] * len(qb.cpus)
                for _, i, j in cols:
                    full[j] = delta32(ra[i], rb[j])
            per_vec[name] = [None if full[j] is None else full[j] / dt  # type: ignore[operator]
                             for _, _, j in cols]
        rx, tx = per_vec.get("NET_RX"), per_vec.get("NET_TX")
        for k, (c, _, _) in enumerate(cols):
            prow = cpu.setdefault(c, {})
            prow["net_rx_per_s"] = None if rx is None else rx[k]
            prow["net_tx_per_s"] = None if tx is None else tx[k]
            stot: float | None = 0.0
            for v in per_vec.values():
                sv = v[k]
                if sv is None or stot is None:
                    stot = None
                    break
                stot += sv
            prow["softirqs_per_s"] = stot
    else:
        _unavail(a, b, "softirqs", un)

    # /proc/interrupts (opt-in): device IRQs per CPU (numeric rows present in both snapshots)
    ina, inb = a.interrupts, b.interrupts
    if ina is not None and inb is not None:
        ia_ = {c: i for i, c in enumerate(ina.cpus)}
        ib_ = {c: i for i, c in enumerate(inb.cpus)}
        sums: dict[int, float | None] = {}
        for k in ina.rows.keys() & inb.rows.keys():
            xa_, xb_ = ina.rows[k], inb.rows[k]
            if xa_.irq is None or xa_.counts is None or xb_.counts is None:
                continue
            for c in ia_.keys() & ib_.keys():
                r = _rate(delta32(xa_.counts[ia_[c]], xb_.counts[ib_[c]]), dt)
                prev = sums.get(c, 0.0)
                sums[c] = None if (prev is None or r is None) else prev + r
        for c, r in sums.items():
            prow = row_for(c)
            if prow is not None:
                prow["all_irqs_per_s"] = r
    elif "interrupts" in a.families or "interrupts" in b.families or "interrupts" in b.unavailable:
        _unavail(a, b, "interrupts", un)

    # NIC queue IRQs via per_cpu_count (index = CPU id), per CPU and per queue (numpy arrays)
    ka, kb = a.irq_percpu, b.irq_percpu
    nic_irq_rate: dict[int, float | None] = {}
    if ka is not None and kb is not None:
        import numpy as np

        width = max((len(v.counts) for v in kb.values()), default=0)
        irq_acc = np.zeros(width, dtype=np.int64)
        broken = np.zeros(width, dtype=bool)      # CPUs with a reset counter in some IRQ
        for irq in sorted(ka.keys() & kb.keys()):
            ca, cb = ka[irq].counts, kb[irq].counts
            n = min(len(ca), len(cb))
            ds = cb[:n] - ca[:n]
            if n and ds.min() < 0:                 # 32-bit wrap, or a reset
                ds = np.where(ds < 0, ds + _WRAP32, ds)
                bad = ds >= (1 << 31)
                broken[:n] |= bad
                ds = np.where(bad, 0, ds)
                nic_irq_rate[irq] = None if bad.any() else float(ds.sum()) / dt
            else:
                nic_irq_rate[irq] = float(ds.sum()) / dt
            irq_acc[:n] += ds
        acc_l, broken_l = irq_acc.tolist(), broken.tolist()
        for c in range(width):
            prow = row_for(c)
            if prow is not None:
                prow["irqs_per_s"] = None if broken_l[c] else acc_l[c] / dt
    else:
        _unavail(a, b, "irq_percpu", un)

    # schedstat: run_delay ns -> seconds waited per second
    ra_, rb_ = a.schedstat, b.schedstat
    if ra_ is not None and rb_ is not None:
        for c in ra_.cpus.keys() & rb_.cpus.keys():
            prow = row_for(c)
            if prow is not None:
                d = delta64(ra_.cpus[c].run_delay_ns, rb_.cpus[c].run_delay_ns)
                prow["runq_wait_s_per_s"] = None if d is None else d / 1e9 / dt
    else:
        _unavail(a, b, "schedstat", un)

    # softnet_stat (32-bit, rows keyed by the cpu-id column)
    na, nb = a.softnet, b.softnet
    if na is not None and nb is not None:
        for c in na.keys() & nb.keys():
            prow = row_for(c)
            if prow is not None:
                sx, sy = na[c], nb[c]
                prow["rx_packets_per_s"] = _rate(delta32(sx.processed, sy.processed), dt)
                prow["backlog_drops_per_s"] = _rate(delta32(sx.dropped, sy.dropped), dt)
                prow["time_squeeze_per_s"] = _rate(delta32(sx.time_squeeze, sy.time_squeeze), dt)
    else:
        _unavail(a, b, "softnet", un)

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
        cpu=MappingProxyType({c: CpuRates(**v) for c, v in sorted(cpu.items())}),
        nic=None if nic is None else MappingProxyType(nic),
        system=SystemRates(**sys_kw),  # type: ignore[arg-type]
        procs_cpu_cores=procs_cores,
        unavailable=MappingProxyType(un),
    )

"""The objective's CPU term, measured where the network path and the service run.

A window's CPU used to be system + softirq + irq summed over every CPU, so a load generator or any
unrelated process counted against the tuned service (issue 10.4). :func:`make_cpu_scope` picks,
in this order:

1. **cgroup** — the policy's probe names the service's systemd unit (``probe.unit``) and the host
   has a cgroup v2 hierarchy: the unit's own ``cpu.stat`` (``system_usec`` by default, or
   ``usage_usec``). Busy polling runs in the service's tasks and is accounted as their system time,
   so it is in there; NET_RX work done in softirq context on other CPUs belongs to no cgroup and is
   not. Scope ``"cgroup nginx.service"``.
2. **cpus** — the CPUs that serve the NIC's queues and the application: ``policy.app_cpus``, the
   CPUs the NIC's queue IRQs target (``effective_affinity_list``) or fired on during the window
   (``per_cpu_count`` deltas), and the rx queues' RPS CPUs; system + softirq + irq there
   (``Rates.busy_cores(cpus)``). The set only grows during the scope's life: a trial that moves the
   IRQs (``irq_affinity``) cannot make their CPU cost vanish from later windows, and the CONFIRM
   phase compares candidate and baseline over the same CPUs. Scope ``"cpus 0,1 (nic queues + app)"``.
3. **whole host** — every CPU, only as a fallback, with the reason:
   ``"whole host (fallback: nic veth0 has no queue IRQs and the policy sets no app_cpus)"``.

The choice is made once per policy (mixing scopes between windows would make their CPU numbers
incomparable); a scope that cannot measure a window raises MetricUnavailable, which the caller
records as a failed window (never told to the optimiser).

**Idle polling is CPU too.** With ``guest_halt_poll_ns`` (cpuidle-haltpoll) or the generic
``poll_idle`` a vCPU spins in the cpuidle ``POLL`` state before it halts; /proc/stat and cgroup
``cpu.stat`` count that spinning as idle (vm-bench.md §8), so without a correction the knob looks
free. Every scope adds the POLL state's time (``/sys/devices/system/cpu/cpuN/cpuidle/stateM/time``,
µs, where ``name`` is ``POLL``) on its own CPUs: the NIC-queue + app CPUs, every CPU for the
whole-host scope, and for a cgroup the policy's app_cpus (every CPU without them: halt polling
belongs to no task). Where cpuidle exposes no POLL state the scope says so (``status()``,
``polltuned check``) and counts none. This module is the one CPU account: the daemon, ``sim``, the
bench and ``check`` all measure CPU through it (HostEnv has no CPU path of its own).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from polltuned.clock import Clock
from polltuned.counters.nicmap import NicInfo
from polltuned.errors import HostError, ParseError, PolltunedError
from polltuned.host.cgroup import CgroupUnavailable, CpuStat, find_unit_cgroup, read_cpu_stat, unified_root, unit_name
from polltuned.host.cpus import format_cpu_list, parse_cpu_list
from polltuned.host.fs import Host
from polltuned.metrics.window import MetricUnavailable, rates
from polltuned.policy.schema import Policy

log = logging.getLogger("polltuned.metrics")

#: the per-CPU fields that make up the CPU term on a CPU scope (busy polling shows up as system time)
CPU_FIELDS = ("system", "softirq", "irq")
ScopeKind = Literal["cgroup", "cpus", "host", "none"]


class CpuSampler(Protocol):
    """``polltuned.counters.Sampler`` as seen from here."""

    def sample(self) -> Any: ...


@dataclass(frozen=True)
class CpuReading:
    """Cores spent in the scope over one window (idle polling included), and what the scope was."""

    cores: float
    scope: str
    cpus: tuple[int, ...] = ()
    #: the part of ``cores`` spent spinning in cpuidle POLL; None when cpuidle exposes no POLL state
    idle_poll_cores: float | None = None


CPU_SYSFS = "/sys/devices/system/cpu"


def parse_cpuidle_poll_us(names_times: Sequence[tuple[str, str]]) -> float:
    """Pure: total µs spent in cpuidle states named ``POLL``, from (name, time) file contents
    (/sys/devices/system/cpu/cpuN/cpuidle/stateM/{name,time}; time is cumulative µs)."""
    total = 0.0
    for name, t in names_times:
        if name.strip() == "POLL":
            try:
                total += float(t.strip())
            except ValueError:
                continue
    return total


class IdlePoll:
    """Per-CPU cumulative µs in the cpuidle POLL state. The POLL state files are found once
    (their names do not change while the system runs); :attr:`missing` says why none is counted."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._paths: dict[int, list[str]] | None = None
        self.missing: str | None = None

    def _discover(self) -> dict[int, list[str]]:
        if self._paths is not None:
            return self._paths
        paths: dict[int, list[str]] = {}
        for cpu in self.host.glob(CPU_SYSFS, "cpu[0-9]*"):
            base = f"{CPU_SYSFS}/{cpu}/cpuidle"
            for st in self.host.glob(base, "state[0-9]*"):
                try:
                    name = self.host.read_text(f"{base}/{st}/name")
                except HostError:
                    continue
                if name.strip() == "POLL":
                    paths.setdefault(int(cpu[3:]), []).append(f"{base}/{st}/time")
        if not paths:
            driver = ""
            with contextlib.suppress(HostError):
                driver = self.host.read_text(f"{CPU_SYSFS}/cpuidle/current_driver").strip()
            self.missing = ("cpuidle exposes no POLL state" + (f" (driver {driver})" if driver else
                                                               " (no cpuidle driver)")
                            + ": idle polling, if any, is not counted")
        self._paths = paths
        return paths

    def read(self) -> dict[int, float] | None:
        """CPU -> cumulative POLL µs; None when no POLL state is visible."""
        paths = self._discover()
        if not paths:
            return None
        out: dict[int, float] = {}
        for cpu, files in paths.items():
            total = 0.0
            for f in files:
                try:
                    total += float(self.host.read_text(f).strip())
                except (HostError, ValueError):
                    continue
            out[cpu] = total
        return out


def poll_cores(before: Mapping[int, float], after: Mapping[int, float], cpus: Iterable[int] | None,
               elapsed_s: float) -> float:
    """Pure: cores spent in POLL on ``cpus`` (None: every CPU) between two :meth:`IdlePoll.read`."""
    if elapsed_s <= 0:
        return 0.0
    keys = before.keys() & after.keys()
    if cpus is not None:
        keys &= set(cpus)
    return sum(max(0.0, after[c] - before[c]) for c in keys) / 1e6 / elapsed_s


def format_cpus(cpus: Iterable[int]) -> str:
    """The kernel's compact CPU list form (``0-3,8``)."""
    return format_cpu_list(set(cpus))


class CpuScope:
    """``begin()`` before the window, ``end()`` after it. ``fallbacks`` lists why preferred scopes
    were passed over (empty when the first choice was used). With ``idle_poll`` (and its ``clock``)
    the cpuidle POLL time on the scope's CPUs is added to every reading."""

    kind: ScopeKind = "host"

    def __init__(self, fallbacks: Sequence[str] = (), *, idle_poll: IdlePoll | None = None,
                 clock: Clock | None = None) -> None:
        self.fallbacks: tuple[str, ...] = tuple(fallbacks)
        self.last: CpuReading | None = None
        self.idle_poll = idle_poll if clock is not None else None
        self._clock = clock
        self._poll0: tuple[dict[int, float], float] | None = None

    def idle_poll_note(self) -> str:
        """Whether idle polling is counted, for status and ``check``."""
        if self.idle_poll is None:
            return "not counted (no idle-poll reader)"
        self.idle_poll.read()  # discovers the POLL states once
        return "counted (cpuidle POLL state)" if self.idle_poll.missing is None else self.idle_poll.missing

    def _poll_begin(self) -> None:
        self._poll0 = None
        if self.idle_poll is not None and self._clock is not None:
            got = self.idle_poll.read()
            if got is not None:
                self._poll0 = (got, self._clock.monotonic())

    def _poll_end(self, cpus: Iterable[int] | None) -> float | None:
        """Cores in POLL on ``cpus`` (None: every CPU) since :meth:`_poll_begin`; None when unseen."""
        start, self._poll0 = self._poll0, None
        if start is None or self.idle_poll is None or self._clock is None:
            return None
        got = self.idle_poll.read()
        if got is None:
            return None
        return poll_cores(start[0], got, cpus, self._clock.monotonic() - start[1])

    def describe(self) -> str:
        raise NotImplementedError

    def begin(self) -> None:
        raise NotImplementedError

    def end(self) -> CpuReading:
        raise NotImplementedError

    def status(self) -> dict[str, object]:
        """Small JSON block for the status document."""
        last = self.last
        return {"kind": self.kind, "scope": last.scope if last is not None else self.describe(),
                "fallbacks": list(self.fallbacks),
                "last_cores": None if last is None else last.cores,
                "last_idle_poll_cores": None if last is None else last.idle_poll_cores,
                "cpus": None if last is None or self.kind == "cgroup" else list(last.cpus)}

    def _done(self, reading: CpuReading) -> CpuReading:
        self.last = reading
        return reading


class CgroupCpuScope(CpuScope):
    """CPU time of one systemd unit's cgroup (cgroup v2 ``cpu.stat``)."""

    kind: ScopeKind = "cgroup"

    def __init__(self, host: Host, unit: str, *, clock: Clock,
                 field: Literal["system", "usage"] = "system", fallbacks: Sequence[str] = (),
                 idle_poll: IdlePoll | None = None, poll_cpus: Sequence[int] = ()) -> None:
        super().__init__(fallbacks, idle_poll=idle_poll, clock=clock)
        #: where halt polling is counted (it belongs to no task): the app CPUs, or every CPU
        self.poll_cpus = tuple(poll_cpus)
        self.host = host
        self.unit = unit_name(unit)
        self.clock = clock
        self.field = field
        self._dir: str | None = None
        self._begin: tuple[CpuStat, float] | None = None

    def describe(self) -> str:
        return f"cgroup {self.unit}" + ("" if self.field == "system" else " (user + system)")

    def _read(self) -> CpuStat:
        if self._dir is None:
            self._dir = find_unit_cgroup(self.host, self.unit)
        try:
            return read_cpu_stat(self.host, self._dir)
        except CgroupUnavailable:
            self._dir = find_unit_cgroup(self.host, self.unit)  # moved (Slice= change) or re-created
            return read_cpu_stat(self.host, self._dir)

    def begin(self) -> None:
        self._begin = None
        try:
            self._begin = (self._read(), self.clock.monotonic())
        except (HostError, ParseError) as e:
            raise MetricUnavailable(f"cpu: {e.message}") from None
        self._poll_begin()

    def end(self) -> CpuReading:
        if self._begin is None:
            raise MetricUnavailable(f"cpu: no begin() reading for cgroup {self.unit}")
        (a, t0), self._begin = self._begin, None
        try:
            b = self._read()
        except (HostError, ParseError) as e:
            raise MetricUnavailable(f"cpu: {e.message}") from None
        dt = self.clock.monotonic() - t0
        if b.cgroup_id != a.cgroup_id:
            raise MetricUnavailable(f"cpu: the cgroup of {self.unit} was re-created during the window "
                                    "(unit restarted)")
        x0, x1 = (a.system_usec, b.system_usec) if self.field == "system" else (a.usage_usec, b.usage_usec)
        if x1 < x0:
            raise MetricUnavailable(f"cpu: {self.unit} cpu.stat went backwards (cgroup re-created)")
        if not dt > 0:
            raise MetricUnavailable(f"cpu: window of {dt!r} s")
        poll = self._poll_end(self.poll_cpus or None)
        return self._done(CpuReading((x1 - x0) / 1e6 / dt + (poll or 0.0), self.describe(), self.poll_cpus, poll))


def _rates(a: Any, b: Any) -> Any:
    return rates(a, b)


class HostCpuScope(CpuScope):
    """system + softirq + irq over every CPU (the fallback)."""

    kind: ScopeKind = "host"

    def __init__(self, sampler: CpuSampler, why: str, *, fallbacks: Sequence[str] = (),
                 idle_poll: IdlePoll | None = None, clock: Clock | None = None) -> None:
        super().__init__(fallbacks, idle_poll=idle_poll, clock=clock)
        self.sampler = sampler
        self.why = why
        self._s0: Any = None

    def describe(self) -> str:
        return f"whole host (fallback: {self.why})"

    def begin(self) -> None:
        self._s0 = self.sampler.sample()
        self._poll_begin()

    def end(self) -> CpuReading:
        if self._s0 is None:
            raise MetricUnavailable("cpu: no begin() snapshot")
        s0, self._s0 = self._s0, None
        r = _rates(s0, self.sampler.sample())
        poll = self._poll_end(None)
        cores = float(r.busy_cores(None, CPU_FIELDS)) + (poll or 0.0)
        return self._done(CpuReading(cores, self.describe(), tuple(sorted(r.cpu)), poll))


#: reads the CPUs an IRQ targets; None when unknown (fake tree without /proc/irq, IRQ gone)
IrqCpus = Callable[[int], "list[int] | None"]


def irq_target_cpus(host: Host) -> IrqCpus:
    """``/proc/irq/N/effective_affinity_list`` (4.13+): the CPU the vector really targets. Not
    ``smp_affinity_list``: that is the allowed set, all CPUs by default, and would make the scope the
    whole host without saying so; where the effective list is missing the CPUs the IRQs fire on count."""
    def read(irq: int) -> list[int] | None:
        p = f"/proc/irq/{irq}/effective_affinity_list"
        try:
            return parse_cpu_list(host.read_text(p), p)
        except (HostError, ParseError):
            return None
    return read


def parse_cpu_mask(text: str, source: str = "cpumask") -> list[int]:
    """Kernel ``%*pb`` bitmap (``rps_cpus``: ``00000000,00000003``, 32-bit hex groups) -> CPU ids."""
    t = text.strip().replace(",", "")
    if not t:
        return []
    try:
        bits = int(t, 16)
    except ValueError:
        raise ParseError(source, 1, f"bad CPU mask {text.strip()!r}") from None
    return [i for i in range(bits.bit_length()) if bits >> i & 1]


class CpusCpuScope(CpuScope):
    """system + softirq + irq on the NIC's queue CPUs and the application's CPUs."""

    kind: ScopeKind = "cpus"

    def __init__(self, sampler: CpuSampler, *, host: Host | None, nic: NicInfo | None, app_cpus: Sequence[int],
                 fallbacks: Sequence[str] = (), idle_poll: IdlePoll | None = None,
                 clock: Clock | None = None) -> None:
        super().__init__(fallbacks, idle_poll=idle_poll, clock=clock)
        self.sampler = sampler
        self.host = host
        self.nic = nic
        self.app = tuple(sorted(set(app_cpus)))
        self._irq_cpus = irq_target_cpus(host) if host is not None else None
        self._nic_cpus: set[int] = set()        # grows: every CPU seen serving the NIC's queues
        self._s0: Any = None
        self._refresh_targets()

    def _label(self, cpus: Iterable[int]) -> str:
        s = set(cpus)
        parts = (["nic queues"] if s & self._nic_cpus else []) + (["app"] if s & set(self.app) else [])
        return f"cpus {format_cpus(s)} ({' + '.join(parts)})"

    def describe(self) -> str:
        return self._label(self._nic_cpus | set(self.app))

    def _refresh_targets(self) -> None:
        """Configured targets: queue IRQ affinity and the rx queues' RPS CPUs."""
        if self.nic is None or self.host is None:
            return
        if self._irq_cpus is not None:
            for irq in self.nic.queue_irq_numbers:
                got = self._irq_cpus(irq)
                if got:
                    self._nic_cpus.update(got)
        for q in self.host.glob(f"/sys/class/net/{self.nic.name}/queues", "rx-*"):
            p = f"/sys/class/net/{self.nic.name}/queues/{q}/rps_cpus"
            try:
                self._nic_cpus.update(parse_cpu_mask(self.host.read_text(p), p))
            except (HostError, ParseError):
                continue

    def _fired(self, a: Any, b: Any) -> set[int]:
        """CPUs on which one of the NIC's queue IRQs fired between the two snapshots."""
        if self.nic is None:
            return set()
        ka: Mapping[int, Any] | None = getattr(a, "irq_percpu", None)
        kb: Mapping[int, Any] | None = getattr(b, "irq_percpu", None)
        if ka is None or kb is None:
            return set()
        out: set[int] = set()
        for irq in self.nic.queue_irq_numbers:
            x, y = ka.get(irq), kb.get(irq)
            if x is None or y is None:
                continue
            ca, cb = x.counts.tolist(), y.counts.tolist()
            out.update(cpu for cpu in range(min(len(ca), len(cb))) if cb[cpu] != ca[cpu])
        return out

    def begin(self) -> None:
        self._refresh_targets()
        self._s0 = self.sampler.sample()
        self._poll_begin()

    def end(self) -> CpuReading:
        if self._s0 is None:
            raise MetricUnavailable("cpu: no begin() snapshot")
        s0, self._s0 = self._s0, None
        s1 = self.sampler.sample()
        self._nic_cpus |= self._fired(s0, s1)
        r = _rates(s0, s1)
        wanted = self._nic_cpus | set(self.app)
        if not wanted:
            dev = self.nic.name if self.nic is not None else "?"
            raise MetricUnavailable(f"cpu: no CPU known to serve {dev}'s queues yet (IRQ affinity unreadable, "
                                    "no queue IRQ fired) and no app_cpus")
        online = [c for c in sorted(wanted) if c in r.cpu]
        if not online:
            raise MetricUnavailable(f"cpu: none of the scope's CPUs ({format_cpus(wanted)}) is online")
        poll = self._poll_end(online)
        cores = float(r.busy_cores(online, CPU_FIELDS)) + (poll or 0.0)
        return self._done(CpuReading(cores, self._label(online), tuple(online), poll))


class NoCpuScope(CpuScope):
    """No way to measure CPU (no counters sampler and no cgroup): every window says why."""

    kind: ScopeKind = "none"

    def __init__(self, why: str, fallbacks: Sequence[str] = ()) -> None:
        super().__init__(fallbacks)
        self.why = why

    def describe(self) -> str:
        return f"none ({self.why})"

    def begin(self) -> None:
        raise MetricUnavailable(f"cpu: {self.why}")

    def end(self) -> CpuReading:
        raise MetricUnavailable(f"cpu: {self.why}")


def make_cpu_scope(policy: Policy, host: Host, sampler: CpuSampler | None, nicmap: Mapping[str, NicInfo] | None,
                   *, clock: Clock, cgroup_field: Literal["system", "usage"] = "system",
                   idle_poll: bool = True) -> CpuScope:
    """The CPU scope for ``policy``: its unit's cgroup, else the NIC-queue + app CPUs, else the whole
    host; with ``idle_poll`` the cpuidle POLL time on its CPUs is added. ``nicmap`` is
    ``Sampler.nics`` (device -> NicInfo). Logs the choice once."""
    poll = IdlePoll(host) if idle_poll else None
    fallbacks: list[str] = []
    unit = getattr(policy.probe, "unit", None)
    if unit:
        try:
            unit_name(unit)
            unified_root(host)
        except PolltunedError as e:
            fallbacks.append(f"cgroup of {unit} unavailable: {e.message}")
        else:
            scope: CpuScope = CgroupCpuScope(host, unit, clock=clock, field=cgroup_field, idle_poll=poll,
                                             poll_cpus=policy.app_cpus)
            log.info("objective CPU scope: %s", scope.describe())
            return scope
    if sampler is None:
        scope = NoCpuScope("no counters sampler to read CPU time from", fallbacks)
        log.warning("objective CPU scope: %s", scope.describe())
        return scope
    dev = policy.nic_device
    nic = (nicmap or {}).get(dev) if dev is not None else None
    if policy.app_cpus or (nic is not None and nic.irqs):
        scope = CpusCpuScope(sampler, host=host, nic=nic, app_cpus=policy.app_cpus, fallbacks=fallbacks,
                             idle_poll=poll, clock=clock)
        log.info("objective CPU scope: %s", scope.describe())
        return scope
    if dev is None:
        why = (f"nic {policy.nic} is inside a network namespace and the policy" if policy.nic
               else "the policy names no nic and") + " sets no app_cpus"
    elif nic is None:
        why = f"nic {dev} is not in the counters' NIC map and the policy sets no app_cpus"
    else:
        why = f"nic {dev} has no queue IRQs ({nic.note or 'none identified'}) and the policy sets no app_cpus"
    scope = HostCpuScope(sampler, why, fallbacks=fallbacks, idle_poll=poll, clock=clock)
    log.warning("objective CPU scope: %s", scope.describe())
    return scope

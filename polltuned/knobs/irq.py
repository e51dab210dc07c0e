"""IRQ affinity of a NIC's queue IRQs, as strategies rather than raw masks: ``DEV:irq_affinity``.

Strategies (values of the knob):

* ``kernel-default`` — what was there before polltuned first touched it (the baseline snapshot);
* ``spread``   — queue IRQ i on online CPU i mod n (one queue per CPU);
* ``pack-app`` — every queue IRQ on the application's CPUs (``app_cpus``);
* ``avoid-app``— every queue IRQ on the online CPUs that are *not* application CPUs.

Each expands to ``/proc/irq/N/smp_affinity_list`` writes (the list form: ERANGE instead of the
mask form's EOVERFLOW beyond nr_cpu_ids), verified through ``effective_affinity_list`` (the
CPU(s) the vector really targets must lie inside the requested set). Managed IRQs (mode 0444
since 6.12; writes fail EPERM, EIO before) are detected without writing and skipped with one
notice. Queue IRQs come from the PCI function's ``msi_irqs`` (``device/msi_irqs`` or, for
virtio, ``device/../msi_irqs``) filtered by their action names (config/control vectors dropped).
"""

from __future__ import annotations

import errno as errno_mod
import logging
import re

from polltuned.errors import HostError, KnobValueError, ParseError
from polltuned.host.cpus import format_cpu_list, online_cpus, parse_cpu_list
from polltuned.host.fs import Host
from polltuned.knobs.base import Availability, JsonValue, Knob, KnobGone, choice_domain, gone_or_raise
from polltuned.records import KnobValue

log = logging.getLogger("polltuned.knobs.irq")

STRATEGIES = ("kernel-default", "spread", "pack-app", "avoid-app")

_NON_QUEUE = re.compile(r"(config|ctrl|control|async|mgmt|misc|fw|cmd|aq|event|err|-req\.)", re.I)


def is_queue_irq_name(name: str) -> bool:
    """Queue vectors by /sys/kernel/irq/N/actions name (knobs.md 3.4.3): ``virtio2-input.0``,
    ``i40e-eth0-TxRx-3``, ``mlx5_comp3@pci:...``, ``gve-ntfy-blk0``; not ``virtio2-config``."""
    return bool(name) and not _NON_QUEUE.search(name)


def parse_affinity_map(text: str) -> dict[int, list[int]] | None:
    """The explicit form ``read()`` returns, ``38:0-1;39:0`` (IRQ or thread id : CPU list, ``;``
    between entries, ``""`` = none), as {id: cpus}; None when ``text`` is not in that form. Writing
    it back restores exactly that placement, so a value read from the host (an engine's baseline)
    is a valid value to write."""
    if not text:
        return {}
    out: dict[int, list[int]] = {}
    for part in text.split(";"):
        n, sep, cpus = part.partition(":")
        if not sep or not n.isdigit() or not cpus:
            return None
        try:
            out[int(n)] = parse_cpu_list(cpus)
        except ParseError:
            return None
    return out


def expand_strategy(strategy: str, irqs: list[int], online: list[int], app: list[int]) -> dict[int, list[int]]:
    """Pure: strategy -> {irq: cpus}. Raises ValueError when the strategy cannot be expanded."""
    if not online:
        raise ValueError("no online CPUs")
    if strategy == "spread":
        return {irq: [online[i % len(online)]] for i, irq in enumerate(sorted(irqs))}
    if strategy == "pack-app":
        cpus = [c for c in app if c in online]
        if not cpus:
            raise ValueError("pack-app needs app_cpus that are online")
        return {irq: cpus for irq in irqs}
    if strategy == "avoid-app":
        cpus = [c for c in online if c not in app]
        if not app:
            raise ValueError("avoid-app needs app_cpus")
        if not cpus:
            raise ValueError("avoid-app: every online CPU is an application CPU")
        return {irq: cpus for irq in irqs}
    raise ValueError(f"unknown strategy {strategy!r}")


class IrqAffinityKnob(Knob):
    kind = "irq-affinity"

    def __init__(self, host: Host, dev: str, app_cpus: tuple[int, ...] | list[int]) -> None:
        self.host = host
        self.dev = dev
        self.app = sorted(set(app_cpus))
        self.key = f"{dev}:irq_affinity"
        self.domain = choice_domain(STRATEGIES, "expanded to /proc/irq/N/smp_affinity_list writes")
        self._last_plan: dict[int, list[int]] | None = None
        self.pending: list[str] = []
        #: IRQs found managed at write time (kernels before 6.12: mode 0644, the write fails EIO)
        self._managed_at_write: set[int] = set()

    # -- discovery ---------------------------------------------------------------------------
    def _msi_dir(self) -> str | None:
        for d in (f"/sys/class/net/{self.dev}/device/msi_irqs", f"/sys/class/net/{self.dev}/device/../msi_irqs"):
            if self.host.exists(d):
                return d
        return None

    def queue_irqs(self) -> list[int]:
        d = self._msi_dir()
        if d is None:
            return []
        out = []
        for n in self.host.glob(d, "*"):
            if not n.isdigit():
                continue
            name = ""
            if self.host.exists(f"/sys/kernel/irq/{n}/actions"):
                name = self.host.read_text(f"/sys/kernel/irq/{n}/actions").strip()
            if is_queue_irq_name(name):
                out.append(int(n))
        return sorted(out)

    def managed(self, irq: int) -> bool:
        return irq in self._managed_at_write or not self.host.is_writable(f"/proc/irq/{irq}/smp_affinity_list")

    def settable_irqs(self) -> tuple[list[int], list[int]]:
        irqs = self.queue_irqs()
        return [i for i in irqs if not self.managed(i)], [i for i in irqs if self.managed(i)]

    def availability(self) -> Availability:
        if not self.host.exists(f"/sys/class/net/{self.dev}"):
            return Availability(False, False, f"no device {self.dev}")
        irqs = self.queue_irqs()
        if not irqs:
            return Availability(False, False, f"{self.dev} has no queue IRQs (virtual device or no MSI vectors)")
        ok, managed = self.settable_irqs()
        notes = (f"managed IRQs skipped (read-only, kernel-owned affinity): {', '.join(map(str, managed))}",) \
            if managed else ()
        if not ok:
            return Availability(True, False, "all queue IRQs are managed (affinity owned by the kernel)", notes)
        return Availability(True, True, notices=notes, warnings=notes)

    # -- values ------------------------------------------------------------------------------
    def validate(self, value: object) -> KnobValue:
        if isinstance(value, str) and value not in STRATEGIES and parse_affinity_map(value) is not None:
            return value  # an explicit placement as read() returns it
        v = super().validate(value)
        if v in ("pack-app", "avoid-app"):
            try:
                online = online_cpus(self.host)
            except HostError:
                online = []
            try:
                expand_strategy(str(v), [0], online or list(self.app), self.app)
            except ValueError as e:
                raise KnobValueError(f"{self.key}: {v!r}: {e} (app_cpus={self.app or 'unset'})") from None
        return v

    def _current(self) -> dict[str, str]:
        ok, _ = self.settable_irqs()
        out: dict[str, str] = {}
        for irq in ok:
            p = f"/proc/irq/{irq}/smp_affinity_list"
            try:
                out[str(irq)] = format_cpu_list(parse_cpu_list(self.host.read_text(p), p))
            except HostError as e:
                raise gone_or_raise(self.key, e) from e
        return out

    def read(self) -> KnobValue:
        if not self.host.exists(f"/sys/class/net/{self.dev}"):
            raise KnobGone(f"{self.key}: no device {self.dev}")
        return ";".join(f"{k}:{v}" for k, v in sorted(self._current().items(), key=lambda kv: int(kv[0])))

    def snapshot(self) -> JsonValue:
        cur: dict[str, JsonValue] = dict(self._current())
        return cur

    def plan(self, strategy: str, baseline: JsonValue) -> dict[int, list[int]]:
        ok, _ = self.settable_irqs()
        if strategy == "kernel-default":
            if not isinstance(baseline, dict):
                return {}
            return {int(k): parse_cpu_list(str(v)) for k, v in baseline.items() if int(k) in ok}
        explicit = parse_affinity_map(strategy) if strategy not in STRATEGIES else None
        if explicit is not None:
            return {irq: cpus for irq, cpus in explicit.items() if irq in ok}
        try:
            return expand_strategy(strategy, ok, online_cpus(self.host), self.app)
        except ValueError as e:
            raise KnobValueError(f"{self.key}: {strategy!r}: {e}") from None

    def write(self, value: KnobValue, *, baseline: JsonValue = None) -> None:
        """Write the plan IRQ by IRQ. A managed IRQ the mode did not reveal (before 6.12 its file is
        0644 and the write fails EIO; EPERM since) is skipped with one warning and left out of the
        plan, the snapshot and verification from then on; if every IRQ is managed, nothing is written
        and the error is raised."""
        plan = self.plan(str(value), baseline)
        self._last_plan = plan
        for irq, cpus in list(plan.items()):
            try:
                self.host.write_text(f"/proc/irq/{irq}/smp_affinity_list", format_cpu_list(cpus) + "\n")
            except HostError as e:
                if e.errno not in (errno_mod.EIO, errno_mod.EPERM):
                    raise
                self._managed_at_write.add(irq)
                del plan[irq]
                log.warning("%s: irq %d is managed (affinity owned by the kernel: write failed %s); skipped",
                            self.key, irq, errno_mod.errorcode.get(e.errno or 0, e.errno))
                if not plan:
                    raise

    def verify(self, value: KnobValue) -> bool:
        """The requested lists must read back exactly. ``effective_affinity_list`` is checked too,
        but on x86 without interrupt remapping the vector moves at the IRQ's *next* interrupt, so
        an effective CPU outside the new set is reported as pending (``self.pending``), not failed."""
        plan = self._last_plan
        if plan is None:
            return False
        self.pending = []
        for irq, cpus in plan.items():
            p = f"/proc/irq/{irq}/smp_affinity_list"
            if parse_cpu_list(self.host.read_text(p), p) != sorted(cpus):
                return False
            eff = f"/proc/irq/{irq}/effective_affinity_list"
            if self.host.exists(eff):
                e = parse_cpu_list(self.host.read_text(eff), eff)
                if e and not set(e) <= set(cpus):
                    self.pending.append(f"irq {irq}: effective CPU {format_cpu_list(e)} moves to "
                                        f"{format_cpu_list(cpus)} at its next interrupt")
        for msg in self.pending:
            log.info("%s: %s", self.key, msg)
        return True

    def effective(self) -> dict[int, list[int]]:
        """IRQ -> CPUs the vector really targets (effective_affinity_list), for status/verify output."""
        out: dict[int, list[int]] = {}
        for irq in self.settable_irqs()[0]:
            eff = f"/proc/irq/{irq}/effective_affinity_list"
            if self.host.exists(eff):
                out[irq] = parse_cpu_list(self.host.read_text(eff), eff)
        return out

    def restore(self, state: JsonValue) -> None:
        self.write("kernel-default", baseline=state)

    def matches(self, state: JsonValue) -> bool:
        if not isinstance(state, dict):
            return False
        cur = self._current()
        return all(cur.get(k) == v for k, v in state.items() if k in cur)

    # -- one part per IRQ: irqbalance moving one IRQ releases that IRQ only ----------------------
    def parts(self, value: KnobValue | None) -> dict[str, str] | None:
        if not isinstance(value, str) or value in STRATEGIES:
            return None
        m = parse_affinity_map(value)
        if m is None:
            return None
        return {str(irq): format_cpu_list(cpus) for irq, cpus in m.items()}

    def without_parts(self, value: KnobValue, baseline: JsonValue, parts: frozenset[str]) -> KnobValue:
        if not parts:
            return value
        plan = self.plan(str(value), baseline)
        return _format_map({irq: cpus for irq, cpus in plan.items() if str(irq) not in parts})

    def state_without(self, state: JsonValue, parts: frozenset[str]) -> JsonValue:
        if not isinstance(state, dict) or not parts:
            return state
        return {k: v for k, v in state.items() if k not in parts}

    def extend_baseline(self, state: JsonValue, value: KnobValue | None, now_state: JsonValue,
                        now_value: KnobValue | None) -> tuple[JsonValue, KnobValue | None]:
        if not isinstance(state, dict) or not isinstance(now_state, dict):
            return state, value
        new = {k: v for k, v in now_state.items() if k not in state}
        if not new:
            return state, value
        merged: dict[str, JsonValue] = {**state, **new}
        old_parts = self.parts(value) or {}
        joined = {**{k: str(v) for k, v in new.items()}, **old_parts}
        return merged, _format_map({int(k): parse_cpu_list(v) for k, v in joined.items()})


def _format_map(plan: dict[int, list[int]]) -> str:
    """{irq: cpus} in the explicit form ``read()`` returns (``38:0-1;39:0``)."""
    return ";".join(f"{irq}:{format_cpu_list(cpus)}" for irq, cpus in sorted(plan.items()))

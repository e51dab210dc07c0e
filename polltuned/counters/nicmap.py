"""NIC queue -> IRQ map, so later code can look at "this NIC's IRQs" only.

Order of preference (knobs.md 3.4.3):

1. MSI/MSI-X vectors of the PCI function: ``/sys/class/net/DEV/device/msi_irqs/<irq>``; for
   virtio-net ``device`` is the ``virtioN`` device and the vectors live on its PCI parent,
   ``/sys/class/net/DEV/device/../msi_irqs/``. Includes non-queue vectors (config/misc).
2. The IRQ's action names (``/sys/kernel/irq/N/actions``, comma separated) classify each vector:
   ``virtioN-input.Q`` / ``virtioN-output.Q`` (virtio-net), ``<drv>-<dev>-TxRx-Q`` (i40e/ice),
   ``<dev>-TxRx-Q`` (bnxt), ``<dev>-Tx-Rx-Q`` (ena), ``mlx5_compQ@pci:...``,
   ``gve-ntfy-blkQ@pci:...``, ``<dev>-rx-Q`` / ``<dev>-tx-Q``.
3. When the device has no ``msi_irqs`` directory, every ``/sys/kernel/irq/*/actions`` naming the
   device is used (once, at discovery).
4. netdev-genl ``napi-get`` (6.8+, real host only) reports ``irq`` for drivers calling
   ``netif_napi_set_irq()`` (mlx5, ice, bnxt, ena; *not* virtio-net on 6.18): such an IRQ is a
   queue IRQ even when its name did not say so (label ``napi-<id>`` if the name gave none).

Devices without a ``device`` link (veth, ifb, lo, bridges) have no hardware IRQs: they are reported
with ``note`` saying so and an empty IRQ list — never with made-up numbers.
"""

from __future__ import annotations

import errno
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from polltuned.errors import HostError
from polltuned.host.fs import Host
from polltuned.host.netdev_genl import GenlNetdev

_VIRTIO = re.compile(r"^(virtio\d+)-(input|output)\.(\d+)$")
_COMBINED = re.compile(r"(?:TxRx|Tx-Rx|txrx|rxtx|comp|ntfy-blk|fp|queue|TRx)[-_.]?(\d+)(?:@|$)")
_RXTX = re.compile(r"[-_.](rx|tx|Rx|Tx|RX|TX)[-_.]?(\d+)(?:@|$)")


@dataclass(frozen=True)
class QueueIrq:
    irq: int
    queue: str          # "rx-0", "tx-0", "combined-3" or "misc"
    name: str           # the action name(s) as the kernel shows them


@dataclass(frozen=True)
class NicInfo:
    name: str
    rx_queues: int
    tx_queues: int
    irqs: tuple[QueueIrq, ...]        # queue vectors, sorted by IRQ number
    other_irqs: tuple[QueueIrq, ...]  # the device's non-queue vectors (config, misc, async)
    source: str                       # "msi_irqs", "irq-names" or "none" (+ "+napi")
    note: str | None = None

    @property
    def queue_irq_numbers(self) -> tuple[int, ...]:
        return tuple(q.irq for q in self.irqs)

    def to_json(self) -> dict[str, object]:
        return {
            "rx_queues": self.rx_queues,
            "tx_queues": self.tx_queues,
            "irqs": [{"irq": q.irq, "queue": q.queue, "name": q.name} for q in self.irqs],
            "other_irqs": [{"irq": q.irq, "name": q.name} for q in self.other_irqs],
            "source": self.source,
            "note": self.note,
        }


def classify_irq_name(name: str, dev: str, virtio_dev: str | None = None) -> str | None:
    """Queue label for an IRQ action name of ``dev``: "rx-Q", "tx-Q", "combined-Q", "misc",
    or None when the name does not belong to ``dev``. Pure."""
    m = _VIRTIO.match(name)
    if m:
        if virtio_dev is not None and m.group(1) != virtio_dev:
            return None
        return f"{'rx' if m.group(2) == 'input' else 'tx'}-{int(m.group(3))}"
    if virtio_dev is not None and name.startswith(virtio_dev + "-"):
        return "misc"
    m = _COMBINED.search(name)
    if m:
        return f"combined-{int(m.group(1))}"
    m = _RXTX.search(name)
    if m:
        return f"{m.group(1).lower()}-{int(m.group(2))}"
    if dev in name:
        return "misc"
    return None


def _queue_counts(host: Host, dev: str) -> tuple[int, int]:
    names = host.glob(f"/sys/class/net/{dev}/queues", "*")
    return sum(n.startswith("rx-") for n in names), sum(n.startswith("tx-") for n in names)


def _actions(host: Host, irq: int) -> str:
    try:
        return host.read_text(f"/sys/kernel/irq/{irq}/actions").strip()
    except HostError:
        return ""


def _int_names(names: list[str]) -> list[int]:
    return sorted(int(n) for n in names if n.isascii() and n.isdigit())


#: ifindex -> [(napi id, irq or None)]
NapiSource = Callable[[int], list[tuple[int, int | None]]]


def _genl_napis(ifindex: int) -> list[tuple[int, int | None]]:
    return [(n.id, n.irq) for n in GenlNetdev().napis(ifindex)]


def discover_nic(host: Host, dev: str, *, napis: NapiSource | None = None) -> NicInfo:
    """Queue and IRQ layout of one interface, read once through the Host. ``napis`` defaults to
    netdev-genl ``napi-get`` on the real host and to nothing on a fake tree."""
    base = f"/sys/class/net/{dev}"
    if not host.exists(base):
        raise HostError(f"no such network interface: {dev} ({base} missing)", errno=errno.ENODEV)
    rxq, txq = _queue_counts(host, dev)
    if not host.exists(f"{base}/device"):
        return NicInfo(dev, rxq, txq, (), (), "none",
                       note="no device link (virtual interface): no hardware IRQs; NAPI/backlog only")
    virtio_dev: str | None = None
    try:
        target = host.readlink(f"{base}/device").rstrip("/").rsplit("/", 1)[-1]
        if re.fullmatch(r"virtio\d+", target):
            virtio_dev = target
    except HostError:
        pass
    msi: list[int] = []
    for d in (f"{base}/device/msi_irqs", f"{base}/device/../msi_irqs"):
        msi = _int_names(host.glob(d, "*"))
        if msi:
            break
    source = "msi_irqs"
    candidates: list[tuple[int, str]] = [(n, _actions(host, n)) for n in msi]
    if not candidates:
        source = "irq-names"
        for n in _int_names(host.glob("/sys/kernel/irq", "*")):
            act = _actions(host, n)
            if act and (dev in act or (virtio_dev is not None and act.startswith(virtio_dev + "-"))):
                candidates.append((n, act))
    queues: list[QueueIrq] = []
    others: list[QueueIrq] = []
    for n, act in candidates:
        label = None
        for part in (p.strip() for p in act.split(",")):
            label = classify_irq_name(part, dev, virtio_dev)
            if label is not None:
                break
        if label is None or label == "misc":
            others.append(QueueIrq(n, "misc", act))
        else:
            queues.append(QueueIrq(n, label, act))
    if napis is None and host.is_real:
        napis = _genl_napis
    if napis is not None:
        try:
            ifindex = int(host.read_text(f"{base}/ifindex").strip())
            napi_irqs = [(nid, irq) for nid, irq in napis(ifindex) if irq is not None]
        except Exception as e:   # no netdev family (< 6.3), no permission, pyroute2 error: names only
            logging.getLogger("polltuned.counters").debug("napi-get for %s unavailable: %s", dev, e)
            napi_irqs = []
        have = {q.irq for q in queues}
        for nid, irq in napi_irqs:
            if irq in have:
                continue
            old = next((o for o in others if o.irq == irq), None)
            if old is not None:
                others.remove(old)
            queues.append(QueueIrq(irq, f"napi-{nid}", old.name if old else _actions(host, irq)))
            have.add(irq)
        if napi_irqs:
            source += "+napi"
        queues.sort(key=lambda q: q.irq)
    note = None
    if not queues:
        note = "device has no per-queue IRQs that could be identified"
        if not candidates:
            source = "none"
    return NicInfo(dev, rxq, txq, tuple(queues), tuple(others), source, note)


def list_links(host: Host) -> list[str]:
    """Interface names under /sys/class/net, loopback excluded."""
    return [n for n in host.glob("/sys/class/net", "*") if n != "lo" and not n.startswith(".")]

"""Per-device NAPI knobs: sysfs (``DEV:napi_defer_hard_irqs``, ``DEV:gro_flush_timeout``,
``DEV:threaded``) and per-NAPI netlink (``DEV:napi:defer-hard-irqs``, ``DEV:napi:gro-flush-timeout``,
``DEV:napi:irq-suspend-timeout``).

DEV is ``eth0`` (host netns) or ``NETNS/DEV`` (a device inside a named netns, e.g. ``ptb/vb``).

Layering trap (knobs.md 1.6, 6.3): a sysfs write sets the value on *every* NAPI of the device
(write-all), overwriting per-NAPI values; a per-NAPI write leaves the sysfs file unchanged. So the
sysfs knobs' snapshot carries both layers ``{"sysfs": v, "napi": {id: v}}`` and ``restore`` writes
sysfs first, then puts every NAPI back; the per-NAPI knobs snapshot ``{"napi": {id: v}}``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polltuned.errors import HostError
from polltuned.host.fs import Host
from polltuned.host.netdev_genl import NapiSetCaps, NetdevApi
from polltuned.host.netns import device_host, netns_exists
from polltuned.knobs.base import (
    S32_MAX,
    ULONG_MAX,
    Availability,
    Domain,
    JsonValue,
    Knob,
    KnobGone,
    gone_or_raise,
    int_domain,
    parse_int_text,
)
from polltuned.records import KnobValue


@dataclass(frozen=True)
class DeviceRef:
    """``eth0`` or ``ptb/vb``."""

    netns: str | None
    name: str

    @property
    def label(self) -> str:
        return f"{self.netns}/{self.name}" if self.netns else self.name

    @property
    def host_name(self) -> str | None:
        """The device's name when it is in the host netns (where the host's rtnetlink socket, its
        /sys/class/net and its IRQs see it); None for a device inside a named netns or the
        unresolved ``{nic}`` placeholder. The one answer to "which device, and is it in a netns?"."""
        if self.netns is not None or self.name == "{nic}":
            return None
        return self.name

    @staticmethod
    def parse(text: str) -> DeviceRef | None:
        if text.count("/") > 1 or not text:
            return None
        ns, _, name = text.rpartition("/")
        if not name or (text.count("/") == 1 and not ns):
            return None
        return DeviceRef(ns or None, name)


class Device:
    """A network device as seen from its namespace; gives sysfs access and its netdev genl API."""

    def __init__(self, host: Host, ref: DeviceRef, netdev_factory: Callable[[Host, DeviceRef, int], NetdevApi],
                 caps: Callable[[], NapiSetCaps]) -> None:
        self.host = host
        self.ref = ref
        self._factory = netdev_factory
        self.caps = caps
        self._dev_host: Host | None = None
        #: the netdev API of the device's current ifindex (kept: the real one keeps its genl socket,
        #: and opening one inside a netns forks; a new ifindex — the device was re-created — gets a new one)
        self._api: tuple[int, NetdevApi] | None = None

    @property
    def dev_host(self) -> Host:
        if self._dev_host is None:
            self._dev_host = device_host(self.host, self.ref.netns)
        return self._dev_host

    def sysfs(self, attr: str) -> str:
        return f"/sys/class/net/{self.ref.name}/{attr}"

    def exists(self) -> bool:
        if self.ref.netns is not None and not netns_exists(self.host, self.ref.netns):
            return False
        return self.dev_host.exists(self.sysfs("ifindex"))

    def gone_reason(self) -> str:
        if self.ref.netns is not None and not netns_exists(self.host, self.ref.netns):
            return f"no network namespace {self.ref.netns}"
        return f"no device {self.ref.name}" + (f" in netns {self.ref.netns}" if self.ref.netns else "")

    def ifindex(self) -> int:
        p = self.sysfs("ifindex")
        try:
            return parse_int_text(p, self.dev_host.read_text(p))
        except HostError as e:
            raise gone_or_raise(self.ref.label, e) from e

    def netdev(self, ifindex: int | None = None) -> NetdevApi:
        idx = self.ifindex() if ifindex is None else ifindex
        if self._api is None or self._api[0] != idx:
            self._api = (idx, self._factory(self.host, self.ref, idx))
        return self._api[1]

    def napi_values(self, attr: str) -> dict[str, int]:
        """napi id (as text, JSON key) -> value of ``attr`` for every NAPI of the device."""
        try:
            idx = self.ifindex()   # once: inside a netns every read is a subprocess
            napis = self.netdev(idx).napis(idx)
        except HostError as e:
            raise gone_or_raise(self.ref.label, e) from e
        return {str(n.id): int(n.values[attr]) for n in napis if attr in n.values}

    def napi_restore(self, attr: str, state: dict[str, int]) -> None:
        idx = self.ifindex()
        api = self.netdev(idx)
        live = {str(n.id) for n in api.napis(idx)}
        for nid, v in state.items():
            if nid in live:  # NAPIs re-created since the snapshot get the device value from sysfs
                api.napi_set(int(nid), {attr: v})


#: sysfs attribute -> (per-NAPI attribute it also sets, static domain). threaded's domain is
#: decided from the napi-set policy (2 = busy-poll exists only after 6.18).
SYSFS_ATTRS: dict[str, tuple[str, Domain]] = {
    "napi_defer_hard_irqs": ("defer-hard-irqs", int_domain(0, S32_MAX, "empty polls", "ERANGE above S32_MAX")),
    "gro_flush_timeout": ("gro-flush-timeout", int_domain(0, ULONG_MAX, "ns")),
    "threaded": ("threaded", int_domain(0, 1, "", "0 softirq, 1 kthread; 2 (busy-poll) needs a kernel after 6.18")),
}

#: per-NAPI attribute (napi-set) -> fallback domain when the policy does not say
NAPI_ATTRS: dict[str, Domain] = {
    "defer-hard-irqs": int_domain(0, S32_MAX, "empty polls"),
    "gro-flush-timeout": int_domain(0, ULONG_MAX, "ns"),
    "irq-suspend-timeout": int_domain(0, ULONG_MAX, "ns", "only effective with defer-hard-irqs and gro-flush-timeout"),
}


def _extend_napi_layer(state: JsonValue, now_state: JsonValue) -> JsonValue:
    """``state`` with the NAPIs of ``now_state`` it does not know added (their live values): NAPIs
    re-created by a link down/up or a driver reset start from the device-level value (sysfs
    napi_defer_hard_irqs / gro_flush_timeout; 0 for irq-suspend-timeout). Limitation: when polltuned
    also manages the sysfs knob of the same attribute, that device-level value is polltuned's."""
    if not isinstance(state, dict) or not isinstance(now_state, dict):
        return state
    old, now = state.get("napi"), now_state.get("napi")
    if not isinstance(old, dict) or not isinstance(now, dict):
        return state
    new = {k: v for k, v in now.items() if k not in old}
    if not new:
        return state
    return {**state, "napi": {**old, **new}}


class SysfsDevKnob(Knob):
    kind = "netdev-sysfs"

    def __init__(self, dev: Device, attr: str) -> None:
        self.dev = dev
        self.attr = attr
        self.key = f"{dev.ref.label}:{attr}"
        self.path = dev.sysfs(attr)
        self.napi_attr, dom = SYSFS_ATTRS[attr]
        if attr == "threaded":
            c = dev.caps()
            hi = c.attrs.get("threaded", (0, 1))[1] if c.present else 1
            dom = int_domain(0, min(hi, 2), "",
                             "0 softirq, 1 kthread, 2 busy-poll" if hi >= 2
                             else "0 softirq, 1 kthread; 2 (busy-poll) unsupported by this kernel (needs > 6.18)")
        self.domain = dom

    def _napi_layer(self) -> bool:
        c = self.dev.caps()
        return c.present and self.napi_attr in c.attrs

    def availability(self) -> Availability:
        if not self.dev.exists():
            return Availability(False, False, self.dev.gone_reason())
        if not self.dev.dev_host.exists(self.path):
            return Availability(False, False, f"missing file {self.path} (kernel too old)")
        if not self.dev.dev_host.is_writable(self.path):
            return Availability(True, False, f"{self.path} not writable (needs CAP_NET_ADMIN in the initial userns)")
        return Availability(True, True)

    def read(self) -> KnobValue:
        try:
            return parse_int_text(self.path, self.dev.dev_host.read_text(self.path))
        except HostError as e:
            raise gone_or_raise(self.key, e) from e

    def write(self, value: KnobValue, *, baseline: JsonValue = None) -> None:
        try:
            self.dev.dev_host.write_text(self.path, f"{value}\n")
        except HostError as e:
            raise gone_or_raise(self.key, e) from e

    def snapshot(self) -> JsonValue:
        v = self.read()
        if not self._napi_layer():
            return {"sysfs": v}
        napi: dict[str, JsonValue] = dict(self.dev.napi_values(self.napi_attr))
        return {"sysfs": v, "napi": napi}

    def restore(self, state: JsonValue) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("sysfs"), int):
            raise HostError(f"{self.key}: bad snapshot {state!r}")
        v = state["sysfs"]
        assert isinstance(v, int)
        self.write(v)  # sysfs first: write-all
        napi = state.get("napi")
        if isinstance(napi, dict) and napi and self._napi_layer():
            self.dev.napi_restore(self.napi_attr, {k: int(x) for k, x in napi.items() if isinstance(x, int)})

    def matches(self, state: JsonValue) -> bool:
        live = self.snapshot()
        if not isinstance(state, dict) or not isinstance(live, dict):
            return False
        if live.get("sysfs") != state.get("sysfs"):
            return False
        want, have = state.get("napi"), live.get("napi")
        if isinstance(want, dict) and isinstance(have, dict):
            return all(have.get(k) == v for k, v in want.items() if k in have)
        return True

    # extend_baseline: not needed (the default keeps the baseline). NAPIs created after the first touch
    # start from the device-level value, and restore's sysfs write-all puts every NAPI, old or new,
    # back to the original device-level value; only per-NAPI originals need the napi layer.


class NapiKnob(Knob):
    """One per-NAPI attribute, set to the same value on every NAPI of the device (napi-set)."""

    kind = "netdev-napi"

    def __init__(self, dev: Device, attr: str) -> None:
        self.dev = dev
        self.attr = attr
        self.key = f"{dev.ref.label}:napi:{attr}"
        base = NAPI_ATTRS[attr]
        c = dev.caps()
        if c.present and attr in c.attrs:
            lo, hi = c.attrs[attr]
            base = int_domain(lo, hi, base.unit, base.note)
        self.domain = base

    def availability(self) -> Availability:
        c = self.dev.caps()
        if not c.present:
            return Availability(False, False, c.reason or "netdev napi-set unsupported (kernel before 6.13)")
        if self.attr not in c.attrs:
            return Availability(False, False, f"napi-set has no {self.attr} attribute on this kernel")
        if not self.dev.exists():
            return Availability(False, False, self.dev.gone_reason())
        try:
            vals = self.dev.napi_values(self.attr)
        except HostError as e:
            return Availability(False, False, f"napi-get failed: {e.message}")
        if not vals:
            return Availability(False, False, "no NAPI instances (device down, or veth without GRO/XDP)")
        return Availability(True, True, notices=(f"{len(vals)} NAPI(s)",))

    def read(self) -> KnobValue:
        vals = self.dev.napi_values(self.attr)
        if not vals:
            raise KnobGone(f"{self.key}: no NAPI instances")
        distinct = set(vals.values())
        if len(distinct) == 1:
            return distinct.pop()
        return "mixed:" + ",".join(f"{k}={v}" for k, v in sorted(vals.items()))

    def write(self, value: KnobValue, *, baseline: JsonValue = None) -> None:
        if not isinstance(value, int):
            raise HostError(f"{self.key}: internal: non-integer value {value!r}")
        api = self.dev.netdev()
        try:
            for n in api.napis(self.dev.ifindex()):
                api.napi_set(n.id, {self.attr: value})
        except HostError as e:
            raise gone_or_raise(self.key, e) from e

    def snapshot(self) -> JsonValue:
        napi: dict[str, JsonValue] = dict(self.dev.napi_values(self.attr))
        return {"napi": napi}

    def restore(self, state: JsonValue) -> None:
        napi = state.get("napi") if isinstance(state, dict) else None
        if not isinstance(napi, dict):
            raise HostError(f"{self.key}: bad snapshot {state!r}")
        self.dev.napi_restore(self.attr, {k: int(x) for k, x in napi.items() if isinstance(x, int)})

    def matches(self, state: JsonValue) -> bool:
        live = self.snapshot()
        want = state.get("napi") if isinstance(state, dict) else None
        have = live.get("napi") if isinstance(live, dict) else None
        if not isinstance(want, dict) or not isinstance(have, dict):
            return False
        return all(have.get(k) == v for k, v in want.items() if k in have)

    def extend_baseline(self, state: JsonValue, value: KnobValue | None, now_state: JsonValue,
                        now_value: KnobValue | None) -> tuple[JsonValue, KnobValue | None]:
        return _extend_napi_layer(state, now_state), value

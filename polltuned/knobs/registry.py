"""The explicit knob registry: key -> Knob for this host.

Keys are parsed by :func:`polltuned.knobs.keys.parse_key` (the grammar is documented there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from polltuned.host.fs import Host
from polltuned.host.netdev_genl import FileNetdev, GenlNetdev, NapiSetCaps, NetdevApi
from polltuned.knobs.base import Knob
from polltuned.knobs.coalesce import COALESCE_PARAMS, CoalesceKnob
from polltuned.knobs.irq import IrqAffinityKnob
from polltuned.knobs.keys import KeyKind, parse_key
from polltuned.knobs.modparam import MODULE_PARAMS, ModuleParamKnob
from polltuned.knobs.netdev import NAPI_ATTRS, SYSFS_ATTRS, Device, DeviceRef, NapiKnob, SysfsDevKnob
from polltuned.knobs.sysctl import SYSCTLS, SysctlKnob
from polltuned.knobs.vhost import VHOST_AFFINITY_KEY, VhostAffinityKnob

NetdevFactory = Callable[[Host, DeviceRef, int], NetdevApi]


def default_netdev_factory(host: Host, ref: DeviceRef, ifindex: int) -> NetdevApi:
    if host.is_real:
        return GenlNetdev(ref.netns)
    return FileNetdev(host, ref.netns, {ifindex: ref.name})


class KnobRegistry:
    """Builds Knob objects for keys on one host. Holds no global state; caches the netdev policy."""

    def __init__(self, host: Host, *, app_cpus: Sequence[int] = (),
                 netdev_factory: NetdevFactory | None = None) -> None:
        self.host = host
        self.app_cpus = tuple(app_cpus)
        self.netdev_factory = netdev_factory or default_netdev_factory
        self._caps: NapiSetCaps | None = None
        self._cache: dict[str, Knob] = {}

    def napi_caps(self) -> NapiSetCaps:
        if self._caps is None:
            if self.host.is_real:
                self._caps = GenlNetdev(None).caps()
            else:
                self._caps = FileNetdev(self.host, None, {}).caps()
        return self._caps

    def device(self, ref: DeviceRef) -> Device:
        return Device(self.host, ref, self.netdev_factory, self.napi_caps)

    def get(self, key: str) -> Knob:
        k = self._cache.get(key)
        if k is None:
            k = self._build(key)
            self._cache[key] = k
        return k

    def _build(self, key: str) -> Knob:
        k = parse_key(key)
        if k.kind is KeyKind.SYSCTL:
            return SysctlKnob(self.host, SYSCTLS[key])
        if k.kind is KeyKind.MODULE:
            return ModuleParamKnob(self.host, key)
        if k.kind is KeyKind.VHOST:
            return VhostAffinityKnob(self.host, self.app_cpus)
        assert k.device is not None
        ref = DeviceRef(k.netns, k.devname or "")
        if k.kind is KeyKind.IRQ_AFFINITY:
            return IrqAffinityKnob(self.host, ref.name, self.app_cpus)
        dev = self.device(ref)
        if k.kind is KeyKind.SYSFS:
            return SysfsDevKnob(dev, k.attr)
        if k.kind is KeyKind.NAPI:
            return NapiKnob(dev, k.attr)
        return CoalesceKnob(self.host, ref, k.attr)

    # -- enumeration for `polltuned check` -----------------------------------------------------
    def host_devices(self) -> list[str]:
        """Devices of the host netns worth listing (not lo)."""
        return [d for d in self.host.glob("/sys/class/net", "*") if d != "lo"]

    def catalogue_keys(self, devices: Sequence[str] | None = None) -> list[str]:
        keys = list(SYSCTLS)
        for dev in (self.host_devices() if devices is None else devices):
            keys += [f"{dev}:{a}" for a in SYSFS_ATTRS]
            keys += [f"{dev}:napi:{a}" for a in NAPI_ATTRS]
            if "/" not in dev:
                keys.append(f"{dev}:irq_affinity")
            keys += [f"{dev}:coalesce:{p}" for p in COALESCE_PARAMS]
        keys += list(MODULE_PARAMS)
        keys += [f"module:vhost_net:{p}" for p in self.host.glob("/sys/module/vhost_net/parameters", "*")]
        keys.append(VHOST_AFFINITY_KEY)
        return keys

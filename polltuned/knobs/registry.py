"""The explicit knob registry: key -> Knob for this host.

Keys are parsed by :func:`polltuned.knobs.keys.parse_key` (unknown or malformed keys raise
KnobKeyError, exit 2, with the rule and the closest known key). Key grammar (kernel vocabulary verbatim):

==============================  ==========================================================
``net.core.busy_poll`` ...      sysctls listed in :data:`polltuned.knobs.sysctl.SYSCTLS`
``DEV:napi_defer_hard_irqs``    per-device sysfs (:data:`polltuned.knobs.netdev.SYSFS_ATTRS`)
``DEV:napi:gro-flush-timeout``  per-NAPI netlink (:data:`polltuned.knobs.netdev.NAPI_ATTRS`)
``DEV:irq_affinity``            IRQ affinity strategy (:mod:`polltuned.knobs.irq`)
``DEV:coalesce:rx-usecs``       ethtool coalescing (:data:`polltuned.knobs.coalesce.COALESCE_PARAMS`)
``module:NAME:PARAM``           writable module parameter (:mod:`polltuned.knobs.modparam`)
``vhost:affinity``              CPU affinity of vhost-* worker threads (:mod:`polltuned.knobs.vhost`)
==============================  ==========================================================

DEV is ``eth0`` or ``NETNS/DEV``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from polltuned.host.fs import Host
from polltuned.host.netdev_genl import FileNetdev, GenlNetdev, NapiSetCaps, NetdevApi
from polltuned.knobs.base import Knob
from polltuned.knobs.coalesce import COALESCE_PARAMS, CoalesceKnob
from polltuned.knobs.irq import IrqAffinityKnob
from polltuned.knobs.keys import parse_key
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
        k = parse_key(key)  # KnobKeyError (exit 2) for unknown or malformed keys
        if k.kind == "sysctl":
            return SysctlKnob(self.host, SYSCTLS[k.attr])
        if k.kind == "module-param":
            return ModuleParamKnob(self.host, key)
        if k.kind == "vhost-affinity":
            return VhostAffinityKnob(self.host, self.app_cpus)
        ref = k.device
        assert ref is not None
        if k.kind == "irq-affinity":
            return IrqAffinityKnob(self.host, ref.name, self.app_cpus)
        if k.kind == "ethtool-coalesce":
            return CoalesceKnob(self.host, ref, k.attr)
        dev = self.device(ref)
        if k.kind == "netdev-sysfs":
            return SysfsDevKnob(dev, k.attr)
        return NapiKnob(dev, k.attr)

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

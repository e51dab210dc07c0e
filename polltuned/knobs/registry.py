"""Knobs for this host: key -> Knob, built by the factory its kind declares.

The key grammar, the kinds and their factories are :data:`polltuned.knobs.keys.KINDS`; a key text
handed to :meth:`KnobRegistry.get` or :meth:`KnobRegistry.key` is parsed once per registry (unknown or
malformed keys raise KnobKeyError, exit 2, with the rule and the closest known key).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from polltuned.host.fs import Host
from polltuned.host.netdev_genl import FileNetdev, GenlNetdev, NapiSetCaps, NetdevApi
from polltuned.knobs.base import Knob
from polltuned.knobs.keys import KnobKey, device_catalogue, parse_key
from polltuned.knobs.modparam import MODULE_PARAMS
from polltuned.knobs.netdev import Device, DeviceRef
from polltuned.knobs.sysctl import SYSCTLS
from polltuned.knobs.vhost import VHOST_AFFINITY_KEY

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
        self._keys: dict[str, KnobKey] = {}

    def napi_caps(self) -> NapiSetCaps:
        if self._caps is None:
            if self.host.is_real:
                self._caps = GenlNetdev(None).caps()
            else:
                self._caps = FileNetdev(self.host, None, {}).caps()
        return self._caps

    def device(self, ref: DeviceRef) -> Device:
        return Device(self.host, ref, self.netdev_factory, self.napi_caps)

    def key(self, key: str | KnobKey) -> KnobKey:
        """The parsed key (KnobKeyError for unknown or malformed keys); each text is parsed once."""
        if isinstance(key, KnobKey):
            return key
        k = self._keys.get(key)
        if k is None:
            k = self._keys[key] = parse_key(key)
        return k

    def get(self, key: str | KnobKey) -> Knob:
        text = str(key)
        knob = self._cache.get(text)
        if knob is None:
            k = self.key(key)
            knob = self._cache[text] = k.spec.build(self, k)
        return knob

    # -- enumeration for `polltuned check` -----------------------------------------------------
    def host_devices(self) -> list[str]:
        """Devices of the host netns worth listing (not lo)."""
        return [d for d in self.host.glob("/sys/class/net", "*") if d != "lo"]

    def catalogue_keys(self, devices: Sequence[str] | None = None) -> list[str]:
        keys = list(SYSCTLS)
        for dev in (self.host_devices() if devices is None else devices):
            keys += device_catalogue(dev)
        keys += list(MODULE_PARAMS)
        keys += [f"module:vhost_net:{p}" for p in self.host.glob("/sys/module/vhost_net/parameters", "*")]
        keys.append(VHOST_AFFINITY_KEY)
        return keys

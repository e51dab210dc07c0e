"""Knob keys, parsed once into a typed :class:`KnobKey`, and when each knob takes effect.

Key grammar (kernel vocabulary verbatim):

==============================  ==========================================================
``net.core.busy_poll`` ...      sysctls listed in :data:`polltuned.knobs.sysctl.SYSCTLS`
``DEV:napi_defer_hard_irqs``    per-device sysfs (:data:`polltuned.knobs.netdev.SYSFS_ATTRS`)
``DEV:napi:gro-flush-timeout``  per-NAPI netlink (:data:`polltuned.knobs.netdev.NAPI_ATTRS`)
``DEV:irq_affinity``            IRQ affinity strategy (:mod:`polltuned.knobs.irq`)
``DEV:coalesce:rx-usecs``       ethtool coalescing (:data:`polltuned.knobs.coalesce.COALESCE_PARAMS`)
``module:NAME:PARAM``           writable module parameter (:mod:`polltuned.knobs.modparam`)
``vhost:affinity``              CPU affinity of vhost-* worker threads (:mod:`polltuned.knobs.vhost`)
==============================  ==========================================================

DEV is ``eth0`` or ``NETNS/DEV``. Every other module takes a ``KnobKey`` (or asks
:func:`parse_key`), never splits a key string itself.

When a knob acts (:class:`Effect`) decides what a measurement window can see of it:
``net.core.busy_read`` is copied into a socket when the socket is created (knobs.md 1.5), so a
probe that measures long-lived sockets (sock_diag RTT of established connections, a server's
Prometheus histogram, a command against a server that is not restarted) cannot see it at all;
``net.core.busy_poll`` is read at every poll/select/epoll call; per-device and per-NAPI values act at
the next NAPI cycle; IRQ affinity acts once ``effective_affinity`` has caught up.
"""

from __future__ import annotations

import difflib
import enum
import functools
from dataclasses import dataclass

from polltuned.errors import UsageError


class KeyKind(enum.Enum):
    SYSCTL = "sysctl"
    SYSFS = "sysfs"
    NAPI = "napi"
    IRQ_AFFINITY = "irq-affinity"
    COALESCE = "coalesce"
    MODULE = "module"
    VHOST = "vhost"


class Effect(enum.Enum):
    """When a written value starts to act."""

    NEW_SOCKETS = "on sockets created afterwards"
    IMMEDIATE = "immediately"
    NEXT_NAPI_CYCLE = "at the next NAPI cycle"
    AFTER_AFFINITY = "once effective_affinity catches up"


@dataclass(frozen=True)
class KnobKey:
    raw: str
    kind: KeyKind
    attr: str                  # sysctl name, sysfs/NAPI attribute, coalesce/module parameter
    device: str | None = None  # "eth0" or "NETNS/DEV" for device knobs
    module: str | None = None  # module name for module parameters

    @property
    def suffix(self) -> str:
        """The device-independent name: ``gro_flush_timeout``, ``napi:irq-suspend-timeout``,
        ``irq_affinity``, ``net.core.busy_read``, ``module:haltpoll:guest_halt_poll_ns``."""
        if self.device is None:
            return self.raw
        return self.raw[len(self.device) + 1:]

    @property
    def netns(self) -> str | None:
        if self.device is None or "/" not in self.device:
            return None
        return self.device.split("/", 1)[0]

    @property
    def devname(self) -> str | None:
        if self.device is None:
            return None
        return self.device.rsplit("/", 1)[-1]

    @property
    def effect(self) -> Effect:
        if self.kind is KeyKind.SYSCTL and self.attr == "net.core.busy_read":
            return Effect.NEW_SOCKETS
        if self.kind in (KeyKind.SYSFS, KeyKind.NAPI):
            return Effect.NEXT_NAPI_CYCLE
        if self.kind is KeyKind.IRQ_AFFINITY:
            return Effect.AFTER_AFFINITY
        return Effect.IMMEDIATE


@functools.cache
def _catalogues() -> tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]:
    from polltuned.knobs.coalesce import COALESCE_PARAMS
    from polltuned.knobs.netdev import NAPI_ATTRS, SYSFS_ATTRS
    from polltuned.knobs.sysctl import SYSCTLS

    return frozenset(SYSCTLS), frozenset(SYSFS_ATTRS), frozenset(NAPI_ATTRS), frozenset(COALESCE_PARAMS)


def _valid_device(text: str) -> bool:
    if not text or text.count("/") > 1:
        return False
    ns, sep, name = text.rpartition("/")
    return bool(name) and (not sep or bool(ns))


def _unknown(key: str, choices: list[str], rule: str) -> UsageError:
    near = difflib.get_close_matches(key, choices, n=1, cutoff=0.75)
    hint = f"did you mean {near[0]!r}?" if near else "see `polltuned check` for the keys of this host"
    return UsageError(f"{key}: unknown knob ({rule})", hint=hint, code="knob-unknown")


def parse_key(key: str) -> KnobKey:
    """Parse and validate a knob key against the catalogue. Raises UsageError(knob-unknown)."""
    sysctls, sysfs, napi, coalesce = _catalogues()
    if key in sysctls:
        return KnobKey(key, KeyKind.SYSCTL, key)
    if key == "vhost:affinity":
        return KnobKey(key, KeyKind.VHOST, "affinity")
    if key.startswith("module:"):
        parts = key.split(":")
        if len(parts) != 3 or not parts[1] or not parts[2] or "/" in key:
            raise UsageError(f"{key}: module parameter keys are module:NAME:PARAM", code="knob-unknown")
        return KnobKey(key, KeyKind.MODULE, parts[2], module=parts[1])
    dev, sep, rest = key.partition(":")
    if not sep:
        rule = "a sysctl polltuned manages" if "." in key else "no DEV: prefix and not a sysctl"
        raise _unknown(key, sorted(sysctls), rule)
    if not _valid_device(dev):
        raise UsageError(f"{key}: {dev!r} is not a device (DEV or NETNS/DEV)", code="knob-unknown")
    suffixes = sorted(sysfs | {f"napi:{a}" for a in napi} | {f"coalesce:{p}" for p in coalesce} | {"irq_affinity"})
    if rest in sysfs:
        return KnobKey(key, KeyKind.SYSFS, rest, device=dev)
    if rest == "irq_affinity":
        if "/" in dev:
            raise UsageError(f"{key}: IRQ affinity applies to physical devices of the host netns",
                             code="knob-unknown")
        return KnobKey(key, KeyKind.IRQ_AFFINITY, rest, device=dev)
    sub, _, attr = rest.partition(":")
    if sub == "napi" and attr in napi:
        return KnobKey(key, KeyKind.NAPI, attr, device=dev)
    if sub == "coalesce" and attr in coalesce:
        return KnobKey(key, KeyKind.COALESCE, attr, device=dev)
    near = difflib.get_close_matches(rest, suffixes, n=1, cutoff=0.75)
    hint = f"did you mean '{dev}:{near[0]}'?" if near else "see `polltuned check` for the keys of this host"
    raise UsageError(f"{key}: unknown device knob {rest!r}", hint=hint, code="knob-unknown")


def key_suffix(key: str) -> str:
    """Device-independent name of a key (a malformed key is its own suffix)."""
    try:
        return parse_key(key).suffix
    except UsageError:
        return key

"""Knob keys: parsed once, here, into a typed :class:`KnobKey` (DESIGN.md house rule 13).

Grammar (kernel vocabulary verbatim):

==============================  ==========================================================
``net.core.busy_poll`` ...      a sysctl of :data:`polltuned.knobs.sysctl.SYSCTLS`
``DEV:napi_defer_hard_irqs``    per-device sysfs (:data:`polltuned.knobs.netdev.SYSFS_ATTRS`)
``DEV:napi:gro-flush-timeout``  per-NAPI netlink (:data:`polltuned.knobs.netdev.NAPI_ATTRS`)
``DEV:irq_affinity``            IRQ affinity strategy (host-netns devices only)
``DEV:coalesce:rx-usecs``       ethtool coalescing (:data:`polltuned.knobs.coalesce.COALESCE_PARAMS`)
``module:NAME:PARAM``           a module parameter; for the modules polltuned knows (kvm, haltpoll)
                                PARAM must be one it knows, other modules are accepted generically
``vhost:affinity``              CPU affinity of the vhost-* worker threads
==============================  ==========================================================

DEV is an interface name (1-15 characters, no ``/``, ``:`` or white space) or ``NETNS/DEV``; in a
policy file it may be the placeholder ``{nic}``. A key that breaks a rule raises
:class:`KnobKeyError`, which names the rule and, when a catalogue key is close, suggests it
("did you mean net.core.busy_poll?"). Unknown and malformed keys are the same error (exit 2).

Each key also says when a written value acts (:class:`Effect`): the engine drops a knob its probe
cannot see (``net.core.busy_read`` under a probe of long-lived sockets).
"""

from __future__ import annotations

import difflib
import enum
import re
from dataclasses import dataclass
from typing import Literal

from polltuned.errors import UsageError
from polltuned.host.netns import valid_netns_name
from polltuned.knobs.coalesce import COALESCE_PARAMS
from polltuned.knobs.modparam import MODULE_PARAMS
from polltuned.knobs.netdev import NAPI_ATTRS, SYSFS_ATTRS, DeviceRef
from polltuned.knobs.sysctl import SYSCTLS
from polltuned.knobs.vhost import VHOST_AFFINITY_KEY

KeyKind = Literal["sysctl", "netdev-sysfs", "netdev-napi", "irq-affinity", "ethtool-coalesce", "module-param",
                  "vhost-affinity"]


class Effect(enum.Enum):
    """When a written value starts to act (what a measurement window can see of it)."""

    NEW_SOCKETS = "on sockets created afterwards"
    IMMEDIATE = "immediately"
    NEXT_NAPI_CYCLE = "at the next NAPI cycle"
    AFTER_AFFINITY = "once effective_affinity catches up"

NIC_PLACEHOLDER = "{nic}"
_IFNAME_RE = re.compile(r"^[^/:\s]{1,15}$")
_MODPART_RE = re.compile(r"^[A-Za-z0-9_]+$")

#: modules whose parameters polltuned knows (a typo in their PARAM is an error, not a generic knob)
KNOWN_MODULES: frozenset[str] = frozenset(k.split(":")[1] for k in MODULE_PARAMS)


@dataclass(frozen=True)
class KnobKey:
    """A parsed knob key. ``attr``: the sysctl key, sysfs attribute, per-NAPI attribute, coalesce
    parameter or module parameter; ``device``: the device for device-scoped kinds; ``module``: the
    module name of a module parameter."""

    text: str
    kind: KeyKind
    attr: str
    device: DeviceRef | None = None
    module: str | None = None

    def __str__(self) -> str:
        return self.text

    @property
    def suffix(self) -> str:
        """The device-independent name: ``gro_flush_timeout``, ``napi:irq-suspend-timeout``,
        ``irq_affinity``; sysctl, module and vhost keys are their own suffix."""
        if self.device is None:
            return self.text
        return self.text.split(":", 1)[1]

    @property
    def effect(self) -> Effect:
        """``net.core.busy_read`` is copied into a socket when the socket is created (knobs.md
        1.5), so a probe that measures long-lived sockets cannot see it; ``net.core.busy_poll`` is
        read at every poll/select/epoll call; per-device and per-NAPI values act at the next NAPI
        cycle; IRQ affinity once ``effective_affinity`` has caught up."""
        if self.kind == "sysctl" and self.attr == "net.core.busy_read":
            return Effect.NEW_SOCKETS
        if self.kind in ("netdev-sysfs", "netdev-napi"):
            return Effect.NEXT_NAPI_CYCLE
        if self.kind == "irq-affinity":
            return Effect.AFTER_AFFINITY
        return Effect.IMMEDIATE


class KnobKeyError(UsageError):
    """A knob key that is not in the catalogue or breaks the grammar."""

    code = "knob-unknown"

    def __init__(self, key: str, rule: str, suggestion: str | None = None) -> None:
        msg = f"{key}: {rule}" + (f"; did you mean {suggestion}?" if suggestion else "")
        super().__init__(msg)
        self.key = key
        self.rule = rule
        self.suggestion = suggestion


def _device_suffixes() -> list[str]:
    return ([*SYSFS_ATTRS, "irq_affinity"] + [f"napi:{a}" for a in NAPI_ATTRS]
            + [f"coalesce:{p}" for p in COALESCE_PARAMS])


def catalogue_patterns(device: str = NIC_PLACEHOLDER) -> list[str]:
    """Every key shape polltuned knows, device-scoped ones on ``device`` (for suggestions, docs)."""
    return [*SYSCTLS, *(f"{device}:{s}" for s in _device_suffixes()), *MODULE_PARAMS, VHOST_AFFINITY_KEY]


def suggest(key: str) -> str | None:
    """The closest catalogue key to ``key`` (None when nothing is close)."""
    dev, sep, _ = key.partition(":")
    cands: list[str] = list(SYSCTLS) + list(MODULE_PARAMS) + [VHOST_AFFINITY_KEY]
    if sep and dev not in ("module", "vhost"):
        cands += [f"{dev}:{s}" for s in _device_suffixes()]
    else:
        cands += [f"{NIC_PLACEHOLDER}:{s}" for s in _device_suffixes()]
    got = difflib.get_close_matches(key, cands, n=1, cutoff=0.6)
    if got:
        return got[0]
    # a bare device attribute (``gro_flush_timeout``) or sysctl leaf (``busy_poll``)
    leaf = [c for c in cands if c.endswith(":" + key) or c.endswith("." + key)]
    return leaf[0] if len(leaf) == 1 else None


def _parse_device(key: str, text: str, placeholder_ok: bool) -> DeviceRef:
    if text == NIC_PLACEHOLDER:
        if placeholder_ok:
            return DeviceRef(None, NIC_PLACEHOLDER)
        raise KnobKeyError(key, "the {nic} placeholder is not resolved (set nic in the policy or pass --nic)")
    ref = DeviceRef.parse(text)
    if ref is None or not _IFNAME_RE.match(ref.name) or (ref.netns is not None and not valid_netns_name(ref.netns)):
        raise KnobKeyError(key, f"device {text!r} is not an interface name (1-15 characters, no '/', ':' or "
                                "spaces) or NETNS/DEV")
    return ref


def parse_key(key: str, *, placeholder_ok: bool = False) -> KnobKey:
    """Parse ``key`` into a KnobKey, or raise KnobKeyError naming the rule it breaks.

    ``placeholder_ok``: accept ``{nic}`` as the device (policy files before --nic is applied)."""
    if not isinstance(key, str) or not key or key != key.strip():
        raise KnobKeyError(repr(key), "a knob key is a non-empty string without surrounding spaces")
    if ":" not in key:
        if key in SYSCTLS:
            return KnobKey(key, "sysctl", key)
        raise KnobKeyError(key, "unknown sysctl: polltuned tunes " + ", ".join(SYSCTLS), suggest(key))
    if key == VHOST_AFFINITY_KEY:
        return KnobKey(key, "vhost-affinity", "affinity")
    head, _, rest = key.partition(":")
    if head == "module":
        parts = key.split(":")
        if len(parts) != 3 or not all(_MODPART_RE.match(p) for p in parts[1:]):
            raise KnobKeyError(key, "module parameter keys are module:NAME:PARAM (letters, digits, '_')",
                               suggest(key))
        if parts[1] in KNOWN_MODULES and key not in MODULE_PARAMS:
            known = ", ".join(k.split(":")[2] for k in MODULE_PARAMS if k.split(":")[1] == parts[1])
            raise KnobKeyError(key, f"module {parts[1]} has no tunable parameter {parts[2]!r} "
                                    f"(polltuned knows: {known})", suggest(key))
        near = difflib.get_close_matches(parts[1], sorted(KNOWN_MODULES), n=1, cutoff=0.6)
        if parts[1] not in KNOWN_MODULES and near:
            raise KnobKeyError(key, f"unknown module {parts[1]!r}: too close to a module polltuned knows "
                                    f"({', '.join(sorted(KNOWN_MODULES))}) to be taken for another one",
                               f"module:{near[0]}:{parts[2]}")
        return KnobKey(key, "module-param", parts[2], module=parts[1])
    if head == "vhost":
        raise KnobKeyError(key, f"the only vhost key is {VHOST_AFFINITY_KEY}", VHOST_AFFINITY_KEY)
    dev = _parse_device(key, head, placeholder_ok)
    if rest in SYSFS_ATTRS:
        return KnobKey(key, "netdev-sysfs", rest, dev)
    if rest == "irq_affinity":
        if dev.netns is not None:
            raise KnobKeyError(key, "IRQ affinity applies to physical devices of the host netns (no NETNS/)")
        return KnobKey(key, "irq-affinity", rest, dev)
    sub, _, attr = rest.partition(":")
    if sub == "napi" and attr in NAPI_ATTRS:
        return KnobKey(key, "netdev-napi", attr, dev)
    if sub == "coalesce" and attr in COALESCE_PARAMS:
        return KnobKey(key, "ethtool-coalesce", attr, dev)
    rule = ("unknown device knob: DEV: is followed by one of " + ", ".join(_device_suffixes()))
    raise KnobKeyError(key, rule, suggest(key))


def key_suffix(key: str) -> str:
    """Device-independent name of a key (a key that does not parse is its own suffix)."""
    try:
        return parse_key(key, placeholder_ok=True).suffix
    except UsageError:
        return key

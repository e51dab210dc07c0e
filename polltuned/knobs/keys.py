"""Knob keys: parsed once, here, into a typed :class:`KnobKey` (DESIGN.md house rule 13).

Every kind of knob declares itself in one :class:`KeyKind` descriptor of the explicit registry
:data:`KINDS`: its grammar, its scope, when a written value acts (:class:`Effect`), the Knob that
serves it (its factory) and its catalogue entry. Grammar (kernel vocabulary verbatim):

==============================  ==========================================================
``net.core.busy_poll`` ...      a sysctl of :data:`polltuned.knobs.sysctl.SYSCTLS`
``DEV:napi_defer_hard_irqs``    per-device sysfs (:data:`polltuned.knobs.netdev.SYSFS_ATTRS`)
``DEV:irq_affinity``            IRQ affinity strategy (host-netns devices only)
``DEV:napi:gro-flush-timeout``  per-NAPI netlink (:data:`polltuned.knobs.netdev.NAPI_ATTRS`)
``DEV:coalesce:rx-usecs``       ethtool coalescing (:data:`polltuned.knobs.coalesce.COALESCE_PARAMS`)
``module:NAME:PARAM``           a module parameter; for the modules polltuned knows (kvm, haltpoll)
                                PARAM must be one it knows, other modules are accepted generically
``vhost:affinity``              CPU affinity of the vhost-* worker threads
==============================  ==========================================================

DEV is an interface name (1-15 characters, no ``/``, ``:`` or white space) or ``NETNS/DEV``; in a
policy file it may be the placeholder ``{nic}``. A key that breaks a rule raises
:class:`KnobKeyError`, which names the rule and, when a catalogue key is close, suggests it
("did you mean net.core.busy_poll?"). Unknown and malformed keys are the same error (exit 2).

Outside knobs/ nobody parses a key: the policy parses its keys at load (``Policy.knob_keys``), the
registry those it is handed (``KnobRegistry.key``); the string form stays the key's only form on
disk (policies, journal, status). "Which device, and is it in a namespace?" is answered by
:attr:`DeviceRef.host_name` alone (:attr:`KnobKey.host_device`, :func:`host_device`).
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from polltuned.errors import UsageError
from polltuned.host.fs import Host
from polltuned.host.netns import valid_netns_name
from polltuned.knobs.base import Knob
from polltuned.knobs.coalesce import COALESCE_PARAMS, CoalesceKnob
from polltuned.knobs.irq import IrqAffinityKnob
from polltuned.knobs.modparam import MODULE_PARAMS, ModuleParamKnob
from polltuned.knobs.netdev import NAPI_ATTRS, SYSFS_ATTRS, Device, DeviceRef, NapiKnob, SysfsDevKnob
from polltuned.knobs.sysctl import SYSCTLS, SysctlKnob, sysctl_path
from polltuned.knobs.vhost import VHOST_AFFINITY_KEY, VhostAffinityKnob

KeyKindName = Literal["sysctl", "netdev-sysfs", "netdev-napi", "irq-affinity", "ethtool-coalesce", "module-param",
                      "vhost-affinity"]
#: host: one value for the host; device: one per device, in any netns; host-device: one per device of
#: the host netns only; module: one per loaded module
Scope = Literal["host", "device", "host-device", "module"]


class Effect(enum.Enum):
    """When a written value starts to act (what a measurement window can see of it)."""

    NEW_SOCKETS = "on sockets created afterwards"
    IMMEDIATE = "immediately"
    NEXT_NAPI_CYCLE = "at the next NAPI cycle"
    AFTER_AFFINITY = "once effective_affinity catches up"


NIC_PLACEHOLDER = "{nic}"
_IFNAME_RE = re.compile(r"^[^/:\s]{1,15}$")
_MODPART_RE = re.compile(r"^[A-Za-z0-9_]+$")


@dataclass(frozen=True)
class KnobKey:
    """A parsed knob key. ``attr``: the sysctl key, sysfs attribute, per-NAPI attribute, coalesce
    parameter or module parameter; ``device``: the device for device-scoped kinds; ``module``: the
    module name of a module parameter."""

    text: str
    kind: KeyKindName
    attr: str
    device: DeviceRef | None = None
    module: str | None = None

    def __str__(self) -> str:
        return self.text

    @property
    def spec(self) -> KeyKind:
        """The descriptor of this key's kind."""
        return KINDS[self.kind]

    @property
    def scope(self) -> Scope:
        return self.spec.scope

    @property
    def suffix(self) -> str:
        """The device-independent name: ``gro_flush_timeout``, ``napi:irq-suspend-timeout``,
        ``irq_affinity``; sysctl, module and vhost keys are their own suffix."""
        if self.device is None:
            return self.text
        return self.text[len(self.device.label) + 1:]

    @property
    def effect(self) -> Effect:
        """When a written value acts: see each kind's descriptor (``net.core.busy_read`` only on
        sockets created afterwards, knobs.md 1.5)."""
        return self.spec.effect(self.attr)

    @property
    def host_device(self) -> str | None:
        """The host-netns device this key lives on (``eth0`` for ``eth0:napi:defer-hard-irqs``), or
        None: no device (sysctls, modules, vhost), a device inside a named netns, the placeholder."""
        return None if self.device is None else self.device.host_name

    @property
    def file(self) -> str | None:
        """The plain kernel file that holds this knob's value (what a fake tree must contain), or
        None for knobs behind netlink, ioctl or strategies."""
        return self.spec.file(self)


class KnobKeyError(UsageError):
    """A knob key that is not in the catalogue or breaks the grammar."""

    code = "knob-unknown"

    def __init__(self, key: str, rule: str, suggestion: str | None = None) -> None:
        msg = f"{key}: {rule}" + (f"; did you mean {suggestion}?" if suggestion else "")
        super().__init__(msg)
        self.key = key
        self.rule = rule
        self.suggestion = suggestion


class KnobContext(Protocol):
    """What a kind's factory needs to build its Knob (:class:`polltuned.knobs.registry.KnobRegistry`)."""

    @property
    def host(self) -> Host: ...

    @property
    def app_cpus(self) -> tuple[int, ...]: ...

    def device(self, ref: DeviceRef) -> Device: ...


#: grammar of one kind: (whole key, its device or None, the text after ``HEAD:``) -> the key, None when
#: the text is not this kind's, KnobKeyError when it is this kind's but breaks a rule
Grammar = Callable[[str, DeviceRef | None, str], "KnobKey | None"]


@dataclass(frozen=True)
class KeyKind:
    """One kind of knob key. ``head``: what comes before the first ``:`` (``DEV`` for the
    device-scoped kinds, ``""`` for a key without ``:``); ``shape``: the grammar for humans;
    ``catalogue``: the keys (device kinds: the suffixes after ``DEV:``) polltuned knows;
    ``build``: the Knob for a key on one host; ``file``: where a plain-file knob lives."""

    name: KeyKindName
    head: str | None
    shape: str
    scope: Scope
    parse: Grammar
    effect: Callable[[str], Effect]
    catalogue: Callable[[], list[str]]
    build: Callable[[KnobContext, KnobKey], Knob]
    file: Callable[[KnobKey], str | None] = lambda _k: None


# -- the grammars --------------------------------------------------------------------------------
def _sysctl(key: str, _dev: DeviceRef | None, _rest: str) -> KnobKey:
    if key in SYSCTLS:
        return KnobKey(key, "sysctl", key)
    raise KnobKeyError(key, "unknown sysctl: polltuned tunes " + ", ".join(SYSCTLS), suggest(key))


def _vhost(key: str, _dev: DeviceRef | None, _rest: str) -> KnobKey:
    if key == VHOST_AFFINITY_KEY:
        return KnobKey(key, "vhost-affinity", "affinity")
    raise KnobKeyError(key, f"the only vhost key is {VHOST_AFFINITY_KEY}", VHOST_AFFINITY_KEY)


def _known_modules() -> dict[str, list[str]]:
    """Modules whose parameters polltuned knows -> those parameters (a typo in one of their
    parameters is an error, not a generic knob)."""
    out: dict[str, list[str]] = {}
    for k in MODULE_PARAMS:
        _, mod, param = k.split(":")
        out.setdefault(mod, []).append(param)
    return out


def _module(key: str, _dev: DeviceRef | None, rest: str) -> KnobKey:
    mod, sep, param = rest.partition(":")
    if not sep or not _MODPART_RE.match(mod) or not _MODPART_RE.match(param):
        raise KnobKeyError(key, "module parameter keys are module:NAME:PARAM (letters, digits, '_')", suggest(key))
    known = _known_modules()
    if mod in known and param not in known[mod]:
        raise KnobKeyError(key, f"module {mod} has no tunable parameter {param!r} "
                                f"(polltuned knows: {', '.join(known[mod])})", suggest(key))
    near = difflib.get_close_matches(mod, sorted(known), n=1, cutoff=0.6)
    if mod not in known and near:
        raise KnobKeyError(key, f"unknown module {mod!r}: too close to a module polltuned knows "
                                f"({', '.join(sorted(known))}) to be taken for another one",
                           f"module:{near[0]}:{param}")
    return KnobKey(key, "module-param", param, module=mod)


def _sysfs(key: str, dev: DeviceRef | None, rest: str) -> KnobKey | None:
    return KnobKey(key, "netdev-sysfs", rest, dev) if rest in SYSFS_ATTRS else None


def _irq(key: str, dev: DeviceRef | None, rest: str) -> KnobKey | None:
    if rest != "irq_affinity":
        return None
    if dev is not None and dev.netns is not None:
        raise KnobKeyError(key, "IRQ affinity applies to physical devices of the host netns (no NETNS/)")
    return KnobKey(key, "irq-affinity", rest, dev)


def _sub(prefix: str, names: Iterable[str], kind: KeyKindName) -> Grammar:
    def parse(key: str, dev: DeviceRef | None, rest: str) -> KnobKey | None:
        sub, _, attr = rest.partition(":")
        return KnobKey(key, kind, attr, dev) if sub == prefix and attr in names else None
    return parse


# -- the factories -------------------------------------------------------------------------------
def _dev(key: KnobKey) -> DeviceRef:
    assert key.device is not None, key.text  # the device kinds' grammars always set it
    return key.device


def _always(effect: Effect) -> Callable[[str], Effect]:
    return lambda _attr: effect


def _sysctl_effect(attr: str) -> Effect:
    """``net.core.busy_read`` is copied into a socket when the socket is created (knobs.md 1.5),
    so a probe that measures long-lived sockets cannot see it; ``net.core.busy_poll`` is read at
    every poll/select/epoll call."""
    return Effect.NEW_SOCKETS if attr == "net.core.busy_read" else Effect.IMMEDIATE


#: The explicit registry of key kinds, in the order a device key's suffix is tried (and listed).
KINDS: dict[KeyKindName, KeyKind] = {
    "sysctl": KeyKind(
        "sysctl", None, "net.core.busy_poll", "host", _sysctl, _sysctl_effect, lambda: list(SYSCTLS),
        lambda ctx, k: SysctlKnob(ctx.host, SYSCTLS[k.attr]), lambda k: sysctl_path(k.attr)),
    "netdev-sysfs": KeyKind(
        "netdev-sysfs", "DEV", "DEV:ATTR", "device", _sysfs, _always(Effect.NEXT_NAPI_CYCLE),
        lambda: list(SYSFS_ATTRS), lambda ctx, k: SysfsDevKnob(ctx.device(_dev(k)), k.attr),
        lambda k: f"/sys/class/net/{_dev(k).label}/{k.attr}"),
    "irq-affinity": KeyKind(
        "irq-affinity", "DEV", "DEV:irq_affinity", "host-device", _irq, _always(Effect.AFTER_AFFINITY),
        lambda: ["irq_affinity"], lambda ctx, k: IrqAffinityKnob(ctx.host, _dev(k).name, ctx.app_cpus)),
    "netdev-napi": KeyKind(
        "netdev-napi", "DEV", "DEV:napi:ATTR", "device", _sub("napi", NAPI_ATTRS, "netdev-napi"),
        _always(Effect.NEXT_NAPI_CYCLE), lambda: [f"napi:{a}" for a in NAPI_ATTRS],
        lambda ctx, k: NapiKnob(ctx.device(_dev(k)), k.attr)),
    "ethtool-coalesce": KeyKind(
        "ethtool-coalesce", "DEV", "DEV:coalesce:PARAM", "device",
        _sub("coalesce", COALESCE_PARAMS, "ethtool-coalesce"),
        _always(Effect.IMMEDIATE), lambda: [f"coalesce:{p}" for p in COALESCE_PARAMS],
        lambda ctx, k: CoalesceKnob(ctx.host, _dev(k), k.attr)),
    "module-param": KeyKind(
        "module-param", "module", "module:NAME:PARAM", "module", _module, _always(Effect.IMMEDIATE),
        lambda: list(MODULE_PARAMS), lambda ctx, k: ModuleParamKnob(ctx.host, k.text, str(k.module), k.attr),
        lambda k: f"/sys/module/{k.module}/parameters/{k.attr}"),
    "vhost-affinity": KeyKind(
        "vhost-affinity", "vhost", VHOST_AFFINITY_KEY, "host", _vhost, _always(Effect.IMMEDIATE),
        lambda: [VHOST_AFFINITY_KEY], lambda ctx, _k: VhostAffinityKnob(ctx.host, ctx.app_cpus)),
}


def _device_kinds() -> list[KeyKind]:
    return [s for s in KINDS.values() if s.head == "DEV"]


def _device_suffixes() -> list[str]:
    return [s for kind in _device_kinds() for s in kind.catalogue()]


def _host_keys() -> list[str]:
    """Catalogue keys that name no device (sysctls, module parameters, vhost)."""
    return [c for kind in KINDS.values() if kind.head != "DEV" for c in kind.catalogue()]


def catalogue_patterns(device: str = NIC_PLACEHOLDER) -> list[str]:
    """Every key shape polltuned knows, device-scoped ones on ``device`` (for suggestions, docs)."""
    return [*SYSCTLS, *(f"{device}:{s}" for s in _device_suffixes()),
            *(c for c in _host_keys() if c not in SYSCTLS)]


def device_catalogue(device: str) -> list[str]:
    """The keys polltuned knows on one device (``NETNS/DEV`` devices have no IRQ affinity)."""
    ref = DeviceRef.parse(device)
    in_netns = ref is not None and ref.netns is not None
    return [f"{device}:{s}" for kind in _device_kinds() if not (in_netns and kind.scope == "host-device")
            for s in kind.catalogue()]


def suggest(key: str) -> str | None:
    """The closest catalogue key to ``key`` (None when nothing is close)."""
    dev, sep, _ = key.partition(":")
    cands: list[str] = _host_keys()
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
    head, sep, rest = key.partition(":")
    for kind in KINDS.values():
        if kind.head == (head if sep else None):
            got = kind.parse(key, None, rest)
            assert got is not None  # a kind with a head of its own refuses what is not its key
            return got
    dev = _parse_device(key, head, placeholder_ok)
    for kind in _device_kinds():
        found = kind.parse(key, dev, rest)
        if found is not None:
            return found
    rule = ("unknown device knob: DEV: is followed by one of " + ", ".join(_device_suffixes()))
    raise KnobKeyError(key, rule, suggest(key))


def parse_keys(keys: Iterable[str], *, placeholder_ok: bool = False) -> dict[str, KnobKey]:
    """key text -> KnobKey for every key (the first bad key raises KnobKeyError)."""
    return {k: parse_key(k, placeholder_ok=placeholder_ok) for k in keys}


def key_problems(keys: Sequence[str], *, placeholder_ok: bool = True) -> list[tuple[str, KnobKeyError]]:
    """(key, its error) for every key that does not parse, in order (the policy loader reports them all)."""
    out: list[tuple[str, KnobKeyError]] = []
    for key in keys:
        try:
            parse_key(key, placeholder_ok=placeholder_ok)
        except KnobKeyError as e:
            out.append((key, e))
    return out


def key_suffix(key: str) -> str:
    """Device-independent name of a key text (a key that does not parse is its own suffix): for
    configurations that arrive as text (scenario files, recorded windows)."""
    try:
        return parse_key(key, placeholder_ok=True).suffix
    except UsageError:
        return key


def knob_file(key: str) -> str | None:
    """The plain kernel file of a key text (:attr:`KnobKey.file`); None for a key that does not
    parse or has no plain file."""
    try:
        return parse_key(key).file
    except UsageError:
        return None


def host_device(text: str | None) -> str | None:
    """The host-netns device name of a device text (a policy's ``nic``): None for no device, the
    ``{nic}`` placeholder, a malformed name or a device inside a named netns (``ns/veth``)."""
    if not text or text == NIC_PLACEHOLDER:
        return None
    ref = DeviceRef.parse(text)
    return None if ref is None else ref.host_name

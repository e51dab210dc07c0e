"""Writable module parameters: ``module:NAME:PARAM`` -> /sys/module/NAME/parameters/PARAM.

Used for the virtualisation spin knobs a host daemon can actually change (knobs.md 3.8):
``module:kvm:halt_poll_ns`` (+ ``_grow``, ``_grow_start``, ``_shrink``) on a KVM host and
``module:haltpoll:guest_halt_poll_ns`` (+ grow/shrink) inside a guest using cpuidle-haltpoll.
Upstream vhost_net has no writable spin parameter; ``module:vhost_net:PARAM`` is accepted
generically and reported as absent/read-only when it is not there.

Known parameters get their kernel type's range; an unknown parameter gets a ``uint`` range
(0..U32_MAX) for numbers or Y/N for booleans, decided from its current text.
"""

from __future__ import annotations

from polltuned.errors import HostError
from polltuned.host.fs import Host
from polltuned.knobs.base import (
    U32_MAX,
    Availability,
    Domain,
    JsonValue,
    Knob,
    choice_domain,
    gone_or_raise,
    int_domain,
)
from polltuned.records import KnobValue

#: module:NAME:PARAM -> kernel domain (types from the module_param() declarations).
MODULE_PARAMS: dict[str, Domain] = {
    "module:kvm:halt_poll_ns": int_domain(0, U32_MAX, "ns", "ignored by VMs whose VMM set KVM_CAP_HALT_POLL"),
    "module:kvm:halt_poll_ns_grow": int_domain(0, U32_MAX, "factor"),
    "module:kvm:halt_poll_ns_grow_start": int_domain(0, U32_MAX, "ns"),
    "module:kvm:halt_poll_ns_shrink": int_domain(0, U32_MAX, "divisor"),
    "module:haltpoll:guest_halt_poll_ns": int_domain(0, U32_MAX, "ns"),
    "module:haltpoll:guest_halt_poll_grow": int_domain(0, U32_MAX, "factor"),
    "module:haltpoll:guest_halt_poll_grow_start": int_domain(0, U32_MAX, "ns"),
    "module:haltpoll:guest_halt_poll_shrink": int_domain(0, U32_MAX, "divisor"),
    "module:haltpoll:guest_halt_poll_allow_shrink": choice_domain(("Y", "N")),
}


def parse_param_text(text: str) -> KnobValue:
    """Module parameter file: ``param_get_*`` prints ``%u\\n``/``%d\\n`` for numbers, ``Y``/``N``
    for bool, raw text for charp. Integers are returned as int, anything else as the stripped text."""
    t = text.strip()
    if t.lstrip("-").isdigit():
        return int(t)
    return t


class ModuleParamKnob(Knob):
    kind = "module-param"

    def __init__(self, host: Host, key: str, module: str, param: str) -> None:
        """``key`` is ``module:MODULE:PARAM``, parsed by its descriptor (polltuned.knobs.keys)."""
        self.host = host
        self.key = key
        self.module, self.param = module, param
        self.path = f"/sys/module/{self.module}/parameters/{self.param}"
        known = MODULE_PARAMS.get(key)
        if known is not None:
            self.domain = known
        else:
            cur: KnobValue = 0
            try:
                cur = parse_param_text(host.read_text(self.path))
            except HostError:
                pass
            self.domain = choice_domain(("Y", "N")) if cur in ("Y", "N") else int_domain(0, U32_MAX)

    def availability(self) -> Availability:
        if not self.host.exists(f"/sys/module/{self.module}"):
            return Availability(False, False, f"module {self.module} not loaded (no /sys/module/{self.module})")
        if not self.host.exists(self.path):
            return Availability(False, False, f"module {self.module} has no parameter {self.param}")
        if not self.host.is_writable(self.path):
            return Availability(True, False, f"{self.path} is read-only (0444: load-time parameter)")
        return Availability(True, True)

    def read(self) -> KnobValue:
        try:
            return parse_param_text(self.host.read_text(self.path))
        except HostError as e:
            raise gone_or_raise(self.key, e) from e

    def write(self, value: KnobValue, *, baseline: JsonValue = None) -> None:
        self.host.write_text(self.path, f"{value}\n")

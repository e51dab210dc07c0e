"""ethtool interrupt coalescing: ``DEV:coalesce:rx-usecs``, ``rx-frames``, ``adaptive-rx``.

Ranges are the ``struct ethtool_coalesce`` field types (u32); drivers clamp, round or reject
further (read back after every write — the actuator does). rx-usecs is ignored while adaptive-rx
is on (knobs.md 1.15).
"""

from __future__ import annotations

from polltuned.errors import HostError
from polltuned.host.ethtool import get_coalesce, set_coalesce
from polltuned.host.fs import Host
from polltuned.knobs.base import U32_MAX, Availability, Domain, JsonValue, Knob, gone_or_raise, int_domain
from polltuned.knobs.netdev import DeviceRef
from polltuned.records import KnobValue

#: knob parameter -> (ioctl field, domain)
COALESCE_PARAMS: dict[str, tuple[str, Domain]] = {
    "rx-usecs": ("rx_coalesce_usecs", int_domain(0, U32_MAX, "µs", "driver may clamp/round; ignored with adaptive-rx")),
    "rx-frames": ("rx_max_coalesced_frames", int_domain(0, U32_MAX, "frames")),
    "adaptive-rx": ("use_adaptive_rx_coalesce", int_domain(0, 1)),
}


class CoalesceKnob(Knob):
    kind = "ethtool-coalesce"

    def __init__(self, host: Host, ref: DeviceRef, param: str) -> None:
        self.host = host
        self.ref = ref
        self.param = param
        self.field, self.domain = COALESCE_PARAMS[param]
        self.key = f"{ref.label}:coalesce:{param}"

    def availability(self) -> Availability:
        try:
            cur = get_coalesce(self.host, self.ref.netns, self.ref.name)
        except HostError as e:
            return Availability(False, False, f"driver does not support coalescing ({e.message})")
        if self.field not in cur:
            return Availability(False, False, f"driver reports no {self.param}")
        return Availability(True, True, notices=("the driver may still reject or round values; read back after write",))

    def read(self) -> KnobValue:
        try:
            return int(get_coalesce(self.host, self.ref.netns, self.ref.name)[self.field])
        except HostError as e:
            raise gone_or_raise(self.key, e) from e
        except KeyError:
            raise HostError(f"{self.key}: driver reports no {self.field}") from None

    def write(self, value: KnobValue, *, baseline: JsonValue = None) -> None:
        set_coalesce(self.host, self.ref.netns, self.ref.name, {self.field: int(value)})

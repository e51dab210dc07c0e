"""sysctl knobs under /proc/sys (``net.core.busy_poll`` -> /proc/sys/net/core/busy_poll).

Limits come from knobs.md section 3 (kernel ``proc_dointvec_minmax`` bounds), with two
polltuned-imposed ones: ``net.core.netdev_budget`` has no kernel bounds (0/negative accepted and
harmful) so polltuned enforces >= 1; ``net.core.netdev_budget_usecs`` is raise-only since 6.14
(+stable): its minimum is the default, 2 jiffies = 2*10^6/HZ µs.

polltuned's hard limits are the kernel's limits (plus the two above): they are what
``validate()`` refuses before any write. How far a search may go (e.g. busy_poll 0..200 µs) is
the policy's ``min``/``max``, which ``polltuned check POLICY`` verifies lies inside these limits.

Every ``net.core`` knob here is registered only in the initial network namespace: inside any other
netns the file does not exist; ``availability()`` says so instead of "missing".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polltuned.errors import HostError
from polltuned.host.fs import Host
from polltuned.host.kconfig import read_kernel_config
from polltuned.knobs.base import (
    INT_MAX,
    Availability,
    Domain,
    JsonValue,
    Knob,
    gone_or_raise,
    int_domain,
    parse_int_text,
)
from polltuned.records import KnobValue


def sysctl_path(key: str) -> str:
    return "/proc/sys/" + key.replace(".", "/")


def parse_kconfig_hz(text: str) -> int | None:
    """CONFIG_HZ from kernel config text (/proc/config.gz, /boot/config-*): ``CONFIG_HZ=250``."""
    for line in text.splitlines():
        if line.startswith("CONFIG_HZ="):
            try:
                return int(line.split("=", 1)[1])
            except ValueError:
                return None
    return None


def budget_usecs_min(hz: int | None) -> int:
    """Minimum net.core.netdev_budget_usecs: 2 jiffies (2*USEC_PER_SEC/HZ). Unknown HZ -> the
    HZ=100 value (20000), the strictest, so polltuned never proposes a value the kernel rejects."""
    if not hz:
        return 20_000
    return 2 * 1_000_000 // hz


@dataclass(frozen=True)
class SysctlSpec:
    key: str
    domain: Callable[[Host], Domain]
    init_net_only: bool


def _fixed(d: Domain) -> Callable[[Host], Domain]:
    return lambda _host: d


def _budget_usecs_domain(host: Host) -> Domain:
    hz = parse_kconfig_hz(read_kernel_config(host) or "")
    lo = budget_usecs_min(hz)
    return int_domain(lo, INT_MAX, "µs", f"raise-only: kernel minimum is its default, 2 jiffies (HZ={hz or '?'})")


#: The explicit sysctl registry (knobs.md 3.1-3.3).
SYSCTLS: dict[str, SysctlSpec] = {
    "net.core.busy_read": SysctlSpec("net.core.busy_read", _fixed(int_domain(0, INT_MAX, "µs")), True),
    "net.core.busy_poll": SysctlSpec("net.core.busy_poll", _fixed(int_domain(0, INT_MAX, "µs")), True),
    "net.core.gro_normal_batch": SysctlSpec(
        "net.core.gro_normal_batch", _fixed(int_domain(1, INT_MAX, "segments")), True),
    "kernel.timer_migration": SysctlSpec("kernel.timer_migration", _fixed(int_domain(0, 1)), False),
    "net.core.netdev_budget": SysctlSpec(
        "net.core.netdev_budget",
        _fixed(int_domain(1, INT_MAX, "packets", "kernel accepts <= 0 and stalls NET_RX; polltuned enforces > 0")),
        True),
    "net.core.netdev_budget_usecs": SysctlSpec("net.core.netdev_budget_usecs", _budget_usecs_domain, True),
}


class SysctlKnob(Knob):
    kind = "sysctl"

    def __init__(self, host: Host, spec: SysctlSpec) -> None:
        self.host = host
        self.spec = spec
        self.key = spec.key
        self.path = sysctl_path(spec.key)
        self.domain = spec.domain(host)

    def availability(self) -> Availability:
        if not self.host.exists(self.path):
            if self.spec.init_net_only and self.host.exists("/proc/sys/net/core/somaxconn"):
                return Availability(False, False, "not init_net: this sysctl exists only in the initial "
                                    "network namespace (run polltuned in the host netns)")
            return Availability(False, False, f"missing file {self.path} (kernel too old or feature off)")
        if not self.host.is_writable(self.path):
            return Availability(True, False, f"{self.path} is not writable (needs root in the initial userns)")
        return Availability(True, True)

    def read(self) -> KnobValue:
        try:
            return parse_int_text(self.path, self.host.read_text(self.path))
        except HostError as e:
            raise gone_or_raise(self.key, e) from e

    def write(self, value: KnobValue, *, baseline: JsonValue = None) -> None:
        self.host.write_text(self.path, f"{value}\n")

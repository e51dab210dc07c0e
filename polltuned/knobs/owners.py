"""Other owners of the knobs polltuned tunes: an active tuned profile, a running irqbalance."""

from __future__ import annotations

import configparser
from dataclasses import dataclass

from polltuned.errors import HostError
from polltuned.host.fs import Host

TUNED_DIRS = ("/etc/tuned", "/usr/lib/tuned", "/usr/lib/tuned/profiles")


@dataclass(frozen=True)
class Owner:
    name: str
    active: bool
    knobs: tuple[str, ...]
    detail: str
    action: str


def parse_tuned_profile(text: str) -> tuple[dict[str, str], list[str]]:
    """tuned.conf (INI): the ``[sysctl]`` entries and the ``[main] include=`` parents."""
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        cp.read_string(text)
    except configparser.Error:
        return {}, []
    sysctls = dict(cp.items("sysctl")) if cp.has_section("sysctl") else {}
    incl = cp.get("main", "include", fallback="") if cp.has_section("main") else ""
    return sysctls, [s.strip() for s in incl.replace(";", ",").split(",") if s.strip()]


def _tuned_sysctls(host: Host, profile: str, depth: int = 0) -> dict[str, str]:
    if depth > 8:
        return {}
    for d in TUNED_DIRS:
        p = f"{d}/{profile}/tuned.conf"
        if host.exists(p):
            try:
                sysctls, parents = parse_tuned_profile(host.read_text(p))
            except HostError:
                return {}
            merged: dict[str, str] = {}
            for par in parents:
                merged.update(_tuned_sysctls(host, par, depth + 1))
            merged.update(sysctls)
            return merged
    return {}


def process_running(host: Host, comm: str) -> bool:
    """Is a process whose /proc/PID/comm is ``comm`` running?"""
    for pid in host.glob("/proc", "[0-9]*"):
        try:
            if host.read_text(f"/proc/{pid}/comm").strip() == comm:
                return True
        except HostError:
            continue
    return False


def detect_owners(host: Host, managed_sysctls: list[str]) -> list[Owner]:
    owners: list[Owner] = []
    active = ""
    if host.exists("/etc/tuned/active_profile"):
        try:
            active = host.read_text("/etc/tuned/active_profile").strip()
        except HostError:
            active = ""
    tuned_running = process_running(host, "tuned")
    if active:
        sets: dict[str, str] = {}
        for prof in active.split():
            sets.update(_tuned_sysctls(host, prof))
        ours = tuple(sorted(k for k in sets if k in managed_sysctls))
        owners.append(Owner(
            "tuned", tuned_running, ours,
            f"active profile {active!r}" + (f" sets {', '.join(f'{k}={sets[k]}' for k in ours)}" if ours else
                                            " sets none of polltuned's sysctls"),
            "tuned re-applies its values when it (re)starts; polltuned treats that as an admin change and "
            "releases those knobs (admin wins). Remove them from the profile or run `tuned-adm off` to let "
            "polltuned tune them." if ours else "no conflict"))
    irqb = process_running(host, "irqbalance")
    owners.append(Owner(
        "irqbalance", irqb, ("DEV:irq_affinity",) if irqb else (),
        "running" if irqb else "not running",
        "irqbalance rewrites /proc/irq/*/smp_affinity: polltuned releases an IRQ-affinity knob as soon as "
        "irqbalance moves it; ban the NIC IRQs (IRQBALANCE_BANNED_IRQS / --banirq) to tune them" if irqb
        else "no conflict"))
    return owners

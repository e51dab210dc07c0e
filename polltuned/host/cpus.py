"""CPU lists and thread affinity (sched_setaffinity) — kernel formats and syscalls."""

from __future__ import annotations

import os

from polltuned.errors import HostError, ParseError
from polltuned.host.fs import Host


def parse_cpu_list(text: str, source: str = "cpulist") -> list[int]:
    """Parse a kernel CPU list (``%*pbl``: ``0-3,8,10-11``; empty string = no CPUs), as in
    /sys/devices/system/cpu/online and /proc/irq/N/smp_affinity_list."""
    t = text.strip()
    out: set[int] = set()
    if not t:
        return []
    for part in t.split(","):
        a, sep, b = part.partition("-")
        try:
            if sep:
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(a))
        except ValueError:
            raise ParseError(source, 1, f"bad CPU list {t!r}") from None
    return sorted(out)


def format_cpu_list(cpus: list[int] | tuple[int, ...] | set[int]) -> str:
    """Inverse of parse_cpu_list, in the kernel's compact form (``0-3,8``)."""
    s = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(parts)


def online_cpus(host: Host) -> list[int]:
    return parse_cpu_list(host.read_text("/sys/devices/system/cpu/online"), "/sys/devices/system/cpu/online")


def get_thread_affinity(host: Host, tid: int) -> list[int]:
    """CPU affinity of thread ``tid``. Fake trees: ``/proc/TID/polltuned_affinity`` (a CPU list)."""
    if host.is_real:
        try:
            return sorted(os.sched_getaffinity(tid))
        except OSError as e:
            raise HostError(f"sched_getaffinity({tid}): {os.strerror(e.errno or 0)}", errno=e.errno) from e
    p = f"/proc/{tid}/polltuned_affinity"
    return parse_cpu_list(host.read_text(p), p)


def set_thread_affinity(host: Host, tid: int, cpus: list[int]) -> None:
    if host.is_real:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError as e:
            raise HostError(f"sched_setaffinity({tid}, {format_cpu_list(cpus)}): {os.strerror(e.errno or 0)}",
                            errno=e.errno) from e
        return
    host.write_text(f"/proc/{tid}/polltuned_affinity", format_cpu_list(cpus) + "\n")

"""CPU time of a systemd unit from its cgroup v2 ``cpu.stat``.

Kernel formats (Documentation/admin-guide/cgroup-v2.rst):

* ``/proc/PID/cgroup`` ("Processes"): one ``hierarchy-ID:controller-list:cgroup-path`` line per
  hierarchy; the cgroup v2 (unified) line is ``0::/system.slice/nginx.service``. The path is
  relative to the unified mount (``/sys/fs/cgroup`` on a v2 host, ``/sys/fs/cgroup/unified`` on a
  hybrid one) and seen through the reader's cgroup namespace.
* ``cpu.stat`` ("Core Interface Files" / "CPU"): flat keyed ``key value`` lines. ``usage_usec``,
  ``user_usec`` and ``system_usec`` are always there (cgroup core base stats, also without the cpu
  controller); ``nr_periods`` etc. only with it. Microseconds, 64-bit, never decreasing while the
  cgroup exists; a unit restart re-creates the cgroup (new inode, counters from 0).

systemd puts a unit's cgroup at ``<slice path>/<unit>`` (``system.slice/nginx.service``;
``Slice=`` or user managers move it): :func:`find_unit_cgroup` looks at the default place first,
then walks the slice/service tree. On a cgroup v1-only host there is no ``cpu.stat``:
:class:`CgroupUnavailable` says so, and callers fall back to another CPU scope.
"""

from __future__ import annotations

import errno as errno_mod
import os
import re
from collections import deque
from dataclasses import dataclass

from polltuned.errors import HostError, ParseError
from polltuned.host.fs import Host

CGROUP_MOUNT = "/sys/fs/cgroup"
#: systemd unit name characters (systemd.unit(5)); a name without a type suffix means ".service"
_UNIT = re.compile(r"^[A-Za-z0-9:_.@\\-]+$")
_UNIT_TYPES = (".service", ".scope", ".slice", ".socket", ".mount", ".swap", ".target", ".device",
               ".automount", ".path", ".timer")
_SEARCH_DEPTH = 6


class CgroupUnavailable(HostError):
    """No usable cgroup v2 accounting for the unit (v1-only host, unit not running, no cpu.stat)."""

    code = "cgroup-unavailable"


@dataclass(frozen=True)
class CgroupMembership:
    """``/proc/PID/cgroup``: the v2 path (None without a unified hierarchy) and the v1 hierarchies."""

    unified: str | None
    v1: dict[str, str]          # controller list ("cpu,cpuacct", "name=systemd") -> path


@dataclass(frozen=True)
class CpuStat:
    usage_usec: int
    user_usec: int
    system_usec: int
    cgroup_id: int = 0          # inode of the cgroup directory: changes when the cgroup is re-created


def parse_proc_cgroup(text: str, source: str = "/proc/self/cgroup") -> CgroupMembership:
    unified: str | None = None
    v1: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith("/"):
            raise ParseError(source, n, f"expected 'id:controllers:/path' (got {line!r})")
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            unified = path
        else:
            v1[controllers] = path
    return CgroupMembership(unified, v1)


def parse_cpu_stat(text: str, source: str = "cpu.stat") -> CpuStat:
    vals: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, _, val = line.partition(" ")
        if not val.strip().isdigit():
            raise ParseError(source, n, f"expected 'key <unsigned>' (got {line!r})")
        vals[key] = int(val)
    missing = [k for k in ("usage_usec", "user_usec", "system_usec") if k not in vals]
    if missing:
        raise ParseError(source, None, f"missing {', '.join(missing)}")
    return CpuStat(vals["usage_usec"], vals["user_usec"], vals["system_usec"])


def unit_name(unit: str) -> str:
    """Validate a unit name; ``nginx`` means ``nginx.service`` (as systemctl reads it)."""
    if not _UNIT.match(unit) or unit in (".", ".."):
        raise CgroupUnavailable(f"not a systemd unit name: {unit!r}", errno=errno_mod.EINVAL)
    return unit if unit.endswith(_UNIT_TYPES) else unit + ".service"


def unified_root(host: Host) -> str:
    """Mount point of the cgroup v2 hierarchy (v2 or hybrid host); CgroupUnavailable on v1-only."""
    if host.exists(f"{CGROUP_MOUNT}/cgroup.controllers"):
        return CGROUP_MOUNT
    if host.exists(f"{CGROUP_MOUNT}/unified/cgroup.controllers"):
        return f"{CGROUP_MOUNT}/unified"
    if host.exists(f"{CGROUP_MOUNT}/cpuacct") or host.exists(f"{CGROUP_MOUNT}/cpu,cpuacct"):
        why = "this host runs cgroup v1 only (no cgroup v2 hierarchy, so no cpu.stat)"
    else:
        why = f"no cgroup filesystem at {CGROUP_MOUNT}"
    raise CgroupUnavailable(why, errno=errno_mod.ENOENT)


def cgroup_of_pid(host: Host, pid: int | str = "self") -> str:
    """Kernel path of ``pid``'s cgroup v2 directory (``/sys/fs/cgroup/system.slice/x.service``)."""
    src = f"/proc/{pid}/cgroup"
    m = parse_proc_cgroup(host.read_text(src), src)
    if m.unified is None:
        raise CgroupUnavailable(f"{src} has no cgroup v2 entry (cgroup v1 only)", errno=errno_mod.ENOENT)
    root = unified_root(host)
    return root if m.unified == "/" else root + m.unified


def find_unit_cgroup(host: Host, unit: str) -> str:
    """Kernel path of ``unit``'s cgroup directory. Looks at ``system.slice/<unit>`` first, then walks
    the slices and service directories (``user.slice/user-1000.slice/user@1000.service/app.slice/``)."""
    name = unit_name(unit)
    root = unified_root(host)
    first = f"{root}/system.slice/{name}"
    if host.exists(f"{first}/cgroup.procs"):
        return first
    queue: deque[tuple[str, int]] = deque([(root, 0)])
    while queue:
        d, depth = queue.popleft()
        for child in host.glob(d, "*"):
            p = f"{d}/{child}"
            if child == name and host.exists(f"{p}/cgroup.procs"):
                return p
            if depth + 1 < _SEARCH_DEPTH and child.endswith((".slice", ".service")):
                queue.append((p, depth + 1))
    raise CgroupUnavailable(f"unit {name} has no cgroup under {root} (not running?)", errno=errno_mod.ENOENT)


def read_cpu_stat(host: Host, cgroup_dir: str) -> CpuStat:
    """``cgroup_dir/cpu.stat`` plus the directory's inode (to notice a re-created cgroup)."""
    p = f"{cgroup_dir}/cpu.stat"
    try:
        ino = os.stat(host.path(cgroup_dir)).st_ino
    except OSError as e:
        raise CgroupUnavailable(f"cgroup {cgroup_dir} is gone: {os.strerror(e.errno or 0)}", errno=e.errno) from e
    try:
        text = host.read_text(p)
    except HostError as e:
        raise CgroupUnavailable(e.message, errno=e.errno) from e
    st = parse_cpu_stat(text, p)
    return CpuStat(st.usage_usec, st.user_usec, st.system_usec, ino)

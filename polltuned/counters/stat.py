"""/proc/stat parser: per-CPU time in USER_HZ ticks plus the global scheduler counters.

Kernel format (fs/proc/stat.c, show_stat(), unchanged 2.6.33 .. 6.18)::

    cpu  <user> <nice> <system> <idle> <iowait> <irq> <softirq> <steal> <guest> <guest_nice>
    cpu0 ...            (one line per *online* CPU; offline CPUs are skipped, so map by N)
    intr <total> <irq0> <irq1> ...
    ctxt <n>
    btime <epoch>
    processes <n>
    procs_running <n>
    procs_blocked <n>
    softirq <total> <HI> <TIMER> ... <RCU>

Values are in USER_HZ (100 per second) ticks. ``guest``/``guest_nice`` are *already included*
in ``user``/``nice`` by the kernel (kernel/sched/cputime.c: account_guest_time), so they are
kept only for information and never added again. Lines we do not use (``intr`` with one column
per IRQ number, which is long on big hosts) are skipped without being split.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from polltuned.counters._util import cpu_id, uint, uints
from polltuned.errors import ParseError

PATH = "/proc/stat"
USER_HZ = 100
#: column names of a cpu line, in kernel order
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")


@dataclass(frozen=True)
class CpuTimes:
    """Ticks (USER_HZ) for one CPU since boot. Kernels before 2.6.33 print fewer columns: missing
    trailing columns are 0 (at least user..idle, 4 columns, are required)."""

    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int
    guest: int
    guest_nice: int


@dataclass(frozen=True)
class StatRecord:
    cpus: Mapping[int, CpuTimes]      # online CPUs only
    total: CpuTimes                   # the aggregate "cpu" line
    ctxt: int | None
    procs_running: int | None
    procs_blocked: int | None


_SCALARS = ("ctxt", "procs_running", "procs_blocked")


def parse_stat(text: str, path: str = PATH) -> StatRecord:
    cpus: dict[int, CpuTimes] = {}
    total: CpuTimes | None = None
    scalars: dict[str, int] = {}
    for lineno, line in enumerate(text.split("\n"), 1):
        if line.startswith("cpu"):
            parts = line.split()
            label = parts[0]
            vals = uints(parts[1:], path, lineno, label[:16])
            if len(vals) < 4 or len(vals) > len(CPU_FIELDS):
                raise ParseError(path, lineno, f"{label[:16]}: expected 4..10 tick columns, got {len(vals)}")
            vals += [0] * (len(CPU_FIELDS) - len(vals))
            times = CpuTimes(*vals)
            if label == "cpu":
                if total is not None:
                    raise ParseError(path, lineno, "duplicate aggregate 'cpu' line")
                total = times
            else:
                n = cpu_id(label, "cpu", path, lineno)
                if n in cpus:
                    raise ParseError(path, lineno, f"duplicate line for cpu{n}")
                cpus[n] = times
        else:
            key, _, rest = line.partition(" ")
            if key in _SCALARS:
                if key in scalars:
                    raise ParseError(path, lineno, f"duplicate {key!r} line")
                scalars[key] = uint(rest.strip(), path, lineno, key)
    if total is None or not cpus:
        raise ParseError(path, None, "no 'cpu' / 'cpuN' lines (is this /proc/stat?)")
    return StatRecord(
        cpus=cpus,
        total=total,
        ctxt=scalars.get("ctxt"),
        procs_running=scalars.get("procs_running"),
        procs_blocked=scalars.get("procs_blocked"),
    )

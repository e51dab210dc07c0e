"""/proc/schedstat parser: per-CPU run-queue wait, the runqueue-length proxy.

Only with CONFIG_SCHEDSTATS (absent on the 6.18 VM this was written on). Kernel format
(kernel/sched/stats.c show_schedstat(); Documentation/scheduler/sched-stats.rst, versions 15, 16
and 17 — the ``cpu`` line is identical in all three)::

    version 17
    timestamp 4295123456
    cpu0 <yld_count> 0 <sched_count> <sched_goidle> <ttwu_count> <ttwu_local> <rq_cpu_time> <run_delay> <pcount>
    domain0 [name] <cpumask> <36 or 45 numbers>       (skipped)

Field 7 ``rq_cpu_time`` = ns tasks ran on this CPU; field 8 ``run_delay`` = ns tasks spent
waiting on this run queue; field 9 = timeslices run. Δrun_delay/Δt is the average number of
runnable-but-waiting tasks on that CPU (Little's law). One line per *online* CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from polltuned.counters._util import cpu_id, uint, uints
from polltuned.errors import ParseError

PATH = "/proc/schedstat"
VERSIONS = (15, 16, 17)


@dataclass(frozen=True)
class SchedCpu:
    rq_cpu_time_ns: int
    run_delay_ns: int
    pcount: int


@dataclass(frozen=True)
class SchedstatRecord:
    version: int
    cpus: Mapping[int, SchedCpu]


def parse_schedstat(text: str, path: str = PATH) -> SchedstatRecord:
    version: int | None = None
    cpus: dict[int, SchedCpu] = {}
    for lineno, line in enumerate(text.split("\n"), 1):
        if line.startswith("version "):
            if version is not None:
                raise ParseError(path, lineno, "duplicate 'version' line")
            version = uint(line[8:].strip(), path, lineno, "version")
            if version not in VERSIONS:
                raise ParseError(path, lineno, f"unsupported schedstat version {version} (know {VERSIONS})")
        elif line.startswith("cpu"):
            if version is None:
                raise ParseError(path, lineno, "cpu line before 'version'")
            parts = line.split()
            n = cpu_id(parts[0], "cpu", path, lineno)
            vals = uints(parts[1:], path, lineno, parts[0])
            if len(vals) != 9:
                raise ParseError(path, lineno, f"{parts[0]}: expected 9 fields, got {len(vals)}")
            if n in cpus:
                raise ParseError(path, lineno, f"duplicate line for cpu{n}")
            cpus[n] = SchedCpu(vals[6], vals[7], vals[8])
        elif line.startswith(("timestamp ", "domain")) or not line.strip():
            continue
        else:
            raise ParseError(path, lineno, f"unexpected line {line[:40]!r}")
    if version is None:
        raise ParseError(path, None, "no 'version' line")
    if not cpus:
        raise ParseError(path, None, "no cpuN lines")
    return SchedstatRecord(version, cpus)

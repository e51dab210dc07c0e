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
from functools import cached_property
from typing import TYPE_CHECKING

from polltuned.counters._util import cpu_id, int_block, uint, uints
from polltuned.errors import ParseError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

PATH = "/proc/schedstat"
VERSIONS = (15, 16, 17)
_OTHER = ("domain", "timestamp ")


@dataclass(frozen=True)
class SchedCpu:
    rq_cpu_time_ns: int
    run_delay_ns: int
    pcount: int


@dataclass(frozen=True, eq=False)
class SchedstatRecord:
    version: int
    ids: tuple[int, ...]
    fields: npt.NDArray[np.int64]       # shape (len(ids), 9): the cpu line's nine fields

    @cached_property
    def cpus(self) -> Mapping[int, SchedCpu]:
        return {c: SchedCpu(r[6], r[7], r[8]) for c, r in zip(self.ids, self.fields.tolist())}

    @property
    def run_delay_ns(self) -> npt.NDArray[np.int64]:
        return self.fields[:, 7]


def _record(version: int, ids: list[int], rows: object) -> SchedstatRecord:
    import numpy as np

    arr = np.asarray(rows, dtype=np.int64).reshape(len(ids), 9)
    arr.flags.writeable = False
    return SchedstatRecord(version, tuple(ids), arr)


def _version(lines: list[str], path: str) -> int:
    found = [(i, ln) for i, ln in enumerate(lines, 1) if ln.startswith("version ")]
    if not found:
        raise ParseError(path, None, "no 'version' line")
    if len(found) > 1:
        raise ParseError(path, found[1][0], "duplicate 'version' line")
    lineno, line = found[0]
    first_cpu = next((i for i, ln in enumerate(lines, 1) if ln.startswith("cpu")), None)
    if first_cpu is not None and first_cpu < lineno:
        raise ParseError(path, first_cpu, "cpu line before 'version'")
    v = uint(line[8:].strip(), path, lineno, "version")
    if v not in VERSIONS:
        raise ParseError(path, lineno, f"unsupported schedstat version {v} (know {VERSIONS})")
    return v


def parse_schedstat(text: str, path: str = PATH) -> SchedstatRecord:
    lines = text.split("\n")
    version = _version(lines, path)
    cpu_lines = [ln for ln in lines if ln.startswith("cpu")]
    unknown = [ln for ln in lines if ln and not ln.startswith(("cpu", "version ", *_OTHER))]
    if cpu_lines and not unknown:
        heads = [ln.partition(" ") for ln in cpu_lines]
        labels = "".join(h[0][3:] for h in heads)
        body = "\n".join(h[2] for h in heads)
        if labels.isascii() and labels.isdigit() and all(len(h[0]) > 3 for h in heads):
            ids = [int(h[0][3:]) for h in heads]
            arr = int_block(body)
            if (arr is not None and arr.size == 9 * len(ids) and body.count(" ") == 8 * len(ids)
                    and "  " not in body and len(set(ids)) == len(ids) and int(arr.max()) < (1 << 63) - 1):
                return _record(version, ids, arr)
    ids2: list[int] = []
    rows: list[list[int]] = []
    for lineno, line in enumerate(lines, 1):
        if line.startswith("cpu"):
            parts = line.split()
            n = cpu_id(parts[0], "cpu", path, lineno)
            vals = uints(parts[1:], path, lineno, parts[0])
            if len(vals) != 9:
                raise ParseError(path, lineno, f"{parts[0]}: expected 9 fields, got {len(vals)}")
            if max(vals) >= 1 << 63:
                raise ParseError(path, lineno, f"{parts[0]}: value wider than 64 bits")
            if n in ids2:
                raise ParseError(path, lineno, f"duplicate line for cpu{n}")
            ids2.append(n)
            rows.append(vals)
        elif line.startswith(("version ", *_OTHER)) or not line.strip():
            continue
        else:
            raise ParseError(path, lineno, f"unexpected line {line[:40]!r}")
    if not ids2:
        raise ParseError(path, None, "no cpuN lines")
    return _record(version, ids2, rows)

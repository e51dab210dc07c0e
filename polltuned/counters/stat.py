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

The per-CPU block is parsed in one numpy call when every cpuN line is well formed and has the
same width (the normal case); anything else goes through the strict line-by-line parser, which
either accepts it (e.g. old kernels with fewer columns) or raises a ParseError naming the line.
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


@dataclass(frozen=True, eq=False)
class StatRecord:
    ids: tuple[int, ...]                 # online CPU ids, in file order
    ticks: npt.NDArray[np.int64]         # shape (len(ids), 10), columns = CPU_FIELDS
    total: CpuTimes                      # the aggregate "cpu" line
    ctxt: int | None
    procs_running: int | None
    procs_blocked: int | None

    @cached_property
    def cpus(self) -> Mapping[int, CpuTimes]:
        return {c: CpuTimes(*row) for c, row in zip(self.ids, self.ticks.tolist())}


_SCALARS = ("ctxt", "procs_running", "procs_blocked")
_CLAMP = (1 << 63) - 1   # strtoll clamps here: such values go through the strict parser


def _scalars(lines: list[str], path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for lineno, line in enumerate(lines, 1):
        key, _, rest = line.partition(" ")
        if key in _SCALARS:
            if key in out:
                raise ParseError(path, lineno, f"duplicate {key!r} line")
            out[key] = uint(rest.strip(), path, lineno, key)
    return out


def _record(ids: list[int], rows: list[list[int]] | npt.NDArray[np.int64], total: list[int],
            sc: dict[str, int]) -> StatRecord:
    import numpy as np

    arr = np.asarray(rows, dtype=np.int64).reshape(len(ids), len(CPU_FIELDS))
    arr.flags.writeable = False
    return StatRecord(tuple(ids), arr, CpuTimes(*total), sc.get("ctxt"), sc.get("procs_running"),
                      sc.get("procs_blocked"))


def _fast(lines: list[str], path: str) -> StatRecord | None:
    cpu_lines = [ln for ln in lines if ln.startswith("cpu")]
    if len(cpu_lines) < 2 or not cpu_lines[0].startswith("cpu  "):
        return None
    heads = [ln.partition(" ") for ln in cpu_lines[1:]]
    labels = "".join(h[0][3:] for h in heads)
    if not (labels.isascii() and labels.isdigit()) or any(len(h[0]) < 4 for h in heads):
        return None
    ids = [int(h[0][3:]) for h in heads]
    body = "\n".join(h[2] for h in heads)
    arr = int_block(body)
    total = int_block(cpu_lines[0][5:])
    width = len(CPU_FIELDS)
    if (arr is None or total is None or arr.size != width * len(ids) or total.size != width
            or body.count(" ") != (width - 1) * len(ids) or "  " in body or len(set(ids)) != len(ids)
            or (len(ids) and (int(arr.max()) >= _CLAMP or int(total.max()) >= _CLAMP))):
        return None
    return _record(ids, arr, total.tolist(), _scalars(lines, path))


def parse_stat(text: str, path: str = PATH) -> StatRecord:
    lines = text.split("\n")
    fast = _fast(lines, path)
    if fast is not None:
        return fast
    ids: list[int] = []
    rows: list[list[int]] = []
    total: list[int] | None = None
    for lineno, line in enumerate(lines, 1):
        if line.startswith("cpu"):
            parts = line.split()
            label = parts[0]
            vals = uints(parts[1:], path, lineno, label[:16])
            if len(vals) < 4 or len(vals) > len(CPU_FIELDS):
                raise ParseError(path, lineno, f"{label[:16]}: expected 4..10 tick columns, got {len(vals)}")
            if max(vals) >= 1 << 63:
                raise ParseError(path, lineno, f"{label[:16]}: value wider than 64 bits")
            vals += [0] * (len(CPU_FIELDS) - len(vals))
            if label == "cpu":
                if total is not None:
                    raise ParseError(path, lineno, "duplicate aggregate 'cpu' line")
                total = vals
            else:
                n = cpu_id(label, "cpu", path, lineno)
                if n in ids:
                    raise ParseError(path, lineno, f"duplicate line for cpu{n}")
                ids.append(n)
                rows.append(vals)
    if total is None or not ids:
        raise ParseError(path, None, "no 'cpu' / 'cpuN' lines (is this /proc/stat?)")
    return _record(ids, rows, total, _scalars(lines, path))

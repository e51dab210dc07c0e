"""PSI parser: /proc/pressure/cpu and /proc/pressure/irq.

Kernel format (kernel/sched/psi.c psi_show(), Documentation/accounting/psi.rst)::

    some avg10=0.02 avg60=0.19 avg300=0.10 total=3875869
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0

``total`` is cumulative stall time in microseconds (use deltas). ``cpu`` prints ``some`` and,
since 5.13, ``full`` (always 0 at system level). ``irq`` (6.1+, CONFIG_IRQ_TIME_ACCOUNTING)
prints only ``full``.
"""

from __future__ import annotations

from dataclasses import dataclass

from polltuned.counters._util import ufloat, uint
from polltuned.errors import ParseError


@dataclass(frozen=True)
class PsiLine:
    avg10: float
    avg60: float
    avg300: float
    total_us: int


@dataclass(frozen=True)
class PsiRecord:
    some: PsiLine | None
    full: PsiLine | None


@dataclass(frozen=True)
class PressureRecord:
    cpu: PsiRecord
    irq: PsiRecord | None      # None: /proc/pressure/irq absent on this kernel


def parse_psi(text: str, path: str) -> PsiRecord:
    got: dict[str, PsiLine] = {}
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 5 or parts[0] not in ("some", "full"):
            raise ParseError(path, lineno, f"expected 'some|full avg10= avg60= avg300= total=', got {line[:40]!r}")
        if parts[0] in got:
            raise ParseError(path, lineno, f"duplicate {parts[0]!r} line")
        vals: dict[str, str] = {}
        for kv in parts[1:]:
            k, eq, v = kv.partition("=")
            if not eq or k not in ("avg10", "avg60", "avg300", "total") or k in vals:
                raise ParseError(path, lineno, f"unexpected field {kv[:40]!r}")
            vals[k] = v
        got[parts[0]] = PsiLine(
            ufloat(vals["avg10"], path, lineno, "avg10"),
            ufloat(vals["avg60"], path, lineno, "avg60"),
            ufloat(vals["avg300"], path, lineno, "avg300"),
            uint(vals["total"], path, lineno, "total"),
        )
    if not got:
        raise ParseError(path, None, "no 'some'/'full' lines")
    return PsiRecord(got.get("some"), got.get("full"))

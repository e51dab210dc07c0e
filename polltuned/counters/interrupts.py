"""/proc/interrupts parser (opt-in family "interrupts": expensive on big hosts).

Kernel format (kernel/irq/proc.c show_interrupts() + arch_show_interrupts(), x86, <= 6.18)::

               CPU0       CPU1                         header: one "CPU%-8d" per *online* CPU
     24:          1          0  IO-APIC   5-edge      ACPI:Ged
     38:          0       2163  PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0
    NMI:          0          0   Non-maskable interrupts
    ERR:          0                                    single global count (also MIS)

Numeric rows: one ``%10u`` per online CPU, then chip name, hwirq-type and the comma-separated
action names. Named rows (NMI LOC RES CAL TLB ...): per-CPU counts then a description. ``ERR``
and ``MIS`` carry one global count. Which named rows appear is arch/config dependent (and 7.x
hides some until non-zero), so rows are optional and columns come from the header. Counts are
``unsigned int`` and wrap at 2**32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from polltuned.counters._util import cpu_header_line
from polltuned.errors import ParseError

PATH = "/proc/interrupts"
WIDTH_BITS = 32


@dataclass(frozen=True)
class IrqRow:
    label: str                       # "38", "LOC", "ERR"
    counts: tuple[int, ...] | None   # per header CPU; None for single-count rows (ERR/MIS)
    total: int
    desc: str                        # chip/type/actions, or the description of a named row

    @property
    def irq(self) -> int | None:
        return int(self.label) if self.label.isdigit() else None


@dataclass(frozen=True)
class InterruptsRecord:
    cpus: tuple[int, ...]
    rows: Mapping[str, IrqRow]

    def per_cpu_total(self, numeric_only: bool = True) -> dict[int, int]:
        """Sum of counts per CPU over device IRQ rows (or every per-CPU row)."""
        out = dict.fromkeys(self.cpus, 0)
        for row in self.rows.values():
            if row.counts is None or (numeric_only and row.irq is None):
                continue
            for c, v in zip(self.cpus, row.counts):
                out[c] += v
        return out


def parse_interrupts(text: str, path: str = PATH) -> InterruptsRecord:
    lines = text.split("\n")
    cpus = cpu_header_line(lines, path)
    n = len(cpus)
    rows: dict[str, IrqRow] = {}
    for lineno, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        label, colon, rest = line.partition(":")
        label = label.strip()
        if not colon or not label or not label.isascii() or not label.isalnum():
            raise ParseError(path, lineno, f"expected '<irq|NAME>: counts...', got {line.strip()[:40]!r}")
        toks = rest.split()
        k = 0
        while k < len(toks) and k < n and toks[k].isascii() and toks[k].isdigit():
            k += 1
        if k == n:
            per = tuple(int(t) for t in toks[:n])
            counts: tuple[int, ...] | None = per
            total = sum(per)
        elif k == 1 and not label.isdigit() and len(toks) == 1:
            counts, total = None, int(toks[0])
        else:
            raise ParseError(path, lineno, f"{label}: {k} counts for {n} CPU columns")
        if label in rows:
            raise ParseError(path, lineno, f"duplicate row {label!r}")
        rows[label] = IrqRow(label, counts, total, " ".join(toks[k:]))
    return InterruptsRecord(cpus=cpus, rows=rows)

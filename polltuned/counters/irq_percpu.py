"""Cheap per-IRQ counts: ``/sys/kernel/irq/N/per_cpu_count`` for the NIC's queue IRQs only.

Kernel format (kernel/irq/irqdesc.c per_cpu_count_show(), CONFIG_SPARSE_IRQ, 4.10+): one
``%u`` per *possible* CPU, comma separated, newline terminated — the position is the CPU id::

    0,2163

The sysfs buffer is one page, so with several hundred possible CPUs and large counts the line can
be cut at 4096 bytes: a line that does not end in a newline is rejected rather than misread.
Counts are ``unsigned int`` and wrap at 2**32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polltuned.counters._util import uints
from polltuned.errors import ParseError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

WIDTH_BITS = 32


@dataclass(frozen=True, eq=False)
class IrqCounts:
    """``counts`` is a read-only int64 numpy array, index = CPU id (numpy keeps the 64 queues x
    256 CPUs of a big host within the per-sample budget)."""

    irq: int
    counts: npt.NDArray[np.int64]

    def per_cpu(self) -> dict[int, int]:
        return dict(enumerate(self.counts.tolist()))


def parse_per_cpu_count(text: str, path: str, irq: int) -> IrqCounts:
    if not text.endswith("\n"):
        raise ParseError(path, 1, "line not newline-terminated (truncated sysfs page?)")
    body = text[:-1]
    if "\n" in body:
        raise ParseError(path, 2, "expected a single line")
    import numpy as np

    digits = body.replace(",", "")
    if not (digits.isascii() and digits.isdigit() and ",," not in body
            and body[0] != "," and body[-1] != ","):
        uints(body.split(","), path, 1, "per_cpu_count")  # raises the precise ParseError
        raise ParseError(path, 1, "malformed per_cpu_count")
    # strtoll semantics: values beyond int64 clamp to its max, so one bound check covers width
    arr = np.fromstring(body, dtype=np.int64, sep=",")
    if arr.size != body.count(",") + 1 or int(arr.max()) > 0xFFFFFFFF:
        raise ParseError(path, 1, "count wider than 32 bits (kernel prints %u)")
    arr.flags.writeable = False
    return IrqCounts(irq, arr)


def irq_path(irq: int) -> str:
    return f"/sys/kernel/irq/{irq}/per_cpu_count"


def parse_irq_set(counts: Mapping[int, IrqCounts]) -> dict[int, int]:
    """Sum over the given IRQs per CPU id."""
    out: dict[int, int] = {}
    for c in counts.values():
        for cpu, v in enumerate(c.counts):
            out[cpu] = out.get(cpu, 0) + v
    return out

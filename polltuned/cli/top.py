"""``polltuned top``: a live per-CPU view of the network path, like top.

One row per CPU (NET_RX/s, NET_TX/s, NIC IRQs/s, softirq %, system %, run-queue wait, time_squeeze/s),
then one row per NIC (packets/s, drops/s, IRQs/s per queue). ``--once --json`` samples one
interval and prints one JSON document (``Rates.to_json()`` plus the NIC queue->IRQ map).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TextIO

from polltuned.cli._knobs_common import make_host
from polltuned.cli._types import finite_float, int_range
from polltuned.clock import Clock, SystemClock
from polltuned.counters import COLLECTORS, Sampler
from polltuned.counters.sampler import Snapshot
from polltuned.errors import UsageError
from polltuned.metrics.window import Rates, rates


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=finite_float(0, 3600), default=1.0, metavar="S",
                   help="seconds between samples, > 0 and <= 3600 (default 1)")
    p.add_argument("--count", type=int_range(0, 10**9), default=0, metavar="N",
                   help="stop after N intervals (default 0: run until ^C)")
    p.add_argument("--once", action="store_true", help="one interval, then exit (same as --count 1)")
    p.add_argument("--json", action="store_true", help="print each interval as one line of JSON")
    p.add_argument("--nic", action="append", metavar="DEV",
                   help="interface to show (repeatable; default: every non-loopback link)")
    p.add_argument("--interrupts", action="store_true",
                   help="also read /proc/interrupts (all device IRQs per CPU; costly on big hosts)")


def _fmt(v: float | None, scale: float = 1.0, width: int = 9, prec: int = 0) -> str:
    if v is None:
        return "n/a".rjust(width)
    return f"{v * scale:{width}.{prec}f}"


def render_text(r: Rates, snap: Snapshot) -> str:
    out = [f"polltuned top — interval {r.interval_s:.2f} s"]
    sysr = r.system
    out.append(
        f"procs_running {sysr.procs_running if sysr.procs_running is not None else 'n/a'}"
        f"   psi cpu some {_fmt(sysr.psi_cpu_some, 100, 1, 1).strip()}%"
        f"   ctxt/s {_fmt(sysr.ctxt_per_s, 1, 1).strip()}"
    )
    out.append(f"{'CPU':>4} {'NET_RX/s':>9} {'NET_TX/s':>9} {'IRQ/s':>9} {'softirq%':>9} {'system%':>9} "
               f"{'user%':>9} {'runq_wait':>9} {'squeeze/s':>9} {'pkts/s':>9}")
    for c, cr in sorted(r.cpu.items()):
        irq = cr.irqs_per_s if cr.all_irqs_per_s is None else cr.all_irqs_per_s
        out.append(
            f"{c:>4} {_fmt(cr.net_rx_per_s)} {_fmt(cr.net_tx_per_s)} {_fmt(irq)} "
            f"{_fmt(cr.softirq, 100, prec=1)} {_fmt(cr.system, 100, prec=1)} {_fmt(cr.user, 100, prec=1)} "
            f"{_fmt(cr.runq_wait_s_per_s, prec=2)} {_fmt(cr.time_squeeze_per_s)} {_fmt(cr.rx_packets_per_s)}"
        )
    if r.nic:
        out.append("")
        out.append(f"{'NIC':<10} {'rx pkts/s':>10} {'tx pkts/s':>10} {'drops/s':>9}  IRQs/s per queue")
        for dev, nr in sorted(r.nic.items()):
            q = "  ".join(f"{lbl}(irq {nr.irq_numbers.get(lbl)}):{_fmt(v, width=1).strip()}"
                          for lbl, v in sorted(nr.irqs_per_s.items()))
            if not q:
                q = nr.note or "no queue IRQs identified"
            out.append(f"{dev:<10} {_fmt(nr.rx_packets_per_s, width=10)} {_fmt(nr.tx_packets_per_s, width=10)} "
                       f"{_fmt(nr.drops_per_s)}  {q}")
    if r.unavailable:
        out.append("")
        out.extend(f"n/a: {k}: {v}" for k, v in sorted(r.unavailable.items()))
    return "\n".join(out)


def to_json(r: Rates, a: Snapshot, b: Snapshot) -> dict[str, object]:
    """Rates.to_json() plus the NIC queue->IRQ map and the two snapshots' CLOCK_MONOTONIC times
    (midpoints of their reads; ``read_s``: how long each sample's reads took)."""
    d = r.to_json()
    d["nic_map"] = {n: info.to_json() for n, info in sorted(b.nics.items())}
    d["t_start"], d["t_end"] = a.t, b.t
    d["read_s"] = [a.read_s, b.read_s]
    return d


def loop(sampler: Sampler, clock: Clock, *, interval: float, count: int, as_json: bool,
         out: TextIO, clear: bool) -> int:
    a = sampler.sample()
    n = 0
    while count <= 0 or n < count:
        clock.sleep(interval)
        b = sampler.sample()
        r = rates(a, b)
        if as_json:
            out.write(json.dumps(to_json(r, a, b), sort_keys=True) + "\n")
        else:
            if clear:
                out.write("\x1b[H\x1b[2J")
            out.write(render_text(r, b) + "\n")
        out.flush()
        a = b
        n += 1
    return 0


def run(args: argparse.Namespace) -> int:
    if not args.interval > 0:
        raise UsageError(f"--interval: must be > 0 (got {args.interval})")
    if args.count < 0:
        raise UsageError(f"--count: must be >= 0 (got {args.count})")
    families: Sequence[str] | None = None
    if args.interrupts:
        families = [n for n, c in COLLECTORS.items() if c.default and n != "procs"] + ["interrupts"]
    count = 1 if args.once else args.count
    clock = SystemClock()
    with Sampler(make_host(args), clock=clock, nic=args.nic, families=families) as sampler:
        return loop(sampler, clock, interval=args.interval, count=count, as_json=args.json,
                    out=sys.stdout, clear=sys.stdout.isatty() and not args.json and count != 1)

"""``polltuned apply KEY=VALUE ...``: a manual, journaled change (rolled back by ``polltuned rollback``)."""

from __future__ import annotations

import argparse
import json

from polltuned.cli._knobs_common import add_app_cpus, build_actuator, fmt, parse_assignment_value
from polltuned.errors import ExitCode, UsageError
from polltuned.records import KnobValue

HELP = "apply knob values as one journaled transaction (undone as a whole if any write fails)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("assignments", nargs="+", metavar="KEY=VALUE",
                   help="e.g. net.core.busy_poll=50 eth0:gro_flush_timeout=20000 eth0:irq_affinity=spread")
    p.add_argument("--reason", default="manual", help="recorded in the journal")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_app_cpus(p)


def parse_assignments(items: list[str]) -> dict[str, KnobValue]:
    out: dict[str, KnobValue] = {}
    for it in items:
        key, sep, val = it.partition("=")
        if not sep or not key or val == "":
            raise UsageError(f"{it!r}: expected KEY=VALUE (e.g. net.core.busy_poll=50)")
        if key in out:
            raise UsageError(f"{key}: given twice")
        out[key] = parse_assignment_value(val)
    return out


def run(args: argparse.Namespace) -> int:
    assignment = parse_assignments(args.assignments)
    act = build_actuator(args)
    res = act.apply(assignment, reason=args.reason)
    if args.json:
        print(json.dumps({"txn": res.txn,
                          "changes": [{"key": c.key, "before": c.before, "after": c.after} for c in res.changes],
                          "skipped_released": list(res.skipped_released),
                          "released_now": list(res.released_now)}, indent=2))
    else:
        for c in res.changes:
            print(f"{c.key}: {fmt(c.before)} -> {fmt(c.after)}")
        for k in res.skipped_released:
            print(f"{k}: skipped: released (changed by the admin; polltuned no longer writes it)")
    return int(ExitCode.OK)

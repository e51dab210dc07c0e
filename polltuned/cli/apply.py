"""``polltuned apply KEY=VALUE ...``: a manual, journaled change (rolled back by ``polltuned rollback``).

``--dry-run`` validates the values, reads the current ones and prints the transaction apply would
journal (epoch, baselines, intents, the values it expects to read back) without writing, locking
or creating anything."""

from __future__ import annotations

import argparse
import json
from typing import Any

from polltuned.cli._knobs_common import add_app_cpus, build_actuator, fmt, parse_assignment_value
from polltuned.cli._owner import add_force, claim_host
from polltuned.errors import ExitCode, UsageError
from polltuned.records import KnobValue


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("assignments", nargs="+", metavar="KEY=VALUE",
                   help="knob key and value, e.g. net.core.busy_poll=50 eth0:gro_flush_timeout=20000 "
                        "eth0:irq_affinity=spread")
    p.add_argument("--reason", default="manual", help="recorded in the journal (default: manual)")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and print the transaction that would be journaled; write nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_app_cpus(p)
    add_force(p)


def parse_assignments(items: list[str]) -> dict[str, KnobValue]:
    out: dict[str, KnobValue] = {}
    for it in items:
        key, sep, val = it.partition("=")
        key = key.strip()
        if not sep or not key or val.strip() == "":
            raise UsageError(f"{it!r}: expected KEY=VALUE (e.g. net.core.busy_poll=50)")
        if key in out:
            raise UsageError(f"{key}: given twice")
        out[key] = parse_assignment_value(val)
    return out


def _record_line(r: dict[str, Any]) -> str:
    t = r["type"]
    if t == "epoch":
        return f"  epoch     {r['epoch']} (opens: the host carries no polltuned value yet)"
    if t == "txn":
        return f"  txn       {r['txn']} ({r['reason']}): {', '.join(r['keys']) or 'nothing to write'}"
    if t == "baseline":
        return f"  baseline  {r['key']} = {fmt(r['value'])}  (original, kept for rollback)"
    if t == "intent":
        return f"  intent    {r['key']} = {fmt(r['value'])}"
    if t == "applied":
        return f"  applied   {r['key']} = {fmt(r['value'])}  (expected read-back)"
    if t == "released":
        return f"  released  {r['key']}: live {fmt(r['live'])}, polltuned left {fmt(r['expected'])} (admin wins)"
    if t == "txn-end":
        return f"  txn-end   {r['txn']}"
    return f"  {t}"


def run(args: argparse.Namespace) -> int:
    assignment = parse_assignments(args.assignments)
    act = build_actuator(args)
    if args.dry_run:
        plan = act.plan(assignment, reason=args.reason)
        if args.json:
            print(json.dumps({"dry_run": True, "journal": str(act.journal.path), "records": list(plan.records),
                              "changes": [{"key": c.key, "before": c.before, "after": c.after} for c in plan.changes],
                              "skipped_released": list(plan.skipped_released),
                              "released_now": list(plan.released_now)}, indent=2))
            return int(ExitCode.OK)
        print(f"dry run: nothing written. The transaction polltuned would journal in {act.journal.path}:")
        for r in plan.records:
            print(_record_line(r))
        for c in plan.changes:
            print(f"{c.key}: {fmt(c.before)} -> {fmt(c.after)}")
        for k in plan.skipped_released:
            print(f"{k}: would be skipped: released (changed by the admin; polltuned no longer writes it)")
        return int(ExitCode.OK)
    claim_host(args, "apply")
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

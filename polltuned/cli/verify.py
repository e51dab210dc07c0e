"""``polltuned verify``: re-read every managed knob; say which hold polltuned's value, which the
admin changed (released: admin wins; for IRQ affinity IRQ by IRQ), which the kernel reset, which vanished.
It only reports: the daemon's HOLD re-applies kernel resets (polltuned.daemon.watch).

A journal that cannot be proven complete (its baseline copy missing or damaged): the state is
unknown; a knob that differs from polltuned's last recorded write is "unknown" (not released), and
verify exits 7 (``error[journal-unverified]``)."""

from __future__ import annotations

import argparse
import json

from polltuned.cli._knobs_common import build_actuator, fmt
from polltuned.errors import ExitCode, JournalUnverified


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    act = build_actuator(args)
    rows, unverified = act.verify_all()
    if args.json:
        print(json.dumps([{"key": r.key, "state": r.state, "expected": r.expected, "live": r.live,
                           "baseline": r.baseline, "detail": r.detail,
                           **({"released_parts": list(r.released_parts)} if r.released_parts else {}),
                           **({"reset_parts": list(r.reset_parts)} if r.reset_parts else {})} for r in rows],
                         indent=2))
    else:
        if unverified:
            print(f"host state unknown: {unverified}")
        elif not rows:
            print("no managed knobs: the host is clean")
        for r in rows:
            extra = f" — {r.detail}" if r.detail else ""
            print(f"{r.key}: {r.state} (live {fmt(r.live)}, polltuned {fmt(r.expected)}, "
                  f"original {fmt(r.baseline)}){extra}")
    if unverified:
        raise JournalUnverified(f"{unverified}: host state unknown",
                                hint="`polltuned rollback` restores what the journal records; check the knobs, then "
                                     "`polltuned rollback --accept-unknown`")
    return int(ExitCode.OK)

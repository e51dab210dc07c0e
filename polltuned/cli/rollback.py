"""``polltuned rollback [--if-dirty]``: put every knob back to its value before polltuned touched it."""

from __future__ import annotations

import argparse
import json

from polltuned.cli._knobs_common import build_actuator, fmt
from polltuned.errors import ExitCode

HELP = "restore every baseline from the journal (reverse order, idempotent, no daemon needed)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--if-dirty", action="store_true",
                   help="do nothing (silently, exit 0) when the journal says the host is clean (for ExecStopPost)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from polltuned.daemon.status import clear_kept, is_kept

    act = build_actuator(args)
    st = act.state()
    if args.if_dirty and not st.open:
        clear_kept(args.state_dir)
        return int(ExitCode.OK)
    if args.if_dirty and is_kept(args.state_dir, st.epoch, st.open):
        # the daemon exited cleanly with on_exit = keep: its deployed values stay on purpose
        print("polltuned: keeping the deployed configuration (policy on_exit = keep); 'polltuned rollback' undoes it")
        return int(ExitCode.OK)
    clear_kept(args.state_dir)
    rep = act.rollback()
    if args.json:
        print(json.dumps({"clean": rep.clean, "was_dirty": rep.was_dirty,
                          "items": [{"key": i.key, "outcome": i.outcome, "value": i.value, "detail": i.detail}
                                    for i in rep.items]}, indent=2))
    else:
        if not rep.was_dirty:
            print("nothing to roll back: the host is clean")
        for i in rep.items:
            extra = f" ({i.detail})" if i.detail else ""
            print(f"{i.key}: {i.outcome} {fmt(i.value)}{extra}")
    return int(ExitCode.OK if rep.ok else ExitCode.FAILURE)

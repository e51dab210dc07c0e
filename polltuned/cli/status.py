"""``polltuned status``: what polltuned changed, why, how much it helped, and how to undo it."""

from __future__ import annotations

import argparse
import json

from polltuned.errors import ExitCode

HELP = "show the daemon's phase, knobs (original -> current -> best), result and counters"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def host_dirty(args: argparse.Namespace) -> bool | None:
    """Is some knob still carrying a polltuned value? None when the journal cannot be read."""
    from polltuned.cli._knobs_common import build_actuator
    from polltuned.errors import PolltunedError

    try:
        return build_actuator(args).is_dirty()
    except PolltunedError:
        return None


def kept_epoch(args: argparse.Namespace) -> bool:
    """Does a keep marker cover the journal's open epoch (the daemon kept its values on purpose)?"""
    from polltuned.cli._knobs_common import build_actuator
    from polltuned.daemon.status import is_kept
    from polltuned.errors import PolltunedError

    try:
        st = build_actuator(args).state()
    except PolltunedError:
        return False
    return is_kept(args.state_dir, st.epoch, st.open)


def run(args: argparse.Namespace) -> int:
    from polltuned.daemon.render import render_status
    from polltuned.daemon.status import daemon_running, read_status

    running = daemon_running(args.run_dir)
    doc = read_status(args.run_dir) or {}
    dirty = None if running else host_dirty(args)
    kept = (not running) and bool(dirty) and kept_epoch(args)
    if args.json:
        out = dict(doc)
        out["running"] = running
        out["host_dirty"] = dirty
        out["kept_by_daemon"] = kept
        print(json.dumps(out, indent=1, sort_keys=True, default=str))
    else:
        print(render_status(doc, running=running, dirty=dirty))
        if kept:
            print("           (kept on purpose: the policy's on_exit = keep)")
    if not running and dirty:
        return int(ExitCode.DIRTY)
    return int(ExitCode.OK)

"""``polltuned status``: what polltuned changed, why, how much it helped, and how to undo it.

The host is one of: clean (exit 0), dirty (polltuned values still applied and no daemon: exit 3),
or its journal is damaged/unreadable: then status says so, lists what the baseline copy knows,
and exits with the journal's error code (7), never "clean". A journal that cannot be proven
complete (baseline copy missing or damaged) with no known knob off its original is "unknown"
(``error[journal-unverified]``, exit 7). "clean" after a rollback that left an admin-changed knob
alone names that knob."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from polltuned.actuator import JournalHealth
from polltuned.cli._knobs_common import build_actuator, fmt
from polltuned.daemon.render import render_status
from polltuned.daemon.status import daemon_running, is_kept, read_status
from polltuned.errors import ExitCode, JournalUnreadable, PermissionNeeded, PolltunedError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _knob_json(m: Any) -> dict[str, Any]:
    return {"key": m.key, "original": m.baseline, "live": m.live, "state": m.state}


def kept_epoch(args: argparse.Namespace) -> bool:
    """Does a keep marker cover the journal's open epoch (the daemon kept its values on purpose)?"""

    try:
        st = build_actuator(args).state()
    except PolltunedError:
        return False
    return is_kept(args.state_dir, st.epoch, st.open)


def run(args: argparse.Namespace) -> int:
    running = daemon_running(args.run_dir)
    doc = read_status(args.run_dir) or {}
    # a member of group polltuned can read the run directory but not the root-only journal: with
    # the daemon running its status file says it all; stopped, the host state is "unknown"
    denied: PolltunedError | None = None
    try:
        health: JournalHealth | None = build_actuator(args).health()
    except (PermissionNeeded, JournalUnreadable) as e:
        health, denied = None, e
    if health is not None and isinstance(health.error, (PermissionNeeded, JournalUnreadable)):
        denied = health.error
        health = None
    if health is None:
        print(json.dumps({**doc, "running": running}, indent=1, sort_keys=True, default=str) if args.json
              else render_status(doc, running=running, dirty=None))
        if not running and denied is not None:
            raise denied  # stopped: whether the host is clean cannot be known by this user (exit 5)
        return int(ExitCode.OK)
    corrupt = health.state in ("corrupt", "unknown")
    dirty = None if corrupt else health.state == "dirty"
    kept = (not running) and bool(dirty) and kept_epoch(args)
    off_copy = [m for m in health.from_copy if m.state == "polltuned"]
    if args.json:
        out = dict(doc)
        out["running"] = running
        out["host_dirty"] = None if running else dirty
        out["kept_by_daemon"] = kept
        out["journal"] = {"state": health.state, "note": health.note,
                          "error": health.error.message if health.error else None,
                          "error_code": health.error.code if health.error else None,
                          "restorable_from_copy": health.restorable,
                          "released_to_admin": list(health.released),
                          "baseline_copy": [_knob_json(m) for m in health.from_copy]}
        print(json.dumps(out, indent=1, sort_keys=True, default=str))
    else:
        print(render_status(doc, running=running, dirty=None if corrupt else bool(dirty), released=health.released))
        if kept:
            print("           (kept on purpose: the policy's on_exit = keep)")
        if health.note:
            print(f"journal:   note: {health.note}")
        if health.state == "unknown":
            assert health.error is not None
            print(f"journal:   UNVERIFIED: {health.error.message}")
        elif corrupt:
            assert health.error is not None
            print(f"journal:   DAMAGED ({health.error.code}): the journal cannot be trusted; "
                  "status does not know which values are polltuned's")
            if health.from_copy:
                print(f"           the baseline copy lists {len(health.from_copy)} knob(s); "
                      f"{len(off_copy)} not at the original value"
                      + (": " + ", ".join(f"{m.key} (live {fmt(m.live)}, original {fmt(m.baseline)})"
                                          for m in off_copy) if off_copy else ""))
                print("           restore them with: polltuned rollback (from the baseline copy)")
            elif health.restorable:
                print("           the baseline copy shows no knob written since the last complete rollback; "
                      "polltuned rollback sets the damaged journal aside")
            else:
                print("           no usable baseline copy: nothing can be restored automatically")
    if corrupt:
        assert health.error is not None
        print(health.error.render(), file=sys.stderr)
        return int(health.error.exit_code)
    if not running and dirty:
        return int(ExitCode.DIRTY)
    return int(ExitCode.OK)

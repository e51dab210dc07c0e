"""``polltuned rollback [--if-dirty]``: put every knob back to its value before polltuned touched it.

A damaged journal (emptied, head lost, cut inside a baseline record, a bad record) is not "nothing
to do": the knobs are restored from the baseline copy, every item is printed, and the command
still fails with ``error[journal-corrupt]`` (exit 7) naming the damage. A journal that cannot be
proven complete (its copy missing or damaged) is rolled back as far as it records, every knob that
differs from its original restored (never released: the record of polltuned's last write may be
lost), and the command fails with ``error[journal-unverified]`` (exit 7); a state directory that
cannot take a write (disk full, read-only) still gets every knob restored, then
``error[state-not-writable]`` (exit 7)."""

from __future__ import annotations

import argparse
import json
import logging

from polltuned.actuator import JournalRecovered, RollbackReport
from polltuned.cli._knobs_common import build_actuator, fmt
from polltuned.cli._owner import add_force, claim_host
from polltuned.daemon.status import clear_kept, is_kept
from polltuned.errors import ExitCode, JournalError, StateNotWritable

log = logging.getLogger("polltuned.rollback")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--if-dirty", action="store_true",
                   help="do nothing (silently, exit 0) when the journal says the host is clean (for ExecStopPost)")
    p.add_argument("--accept-unknown", action="store_true",
                   help="after an unverified or damaged journal: you checked the knobs by hand; set the journal "
                        "aside and start a fresh one (the host state is known again)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_force(p)


def _print(rep: RollbackReport, as_json: bool, recovered: JournalRecovered | None = None) -> None:
    if as_json:
        doc: dict[str, object] = {
            "clean": rep.clean, "was_dirty": rep.was_dirty,
            "items": [{"key": i.key, "outcome": i.outcome, "value": i.value, "detail": i.detail} for i in rep.items]}
        if rep.problem is not None:
            doc["error"] = rep.problem.message
            doc["error_code"] = rep.problem.code
        if recovered is not None:
            doc["journal_error"] = recovered.damage.message
            doc["restored_from_copy"] = True
            doc["damaged_journal"] = str(recovered.aside) if recovered.aside else None
        print(json.dumps(doc, indent=2))
        return
    if not rep.was_dirty and recovered is None:
        print("nothing to roll back: the host is clean")
    for i in rep.items:
        extra = f" ({i.detail})" if i.detail else ""
        src = " [from the baseline copy]" if recovered is not None else ""
        print(f"{i.key}: {i.outcome} {fmt(i.value)}{src}{extra}")


def _clear_kept(state_dir: str) -> None:
    """Drop the keep marker; a state directory that takes no write (read-only, disk full) must not
    stop the rollback: the knobs matter more (the rollback reports the state directory itself)."""
    try:
        clear_kept(state_dir)
    except StateNotWritable as e:
        log.warning("%s", e.message)


def run(args: argparse.Namespace) -> int:
    act = build_actuator(args)
    claim_host(args, "rollback")
    if args.accept_unknown:
        aside = act.accept_unknown()
        print("accepted: the host state is known again (a fresh journal starts)"
              + (f"; the old journal is kept as {aside}" if aside else ""))
        return int(ExitCode.OK)
    epoch: int | None = None
    try:
        st = act.state()
        is_open, epoch = st.open, st.epoch
    except JournalError:  # damaged or unreadable: not "clean"; the rollback below restores from the copy
        is_open = True
    if args.if_dirty:
        if not is_open:
            _clear_kept(args.state_dir)
            return int(ExitCode.OK)
        if epoch is not None and is_kept(args.state_dir, epoch, is_open):
            # the daemon exited cleanly with on_exit = keep (this journal epoch): its deployed values
            # stay on purpose
            print("polltuned: keeping the deployed configuration (policy on_exit = keep); "
                  "'polltuned rollback' undoes it")
            return int(ExitCode.OK)
    _clear_kept(args.state_dir)
    try:
        rep = act.rollback()
    except JournalRecovered as e:
        _print(e.report, args.json, e)
        raise
    _print(rep, args.json)
    if rep.problem is not None:
        raise rep.problem
    return int(ExitCode.OK if rep.ok else ExitCode.FAILURE)

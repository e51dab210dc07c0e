"""``polltuned report``: a PNG of a policy's study (objective over trials, Pareto front, per-knob effects)."""

from __future__ import annotations

import argparse

from polltuned.cli.history import add_arguments as history_args
from polltuned.cli.history import study_rows
from polltuned.errors import ExitCode, UsageError
from polltuned.report import draw_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    history_args(p)
    p.add_argument("-o", "--output", default="polltuned-report.png", metavar="PNG",
                   help="where to write the PNG (default polltuned-report.png)")


def run(args: argparse.Namespace) -> int:
    name, rows = study_rows(args)
    if not rows:
        raise UsageError(f"policy {name}: no recorded trials in {args.state_dir} to draw")
    path = draw_report(rows, args.output, title=f"polltuned — {name}")
    print(f"wrote {path} ({len(rows)} windows)")
    return int(ExitCode.OK)

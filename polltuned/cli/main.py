"""The ``polltuned`` command line.

Each subcommand is a module exposing ``HELP: str``, ``add_arguments(parser)`` and
``run(args) -> int``. The registry below is explicit (no discovery by file name) and modules are
imported lazily so ``polltuned --help`` stays fast and heavy imports (skopt) happen only when used.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from polltuned.errors import ExitCode, PolltunedError

#: subcommand -> module implementing it
COMMANDS: dict[str, str] = {
    "sim": "polltuned.cli.sim",
    "check": "polltuned.cli.check",
    "apply": "polltuned.cli.apply",
    "rollback": "polltuned.cli.rollback",
    "verify": "polltuned.cli.verify",
    "top": "polltuned.cli.top",
    "bench": "polltuned.cli.bench",
    "run": "polltuned.cli.run",
    "status": "polltuned.cli.status",
    "history": "polltuned.cli.history",
    "report": "polltuned.cli.report",
}

DEFAULT_STATE_DIR = "/var/lib/polltuned"
DEFAULT_RUN_DIR = "/run/polltuned"


def _load(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name])


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="polltuned",
        description="Measured, reversible tuning of Linux network polling knobs.",
    )
    p.add_argument("--host-root", default="/", metavar="DIR",
                   help="root of the /proc and /sys trees to use (default /; tests use fixtures)")
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR, metavar="DIR",
                   help=f"journal and trial history (default {DEFAULT_STATE_DIR})")
    p.add_argument("--run-dir", default=DEFAULT_RUN_DIR, metavar="DIR",
                   help=f"status file and lock (default {DEFAULT_RUN_DIR})")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        if name != only:
            # cheap placeholder so --help lists every command without importing it
            sub.add_parser(name)
            continue
        mod = _load(name)
        sp = sub.add_parser(name, help=getattr(mod, "HELP", None), description=getattr(mod, "HELP", None))
        mod.add_arguments(sp)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args_list if a in COMMANDS), None)
    parser = build_parser(only=command)
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return int(ExitCode.USAGE)
    try:
        rc: int = _load(args.command).run(args)
        return rc
    except PolltunedError as e:
        if args.debug:
            raise
        print(e.render(), file=sys.stderr)
        return int(e.exit_code)
    except KeyboardInterrupt:
        print("polltuned: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return int(ExitCode.OK)

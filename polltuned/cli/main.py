"""The ``polltuned`` command line.

Each subcommand is a module exposing ``add_arguments(parser)`` and ``run(args) -> int``; its
one-line summary lives in the registry below, so ``polltuned --help`` lists every command without
importing any of them. The registry is explicit (no discovery by file name) and modules are
imported lazily so heavy imports (skopt) happen only when used.

Every failure is one line on stderr, ``polltuned: error[<code>]: <message>`` (plus an optional
``  hint:`` line), with a named exit code (polltuned.errors.ExitCode): argparse's own errors too.
Tracebacks only with ``--debug``; an unexpected exception is ``error[internal]``.
"""

from __future__ import annotations

import argparse
import errno as errno_mod
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn

from polltuned.errors import ExitCode, PermissionNeeded, PolltunedError, UsageError

#: subcommand -> (module implementing it, one-line summary for --help and the man page)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("polltuned.cli.run", "run the tuning daemon in the foreground (what the systemd unit starts)"),
    "status": ("polltuned.cli.status",
               "show the daemon's phase, knobs (original -> current -> best), result, counters and journal health"),
    "rollback": ("polltuned.cli.rollback",
                 "restore every original value from the journal (reverse order, idempotent, no daemon needed)"),
    "verify": ("polltuned.cli.verify",
               "re-read every managed knob: holds / admin-changed / partly-released / kernel-reset / gone"),
    "apply": ("polltuned.cli.apply",
              "apply knob values as one journaled transaction (undone as a whole if any write fails)"),
    "check": ("polltuned.cli.check",
              "list every knob on this host (present, writable, value, domain, reason) and other owners"),
    "top": ("polltuned.cli.top", "live per-CPU softirq/IRQ/CPU view of the network path"),
    "history": ("polltuned.cli.history", "list the measurement windows and trials recorded for a policy"),
    "report": ("polltuned.cli.report", "draw the recorded trials of a policy to a PNG"),
    "bench": ("polltuned.cli.bench",
              "tune this host on the embedded netns+veth world (sockperf, nginx or memcached), then compare "
              "defaults/static/deployed (and an oracle) interleaved"),
    "sim": ("polltuned.cli.sim", "tune a simulated scenario with the real engine on a fake kernel tree"),
    "man": ("polltuned.cli.man", "print this manual page (roff, generated from the parser) to stdout"),
}

DEFAULT_STATE_DIR = "/var/lib/polltuned"
DEFAULT_RUN_DIR = "/run/polltuned"
DESCRIPTION = "Measured, reversible tuning of Linux network polling knobs."
#: global options that take a value (to find the command word in argv)
_GLOBAL_VALUED = ("--host-root", "--state-dir", "--run-dir")


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``polltuned: error[usage]`` line (a UsageError), and no
    abbreviated options (``--o`` is not ``--output``: a typo must not become a file name)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix("polltuned").strip()
        raise UsageError(f"{where + ': ' if where else ''}{message}", hint=f"{self.prog} --help")


def _load(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name][0])


def build_parser(only: str | None = None, *, full: bool = False) -> Parser:
    """The parser. ``only``: build that command's options (the others are cheap placeholders that
    still carry their summary); ``full``: build every command (for the man page and tests)."""
    p = Parser(prog="polltuned", description=DESCRIPTION)
    p.add_argument("--host-root", default="/", metavar="DIR",
                   help="root of the /proc and /sys trees to use (default /; tests use fixtures)")
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR, metavar="DIR",
                   help=f"journal, baseline copy and trial history (default {DEFAULT_STATE_DIR})")
    p.add_argument("--run-dir", default=DEFAULT_RUN_DIR, metavar="DIR",
                   help=f"status file and lock (default {DEFAULT_RUN_DIR})")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, (_, summary) in COMMANDS.items():
        sp = sub.add_parser(name, help=summary, description=summary)
        if full or name == only:
            _load(name).add_arguments(sp)
    return p


def command_word(argv: Sequence[str]) -> str | None:
    """The subcommand in ``argv``, skipping the values of global options."""
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in _GLOBAL_VALUED:
            skip = True
            continue
        if a.startswith("-"):
            continue
        return a if a in COMMANDS else None
    return None


def _os_error(e: OSError) -> PolltunedError:
    what = e.filename if e.filename is not None else "polltuned"
    why = e.strerror or str(e)
    if e.errno in (errno_mod.EACCES, errno_mod.EPERM):
        return PermissionNeeded(f"{what}: {why}", hint="run polltuned as root (sudo)")
    return PolltunedError(f"{what}: {why}", code="os-error")


def _check_dirs(args: argparse.Namespace) -> None:
    """``--state-dir``/``--run-dir`` that exist but are not directories: one usage line, before any
    command half-works with them (apply succeeding and status failing)."""
    import os

    for opt in ("state_dir", "run_dir"):
        d = getattr(args, opt, None)
        if d and os.path.lexists(d) and not os.path.isdir(d):
            raise UsageError(f"--{opt.replace('_', '-')} {d}: exists and is not a directory")


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    try:
        parser = build_parser(only=command_word(args_list))
        args = parser.parse_args(args_list)
        if args.command is None:
            parser.print_help()
            return int(ExitCode.USAGE)
        _check_dirs(args)
        rc: int = _load(args.command).run(args)
        return rc
    except PolltunedError as e:
        if debug:
            raise
        print(e.render(), file=sys.stderr)
        return int(e.exit_code)
    except KeyboardInterrupt:
        print("polltuned: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return int(ExitCode.OK)
    except OSError as e:
        if debug:
            raise
        err = _os_error(e)
        print(err.render(), file=sys.stderr)
        return int(err.exit_code)
    except Exception as e:  # the last line of defence: still one line, never a traceback
        if debug:
            raise
        err = PolltunedError(f"unexpected {type(e).__name__}: {e}", code="internal",
                             hint="this is a bug: run again with --debug for the traceback and report it")
        print(err.render(), file=sys.stderr)
        return int(ExitCode.FAILURE)

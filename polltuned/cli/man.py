"""``polltuned man``: the manual page polltuned(8), generated from the argparse tree as roff.

Generated, not written by hand, so it cannot drift from the parser: every command with its
summary, every option with its help, the exit codes from polltuned.errors.ExitCode, and the
files. ``config/install.sh`` installs it to /usr/local/share/man/man8/polltuned.8.
"""

from __future__ import annotations

import argparse
import sys

from polltuned.cli.main import COMMANDS, build_parser
from polltuned.errors import ExitCode

_EXIT_MEANING: dict[ExitCode, str] = {
    ExitCode.OK: "success (status: the host is clean or the daemon is running)",
    ExitCode.FAILURE: "a runtime failure (a rollback item failed, an unexpected error)",
    ExitCode.USAGE: "bad input: a command-line value, policy or config file is invalid",
    ExitCode.DIRTY: "status: no daemon is running and the host still carries polltuned values",
    ExitCode.UNSUPPORTED: "a knob or capability is missing on this host",
    ExitCode.PERMISSION: "not permitted: run as root",
    ExitCode.LOCKED: "another polltuned holds the lock",
    ExitCode.JOURNAL: "the journal is damaged or unreadable (rollback restores from the baseline copy)",
    ExitCode.PROBE: "a latency measurement failed",
}

_FILES = (
    ("/var/lib/polltuned/journal.jsonl",
     "the append-only, fsync'd journal of original values, intents and writes (JSON lines, CRC per record)"),
    ("/var/lib/polltuned/journal.baselines.json",
     "a second, independent copy of the original values, written before the first write of a knob; "
     "rollback restores from it when the journal is damaged"),
    ("/run/polltuned/status.json", "the running daemon's status document"),
    ("/etc/polltuned/polltuned.toml", "the daemon configuration"),
    ("/etc/polltuned/policies, /usr/share/polltuned/policies", "policies (TOML), looked up by name"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", metavar="FILE", default=None,
                   help="write the page to FILE instead of stdout")


def esc(text: str) -> str:
    """Text -> roff: backslashes and hyphens escaped, non-ASCII as \\[uXXXX], no control lines."""
    out = []
    for c in text:
        if c == "\\":
            out.append("\\e")
        elif c == "-":
            out.append("\\-")
        elif ord(c) > 126:
            out.append(f"\\[u{ord(c):04X}]")
        elif c in "\n\r\t":
            out.append(" ")
        elif c.isprintable():
            out.append(c)
    s = "".join(out)
    return "\\&" + s if s[:1] in (".", "'") else s


def _option_head(a: argparse.Action) -> str:
    if not a.option_strings:
        return f"\\fI{esc(str(a.metavar or a.dest))}\\fR"
    names = ", ".join(f"\\fB{esc(o)}\\fR" for o in a.option_strings)
    if a.nargs == 0:
        return names
    mv = a.metavar if a.metavar is not None else (
        "{" + ",".join(str(c) for c in a.choices) + "}" if a.choices else a.dest.upper())
    return f"{names} \\fI{esc(str(mv))}\\fR"


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _synopsis(name: str, parser: argparse.ArgumentParser) -> str:
    parts = [f"\\fBpolltuned\\fR [\\fIglobal options\\fR] \\fB{esc(name)}\\fR"]
    for a in _options(parser):
        if a.option_strings:
            parts.append(f"[{_option_head(a)}]")
        else:
            head = _option_head(a)
            parts.append(f"[{head}]" if a.nargs == "?" else (f"{head} ..." if a.nargs in ("+", "*") else head))
    return " ".join(parts)


def _describe(lines: list[str], parser: argparse.ArgumentParser) -> None:
    for a in _options(parser):
        lines.append(".TP")
        lines.append(_option_head(a))
        lines.append(esc(a.help or ""))


def render(parser: argparse.ArgumentParser) -> str:
    """The whole page for a fully built parser (``build_parser(full=True)``)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    lines = [
        '.TH POLLTUNED 8 "" "polltuned" "System Administration"',
        ".SH NAME",
        "polltuned \\- " + esc((parser.description or "").rstrip(".")),
        ".SH SYNOPSIS",
        "\\fBpolltuned\\fR [\\fIglobal options\\fR] \\fICOMMAND\\fR [\\fIoptions\\fR]",
        ".SH DESCRIPTION",
        esc("polltuned finds the network-polling settings (busy polling, NAPI deferral, GRO batching, "
            "timer migration, IRQ affinity, virtualisation spin knobs) that give the running workload the "
            "lowest tail latency per unit of CPU, applies them, watches them, and can always put the host "
            "back as it found it: every change is journaled before it is written."),
        ".PP",
        esc("Errors are one line on standard error, polltuned: error[CODE]: MESSAGE, optionally followed "
            "by a hint line; tracebacks only with --debug."),
        ".SH GLOBAL OPTIONS",
    ]
    _describe(lines, parser)
    lines.append(".SH COMMANDS")
    for name, sp in sub.choices.items():
        lines.append(f'.SS "{esc(name)}"')
        lines.append(esc(COMMANDS[name][1]) + ".")
        lines.append(".PP")
        lines.append(_synopsis(name, sp))
        _describe(lines, sp)
    lines.append(".SH EXIT STATUS")
    for code in ExitCode:
        lines.append(".TP")
        lines.append(f"\\fB{int(code)}\\fR ({esc(code.name.lower())})")
        lines.append(esc(_EXIT_MEANING[code]))
    lines.append(".SH FILES")
    for path, what in _FILES:
        lines.append(".TP")
        lines.append(f"\\fI{esc(path)}\\fR")
        lines.append(esc(what))
    lines.append(".SH SEE ALSO")
    lines.append("\\fBsysctl\\fR(8), \\fBtuned\\fR(8), \\fBirqbalance\\fR(1), \\fBsystemctl\\fR(1), "
                 "\\fBsockperf\\fR(1)")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    page = render(build_parser(full=True))
    if args.output:
        with open(args.output, "w", encoding="ascii") as fh:
            fh.write(page)
    else:
        sys.stdout.write(page)
    return int(ExitCode.OK)

"""Shared wiring for the knob subcommands (check/apply/rollback/verify)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from polltuned.actuator import Actuator
from polltuned.actuator import build_actuator as make_actuator
from polltuned.clock import SystemClock
from polltuned.errors import UsageError
from polltuned.host.cpus import parse_cpu_list
from polltuned.host.fs import FsHost
from polltuned.records import KnobValue


def add_app_cpus(p: argparse.ArgumentParser) -> None:
    p.add_argument("--app-cpus", default="", metavar="LIST",
                   help="application CPUs (kernel list form, e.g. 0-1,4) for pack-app/avoid-app strategies")


def app_cpus(args: argparse.Namespace) -> list[int]:
    text = getattr(args, "app_cpus", "") or ""
    try:
        return parse_cpu_list(text, "--app-cpus")
    except Exception:
        raise UsageError(f"--app-cpus: {text!r} is not a CPU list (e.g. 0-1,4)") from None


def make_host(args: argparse.Namespace) -> FsHost:
    """The host of ``--host-root``, refused unless it is a /proc + /sys tree: a typo must not make
    every knob look vanished (rollback would record them "gone" and forget their originals)."""
    root = Path(args.host_root)
    if not root.is_dir():
        raise UsageError(f"--host-root {args.host_root}: no such directory")
    if root.resolve() != Path("/") and not ((root / "proc").is_dir() or (root / "sys").is_dir()):
        raise UsageError(f"--host-root {args.host_root}: neither proc/ nor sys/ in it: not a /proc + /sys tree")
    return FsHost(root)


def build_actuator(args: argparse.Namespace) -> Actuator:
    """The actuator of ``--host-root``, ``--state-dir`` and ``--app-cpus`` (polltuned.actuator's builder)."""
    return make_actuator(make_host(args), Path(args.state_dir), SystemClock(), app_cpus=app_cpus(args))


_ASCII_INT = re.compile(r"[+-]?[0-9]{1,30}", re.ASCII)


def parse_assignment_value(text: str) -> KnobValue:
    """CLI value: an integer when it is ASCII decimal digits (not ``²`` or ``٣``), else the string
    (strategy names; the knob's validation refuses what it cannot take)."""
    t = text.strip()
    if _ASCII_INT.fullmatch(t):
        return int(t)
    return t


def fmt(v: object) -> str:
    return "-" if v is None else str(v)

"""``polltuned history``: the trials of a policy's study (durable, from the state directory)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from polltuned.daemon.config import load_config
from polltuned.daemon.render import study_lines
from polltuned.errors import ExitCode, UsageError
from polltuned.host.fs import FsHost
from polltuned.policy.loader import load_policy
from polltuned.study.select import open_for_host


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", metavar="NAME|FILE", help="policy name or file (default: the config's policy)")
    p.add_argument("--config", default="/etc/polltuned/polltuned.toml", metavar="FILE",
                   help="daemon config naming the policy when --policy is not given "
                        "(default /etc/polltuned/polltuned.toml)")
    p.add_argument("--nic", metavar="DEV", help="the nic the policy's {nic} knobs were resolved with")
    p.add_argument("--session", metavar="ID", help="only this session id (default: the latest)")
    p.add_argument("--all", action="store_true", help="every session, not only the latest")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def open_store(args: argparse.Namespace) -> tuple[Any, Any]:
    """(policy, the policy's study store as the daemon config's ``[study]`` names it)."""

    ref, nic = args.policy, args.nic
    cfg = load_config(args.config) if Path(args.config).is_file() else None
    if ref is None:
        if cfg is None:
            raise UsageError("no --policy given and no daemon config at " + args.config)
        ref, nic = cfg.policy, nic or cfg.nic
    pol = load_policy(ref, nic=nic)
    store = open_for_host(cfg.study if cfg is not None else None, args.state_dir, pol,
                          FsHost(getattr(args, "host_root", "/")))
    return pol, store


def study_rows(args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    """(policy name, one row per window record of the chosen session(s)) from the study."""
    name, rows, _info = study_history(args)
    return name, rows


def study_history(args: argparse.Namespace) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """(policy name, window rows of the chosen session(s), the store's description)."""
    pol, store = open_store(args)
    try:
        logs = store.sessions()
        if hasattr(store, "refresh"):
            store.refresh()
        info = store.describe().to_json()
    finally:
        store.close()
    sessions = [s.session for s in logs]
    if not sessions:
        return pol.name, [], info
    if args.session:
        if args.session not in sessions:
            raise UsageError(f"--session: {args.session!r} not in {sessions}")
        wanted = {args.session}
    else:
        wanted = set(sessions) if args.all else {sessions[-1]}
    rows = []
    for s in logs:
        if s.session not in wanted:
            continue
        for w in s.windows:
            sc = w.score or {}
            rows.append({"session": s.session, "trial": w.trial, "phase": w.phase, "status": w.status,
                         "config": w.config, "objective": w.value, "latency_us": sc.get("latency_us"),
                         "cpu_cores": sc.get("cpu_cores"), "reasons": sc.get("reasons") or []})
    return pol.name, rows, info


def run(args: argparse.Namespace) -> int:
    name, rows, info = study_history(args)
    if args.json:
        print(json.dumps({"policy": name, "study": info, "windows": rows}, indent=1, default=str))
        return int(ExitCode.OK)
    for line in study_lines(info):
        print(line)
    if not rows:
        print(f"policy {name}: no recorded trials in {args.state_dir}")
        return int(ExitCode.OK)

    def f(x: Any) -> str:
        return "-" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))

    print(f"policy {name}: {len(rows)} windows (session {rows[-1]['session']})")
    print(f"{'trial':>5}  {'phase':<9} {'status':<10} {'objective':>10} {'latency µs':>10} {'cpu':>6}  config")
    for r in rows:
        cfg = ", ".join(f"{k}={v}" for k, v in r["config"].items())
        print(f"{f(r['trial']):>5}  {f(r['phase']):<9} {f(r['status']):<10} {f(r['objective']):>10} "
              f"{f(r['latency_us']):>10} {f(r['cpu_cores']):>6}  {cfg}")
    return int(ExitCode.OK)

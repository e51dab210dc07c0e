"""``polltuned history``: the trials of a policy's study (durable, from the state directory)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from polltuned.errors import ExitCode, UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", metavar="NAME|FILE", help="policy name or file (default: the config's policy)")
    p.add_argument("--config", default="/etc/polltuned/polltuned.toml", metavar="FILE",
                   help="daemon config naming the policy when --policy is not given "
                        "(default /etc/polltuned/polltuned.toml)")
    p.add_argument("--nic", metavar="DEV", help="the nic the policy's {nic} knobs were resolved with")
    p.add_argument("--session", metavar="ID", help="only this session id (default: the latest)")
    p.add_argument("--all", action="store_true", help="every session, not only the latest")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def study_rows(args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    """(policy name, one row per window record of the chosen session(s)) from the study file."""
    from polltuned.daemon.config import load_config
    from polltuned.policy.loader import load_policy
    from polltuned.study import Study

    ref, nic = args.policy, args.nic
    if ref is None:
        if not Path(args.config).is_file():
            raise UsageError("no --policy given and no daemon config at " + args.config)
        cfg = load_config(args.config)
        ref, nic = cfg.policy, nic or cfg.nic
    pol = load_policy(ref, nic=nic)
    st = Study.open(args.state_dir, pol)
    records = [json.loads(line) for line in st.text().splitlines() if line.strip().startswith("{")
               and line.strip().endswith("}")]
    sessions = [r["session"] for r in records if r.get("kind") == "session"]
    if not sessions:
        return pol.name, []
    if args.session:
        if args.session not in sessions:
            raise UsageError(f"--session: {args.session!r} not in {sessions}")
        wanted = {args.session}
    else:
        wanted = set(sessions) if args.all else {sessions[-1]}
    rows = []
    for r in records:
        if r.get("kind") != "window" or r.get("session") not in wanted:
            continue
        sc = r.get("score") or {}
        rows.append({"session": r["session"], "trial": r.get("trial"), "phase": r.get("phase"),
                     "status": r.get("status"), "config": r.get("config") or {}, "objective": r.get("value"),
                     "latency_us": sc.get("latency_us"), "cpu_cores": sc.get("cpu_cores"),
                     "reasons": sc.get("reasons") or []})
    return pol.name, rows


def run(args: argparse.Namespace) -> int:
    name, rows = study_rows(args)
    if args.json:
        print(json.dumps({"policy": name, "windows": rows}, indent=1, default=str))
        return int(ExitCode.OK)
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

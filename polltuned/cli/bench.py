"""``polltuned bench``: tune this host's real knobs on the embedded netns + veth + sockperf world.

Needs root. Creates ``ptb-c``/``ptb-s`` with a veth pair (198.18.230.0/24), runs the real engine on
the real host knobs with the workload's shipped policy (``bench``; ``bench-nginx`` and
``bench-memcached`` for the application workloads), compares kernel defaults, tuned's static
busy_read=busy_poll=50, the deployed configuration (and with ``--oracle`` the oracle's best)
interleaved, prints the table with 95 % CIs, and always restores every knob, stops the servers and
removes the namespaces (also on failure and Ctrl-C).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
from pathlib import Path

from polltuned.bench.mix import (
    DEFAULT_PHASE_S,
    DEFAULT_SCHEDULE,
    MixPaths,
    MixSettings,
    mix_recover_daemon,
    parse_schedule,
    render_mix_table,
    run_mix,
    stop_leftover_daemon,
)
from polltuned.bench.rates import parse_rates, render_rates_table, run_rates
from polltuned.bench.run import run_bench
from polltuned.bench.session import BenchSettings, recover
from polltuned.bench.table import render_table
from polltuned.bench.world import WORKLOADS, get_workload
from polltuned.cli._types import SEED, finite_float, int_range
from polltuned.clock import SystemClock
from polltuned.errors import LockedError, PermissionNeeded, UsageError
from polltuned.host.fs import FsHost

LOCK = "/tmp/polltuned-realkernel.lock"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default="single", choices=[*WORKLOADS, "mix"],
                   help="single (default), parallel, shared-cpu, cpu-hog (sockperf); nginx (nginx + wrk); "
                        "memcached (memcached + polltuned's closed-loop GET client); mix (the daemon, "
                        "unattended, while the client load alternates: see --phases, --phase-s)")
    p.add_argument("--phases", metavar="LOAD,LOAD,...", default=None,
                   help="--workload mix: the loads in order, each for --phase-s (default "
                        "single,shared,single,shared; sockperf loads: single, shared; memcached loads, one "
                        "open-loop client at a low and a high rate: kv-low, kv-high; one server per run)")
    p.add_argument("--phase-s", type=finite_float(5, 86400), metavar="S", default=None,
                   help="--workload mix: seconds per phase (default 150: the whole run takes ~15 minutes)")
    p.add_argument("--rates", metavar="R,R,...", default=None,
                   help="load points (memcached, nginx): percentages of the capacity measured first under the "
                        "defaults (closed loop), e.g. 20%%,60%%,90%%, or requests/s, e.g. 5000,20000; the engine "
                        "tunes with the open-loop client at each rate; one table block per rate")
    p.add_argument("--policy", metavar="NAME|FILE",
                   help="policy (default: the workload's: bench, bench-nginx or bench-memcached)")
    p.add_argument("--no-seeds", action="store_true", help="remove every 'seeds' entry from the policy")
    p.add_argument("--budget", type=int_range(3, 10_000), metavar="N",
                   help="search windows, 3..10000 (default: the policy's)")
    p.add_argument("--window", type=finite_float(0, 3600), metavar="S",
                   help="seconds per window, > 0 and <= 3600 (default: the policy's)")
    p.add_argument("--rounds", type=int_range(1, 100), default=None, metavar="N",
                   help="at least N interleaved rounds of the final comparison, 1..100 (default 8; 6 per load for "
                        "--workload mix); more, up to --max-rounds, until every arm's 95%% CI of J is within ±15%%")
    p.add_argument("--max-rounds", type=int_range(1, 200), metavar="N",
                   help="hard cap on comparison rounds (default 2 x --rounds)")
    p.add_argument("--oracle", metavar="FILE",
                   help="JSON from benchmarks/oracle.py: measure its best configuration for this workload as a "
                        "fourth arm of the final comparison")
    p.add_argument("--wait-quiet", type=finite_float(0, 86400), metavar="S",
                   help="first wait up to S seconds until the whole machine uses <= 0.15 cores for 10 s "
                        "(other processes disturb latency); then start anyway")
    p.add_argument("--seed", type=SEED, metavar="N", help="optimiser seed, 0..2^32-1 (default: the policy's)")
    p.add_argument("--record", metavar="FILE", help="append every window as JSON lines (replay input)")
    p.add_argument("--report", metavar="PNG", help="draw the trials report to this file")
    p.add_argument("--json", action="store_true", help="print the result as one JSON document")
    p.add_argument("--cleanup", action="store_true",
                   help="only undo what a crashed bench left (knobs from its journal, ptb-* namespaces and the "
                        "servers and clients in them, the nginx/memcached directory), then exit")
    p.add_argument("--no-lock", action="store_true",
                   help=f"do not take {LOCK} (only when the caller already holds it)")


def run(args: argparse.Namespace) -> int:
    host = FsHost(args.host_root)
    if not host.is_real:
        raise UsageError("bench runs on the real kernel only (--host-root must be /)")
    if os.geteuid() != 0:
        raise PermissionNeeded("bench needs root: it creates network namespaces and changes kernel knobs",
                               hint="sudo polltuned bench")
    if args.budget is not None and args.budget < 3:
        raise UsageError(f"--budget: must be >= 3 (got {args.budget})")
    if args.rounds is None:
        args.rounds = 6 if args.workload == "mix" else 8
    if args.rounds < 1:
        raise UsageError(f"--rounds: must be >= 1 (got {args.rounds})")
    if args.wait_quiet is not None and not (0 <= args.wait_quiet <= 86400):
        raise UsageError(f"--wait-quiet: must be in [0, 86400] seconds (got {args.wait_quiet})")
    if args.max_rounds is not None and args.max_rounds < args.rounds:
        raise UsageError(f"--max-rounds: must be >= --rounds (got {args.max_rounds} < {args.rounds})")
    if args.oracle is not None and not Path(args.oracle).is_file():
        raise UsageError(f"--oracle: no such file (got {args.oracle})")
    settings = BenchSettings(
        workload=args.workload, policy=args.policy, budget=args.budget, window_s=args.window,
        compare_rounds=args.rounds, max_rounds=args.max_rounds, seed=args.seed,
        state_dir=Path(args.state_dir) / "bench",
        record=Path(args.record) if args.record else None, report=Path(args.report) if args.report else None,
        no_seeds=args.no_seeds, oracle=Path(args.oracle) if args.oracle else None, wait_quiet_s=args.wait_quiet)
    mix = None
    if args.workload == "mix":
        if args.oracle is not None or args.record or args.report or args.no_seeds or args.seed is not None:
            raise UsageError("--workload mix: --oracle, --record, --report, --no-seeds and --seed do not apply "
                             "(its oracle is a sweep measured per load; the daemon runs the policy as written)")
        mix = MixSettings(
            schedule=parse_schedule(args.phases) if args.phases else DEFAULT_SCHEDULE,
            phase_s=args.phase_s if args.phase_s is not None else DEFAULT_PHASE_S, policy=args.policy,
            budget=args.budget, window_s=args.window, compare_rounds=args.rounds,
            # the mix run is long already: no extension past --rounds unless --max-rounds asks for it
            max_rounds=args.max_rounds if args.max_rounds is not None else args.rounds,
            state_dir=Path(args.state_dir) / "bench", wait_quiet_s=args.wait_quiet)
    elif args.phases is not None or args.phase_s is not None:
        raise UsageError("--phases and --phase-s apply to --workload mix only")
    rates = None
    if args.rates is not None:
        if mix is not None:
            raise UsageError("--rates does not apply to --workload mix")
        if args.report:
            raise UsageError("--rates: --report draws one run's trials; use --json for every rate's")
        rates = parse_rates(args.rates)

        if get_workload(args.workload).app == "sockperf":
            raise UsageError(f"--rates: workload {args.workload} is sockperf ping-pong (closed loop only)",
                             hint="--rates needs an open-loop client: --workload memcached or nginx")
    fd = -1
    if not args.no_lock:
        fd = os.open(LOCK, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"polltuned: waiting for {LOCK} (another real-kernel run is active)", file=sys.stderr)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except KeyboardInterrupt:
                os.close(fd)
                raise LockedError(f"{LOCK} is held by another run") from None

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        if args.cleanup:
            mpaths = MixPaths(settings.state_dir / "mix")
            stop_leftover_daemon(mpaths, host=host, clock=SystemClock(), progress=progress)
            mixed = mix_recover_daemon(mpaths, host=host, clock=SystemClock(), progress=progress)
            dirty, removed = recover(settings.state_dir, host=host, clock=SystemClock(), progress=progress)
            print(f"knobs rolled back: {'yes' if dirty or mixed else 'nothing to do'}; "
                  f"namespaces removed: {', '.join(removed) or 'none'}")
            return 0
        if mix is not None:
            mres = run_mix(mix, host=host, clock=SystemClock(), progress=progress)
        elif rates is not None:
            rres = run_rates(settings, rates, host=host, clock=SystemClock(), progress=progress)
        else:
            res = run_bench(settings, host=host, clock=SystemClock(), progress=progress)
    finally:
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
    if mix is not None:
        if args.json:
            progress(render_mix_table(mres))   # the table on stderr, the document on stdout
        print(json.dumps(mres.to_json(), indent=1, default=str) if args.json else render_mix_table(mres))
        return 0 if mres.restored else 1
    if rates is not None:
        print(json.dumps(rres.to_json(), indent=1, default=str) if args.json else render_rates_table(rres))
        return 0 if rres.restored else 1
    if args.json:
        print(json.dumps(res.to_json(), indent=1, default=str))
    else:
        print(render_table(res))
        if args.report:
            print(f"report: {args.report}")
    return 0 if res.restored else 1

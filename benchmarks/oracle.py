"""The oracle: the best J this host can reach on a bench workload, by exhaustive coarse sweep.

    sudo .venv/bin/python benchmarks/oracle.py --workload single --workload nginx --workload memcached \
        --out oracle.json [--reps 3] [--window 2] [--seed 0]

Per workload it builds the bench world (``polltuned bench``'s, same policy and probe), then measures
every configuration of a coarse grid

    net.core.busy_read  {0, 25, 50, 100}  x  net.core.busy_poll {0, 25, 50, 100}
    x  deferral on the server veth: off (the veth's values) or napi_defer_hard_irqs=2 + gro_flush_timeout=20000

(32 configurations; every other knob stays at its value at start), ``--reps`` windows each,
interleaved: in every repetition all configurations once, in an order shuffled per repetition (seeded)
so drift spreads over all of them. Each window is scored with the workload policy's objective; a
configuration's J is the geometric mean over its windows with a 95 % CI on the log scale
(the bench's arm summary, polltuned.bench.comparison.summarise_arm). The best configuration
(lowest J, among those with at least half of their windows valid) is this host's oracle.

Writes (merging into an existing --out file, one entry per workload)::

    {"v": 1, "workloads": {"nginx": {"best": {"config": {...}, "label": "br50 bp50 defer", "objective": J,
     "objective_ci95": [lo, hi]}, "default": {...}, "configs": [...], "foreign_cores": ..,
     "steal_cores": .., "duration_s": .., "windows": N, ...}}}

``polltuned bench --workload W --oracle FILE`` then measures the oracle's best as a fourth arm of its
final comparison, interleaved with default / static / deployed in the same run.

Holds /tmp/polltuned-realkernel.lock for the whole run; every knob is rolled back and the world
removed after each workload (also on failure and Ctrl-C). About 96 windows per workload:
~3 s each for nginx/memcached, ~5 s for sockperf (its 2.2 s start-up).
"""

from __future__ import annotations

import argparse
import fcntl
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

LOCK = "/tmp/polltuned-realkernel.lock"
BUSY_READ = (0, 25, 50, 100)
BUSY_POLL = (0, 25, 50, 100)
DEFER_ON = {"napi_defer_hard_irqs": 2, "gro_flush_timeout": 20000}


def grid(nic: str, busy_read: Sequence[int] = BUSY_READ, busy_poll: Sequence[int] = BUSY_POLL,
         deferral: Sequence[bool] = (False, True)) -> list[tuple[str, dict[str, int | None]]]:
    """Pure: (label, overrides) per configuration. A deferral value of None means "the value the
    veth had at start" (deferral off)."""
    out: list[tuple[str, dict[str, int | None]]] = []
    for br, bp, d in itertools.product(busy_read, busy_poll, deferral):
        cfg: dict[str, int | None] = {"net.core.busy_read": br, "net.core.busy_poll": bp}
        for k, v in DEFER_ON.items():
            cfg[f"{nic}:{k}"] = v if d else None
        out.append((f"br{br} bp{bp}" + (" defer" if d else ""), cfg))
    return out


def resolve(overrides: Mapping[str, int | None], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Pure: the full assignment: defaults, overridden where the value is not None."""
    return {**defaults, **{k: v for k, v in overrides.items() if v is not None and k in defaults}}


def schedule(n_configs: int, reps: int, seed: int) -> list[int]:
    """Pure: configuration indices, every configuration once per repetition, shuffled per repetition."""
    rng = random.Random(seed)
    order: list[int] = []
    for _ in range(reps):
        idx = list(range(n_configs))
        rng.shuffle(idx)
        order += idx
    return order


def aggregate(labels: Sequence[str], configs: Sequence[Mapping[str, Any]], results: Sequence[tuple[int, Any]],
              objective: Any, level: float = 0.95) -> dict[str, Any]:
    """Pure: per configuration the geometric-mean J with its log-scale CI, median p99, mean CPU;
    the best configuration (lowest J with at least half its windows valid) and the default's row
    (the first configuration whose assignment equals the defaults, if any)."""
    from polltuned.bench.comparison import summarise_arm

    by: dict[int, list[Any]] = {}
    for i, w in results:
        by.setdefault(i, []).append(w)

    def r(x: float) -> float | None:
        return round(x, 3) if math.isfinite(x) else None

    rows: list[dict[str, Any]] = []
    for i, (label, cfg) in enumerate(zip(labels, configs)):
        ws = by.get(i, [])
        # the bench's own arm summary: geometric-mean J and its log-scale CI, median p99, mean CPU
        a = summarise_arm(label, cfg, ws, objective, level=level)
        js = [j for j in a.values if j is not None]
        rows.append({"label": label, "config": dict(cfg), "windows": a.windows, "valid": len(js),
                     "objective": r(a.objective), "objective_ci95": [r(a.objective_ci[0]), r(a.objective_ci[1])],
                     "p99_us": r(a.p99), "cpu_cores": r(a.cpu_cores),
                     "objective_samples": [r(j) for j in js]})
    eligible = [row for row in rows if row["objective"] is not None and row["valid"] * 2 >= max(1, row["windows"])]
    best = min(eligible, key=lambda row: row["objective"]) if eligible else None
    # configurations the sweep cannot tell apart from the best: their CI reaches the best's
    ties: list[str] = []
    if best is not None and best["objective_ci95"][1] is not None:
        ties = [row["label"] for row in eligible if row is not best and row["objective_ci95"][0] is not None
                and row["objective_ci95"][0] <= best["objective_ci95"][1]]
    return {"configs": rows, "best": best, "indistinguishable_from_best": ties}


def sweep(workload: str, *, reps: int, window_s: float | None, seed: int, state_dir: Path,
          progress: Callable[[str], None], wait_quiet_s: float | None = None) -> dict[str, Any]:
    """One workload on the real kernel: the grid, interleaved and repeated; knobs restored after."""
    from polltuned.bench.cpu import wait_for_quiet
    from polltuned.bench.session import BenchSettings, bench_session
    from polltuned.clock import SystemClock
    from polltuned.host.fs import FsHost

    clock = SystemClock()
    quiet = None
    if wait_quiet_s is not None:
        quiet, waited = wait_for_quiet(FsHost("/"), clock, timeout_s=wait_quiet_s, progress=progress)
        progress(f"machine {'quiet' if quiet else 'still busy'} after {waited:.0f} s of waiting")
    t0 = clock.monotonic()
    settings = BenchSettings(workload=workload, window_s=window_s, state_dir=state_dir)
    with bench_session(settings, host=FsHost("/"), clock=clock, progress=progress) as sess:
        env = sess.env
        env.phase = "oracle"
        defaults = env.current()
        nic = sess.world.config.nic
        missing = [k for k in ("net.core.busy_read", "net.core.busy_poll", f"{nic}:napi_defer_hard_irqs",
                               f"{nic}:gro_flush_timeout") if k not in defaults]
        if missing:
            raise SystemExit(f"oracle: knobs not available on this host: {', '.join(missing)}")
        labelled = grid(nic)
        labels = [lab for lab, _ in labelled]
        configs = [resolve(o, defaults) for _, o in labelled]
        order = schedule(len(configs), reps, seed)
        results: list[tuple[int, Any]] = []
        for n, i in enumerate(order):
            env.apply(configs[i])
            w = env.measure(n)
            results.append((i, w))
            progress(f"[ORACLE {workload}] {n + 1}/{len(order)} {labels[i]}: "
                     + (f"p99={w.latency.get('p99', math.nan):.1f}us cpu={w.cpu_cores or math.nan:.2f} "
                        f"foreign={w.extra.get('foreign_cores', math.nan):.2f}" if w.ok else f"failed: {w.error}"))
        agg = aggregate(labels, configs, results, sess.policy.objective)
        default_rows = [row for row in agg["configs"] if row["config"] == defaults]
        foreign = [w.extra["foreign_cores"] for _, w in results if w.ok and "foreign_cores" in w.extra]
        steal = [w.extra["steal_cores"] for _, w in results if w.ok and "steal_cores" in w.extra]
        doc = {"policy": sess.policy.name, "objective": sess.policy.objective.model_dump(),
               "window_s": sess.policy.tuning.window_s, "reps": reps, "seed": seed,
               "windows": len(results), "defaults": defaults, "nic": nic,
               "grid": {"net.core.busy_read": list(BUSY_READ), "net.core.busy_poll": list(BUSY_POLL),
                        "deferral": {f"{nic}:{k}": v for k, v in DEFER_ON.items()}},
               "best": agg["best"], "indistinguishable_from_best": agg["indistinguishable_from_best"],
               "default": default_rows[0] if default_rows else None,
               "configs": agg["configs"],
               "foreign_cores": round(statistics.fmean(foreign), 3) if foreign else None,
               "foreign_cores_max": round(max(foreign), 3) if foreign else None,
               "steal_cores": round(statistics.fmean(steal), 3) if steal else None}
    doc["restored"] = sess.restored
    doc["started_quiet"] = quiet
    doc["duration_s"] = round(clock.monotonic() - t0, 1)
    doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", action="append", required=True, help="bench workload (repeatable)")
    ap.add_argument("--out", default="oracle.json", help="JSON file (merged: other workloads are kept)")
    ap.add_argument("--reps", type=int, default=3, help="windows per configuration (>= 3 recommended)")
    ap.add_argument("--window", type=float, help="seconds per window (default: the policy's)")
    ap.add_argument("--seed", type=int, default=0, help="shuffling seed")
    ap.add_argument("--state-dir", default="/var/lib/polltuned/oracle")
    ap.add_argument("--wait-quiet", type=float, metavar="S",
                    help="before each workload wait up to S s for the machine to use <= 0.15 cores for 10 s")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("oracle: needs root (namespaces, kernel knobs)", file=sys.stderr)
        return 5
    if args.reps < 1:
        print("oracle: --reps must be >= 1", file=sys.stderr)
        return 2
    out = Path(args.out)
    doc: dict[str, Any] = {"v": 1, "workloads": {}}
    if out.exists():
        doc = json.loads(out.read_text())
        doc.setdefault("workloads", {})

    def progress(m: str) -> None:
        print(m, file=sys.stderr, flush=True)

    fd = os.open(LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        for w in args.workload:
            res = sweep(w, reps=args.reps, window_s=args.window, seed=args.seed,
                        state_dir=Path(args.state_dir), progress=progress, wait_quiet_s=args.wait_quiet)
            doc["workloads"][w] = res
            out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
            best, base = res["best"], res["default"]
            print(f"{w}: best {best['label'] if best else '-'} J={best['objective'] if best else '-'} "
                  f"{best['objective_ci95'] if best else ''} ({len(res['indistinguishable_from_best'])} others within "
                  f"its CI); default J={base['objective'] if base else '-'}; "
                  f"foreign CPU {res['foreign_cores']} (max {res['foreign_cores_max']}); "
                  f"{res['duration_s']} s; restored: {res['restored']}")
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

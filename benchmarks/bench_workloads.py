"""Run `polltuned bench` on every workload and print the README table (markdown).

    sudo .venv/bin/python benchmarks/bench_workloads.py --out bench-results/  [--workload single ...]

Each workload is one full bench run (default budget; final comparison of >= 8 interleaved rounds,
extended until every arm's J has a 95 % CI within ±15 %, at most 16), holding the real-kernel lock.
Workloads: single, parallel, shared-cpu, cpu-hog (sockperf), nginx, memcached. ``--oracle FILE``
(from benchmarks/oracle.py) adds the oracle's best configuration as a fourth arm.
Per workload it writes OUT/<workload>.json (the bench's --json document) and
OUT/<workload>.jsonl (--record) and OUT/<workload>.png (--report), then prints one markdown table
over all workloads with the targets of issue 9 checked per row (J: the arm's geometric mean over
the interleaved rounds):
  * deployed p99 no worse than the defaults' (the medians of the interleaved comparison);
  * deployed J <= 1.1 x min(default J, static J);
  * where static beats the defaults by >= 2x on J: deployed captures >= 80 % of that gain
    (log-scale share: log(J_default / J_deployed) / log(J_default / J_static) >= 0.8);
  * with an oracle arm: deployed J <= 1.2 x the oracle's.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

LOCK = "/tmp/polltuned-realkernel.lock"


def verdicts(d: dict[str, Any]) -> dict[str, str]:
    """Pure: check issue 9's real-bench targets on one bench --json document."""
    base, static, dep = d["default"], d["static"], d["deployed"]
    jb, js, jd = base["objective"], static["objective"], dep["objective"]
    out: dict[str, str] = {}
    out["no_regression"] = "yes" if dep["p99_us"] <= base["p99_us"] else "NO"
    best = min(jb, js)
    out["vs_best"] = (f"J {jd / best:.2f} x min(default, static)"
                      + (" (<= 1.1: met)" if jd <= 1.1 * best else " (<= 1.1: MISSED)"))
    if jb >= 2 * js:
        share = math.log(jb / jd) / math.log(jb / js)
        out["gain_share"] = (f"static {jb / js:.1f}x better than defaults: {share * 100:.0f} % of its gain captured"
                             + (" (>= 80 %: met)" if share >= 0.8 else " (>= 80 %: MISSED)"))
    else:
        out["gain_share"] = f"static not >= 2x better than defaults ({jb / js:.2f}x)"
    orc = d.get("oracle")
    if isinstance(orc, dict) and orc.get("objective"):
        r = jd / orc["objective"]
        out["vs_oracle"] = f"J {r:.2f} x oracle" + (" (<= 1.2: met)" if r <= 1.2 else " (<= 1.2: MISSED)")
    else:
        out["vs_oracle"] = "no oracle arm"
    return out


def _num(x: Any, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, int | float) else "-"


def table(docs: list[dict[str, Any]]) -> str:
    lines = ["| workload | config | p50 µs | p99 µs | p99.9 µs | CPU cores | objective J (95% CI) "
             "| J / default (95% CI) | foreign CPU | knobs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for d in docs:
        base_cfg = d["default"]["config"]
        for arm in ("default", "static", "deployed", "oracle"):
            if arm not in d:
                continue
            a = d[arm]
            ci = a["objective_ci95"]
            ci_s = f" ({ci[0]:.0f}–{ci[1]:.0f})" if ci[0] is not None and ci[1] is not None else ""
            rci = a.get("ratio_ci95") or [None, None]
            ratio = (f"{_num(a.get('ratio_to_default'), '.3g')} ({_num(rci[0], '.3g')}–{_num(rci[1], '.3g')})"
                     if arm != "default" else "1")
            knobs = ""
            fc = f"{a['foreign_cores']:.2f}" if a.get("foreign_cores") is not None else "-"
            if arm in ("deployed", "oracle"):
                diff = {k: v for k, v in a["config"].items() if base_cfg.get(k) != v}
                knobs = ", ".join(f"{k.split(':')[-1]}={v}" for k, v in diff.items()) or "defaults kept"
            lines.append(f"| {d['workload']} | {arm} | {_num(a['p50_us'], '.1f')} | {_num(a['p99_us'], '.1f')} | "
                         f"{_num(a['p999_us'], '.0f')} | {_num(a['cpu_cores'], '.2f')} | "
                         f"{_num(a['objective'], '.1f')}{ci_s} | {ratio} | {fc} | {knobs} |")
    lines.append("")
    for d in docs:
        v = verdicts(d)
        lines.append(f"- **{d['workload']}** ({d['duration_s']:.0f} s): p99 no worse than defaults: "
                     f"{v['no_regression']}; {v['vs_best']}; {v['gain_share']}; {v['vs_oracle']}; "
                     f"verdict: {d['tuning']['reason']}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-results", help="directory for per-workload JSON (default bench-results)")
    ap.add_argument("--workload", action="append", help="only these workloads (repeatable)")
    ap.add_argument("--budget", type=int, help="search windows (default: the policy's)")
    ap.add_argument("--rounds", type=int, default=8, help="minimum comparison rounds (default 8)")
    ap.add_argument("--max-rounds", type=int, help="comparison hard cap (default 2 x --rounds)")
    ap.add_argument("--oracle", help="oracle JSON (benchmarks/oracle.py): adds the oracle arm")
    ap.add_argument("--no-seeds", action="store_true", help="remove every 'seeds' entry from the policies")
    ap.add_argument("--wait-quiet", type=float, metavar="S",
                    help="before each workload wait up to S s for the machine to use <= 0.15 cores for 10 s")
    ap.add_argument("--table-only", action="store_true", help="print the table from existing OUT/*.json")
    args = ap.parse_args()
    from polltuned.bench.run import run_bench
    from polltuned.bench.session import BenchSettings
    from polltuned.bench.table import render_table
    from polltuned.bench.world import WORKLOADS
    from polltuned.clock import SystemClock
    from polltuned.host.fs import FsHost

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.workload or list(WORKLOADS)
    if not args.table_only:
        fd = os.open(LOCK, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            for name in names:
                t0 = time.monotonic()
                rec = out / f"{name}.jsonl"
                rec.unlink(missing_ok=True)
                oracle = Path(args.oracle) if args.oracle else None
                if oracle is not None and name not in json.loads(oracle.read_text()).get("workloads", {}):
                    oracle = None
                res = run_bench(BenchSettings(workload=name, budget=args.budget, compare_rounds=args.rounds,
                                              max_rounds=args.max_rounds, state_dir=out / "state", record=rec,
                                              report=out / f"{name}.png", no_seeds=args.no_seeds,
                                              oracle=oracle, wait_quiet_s=args.wait_quiet),
                                host=FsHost("/"), clock=SystemClock(),
                                progress=lambda m: print(m, file=sys.stderr, flush=True))
                (out / f"{name}.json").write_text(json.dumps(res.to_json(), indent=1, default=str))
                print(render_table(res), file=sys.stderr)
                print(f"{name}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
    docs = [json.loads((out / f"{n}.json").read_text()) for n in names if (out / f"{n}.json").exists()]
    print(table(docs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

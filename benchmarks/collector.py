"""Cost of one full counter sample (every default collector: read + parse, then rates()).

Measured on the generated large host (256 CPUs, 4,096 IRQs, one NIC with 64 queue IRQs, read
through FsHost from a cache directory) and on this real host, as the median of many runs.
Prints one JSON document:

* ``cpu_us``: thread CPU time per sample (``time.thread_time``: user + kernel time of this thread,
  the number that matters for "% of one CPU" and that is least disturbed by other load);
* ``wall_us``: wall time per sample (``time.perf_counter``; inflated when the machine is busy);
* ``cpu_pct_at_1s``: median CPU time / 1 s interval * 100;
* ``*_with_json``: the same plus ``Rates.to_json()`` (materialises every per-CPU object, as
  ``polltuned top --json`` does);
* ``interrupts_opt_in``: reading + parsing /proc/interrupts of the large tree alone (11 MB),
  which is why that family is opt-in.

    .venv/bin/python benchmarks/collector.py [--runs 300] [--check]

``--check`` exits 1 when the large-tree median CPU cost exceeds 5 ms or 1 % of a CPU at 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from polltuned.clock import FakeClock, SystemClock
from polltuned.counters import Sampler
from polltuned.counters.interrupts import parse_interrupts
from polltuned.host.fs import FsHost
from polltuned.metrics.window import rates
from polltuned.stats import percentile
from tests.fixtures.gen_large_host import Spec, cached_tree

TARGET_MS = 5.0


def _stats(cpu: list[float], wall: list[float]) -> dict[str, float]:
    return {
        "cpu_us_median": round(statistics.median(cpu) * 1e6, 1),
        "cpu_us_p90": round(percentile(cpu, 0.9) * 1e6, 1),
        "wall_us_median": round(statistics.median(wall) * 1e6, 1),
        "wall_us_p90": round(percentile(wall, 0.9) * 1e6, 1),
        "cpu_pct_at_1s": round(statistics.median(cpu) * 100, 3),
    }


def _measure(step: Callable[[], object], runs: int, warmup: int) -> dict[str, float]:
    for _ in range(warmup):
        step()
    cpu: list[float] = []
    wall: list[float] = []
    for _ in range(runs):
        c0, w0 = time.thread_time(), time.perf_counter()
        step()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return _stats(cpu, wall)


def bench_large(runs: int, warmup: int, *, interrupts: bool = True) -> dict[str, object]:
    spec = Spec()
    t0, t1 = cached_tree(spec), cached_tree(spec, step=1)
    clock = FakeClock()
    first = Sampler(FsHost(t0), clock=clock)
    a = first.sample()
    first.close()
    sampler = Sampler(FsHost(t1), clock=clock)

    def one() -> object:
        clock.advance(1.0)
        return rates(a, sampler.sample())

    def one_json() -> object:
        clock.advance(1.0)
        return rates(a, sampler.sample()).to_json()

    clock.advance(1.0)
    check = rates(a, sampler.sample())
    out: dict[str, object] = {
        "tree": {"cpus": spec.cpus, "irqs": spec.irqs, "nic_queue_irqs": spec.queues},
        "families": list(sampler.families),
        "unavailable": dict(check.unavailable),
        "cpus_with_rates": len(check.cpu),
        "sample_and_rates": _measure(one, runs, warmup),
        "sample_and_rates_with_json": _measure(one_json, max(20, runs // 5), 3),
    }
    if interrupts:
        tree_i = cached_tree(spec, interrupts=True)
        text_path = tree_i / "proc" / "interrupts"
        host = FsHost(tree_i)
        out["interrupts_opt_in"] = {
            "bytes": text_path.stat().st_size,
            **_measure(lambda: parse_interrupts(host.read_text("/proc/interrupts")), max(5, runs // 30), 1),
        }
    sampler.close()
    return out


def bench_real(runs: int, warmup: int) -> dict[str, object]:
    clock = SystemClock()
    pid = os.getpid()
    with Sampler(FsHost("/"), clock=clock, pids=lambda: [pid]) as sampler:
        prev = [sampler.sample()]
        time.sleep(0.01)

        def one() -> object:
            cur = sampler.sample()
            r = rates(prev[0], cur)
            prev[0] = cur
            return r

        res = _measure(one, runs, warmup)
        last = one()
        return {"families": list(sampler.families), "nics": sorted(sampler.nics),
                "unavailable": dict(getattr(last, "unavailable", {})), "sample_and_rates": res}


def main() -> int:
    ap = argparse.ArgumentParser(description="cost of one full counter sample")
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--check", action="store_true", help=f"exit 1 if the large tree misses {TARGET_MS} ms / 1 %%")
    args = ap.parse_args()
    large = bench_large(args.runs, args.warmup)
    real = bench_real(args.runs, args.warmup)
    sr = large["sample_and_rates"]
    assert isinstance(sr, dict)
    ok = sr["cpu_us_median"] <= TARGET_MS * 1000 and sr["cpu_pct_at_1s"] < 1.0
    doc = {
        "benchmark": "collector",
        "command": "benchmarks/collector.py " + " ".join(sys.argv[1:]),
        "runs": args.runs,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "nproc": os.cpu_count(),
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "target": {"large_tree_median_ms": TARGET_MS, "cpu_pct_at_1s": 1.0, "met": ok},
        "large_tree": large,
        "real_host": real,
    }
    print(json.dumps(doc, indent=2))
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())

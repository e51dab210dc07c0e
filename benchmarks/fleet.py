#!/usr/bin/env python3
"""Fleet benchmark: N simulated hosts sharing one study (a PostgreSQL started locally for the run)
against N independent hosts.

Every host is one process running the real engine (``Engine`` over a ``ScenarioEnv``, as
benchmarks/tuner_quality.py does) on the same scenario, with its own latency offset (x0.8-1.25)
and its own extra window noise; a window takes ``--pace-s`` real seconds, so the hosts measure
side by side and see each other's pending trials. ``fleet``: the hosts share the class's study
(``[study] backend = "postgresql"``, each with its local SQLite store too); ``alone``: each host has
only its local SQLite store. Both run the same seeds. One extra host with a 3x latency offset
(``--odd``) joins the fleet to show that a host not matching its class tunes alone.

Scored with the scenario's noise-free ``expected`` (never shown to the tuners):

  to5%      windows a host measured until its recommendation was within 5 % of the optimum J*
            (median over hosts and repetitions; "never" = the budget + 1 and counted)
  class     windows per host until the first host of the class got there (the class's best);
            the target compares it with the median alone host's to5% ("the windows per host that
            one host alone needs"); every fleet host's own to5% is reported beside it
  deploy5   hosts whose deployed configuration is within 5 % of J*
  breach    search windows per host at configurations worse than the guard limit
  worse     deployments worse than the baseline (over all hosts and repetitions)
  dup       proposals equal to a configuration another host was measuring at that moment
  latency   store time per tell (one window record committed) and per ask (the class's new
            observations + pending trials + announcing the proposal), p50 / p99 over all calls

Usage:
  benchmarks/fleet.py [--hosts 8] [--scenario busypoll_split] [--reps 3] [--budget 30] [--pace-s 0.3]
                      [--store postgresql|sqlite] [--no-seeds] [--odd | --no-odd] [--json FILE]
  benchmarks/fleet.py --latency-hosts 64 [--latency-optimiser random]   # the 64-host latency run
  benchmarks/fleet.py --quick ...     # tiny (tests)

``--store sqlite`` shares one SQLite file instead of a server (no PostgreSQL needed; tests).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks._load import load  # noqa: E402
from polltuned.clock import FakeClock, SystemClock  # noqa: E402
from polltuned.engine.core import Engine  # noqa: E402
from polltuned.engine.driver import drive  # noqa: E402
from polltuned.optimiser import make_optimiser  # noqa: E402
from polltuned.optimiser.space import Space  # noqa: E402
from polltuned.policy.edits import strip_seeds  # noqa: E402
from polltuned.policy.loader import load_policy  # noqa: E402
from polltuned.policy.schema import Policy  # noqa: E402
from polltuned.records import KnobValue  # noqa: E402
from polltuned.stats import percentile  # noqa: E402
from polltuned.study import SessionLog, Study, StudyInfo, fingerprint, open_local  # noqa: E402
from polltuned.study.config import StudyConfig  # noqa: E402
from polltuned.study.select import open_study  # noqa: E402
from polltuned.study.sql import ClassRules  # noqa: E402
from polltuned.study.sqlite import SqliteStudy  # noqa: E402
from polltuned.worlds.env import ScenarioEnv, default_config  # noqa: E402
from polltuned.worlds.scenario import Scenario, load_scenario  # noqa: E402

LATENCY_KEYS = ("p50_us", "p99_us", "p999_us", "mean_us")


# ---------------------------------------------------------------- one simulated host
class HostWorld:
    """The class's scenario as one host sees it: latencies x ``factor`` and extra lognormal noise."""

    def __init__(self, sc: Scenario, factor: float, extra_sd: float) -> None:
        self.sc = sc
        self.name = sc.name
        self.factor = factor
        self.extra_sd = extra_sd

    def measure(self, config: Mapping[str, KnobValue], rng: Any, window: int = 0) -> dict[str, float]:
        m = dict(self.sc.measure(config, rng, window=window))
        f = self.factor * math.exp(float(rng.normal(0.0, self.extra_sd))) if self.extra_sd > 0 else self.factor
        return {k: (v * f if k in LATENCY_KEYS else v) for k, v in m.items()}

    def expected(self, config: Mapping[str, KnobValue]) -> dict[str, float]:
        m = dict(self.sc.expected(config))
        return {k: (v * self.factor if k in LATENCY_KEYS else v) for k, v in m.items()}


class PacedEnv(ScenarioEnv):
    """A ScenarioEnv whose windows take ``pace_s`` real seconds (hosts measure side by side)."""

    pace_s = 0.0

    def measure(self, window_index: int) -> Any:
        if self.pace_s > 0:
            time.sleep(self.pace_s)
        return super().measure(window_index)


def jitter(index: int, seed: int) -> tuple[float, float]:
    """(pace factor 0.85-1.15, start delay as a fraction of one window) of a host: hosts of a real
    fleet do not measure in lockstep (and a lockstep start makes 64 processes on 2 CPUs queue)."""
    import numpy as np

    rng = np.random.default_rng(104729 * seed + index)
    return float(rng.uniform(0.85, 1.15)), float(rng.uniform(0.0, 1.0))


class TimedStore(Study):
    """Delegates to the host's store and times every call the engine makes (wall seconds)."""

    def __init__(self, inner: Study) -> None:
        self.inner = inner
        self.fingerprint = inner.fingerprint
        self.backend = inner.backend
        self.times: dict[str, list[float]] = {}
        self.ask: list[float] = []
        self._open_ask = 0.0
        self._last_pending: list[dict[str, KnobValue]] = []
        self.duplicates = 0
        self.proposals = 0

    def _t(self, name: str, t0: float) -> float:
        dt = time.perf_counter() - t0
        self.times.setdefault(name, []).append(dt)
        return dt

    def append(self, kind: str, **fields: Any) -> None:
        t0 = time.perf_counter()
        self.inner.append(kind, **fields)
        self._t("tell" if kind == "window" else f"append_{kind}", t0)

    def sessions(self) -> list[SessionLog]:
        t0 = time.perf_counter()
        s = self.inner.sessions()
        self._t("sessions", t0)
        return s

    def join_class(self, session: str, baseline_j: float, noise_sd: float) -> bool:
        t0 = time.perf_counter()
        ok = self.inner.join_class(session, baseline_j, noise_sd)
        self._t("join", t0)
        return ok

    def shared_observations(self, session: str, baseline: Mapping[str, KnobValue]
                            ) -> list[tuple[dict[str, KnobValue], float]]:
        t0 = time.perf_counter()
        out = self.inner.shared_observations(session, baseline)
        self._open_ask = self._t("shared_observations", t0)
        return out

    def pending_configs(self, session: str) -> list[dict[str, KnobValue]]:
        t0 = time.perf_counter()
        out = self.inner.pending_configs(session)
        self._open_ask += self._t("pending_configs", t0)
        self._last_pending = out
        return out

    def set_pending(self, session: str, config: Mapping[str, KnobValue] | None) -> None:
        t0 = time.perf_counter()
        self.inner.set_pending(session, config)
        dt = self._t("set_pending" if config is not None else "clear_pending", t0)
        if config is not None:
            self.ask.append(self._open_ask + dt)
            self.proposals += 1
            self.duplicates += any(dict(config) == p for p in self._last_pending)

    def describe(self) -> StudyInfo:
        return self.inner.describe()

    def close(self) -> None:
        self.inner.close()


class RefreshingOptimiser:
    """EXPERIMENT (``--fresh-shared``), not the daemon's engine: with the engine's ``fresh_shared``
    (the class's observations re-read at every re-tell: reference windows, proposals), this makes
    the engine re-tell just before each recommendation too, instead of only at proposals — what
    an engine change would buy. Delegates everything else to the optimiser."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.engine: Engine | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def best(self) -> Any:
        e = self.engine
        if e is not None and e.state.in_class:
            e.retell()
        return self.inner.best()


@dataclass(frozen=True)
class HostSpec:
    index: int
    mode: str                 # fleet | alone
    scenario: str
    seed: int
    factor: float
    extra_sd: float
    odd: bool = False


@dataclass(frozen=True)
class RunSpec:
    policy: Policy
    pace_s: float
    store: str                # postgresql | sqlite
    dsn: str                  # postgresql DSN, or the shared SQLite file
    workdir: str
    optimiser: str
    pending_timeout_s: float
    fresh_shared: bool = False


def open_host_store(spec: HostSpec, run: RunSpec) -> Study:
    p = run.policy
    local_dir = Path(run.workdir) / f"{spec.mode}-{spec.index}"
    if spec.mode == "alone":
        return open_local(local_dir, p)
    if run.store == "postgresql":
        cfg = StudyConfig(backend="postgresql", dsn=run.dsn, pending_timeout_s=run.pending_timeout_s)
        return open_study(cfg, local_dir, p, class_fp="bench", host_id=f"host-{spec.index}", clock=SystemClock())
    fp = fingerprint(p)
    return SqliteStudy(Path(run.dsn), fp, class_key=f"{fp}-bench", host_id=f"host-{spec.index}", shared=True,
                       clock=SystemClock(), rules=ClassRules(pending_timeout_s=run.pending_timeout_s))


def host_main(spec: HostSpec, run: RunSpec, go: Any, out: Any) -> None:
    """One host (a child process): wait for the start signal, tune, report."""
    try:
        p = run.policy.model_copy(update={"tuning": run.policy.tuning.model_copy(
            update={"seed": spec.seed, "optimiser": run.optimiser})})
        world = HostWorld(load_scenario(spec.scenario), spec.factor, spec.extra_sd)
        base = default_config(p)
        env = PacedEnv(p, world, seed=spec.seed * 1009 + spec.index, baseline=base)  # type: ignore[arg-type]
        factor, delay = jitter(spec.index, spec.seed)
        env.pace_s = run.pace_s * factor
        store = TimedStore(open_host_store(spec, run))
        # every host of a fleet runs the same policy, so the same optimiser seed (as the daemon does:
        # tuning.seed); only its world (offset, noise) differs. Same seed + pending + shared
        # observations = the hosts split one space-filling design instead of each running its own.
        opt = make_optimiser(run.optimiser, Space.from_policy(p), base, seed=spec.seed,
                             initial_points=p.tuning.initial_points,
                             safety_limit=math.log(1 + p.guard.max_regression))
        fresh = run.fresh_shared and spec.mode == "fleet"
        wrapped = RefreshingOptimiser(opt) if fresh else None
        t = Engine(p, store, current=env.current(), clock=FakeClock(), optimiser=wrapped or opt,  # type: ignore[arg-type]
                   fresh_shared=fresh)
        if wrapped is not None:
            wrapped.engine = t
        go.wait()
        time.sleep(delay * run.pace_s)
        t0, c0 = time.perf_counter(), time.process_time()
        r = drive(t, env)
        cpu = time.process_time() - c0
        assert r is not None
        out.put({"index": spec.index, "mode": spec.mode, "odd": spec.odd, "ok": True,
                 "elapsed_s": time.perf_counter() - t0, "cpu_s": cpu, "in_class": t.state.in_class,
                 "membership": store.describe().membership, "fallback": store.describe().fallback,
                 "windows": [[ph, dict(c)] for ph, c in t.trace.windows],
                 "recs": [[w, dict(c)] for w, c in t.trace.recommendations],
                 "deployed": dict(r.deployed), "deployed_is_baseline": r.deployed_is_baseline,
                 "windows_used": r.windows_used, "reason": r.reason, "times": store.times, "ask": store.ask,
                 "duplicates": store.duplicates, "proposals": store.proposals})
        store.close()
    except BaseException as e:  # report, never hang the parent
        out.put({"index": spec.index, "mode": spec.mode, "odd": spec.odd, "ok": False,
                 "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()})


def run_hosts(specs: Sequence[HostSpec], run: RunSpec, timeout_s: float) -> list[dict[str, Any]]:
    ctx = mp.get_context("fork")
    go = ctx.Event()
    out = ctx.Queue()
    procs = [ctx.Process(target=host_main, args=(s, run, go, out), daemon=True) for s in specs]
    for pr in procs:
        pr.start()
    time.sleep(0.5)
    go.set()
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(results) < len(procs) and time.monotonic() < deadline:
        try:
            results.append(out.get(timeout=1.0))
        except Exception:
            if not any(pr.is_alive() for pr in procs) and out.empty():
                break
    for pr in procs:
        pr.join(timeout=5)
        if pr.is_alive():
            pr.kill()
    bad = [r for r in results if not r.get("ok")]
    if bad:
        raise SystemExit(f"fleet.py: host {bad[0]['index']} failed: {bad[0]['error']}\n{bad[0].get('trace', '')}")
    if len(results) < len(procs):
        raise SystemExit(f"fleet.py: only {len(results)} of {len(procs)} hosts reported within {timeout_s:.0f} s")
    return sorted(results, key=lambda r: r["index"])


# ---------------------------------------------------------------- scoring
def score_host(r: dict[str, Any], sc: Scenario, pol: Policy, j_star: float, budget: int) -> dict[str, Any]:
    tq = load("tuner_quality")
    base = default_config(pol)

    def J(c: Mapping[str, KnobValue]) -> float:
        return float(tq.J(sc, pol, {**base, **c}))

    j_base = J(base)
    limit = j_base * (1 + pol.guard.max_regression)
    first = None
    for w, c in r["recs"]:
        if J(c) <= 1.05 * j_star:
            first = int(w)
            break
    search = [c for ph, c in r["windows"] if ph in ("reference", "trial", "repeat")]
    return {"index": r["index"], "odd": r["odd"], "in_class": r["in_class"], "membership": r["membership"],
            "windows": r["windows_used"], "to5": first if first is not None else budget + 1,
            "reached": first is not None,
            "breaches": sum(1 for c in search if J(c) > limit), "worse": J(r["deployed"]) > j_base * (1 + 1e-9),
            "deploy5": J(r["deployed"]) <= 1.05 * j_star, "kept": bool(r["deployed_is_baseline"]),
            "excess": J(r["deployed"]) / j_star - 1, "deployed": {k: v for k, v in r["deployed"].items()
                                                                 if base.get(k) != v}, "reason": r["reason"],
            "duplicates": r["duplicates"], "proposals": r["proposals"], "elapsed_s": r["elapsed_s"]}


def latency_summary(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    calls: dict[str, list[float]] = {}
    ask: list[float] = []
    for r in results:
        for k, v in r["times"].items():
            calls.setdefault(k, []).extend(v)
        ask.extend(r["ask"])

    def ms(xs: Sequence[float]) -> dict[str, float | int | None]:
        p50, p99 = percentile(xs, 0.5), percentile(xs, 0.99)
        return {"n": len(xs), "p50": p50 * 1000 if xs else None, "p99": p99 * 1000 if xs else None,
                "max": max(xs) * 1000 if xs else None}

    return {"tell_ms": ms(calls.get("tell", [])), "ask_ms": ms(ask),
            "calls_ms": {k: ms(v) for k, v in sorted(calls.items())}}


def summarise(mode: str, scored: Sequence[dict[str, Any]], results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    normal = [h for h in scored if not h["odd"]]
    reps: dict[int, list[dict[str, Any]]] = {}
    for h in normal:
        reps.setdefault(h["rep"], []).append(h)
    class_first = [min(x["to5"] for x in hs) for hs in reps.values()]
    return {
        "per_host": list(scored),
        "to5_median": statistics.median(h["to5"] for h in normal) if normal else None,
        "to5_mean": statistics.fmean(h["to5"] for h in normal) if normal else None,
        "never_reached": sum(1 for h in normal if not h["reached"]),
        "class_first_median": statistics.median(class_first) if class_first else None,
        "deploy5": sum(1 for h in normal if h["deploy5"]),
        "hosts_scored": len(normal),
        "breaches_per_host": statistics.fmean(h["breaches"] for h in normal) if normal else None,
        "worse_than_baseline": sum(1 for h in scored if h["worse"]),
        "duplicates": sum(h["duplicates"] for h in scored), "proposals": sum(h["proposals"] for h in scored),
        "in_class": sum(1 for h in scored if h["in_class"]),
        "odd_hosts": [{"in_class": h["in_class"], "membership": h["membership"], "worse": h["worse"]}
                      for h in scored if h["odd"]],
        "latency": latency_summary(results),
    }


# ---------------------------------------------------------------- the run
def new_database(cluster: Any, name: str) -> str:
    import psycopg

    with psycopg.connect(cluster.dsn, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return f"host={cluster.sock} dbname={name} user=polltuned"


def host_specs(mode: str, n: int, scenario: str, seed: int, odd: bool) -> list[HostSpec]:
    import numpy as np

    rng = np.random.default_rng(7919 * seed + 17)
    specs = [HostSpec(i, mode, scenario, seed, float(np.clip(math.exp(rng.normal(0, 0.12)), 0.8, 1.25)),
                      float(rng.uniform(0.0, 0.08))) for i in range(n)]
    if odd and mode == "fleet":
        specs.append(HostSpec(n, mode, scenario, seed, 3.0, 0.03, odd=True))
    return specs


def fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--scenario", default="busypoll_split", help="shipped scenario or family:SEED:INDEX")
    ap.add_argument("--policy", default="sim-default")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (seeds) of fleet and alone")
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--pace-s", type=float, default=0.3, help="real seconds per window")
    ap.add_argument("--store", choices=("postgresql", "sqlite"), default="postgresql")
    ap.add_argument("--optimiser", default="skopt")
    ap.add_argument("--no-seeds", action="store_true", help="remove the policy's seeds (no hints)")
    ap.add_argument("--odd", action=argparse.BooleanOptionalAction, default=True,
                    help="one extra fleet host with a 3x latency offset (it must tune alone)")
    ap.add_argument("--latency-hosts", type=int, default=0, metavar="N",
                    help="instead: the store-latency run with N hosts sharing the study (fleet only)")
    ap.add_argument("--latency-optimiser", default="random",
                    help="optimiser of the latency run (random: the store, not 64 GP fits on 2 CPUs, is measured)")
    ap.add_argument("--pending-timeout-s", type=float, default=30.0)
    ap.add_argument("--fresh-shared", action="store_true",
                    help="EXPERIMENT: fleet hosts re-read the class's observations before every re-tell and "
                         "recommendation (an engine change, not what the daemon does today)")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--workdir", metavar="DIR", help="where the hosts' local stores go (default: a temp dir)")
    ap.add_argument("--quick", action="store_true", help="1 rep, budget 12, no pacing, no odd host (tests)")
    a = ap.parse_args(argv)
    if a.quick:
        a.reps, a.budget, a.pace_s, a.odd = 1, min(a.budget, 12), 0.0, False
    tq = load("tuner_quality")
    pol = load_policy(a.policy)
    pol = pol.model_copy(update={"tuning": pol.tuning.model_copy(update={"budget": a.budget})})
    run_pol = strip_seeds(pol) if a.no_seeds else pol
    sc = load_scenario(a.scenario)
    j_star, c_star = tq.optimum(sc, pol, default_config(pol))
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="ptfleet-"))
    cluster = None
    t_start = time.monotonic()
    try:
        if a.store == "postgresql":
            pgc = load("pgcluster")
            cluster = pgc.PrivateCluster.start(max_connections=max(100, 2 * (a.latency_hosts or a.hosts) + 20))
        doc: dict[str, Any] = {"scenario": sc.name, "policy": pol.name, "budget": a.budget, "pace_s": a.pace_s,
                               "store": a.store, "no_seeds": a.no_seeds, "fresh_shared": a.fresh_shared,
                               "J_star": j_star,
                               "optimum": {k: v for k, v in c_star.items() if default_config(pol).get(k) != v}}
        if a.latency_hosts:
            n = a.latency_hosts
            dsn = new_database(cluster, "latency") if cluster is not None else str(work / "latency.sqlite3")
            run = RunSpec(run_pol, a.pace_s, a.store, dsn, str(work / "latency"), a.latency_optimiser,
                          a.pending_timeout_s)
            res = run_hosts(host_specs("fleet", n, a.scenario, 1, False), run, timeout_s=60 + a.budget * a.pace_s * 20)
            lat = latency_summary(res)
            cpu_w = statistics.fmean(r["cpu_s"] / max(1, r["windows_used"]) for r in res)
            doc.update({"hosts": n, "latency_run": lat, "in_class": sum(1 for r in res if r["in_class"]),
                        "host_cpu_ms_per_window": cpu_w * 1000, "elapsed_s": time.monotonic() - t_start})
            print(f"fleet.py latency run: {n} hosts sharing one {a.store} study, optimiser {a.latency_optimiser}, "
                  f"budget {a.budget}, {a.pace_s:g} s per window (x0.85-1.15 per host); {doc['in_class']} joined "
                  f"the class; engine CPU per host {cpu_w * 1000:.0f} ms per window")
            for name, v in [("tell (window committed)", lat["tell_ms"]), ("ask (observations + pending + "
                                                                          "announce)", lat["ask_ms"])]:
                print(f"  {name:<44} n={v['n']:>5}  p50 {fmt(v['p50'], 2)} ms  p99 {fmt(v['p99'], 2)} ms  "
                      f"max {fmt(v['max'], 2)} ms")
            for k, v in lat["calls_ms"].items():
                print(f"    {k:<42} n={v['n']:>5}  p50 {fmt(v['p50'], 2)} ms  p99 {fmt(v['p99'], 2)} ms")
            worst = max(lat["tell_ms"]["p99"] or 0.0, lat["ask_ms"]["p99"] or 0.0)
            doc["target_p99_50ms"] = worst <= 50.0
            print(f"  target ask/tell p99 <= 50 ms: {'met' if worst <= 50.0 else 'NOT met'} (worst p99 {worst:.1f} ms)")
        else:
            doc.update({"hosts": a.hosts, "reps": a.reps, "modes": {}})
            scored: dict[str, list[dict[str, Any]]] = {"fleet": [], "alone": []}
            raw: dict[str, list[dict[str, Any]]] = {"fleet": [], "alone": []}
            for rep in range(a.reps):
                for mode in ("fleet", "alone"):
                    dsn = ""
                    if mode == "fleet":
                        dsn = (new_database(cluster, f"fleet_r{rep}") if cluster is not None
                               else str(work / f"fleet_r{rep}.sqlite3"))
                    run = RunSpec(run_pol, a.pace_s, a.store, dsn, str(work / f"r{rep}"), a.optimiser,
                                  a.pending_timeout_s, a.fresh_shared)
                    res = run_hosts(host_specs(mode, a.hosts, a.scenario, rep + 1, a.odd), run,
                                    timeout_s=120 + a.budget * max(a.pace_s, 0.05) * 40)
                    raw[mode] += res
                    scored[mode] += [{**score_host(r, sc, pol, j_star, a.budget), "rep": rep} for r in res]
                    print(f"  rep {rep} {mode}: done in {max(r['elapsed_s'] for r in res):.0f} s", file=sys.stderr)
            for mode in ("fleet", "alone"):
                doc["modes"][mode] = summarise(mode, scored[mode], raw[mode])
            f, al = doc["modes"]["fleet"], doc["modes"]["alone"]
            # the target: windows per host until the *class* is within 5 % (its first host's
            # recommendation gets there) vs the windows one host alone needs (median alone host)
            ratio = (f["class_first_median"] / al["to5_median"]) if f["class_first_median"] and al["to5_median"] \
                else None
            per_host = (f["to5_median"] / al["to5_median"]) if f["to5_median"] and al["to5_median"] else None
            doc["class_ratio"], doc["per_host_ratio"] = ratio, per_host
            doc["target_quarter"] = ratio is not None and ratio <= 0.25 and f["worse_than_baseline"] == 0
            doc["per_host_quarter"] = per_host is not None and per_host <= 0.25
            doc["elapsed_s"] = time.monotonic() - t_start
            print(f"fleet.py: {a.hosts} hosts x {a.reps} reps, scenario {sc.name} (J* {j_star:.4g}), budget {a.budget}"
                  f" windows, {a.pace_s:g} s/window, store {a.store}, policy seeds "
                  f"{'removed' if a.no_seeds else 'as given'}, {doc['elapsed_s']:.0f} s")
            print(f"{'mode':<6} {'to5% median':>11} {'mean':>6} {'never':>6} {'class first':>11} {'deploy5':>8} "
                  f"{'breach/host':>11} {'worse':>6} {'dup':>4} {'tell p50/p99 ms':>16} {'ask p50/p99 ms':>15}")
            for mode in ("fleet", "alone"):
                m = doc["modes"][mode]
                t, k = m["latency"]["tell_ms"], m["latency"]["ask_ms"]
                print(f"{mode:<6} {fmt(m['to5_median']):>11} {fmt(m['to5_mean']):>6} "
                      f"{m['never_reached']:>3}/{m['hosts_scored']:<2} {fmt(m['class_first_median']):>11} "
                      f"{m['deploy5']:>3}/{m['hosts_scored']:<4} {fmt(m['breaches_per_host'], 2):>11} "
                      f"{m['worse_than_baseline']:>6} {m['duplicates']:>4} "
                      f"{fmt(t['p50'], 2):>7}/{fmt(t['p99'], 2):<8} {fmt(k['p50'], 2):>7}/{fmt(k['p99'], 2):<7}")
            for o in f["odd_hosts"]:
                print(f"odd host (3x latency): {'JOINED the class' if o['in_class'] else 'tuned alone'} — "
                      f"{o['membership']}; deployed worse than baseline: {o['worse']}")
            print(f"target (class within 5 % in <= 1/4 of the windows one host alone needs, 0 worse): "
                  f"{'met' if doc['target_quarter'] else 'NOT met'} (class first {fmt(f['class_first_median'])} / "
                  f"alone {fmt(al['to5_median'])} = {fmt(ratio, 2)}, worse {f['worse_than_baseline']})")
            print(f"every fleet host's own recommendation within 5 %: median {fmt(f['to5_median'])} windows vs alone "
                  f"{fmt(al['to5_median'])} = {fmt(per_host, 2)} ({'<=' if doc['per_host_quarter'] else '>'} 1/4)")
        if a.json:
            Path(a.json).write_text(json.dumps(doc, indent=1, default=str))
    finally:
        if cluster is not None:
            cluster.stop()
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

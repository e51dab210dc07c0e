"""The orchestration of ``polltuned bench`` (see the package docstring for the order of operations):
inside :func:`polltuned.bench.session.bench_session`, tune with the engine, then run the final
comparison of default / static / deployed (/ oracle) and build the result."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import replace

from polltuned.bench.comparison import STATIC_OVERRIDES, run_comparison, summarise_comparison
from polltuned.bench.cpu import wait_for_quiet
from polltuned.bench.env import BenchEnv
from polltuned.bench.session import BenchSession, BenchSettings, bench_session, load_oracle
from polltuned.bench.table import BenchResult
from polltuned.clock import Clock
from polltuned.engine.builder import build_engine
from polltuned.engine.driver import drive
from polltuned.engine.phases import Event
from polltuned.host.fs import Host
from polltuned.objective import score
from polltuned.policy.schema import Policy
from polltuned.records import Config, KnobValue, Window
from polltuned.report import draw_report
from polltuned.study import memory_study


def _window_line(w: Window) -> str:
    if not w.ok:
        return f"failed: {w.error}"
    return (f"p99={w.latency.get('p99', math.nan):.1f}us cpu={w.cpu_cores or math.nan:.2f} "
            f"foreign={w.extra.get('foreign_cores', math.nan):.2f} steal={w.extra.get('steal_cores', math.nan):.2f}")


def tune_and_compare(sess: BenchSession, env: BenchEnv, policy: Policy, defaults: Config, *,
                     settings: BenchSettings, clock: Clock, progress: Callable[[str], None],
                     oracle_cfg: Mapping[str, KnobValue] | None = None, quiet: bool | None = None,
                     ) -> BenchResult:
    """One tuning run from ``defaults`` (already applied) with the engine, then the interleaved
    final comparison of default / static / deployed (/ oracle) under ``policy``'s probe."""
    rule = settings.stop_rule()
    t_start = clock.monotonic()
    engine = build_engine(policy, env, memory_study(policy), clock, dropped=sess.dropped)

    def show(ev: Event) -> None:
        if ev.phase in ("MEASURE", "CONFIRM", "SCORE", "DONE", "ROLLBACK", "APPLY"):
            progress(f"[{ev.phase}] {ev.message}")

    env.phase = "tune"
    result = drive(engine, env, on_event=show)
    assert result is not None
    tuning_s = clock.monotonic() - t_start
    deployed = {k: result.deployed.get(k, defaults[k]) for k in defaults}
    static = {**defaults, **{k: v for k, v in STATIC_OVERRIDES.items() if k in defaults}}
    arms: dict[str, Config] = {"default": defaults, "static": static}
    deployed_is_default = all(deployed[k] == defaults[k] for k in defaults)
    if not deployed_is_default:
        arms["deployed"] = deployed
    oracle_is_default = False
    if oracle_cfg is not None:
        unknown = sorted(k for k in oracle_cfg if k not in defaults)
        if unknown:
            progress(f"oracle knobs not tuned in this run, left out of the oracle arm: {', '.join(unknown)}")
        oracle = {**defaults, **{k: v for k, v in oracle_cfg.items() if k in defaults}}
        oracle_is_default = all(oracle[k] == defaults[k] for k in defaults)
        if not oracle_is_default:
            arms["oracle"] = oracle
    env.phase = "compare"
    progress(f"final comparison: {', '.join(arms)} interleaved, {rule.min_rounds}..{rule.max_rounds} rounds "
             f"(stops once every J's 95% CI is within ±{rule.rel_halfwidth:.0%})")
    wins, why = run_comparison(
        env, arms, policy.objective, rule, first_index=result.windows_used + 1000,
        on_window=lambda n, r, w: progress(f"[COMPARE] round {r + 1} {n}: {_window_line(w)}"))
    rounds = max((len(v) for v in wins.values()), default=0)
    summaries = summarise_comparison(arms, wins, policy.objective, level=rule.level)
    d = summaries["default"]
    if deployed_is_default:
        summaries["deployed"] = replace(d, name="deployed")
    if oracle_cfg is not None and oracle_is_default:
        summaries["oracle"] = replace(d, name="oracle")
    trials: list[dict[str, object]] = [{"phase": ph, "config": cfg, "window": w.to_json(),
               "objective": (s.value if (s := score(w, policy.objective)).ok else None)}
              for ph, cfg, w in env.windows.entries]
    comparison: dict[str, object] = {
        "rounds": rounds, "min_rounds": rule.min_rounds, "max_rounds": rule.max_rounds,
        "rel_halfwidth_target": rule.rel_halfwidth, "level": rule.level, "stop_reason": why,
        "order": "rotating per round", "arms_measured": list(arms),
        "aliases": {**({"deployed": "default"} if deployed_is_default else {}),
                    **({"oracle": "default"} if oracle_cfg is not None and oracle_is_default else {})},
        "oracle_file": str(settings.oracle) if settings.oracle is not None else None}
    return BenchResult(
        workload=sess.workload.name, arms=summaries, tuning=result.to_json(), trials=trials,
        duration_s=0.0, restored=False, knobs=sess.knobs, dropped_knobs=sess.dropped,
        world=sess.world.describe(), deployed_is_default=deployed_is_default, comparison=comparison,
        policy=policy.name, tuning_s=tuning_s, started_quiet=quiet)


def wait_if_asked(settings: BenchSettings, *, host: Host, clock: Clock,
                  progress: Callable[[str], None]) -> bool | None:
    """``--wait-quiet``: wait for a quiet machine first; whether it got quiet (None: not asked)."""
    if settings.wait_quiet_s is None:
        return None
    quiet, waited = wait_for_quiet(host, clock, timeout_s=settings.wait_quiet_s, progress=progress)
    progress(f"machine {'quiet' if quiet else 'still busy'} after {waited:.0f} s of waiting")
    return quiet


def run_bench(settings: BenchSettings, *, host: Host, clock: Clock,
              progress: Callable[[str], None] = lambda s: None) -> BenchResult:
    """The whole bench on the real host. Needs root; hold /tmp/polltuned-realkernel.lock around it."""
    oracle_cfg = load_oracle(settings.oracle, settings.workload) if settings.oracle is not None else None
    quiet = wait_if_asked(settings, host=host, clock=clock, progress=progress)
    t_start = clock.monotonic()
    owner_pid = os.getpid()
    with contextlib.ExitStack() as stack:
        try:
            sess = stack.enter_context(bench_session(settings, host=host, clock=clock, progress=progress))
            setup_s = clock.monotonic() - t_start
            res = tune_and_compare(sess, sess.env, sess.policy, sess.env.current(), settings=settings, clock=clock,
                                   progress=progress, oracle_cfg=oracle_cfg, quiet=quiet)
            res.tuning_s += setup_s  # "tuning" in the table counts from the start, the world's setup included
        finally:
            if os.getpid() == owner_pid:
                progress("restoring the host: every knob back, servers stopped, namespaces removed")

    res.restored = sess.restored
    res.duration_s = clock.monotonic() - t_start
    if settings.report is not None:
        draw_report(res.trials, settings.report)
    return res

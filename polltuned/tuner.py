"""The tuning loop: BASELINE -> (PROPOSE -> APPLY -> SETTLE -> MEASURE -> SCORE)* -> CONFIRM.

``Tuner.run()`` is a generator yielding an Event at every phase change and after every window, so
the caller (daemon, ``polltuned sim``, the bench) can publish status, ping a watchdog, or stop
between steps. Rules it keeps:

* the baseline (the host's values when tuning starts, restricted to the policy's knobs) is
  measured first; the budget counts measurement windows (baseline and repeats included;
  confirmation windows are extra);
* the optimiser runs only between windows, never during one;
* a trial whose first window is worse than the baseline by more than ``guard.max_regression`` or
  breaks a constraint is aborted and the best known assignment is put back (ROLLBACK); a failed
  window is recorded as failed and never told to the optimiser as a number;
* a second window is taken only when the first one is promising (noise demands it before the
  trial can become the incumbent), or when the policy asks for ``tuning.repeats``;
* the final pick is the optimiser's recommendation (posterior mean), re-measured against the
  baseline interleaved A/B/A/B; it is deployed only when the gain is significant and at least
  ``confirm.min_effect``; otherwise the baseline stays and the verdict says why;
* every window is appended to the Study; a restart resumes the unfinished session.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from polltuned.clock import Clock
from polltuned.errors import PolltunedError
from polltuned.objective import Score, score
from polltuned.optimiser import Optimiser, make_optimiser
from polltuned.optimiser.space import Space
from polltuned.policy.schema import Policy
from polltuned.records import KnobValue
from polltuned.safety import Verdict, confirm_verdict, guard_check
from polltuned.study import Study
from polltuned.trial import TrialEnv

PHASES = ("BASELINE", "PROPOSE", "APPLY", "SETTLE", "MEASURE", "SCORE", "CONFIRM", "ROLLBACK", "DONE")
BASELINE_WINDOWS = 2
MAX_FAILED_BASELINE = 3
MAX_CONSECUTIVE_FAILURES = 5


@dataclass(frozen=True)
class Event:
    phase: str
    message: str
    trial: int | None = None
    window: int | None = None
    value: float | None = None

    def to_json(self) -> dict[str, object]:
        return {"phase": self.phase, "message": self.message, "trial": self.trial,
                "window": self.window, "value": self.value}


@dataclass(frozen=True)
class TrialRecord:
    index: int
    config: dict[str, KnobValue]
    status: str                      # ok | failed | aborted
    values: tuple[float, ...]        # J of each usable window
    reason: str = ""

    def to_json(self) -> dict[str, object]:
        return {"index": self.index, "config": dict(self.config), "status": self.status,
                "values": list(self.values), "reason": self.reason}


@dataclass(frozen=True)
class TuningResult:
    baseline_config: dict[str, KnobValue]
    baseline_value: float
    best_config: dict[str, KnobValue]
    best_value: float
    trials: tuple[TrialRecord, ...]
    verdict: Verdict | None
    deployed: dict[str, KnobValue]
    deployed_is_baseline: bool
    reason: str
    guard_events: tuple[str, ...]
    windows_used: int
    stopped: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "baseline_config": dict(self.baseline_config),
            "baseline_value": self.baseline_value,
            "best_config": dict(self.best_config),
            "best_value": self.best_value,
            "trials": [t.to_json() for t in self.trials],
            "counts": {s: sum(1 for t in self.trials if t.status == s) for s in ("ok", "failed", "aborted")},
            "confirmation": self.verdict.to_json() if self.verdict else None,
            "deployed": dict(self.deployed),
            "deployed_is_baseline": self.deployed_is_baseline,
            "reason": self.reason,
            "guard_events": list(self.guard_events),
            "windows_used": self.windows_used,
            "stopped": self.stopped,
        }


@dataclass
class _Trace:
    """What the benchmark needs to score exploration: the config measured in each window, and the
    recommendation after each trial (keyed by windows used)."""

    windows: list[tuple[str, dict[str, KnobValue]]] = field(default_factory=list)
    recommendations: list[tuple[int, dict[str, KnobValue]]] = field(default_factory=list)


class Tuner:
    def __init__(self, policy: Policy, env: TrialEnv, store: Study, *, clock: Clock,
                 optimiser: Optimiser | None = None) -> None:
        self.policy = policy
        self.env = env
        self.store = store
        self.clock = clock
        self.space = Space.from_policy(policy)
        self._opt = optimiser
        self._stop = False
        self._result: TuningResult | None = None
        self.trace = _Trace()

    # ------------------------------------------------------------------ public
    def request_stop(self) -> None:
        self._stop = True

    @property
    def result(self) -> TuningResult | None:
        return self._result

    @property
    def optimiser(self) -> Optimiser | None:
        return self._opt

    def run(self) -> Iterator[Event]:
        pol = self.policy
        keys = self.space.keys
        resumed = self.store.resumable()
        if resumed is not None:
            session = resumed.session
            baseline = {k: resumed.baseline[k] for k in keys if k in resumed.baseline}
        else:
            session = uuid.uuid4().hex[:12]
            cur = self.env.current()
            baseline = {k: cur[k] for k in keys if k in cur}
            self.store.append("session", session=session, fingerprint=self.store.fingerprint,
                              policy=pol.name, seed=pol.tuning.seed, started=self.clock.wall(),
                              baseline=baseline)
        self._session = session
        self._baseline = baseline
        self._base_key = self.space.key_of(baseline)
        max_reg = pol.guard.max_regression
        if self._opt is None:
            self._opt = make_optimiser(pol.tuning.optimiser, self.space, baseline, seed=pol.tuning.seed,
                                       initial_points=pol.tuning.initial_points,
                                       safety_limit=math.log(1.0 + max_reg))
        opt = self._opt
        trials: list[TrialRecord] = []
        guard_events: list[str] = []
        self._best_known: dict[str, KnobValue] = dict(baseline)
        windows_used = 0
        trial_no = 0
        base_values: list[float] = []
        base_drops: float | None = None

        # ---- replay an unfinished session, or warm-start from finished ones
        if resumed is not None:
            for wr in resumed.windows:
                if wr.phase == "baseline" and wr.status == "ok" and wr.y is not None:
                    base_values.append(wr.y)  # stored as J for baseline windows, see below
                if wr.phase in ("baseline", "trial"):
                    windows_used += 1
                trial_no = max(trial_no, wr.trial + 1)
            yield Event("BASELINE", f"resuming session {session}: {windows_used} windows already measured")
        elif pol.tuning.warm_start:
            prior = self.store.prior_observations()
            for cfg, y in prior:
                opt.tell(cfg, y)
            if prior:
                yield Event("BASELINE", f"warm start: told {len(prior)} windows from earlier sessions")

        # ---- BASELINE
        failed_base = 0
        while len(base_values) < BASELINE_WINDOWS and not self._stop:
            yield Event("BASELINE", "measuring the baseline", window=windows_used)
            w = self.env.measure(windows_used)
            s = score(w, pol.objective)
            windows_used += 1
            self.trace.windows.append(("baseline", dict(baseline)))
            if not s.ok:
                failed_base += 1
                self._log_window(-1, "baseline", baseline, "failed", None, None, s)
                yield Event("BASELINE", "baseline window failed: " + "; ".join(s.reasons), window=windows_used - 1)
                if failed_base >= MAX_FAILED_BASELINE:
                    break
                continue
            base_values.append(s.value)
            if w.drops_per_s is not None:
                base_drops = w.drops_per_s
            self._log_window(-1, "baseline", baseline, "ok", s.value, None, s)
            yield Event("MEASURE", f"baseline J={s.value:.4g}", window=windows_used - 1, value=s.value)
        if not base_values:
            self._finish(baseline, math.nan, trials, None, "baseline could not be measured; nothing changed",
                         guard_events, windows_used, stopped=self._stop)
            yield Event("DONE", self._result_reason())
            return
        j_ref = math.exp(sum(math.log(v) for v in base_values) / len(base_values))
        if resumed is not None:
            # replay every told window relative to the same reference
            for wr in resumed.windows:
                if wr.status in ("ok", "aborted") and wr.y is not None and wr.phase == "trial":
                    opt.tell(wr.config, wr.y)
                elif wr.status == "failed" and wr.phase == "trial":
                    opt.tell_failed(wr.config)
        for v in base_values:
            opt.tell(baseline, math.log(v / j_ref))
        self._j_ref = j_ref
        noise_sd = 0.08

        # ---- search
        consecutive_failures = 0
        consecutive_aborts = 0
        while windows_used < pol.tuning.budget and not self._stop:
            yield Event("PROPOSE", "asking the optimiser", trial=trial_no)
            cfg = opt.ask(remaining=pol.tuning.budget - windows_used)
            full = dict(baseline)
            full.update(cfg)
            yield Event("APPLY", "apply " + _fmt(cfg, baseline), trial=trial_no)
            try:
                self.env.apply(full)
            except PolltunedError as e:
                opt.tell_failed(cfg)
                trials.append(TrialRecord(trial_no, cfg, "failed", (), f"apply failed: {e.message}"))
                self.store.append("trial", session=session, trial=trial_no, config=cfg, status="failed",
                                  reason=f"apply failed: {e.message}", windows=0)
                yield Event("ROLLBACK", f"apply failed: {e.message}", trial=trial_no)
                trial_no += 1
                consecutive_failures += 1
                if consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
                    break
                continue
            values: list[float] = []
            status = "ok"
            reason = ""
            n_max = max(1, pol.tuning.repeats)
            best_now = opt.best()
            best_mean = best_now.observed_mean if best_now is not None else 0.0
            i = 0
            while True:
                yield Event("SETTLE", f"settle {pol.tuning.settle_s:g}s, then measure", trial=trial_no,
                            window=windows_used)
                w = self.env.measure(windows_used)
                windows_used += 1
                self.trace.windows.append(("trial", dict(cfg)))
                s = score(w, pol.objective, baseline_drops_per_s=base_drops)
                # decide, journal, then report: a crash after the event never loses the window
                outcome, y_told, why = "ok", math.nan, ""
                if not s.ok:
                    outcome, why = "failed", "; ".join(s.reasons)
                else:
                    y_told = math.log(s.value / j_ref)
                    g = guard_check(s, j_ref, max_reg) if i == 0 else None
                    if g is not None and g.abort:
                        # told as a capped bad number: the optimiser must learn the region is bad,
                        # without one huge value flattening the surrogate
                        outcome, why = "aborted", g.reason
                        y_told = min(max(y_told, math.log(1 + max_reg)) + (0.3 if not s.feasible else 0.0),
                                     math.log(1 + max_reg) + 1.0)
                    elif not s.feasible:
                        outcome, why = "aborted", "constraint broken: " + "; ".join(s.reasons)
                        y_told = math.log(1 + max_reg) + 0.3
                self._log_window(trial_no, "trial", cfg, outcome, s.value if s.ok else None,
                                 None if outcome == "failed" else y_told, s)
                yield Event("MEASURE", _describe(s), trial=trial_no, window=windows_used - 1,
                            value=s.value if s.ok else None)
                if outcome == "failed":
                    status, reason = "failed", why
                    opt.tell_failed(cfg)
                    break
                opt.tell(cfg, y_told)
                values.append(s.value)
                if outcome == "aborted":
                    status, reason = "aborted", why
                    guard_events.append(f"trial {trial_no}: {why}")
                    break
                y = y_told
                i += 1
                if windows_used >= pol.tuning.budget or self._stop:
                    break
                if i < n_max:
                    continue
                # one extra window when the first is promising: it could become the incumbent
                if i == 1 and n_max == 1 and y < best_mean + noise_sd:
                    n_max = 2
                    continue
                break
            yield Event("SCORE", f"trial {trial_no} {status}" + (f": {reason}" if reason else ""),
                        trial=trial_no, value=values[-1] if values else None)
            trials.append(TrialRecord(trial_no, cfg, status, tuple(values), reason))
            self.store.append("trial", session=session, trial=trial_no, config=cfg, status=status,
                              reason=reason, windows=len(values))
            consecutive_failures = consecutive_failures + 1 if status == "failed" else 0
            rec = opt.best()
            if rec is not None:
                self._best_known = {**baseline, **rec.config}
                self.trace.recommendations.append((windows_used, dict(rec.config)))
            if status != "ok":
                yield Event("ROLLBACK", "rolling back to the best known assignment", trial=trial_no)
                self._safe_apply(self._best_known)
            trial_no += 1
            consecutive_aborts = consecutive_aborts + 1 if status == "aborted" else 0
            if (consecutive_aborts >= 2 and windows_used + 1 + BASELINE_WINDOWS <= pol.tuning.budget
                    and not self._stop):
                consecutive_aborts = 0
                # two guard aborts in a row: is the incumbent still what we think it is? A workload
                # change makes everything learnt so far wrong; re-measure and restart if so.
                inc = self._best_known
                yield Event("MEASURE", "two aborts in a row: re-measuring the incumbent", trial=trial_no)
                self._safe_apply(inc)
                w = self.env.measure(windows_used)
                windows_used += 1
                self.trace.windows.append(("trial", {k: inc[k] for k in keys if k in inc}))
                s = score(w, pol.objective, baseline_drops_per_s=base_drops)
                if s.ok and guard_check(s, j_ref, max_reg).abort:
                    msg = (f"drift: the incumbent now scores J={s.value:.4g} (baseline was {j_ref:.4g}); "
                           "re-measuring the baseline and restarting the search")
                    guard_events.append(msg)
                    yield Event("ROLLBACK", msg, trial=trial_no)
                    self._safe_apply(baseline)
                    new_base: list[float] = []
                    for _ in range(BASELINE_WINDOWS * 2):
                        if len(new_base) >= BASELINE_WINDOWS:
                            break
                        wb = self.env.measure(windows_used)
                        windows_used += 1
                        self.trace.windows.append(("baseline", dict(baseline)))
                        sb = score(wb, pol.objective)
                        if sb.ok:
                            new_base.append(sb.value)
                            self._log_window(-1, "baseline", baseline, "ok", sb.value, None, sb)
                    if new_base:
                        j_ref = math.exp(sum(math.log(v) for v in new_base) / len(new_base))
                        self._j_ref = j_ref
                        opt = make_optimiser(opt.name, self.space, baseline, seed=pol.tuning.seed + trial_no,
                                             initial_points=pol.tuning.initial_points,
                                             safety_limit=math.log(1.0 + max_reg))
                        self._opt = opt
                        for v in new_base:
                            opt.tell(baseline, math.log(v / j_ref))
                        opt.tell(inc, min(math.log(s.value / j_ref), math.log(1 + max_reg) + 1.0))
                        for tr in trials[-2:]:
                            for v in tr.values:
                                opt.tell(tr.config, min(math.log(v / j_ref), math.log(1 + max_reg) + 1.0))
                        self._best_known = dict(baseline)
                elif s.ok:
                    opt.tell(inc, math.log(s.value / j_ref))
            if consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
                guard_events.append(f"{consecutive_failures} consecutive failed trials: search stopped")
                break

        # ---- CONFIRM
        rec = opt.best()
        if self._stop:
            self._safe_apply(baseline)
            self._finish(baseline, j_ref, trials, None, "stopped on request; baseline restored",
                         guard_events, windows_used, stopped=True)
            yield Event("DONE", self._result_reason())
            return
        if rec is None or self.space.key_of(rec.config) == self._base_key:
            self._safe_apply(baseline)
            self._finish(baseline, j_ref, trials, None, "the best configuration found is the baseline; kept",
                         guard_events, windows_used)
            yield Event("DONE", self._result_reason())
            return
        cand = {**baseline, **rec.config}
        simplify = getattr(opt, "simplify", None)
        if callable(simplify):
            simple = {**baseline, **simplify(rec.config)}
            if simple != cand:
                yield Event("CONFIRM", "simplified the candidate to " + _fmt(simple, baseline))
                cand = simple
            if self.space.key_of(cand) == self._base_key:
                self._safe_apply(baseline)
                self._finish(baseline, j_ref, trials, None,
                             "the model finds no change worth making; baseline kept", guard_events, windows_used)
                yield Event("DONE", self._result_reason())
                return
        yield from self._confirm(cand, baseline, j_ref, trials, guard_events, windows_used, base_drops)

    # ------------------------------------------------------------------ confirmation
    def _confirm(self, cand: dict[str, KnobValue], baseline: dict[str, KnobValue], j_ref: float,
                 trials: list[TrialRecord], guard_events: list[str], windows_used: int,
                 base_drops: float | None) -> Iterator[Event]:
        pol = self.policy
        a: list[float] = []
        b: list[float] = []
        idx = windows_used
        pairs = pol.confirm.pairs
        extended = False
        alpha = pol.confirm.alpha / 2
        broke: str | None = None
        p = 0
        while p < pairs and broke is None:
            for arm, cfg in (("A", baseline), ("B", cand)):
                try:
                    self.env.apply(cfg)
                except PolltunedError as e:
                    broke = f"apply failed during confirmation: {e.message}"
                    break
                w = self.env.measure(idx)
                idx += 1
                self.trace.windows.append(("confirm", dict(cfg)))
                s = score(w, pol.objective, baseline_drops_per_s=base_drops)
                self._log_window(-2, "confirm", cfg, "ok" if s.ok else "failed", s.value if s.ok else None,
                                 None, s)
                yield Event("CONFIRM", f"pair {p + 1}/{pairs} {arm}: {_describe(s)}", window=idx - 1,
                            value=s.value if s.ok else None)
                if not s.ok:
                    continue
                if arm == "B":
                    g = guard_check(s, j_ref, pol.guard.max_regression)
                    if g.abort:
                        broke = f"candidate broke the guard during confirmation: {g.reason}"
                        guard_events.append(broke)
                        break
                (a if arm == "A" else b).append(s.value)
            p += 1
            if p == pairs and not extended and broke is None and len(a) >= 2 and len(b) >= 2:
                v = confirm_verdict(a, b, alpha=alpha, min_effect=pol.confirm.min_effect)
                # inconclusive but promising: double the pairs once. Two looks, each at alpha/2
                # (Bonferroni), so the chance of deploying a non-improvement stays <= alpha.
                if not v.deploy and v.gain > 0 and v.p_value < 0.3:
                    pairs *= 2
                    extended = True
        verdict = confirm_verdict(a, b, alpha=alpha, min_effect=pol.confirm.min_effect)
        if broke is not None:
            verdict = Verdict(verdict.baseline_samples, verdict.candidate_samples, verdict.gain, verdict.ci_low,
                              verdict.ci_high, verdict.p_value, verdict.significant, False, broke)
        deployed = cand if verdict.deploy else baseline
        self._safe_apply(deployed)
        reason = ("deployed: " if verdict.deploy else "baseline kept: ") + verdict.reason
        self._finish(cand, j_ref, trials, verdict, reason, guard_events, windows_used, deployed=deployed)
        yield Event("DONE", reason)

    # ------------------------------------------------------------------ helpers
    def _safe_apply(self, cfg: Mapping[str, KnobValue]) -> None:
        try:
            self.env.apply(cfg)
        except PolltunedError:
            pass  # the actuator left the host unchanged; the daemon's rollback path handles the rest

    def _log_window(self, trial: int, phase: str, cfg: Mapping[str, KnobValue], status: str,
                    value: float | None, y: float | None, s: Score) -> None:
        # baseline windows store J in "y" (the reference is rebuilt from them on resume)
        self.store.append("window", session=self._session, trial=trial, phase=phase, config=dict(cfg),
                          status=status, value=value, y=value if phase == "baseline" else y,
                          score=s.to_json())

    def _finish(self, best: dict[str, KnobValue], j_ref: float, trials: list[TrialRecord],
                verdict: Verdict | None, reason: str, guard_events: list[str], windows_used: int,
                *, deployed: dict[str, KnobValue] | None = None, stopped: bool = False) -> None:
        dep = deployed if deployed is not None else self._baseline
        rec = self._opt.best() if self._opt is not None else None
        best_value = j_ref * math.exp(rec.predicted) if rec is not None and math.isfinite(j_ref) else math.nan
        self._result = TuningResult(
            baseline_config=dict(self._baseline), baseline_value=j_ref, best_config=dict(best),
            best_value=best_value, trials=tuple(trials), verdict=verdict, deployed=dict(dep),
            deployed_is_baseline=self.space.key_of(dep) == self._base_key, reason=reason,
            guard_events=tuple(guard_events), windows_used=windows_used, stopped=stopped)
        self.store.append("end", session=self._session, result=self._result.to_json())

    def _result_reason(self) -> str:
        return self._result.reason if self._result else ""


def _fmt(cfg: Mapping[str, KnobValue], base: Mapping[str, KnobValue]) -> str:
    diff = [f"{k}={v}" for k, v in cfg.items() if base.get(k) != v]
    return ", ".join(diff) if diff else "(baseline values)"


def _describe(s: Score) -> str:
    if not s.ok:
        return "failed: " + "; ".join(s.reasons)
    return f"J={s.value:.4g} latency={s.latency_us:.1f}µs cpu={s.cpu_cores:.2f}" + (
        "" if s.feasible else " infeasible: " + "; ".join(s.reasons))

"""The tuning session: phase functions over a typed :class:`SessionState`.

    (RESUME) -> BASELINE -> (PROPOSE -> APPLY -> SETTLE -> MEASURE -> SCORE)* -> CONFIRM -> DONE
    (OBSERVE: BASELINE, then list what would be tried; nothing is written)

``Tuner.run()`` is a generator yielding an :class:`Event` at every phase change and after every
window, so the caller (the daemon's controller, ``polltuned sim``, the bench) can publish status,
ping a watchdog, or stop between steps. Rules it keeps:

* **measure through drift**: the baseline is measured first (two reference windows) and again
  after every few trial windows (``R R T T T R T T T R …``; every 2 to 6, as often as the measured
  drift demands: ``ReferenceSeries.interval``); every window is told to the optimiser as its
  log-ratio to the baseline level at its time (polltuned.engine.reference), and the told values are
  revised when the next reference arrives. The budget counts every window
  (references, trials, repeats); confirmation windows are extra;
* **more windows where the noise demands it**: a trial gets another window (with its own
  reference when one is due) while its mean log-ratio is within one standard error of beating the
  incumbent by ``MIN_GAIN`` without having shown it — the rule is
  ``mean - se < inc - MIN_GAIN < mean + se`` with ``se = noise x sqrt(1 + 1/m) / sqrt(n)`` and the
  noise estimated from the reference windows — up to ``MAX_WINDOWS_PER_VISIT`` windows;
* the optimiser runs only between windows, never during one;
* **guard**: a trial whose first window is worse than its reference level by more than
  ``guard.max_regression`` *beyond the window noise* (``objective.guard_limit``), or breaks a
  constraint, is aborted, told as a capped bad number, and the baseline is put back (ROLLBACK);
  a failed window is recorded as failed and never told as a number;
* a workload shift (the references jump, ``ReferenceSeries.shift``) restarts the search on the new
  workload: observations from before it are no longer told;
* the final pick is the optimiser's recommendation, simplified, re-measured against the baseline
  interleaved A/B/A/B; it is deployed only when the gain is significant and at least
  ``confirm.min_effect``; otherwise the baseline stays and the verdict says why;
* every window is appended to the Study; a restart resumes the unfinished session; a start with a
  confirmed deployment on record for the same policy and host (``resume=True``) re-applies it and
  checks it with a short interleaved comparison instead of searching again.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Generator, Iterator, Mapping, Sequence

from polltuned.clock import Clock
from polltuned.engine.env import TrialEnv
from polltuned.engine.phases import Event, Phase
from polltuned.engine.session import SessionState, Trace, TrialRecord, TuningResult, WindowObs
from polltuned.errors import PolltunedError
from polltuned.objective import Score, guard_limit, model_value, penalised, score
from polltuned.optimiser import Optimiser, make_optimiser
from polltuned.optimiser.space import Space
from polltuned.policy.schema import Policy
from polltuned.records import KnobValue
from polltuned.safety import Verdict, confirm_verdict
from polltuned.study import Study

BASELINE_WINDOWS = 2
MAX_FAILED_BASELINE = 3
MAX_CONSECUTIVE_FAILURES = 5
MAX_WINDOWS_PER_VISIT = 2
MIN_GAIN = 0.02
RESUME_PAIRS = 2


class Tuner:
    def __init__(self, policy: Policy, env: TrialEnv, store: Study, *, clock: Clock,
                 optimiser: Optimiser | None = None, host_fingerprint: str | None = None,
                 resume: bool = False, observe: bool = False,
                 dropped_knobs: Mapping[str, str] | None = None) -> None:
        self.policy = policy
        self.env = env
        self.store = store
        self.clock = clock
        self.space = Space.from_policy(policy)
        self._opt = optimiser
        self.host_fingerprint = host_fingerprint
        self.resume = resume
        self.observe = observe or policy.mode == "observe"
        self.dropped_knobs = dict(dropped_knobs or {})
        self._stop = False
        self._result: TuningResult | None = None
        self.trace = Trace()
        self.state: SessionState | None = None

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
        st = yield from self._start()
        if self.resume and not self.observe:
            kept = yield from self._resume(st)
            if kept:
                return
        if not (yield from self._baseline(st)):
            self._finish(st, None, "baseline could not be measured; nothing changed", stopped=self._stop)
            yield Event(Phase.DONE, self._reason())
            return
        if self.observe:
            yield from self._observe(st)
            return
        st.in_class = self.store.join_class(st.session, st.j_ref, st.refs.noise_sd())
        if st.in_class:
            yield Event(Phase.BASELINE, "this host joined its workload class: the search shares the class's "
                                        "observations and pending trials")
        yield from self._search(st)
        yield from self._conclude(st)

    # ------------------------------------------------------------------ start / resume
    def _start(self) -> Generator[Event, None, SessionState]:
        pol = self.policy
        keys = self.space.keys
        resumed = self.store.resumable()
        if resumed is not None and not self.observe:
            base = {k: resumed.baseline[k] for k in keys if k in resumed.baseline}
            st = SessionState(resumed.session, base, self.space.key_of(base))
        else:
            cur = self.env.current()
            base = {k: cur[k] for k in keys if k in cur}
            st = SessionState(uuid.uuid4().hex[:12], base, self.space.key_of(base))
            self.store.append("session", session=st.session, fingerprint=self.store.fingerprint,
                              policy=pol.name, seed=pol.tuning.seed, started=self.clock.wall(),
                              baseline=base, host=self.host_fingerprint,
                              mode="observe" if self.observe else "search")
        st.best_known = dict(base)
        self.state = st
        if self._opt is None:
            self._opt = make_optimiser(pol.tuning.optimiser, self.space, base, seed=pol.tuning.seed,
                                       initial_points=pol.tuning.initial_points,
                                       safety_limit=math.log(1.0 + pol.guard.max_regression))
        if resumed is not None and not self.observe:
            self.resume = False
            for wr in resumed.windows:
                if wr.phase in ("baseline", "trial"):
                    idx = wr.index if wr.index is not None else st.windows_used
                    st.windows_used = max(st.windows_used, idx + 1)
                    if wr.status in ("ok", "aborted") and wr.value is not None and wr.value > 0:
                        ref = wr.phase == "baseline"
                        if ref:
                            st.refs.add(idx, math.log(wr.value))
                        st.obs.append(WindowObs(idx, self.space.canonical(wr.config), math.log(wr.value), ref,
                                                aborted=wr.status == "aborted"))
                    elif wr.status == "failed" and wr.phase == "trial":
                        self._opt.tell_failed(wr.config)
                st.trial_no = max(st.trial_no, wr.trial + 1)
            self._retell(st)
            yield Event(Phase.BASELINE, f"resuming session {st.session}: {st.windows_used} windows already measured")
        elif pol.tuning.warm_start and not self.observe:
            st.prior = self.store.prior_observations(base)
            if st.prior:
                yield Event(Phase.BASELINE, f"warm start: {len(st.prior)} windows from earlier sessions "
                                            "with the same baseline")
        return st

    def _resume(self, st: SessionState) -> Generator[Event, None, bool]:
        """A confirmed deployment on record for this policy and host: re-apply it and check it with
        a short interleaved comparison (B A B A: the deployed values are measured first)."""
        rec = self.store.confirmed_deployment(self.host_fingerprint)
        if rec is None:
            return False
        old_base, deployed = rec
        if self.space.key_of(old_base) != st.base_key:
            yield Event(Phase.RESUME, "a confirmed configuration is on record, but the host's values differ "
                                      "from the baseline it was confirmed against: searching again")
            return False
        cand = {**st.baseline, **{k: v for k, v in deployed.items() if k in st.baseline}}
        yield Event(Phase.RESUME, "re-applying the confirmed configuration " + _fmt(cand, st.baseline))
        a: list[float] = []
        b: list[float] = []
        for _ in range(RESUME_PAIRS):
            for arm, cfg in (("B", cand), ("A", st.baseline)):
                if self._stop:
                    break
                try:
                    self.env.apply(cfg)
                except PolltunedError as e:
                    yield Event(Phase.RESUME, f"could not re-apply it ({e.message}): searching again")
                    self._safe_apply(st.baseline)
                    return False
                idx = st.windows_used
                w = self.env.measure(idx)
                s = score(w, self.policy.objective)
                self._log_window(st, -3, "resume", cfg, idx, s, None, hist=w.histogram)
                st.windows_used += 1
                self.trace.windows.append(("confirm", dict(cfg)))
                if s.ok and s.feasible:
                    (b if arm == "B" else a).append(s.value)
                yield Event(Phase.RESUME, f"{'deployed' if arm == 'B' else 'baseline'}: {_describe(s)}",
                            window=st.windows_used - 1, value=s.value if s.ok else None)
        if self._stop:
            self._safe_apply(st.baseline)
            self._finish(st, None, "stopped on request; baseline restored", stopped=True, mode="resume")
            yield Event(Phase.DONE, self._reason())
            return True
        if a and b:
            d = sum(math.log(x) for x in b) / len(b) - sum(math.log(x) for x in a) / len(a)
            if d <= 0.0:
                verdict = Verdict(tuple(a), tuple(b), 1 - math.exp(d), math.nan, math.nan, math.nan, False, True,
                                  f"confirmed configuration re-applied; still {1 - math.exp(d):+.1%} vs "
                                  f"baseline in a {RESUME_PAIRS}-pair check")
                self._safe_apply(cand)
                self._finish(st, verdict, "resumed: " + verdict.reason, deployed=cand, mode="resume")
                yield Event(Phase.DONE, self._reason())
                return True
            yield Event(Phase.RESUME, f"the confirmed configuration is {math.exp(d) - 1:+.1%} vs baseline now: "
                                      "searching again")
        else:
            yield Event(Phase.RESUME, "the short check had no usable windows: searching again")
        self._safe_apply(st.baseline)
        return False

    # ------------------------------------------------------------------ baseline and references
    def _measure_reference(self, st: SessionState, *, apply: bool = True) -> Generator[Event, None, Score | None]:
        if apply:
            try:
                self.env.apply(st.baseline)
            except PolltunedError as e:
                yield Event(Phase.ROLLBACK, f"could not put the baseline back: {e.message}")
                return None
        w = self.env.measure(st.windows_used)
        s = score(w, self.policy.objective)
        idx = st.windows_used
        st.windows_used += 1
        st.since_ref = 0
        self.trace.windows.append(("baseline", dict(st.baseline)))
        if not s.ok:
            self._log_window(st, -1, "baseline", st.baseline, idx, s, None, hist=w.histogram)
            yield Event(Phase.BASELINE, "baseline window failed: " + "; ".join(s.reasons), window=idx)
            return s
        if w.drops_per_s is not None:
            st.base_drops = w.drops_per_s
        st.refs.add(idx, math.log(s.value))
        st.obs.append(WindowObs(idx, dict(st.baseline), math.log(s.value), True))
        self._retell(st)
        y = next((v for i, v in st.refs.reference_ys() if i == idx), None)
        self._log_window(st, -1, "baseline", st.baseline, idx, s, y, hist=w.histogram)
        yield Event(Phase.MEASURE, f"baseline J={s.value:.4g}", window=idx, value=s.value)
        shift = st.refs.shift()
        if shift is not None:
            yield from self._restart_on_shift(st, shift)
        elif st.refs.suspect():
            st.since_ref = st.refs.interval()  # a second reference next: a shift, or one odd window?
        return s

    def _baseline(self, st: SessionState) -> Generator[Event, None, bool]:
        failed = 0
        while len(st.refs) < BASELINE_WINDOWS and not self._stop:
            yield Event(Phase.BASELINE, "measuring the baseline", window=st.windows_used)
            s = yield from self._measure_reference(st, apply=not self.observe)
            if s is None or not s.ok:
                failed += 1
                if failed >= MAX_FAILED_BASELINE:
                    break
        return len(st.refs) > 0

    def _restart_on_shift(self, st: SessionState, at: int) -> Iterator[Event]:
        msg = (f"workload shift: the baseline now scores J={math.exp(st.refs.logs[-1]):.4g} "
               f"(it was {math.exp(st.refs.logs[0]):.4g}); the search restarts on the new workload")
        st.guard_events.append(msg)
        st.refs.start_regime(at)
        st.obs = [o for o in st.obs if o.index >= at]
        st.prior = []
        st.best_known = dict(st.baseline)
        pol = self.policy
        assert self._opt is not None
        self._opt = make_optimiser(self._opt.name, self.space, st.baseline, seed=pol.tuning.seed + at,
                                   initial_points=max(2, pol.tuning.initial_points // 2),
                                   safety_limit=math.log(1.0 + pol.guard.max_regression))
        self._retell(st)
        yield Event(Phase.ROLLBACK, msg)

    # ------------------------------------------------------------------ observe
    def _observe(self, st: SessionState) -> Iterator[Event]:
        assert self._opt is not None
        would: list[dict[str, KnobValue]] = []
        for _ in range(max(1, self.policy.tuning.initial_points)):
            c = self._opt.ask(remaining=self.policy.tuning.budget)
            would.append(c)
            self._opt.tell_failed(c)  # not measured: only so the next ask proposes something else
        yield Event(Phase.OBSERVE, "observe mode: would try " + "; ".join(_fmt(c, st.baseline) for c in would))
        self._finish(st, None, f"observe mode: measured the baseline (J={st.j_ref:.4g}, window noise "
                               f"{st.refs.noise_sd():.2f} in log units); nothing was written",
                     mode="observe", would_try=would)
        yield Event(Phase.DONE, self._reason())

    # ------------------------------------------------------------------ search
    def _search(self, st: SessionState) -> Iterator[Event]:
        pol = self.policy
        assert self._opt is not None
        while st.windows_used < pol.tuning.budget and not self._stop:
            if st.since_ref >= st.refs.interval() and st.windows_used + 1 < pol.tuning.budget:
                yield Event(Phase.BASELINE, "reference window (the baseline, interleaved)", window=st.windows_used)
                yield from self._measure_reference(st)
                continue
            yield Event(Phase.PROPOSE, "asking the optimiser", trial=st.trial_no)
            pending: list[dict[str, KnobValue]] = []
            if st.in_class:
                # what the other hosts of the class measured (relative to their own baselines) and
                # what they are measuring now (not proposed twice: constant liar)
                st.shared = self.store.shared_observations(st.session, st.baseline)
                pending = self.store.pending_configs(st.session)
                self._retell(st)
            cfg = self._opt.ask(remaining=pol.tuning.budget - st.windows_used, pending=pending)
            if st.in_class:
                self.store.set_pending(st.session, cfg)
            yield from self._trial(st, cfg)
            if st.in_class:
                self.store.set_pending(st.session, None)
            if st.consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
                st.guard_events.append(f"{st.consecutive_failures} consecutive failed trials: search stopped")
                break

    def _trial(self, st: SessionState, cfg: dict[str, KnobValue]) -> Iterator[Event]:
        pol = self.policy
        opt = self._opt
        assert opt is not None
        no = st.trial_no
        st.trial_no += 1
        full = {**st.baseline, **cfg}
        yield Event(Phase.APPLY, "apply " + _fmt(cfg, st.baseline), trial=no)
        try:
            self.env.apply(full)
        except PolltunedError as e:
            opt.tell_failed(cfg)
            st.trials.append(TrialRecord(no, cfg, "failed", (), f"apply failed: {e.message}"))
            self.store.append("trial", session=st.session, trial=no, config=cfg, status="failed",
                              reason=f"apply failed: {e.message}", windows=0)
            st.consecutive_failures += 1
            yield Event(Phase.ROLLBACK, f"apply failed: {e.message}", trial=no)
            return
        values: list[float] = []
        status, reason = "ok", ""
        visit = 0
        while st.windows_used < pol.tuning.budget and not self._stop:
            if visit > 0 and st.since_ref >= st.refs.interval():
                yield from self._measure_reference(st)
                if st.windows_used >= pol.tuning.budget:
                    break
                try:
                    self.env.apply(full)
                except PolltunedError as e:
                    status, reason = "failed", f"apply failed: {e.message}"
                    break
            yield Event(Phase.SETTLE, f"settle {pol.tuning.settle_s:g}s, then measure", trial=no,
                        window=st.windows_used)
            idx = st.windows_used
            w = self.env.measure(idx)
            st.windows_used += 1
            st.since_ref += 1
            self.trace.windows.append(("trial", dict(cfg)))
            s = score(w, pol.objective, baseline_drops_per_s=st.base_drops)
            # decide, journal, then report: a crash after the event never loses the window
            if not s.ok:
                self._log_window(st, no, "trial", cfg, idx, s, None, hist=w.histogram)
                yield Event(Phase.MEASURE, _describe(s), trial=no, window=idx)
                status, reason = "failed", "; ".join(s.reasons)
                opt.tell_failed(cfg)
                break
            lj = math.log(s.value)
            level = st.refs.level(idx)
            y = model_value(s.value, level) if level is not None else 0.0
            limit = guard_limit(pol.guard.max_regression, st.refs.window_se(idx))
            aborted = not s.feasible or (visit == 0 and y > limit)
            ob = WindowObs(idx, self.space.canonical(cfg), lj, False, aborted=aborted, infeasible=not s.feasible)
            st.obs.append(ob)
            y_told = self._told(st, ob)
            self._log_window(st, no, "trial", cfg, idx, s, y_told, status="aborted" if aborted else "ok",
                             hist=w.histogram)
            yield Event(Phase.MEASURE, _describe(s), trial=no, window=idx, value=s.value)
            opt.tell(cfg, y_told)
            if values and not aborted:
                st.refs.add_repeat(idx, math.log(values[-1]), lj)
            values.append(s.value)
            visit += 1
            if aborted:
                status = "aborted"
                reason = ("constraint broken: " + "; ".join(s.reasons)) if not s.feasible else (
                    f"objective {s.value:.4g} is {math.exp(y) - 1:+.0%} vs the baseline next to it "
                    f"(limit +{pol.guard.max_regression:.0%} beyond the window noise)")
                st.guard_events.append(f"trial {no}: {reason}")
                break
            if not self._another_window(st, cfg, visit):
                break
        yield Event(Phase.SCORE, f"trial {no} {status}" + (f": {reason}" if reason else ""), trial=no,
                    value=values[-1] if values else None)
        st.trials.append(TrialRecord(no, cfg, status, tuple(values), reason))
        self.store.append("trial", session=st.session, trial=no, config=cfg, status=status, reason=reason,
                          windows=len(values))
        st.consecutive_failures = st.consecutive_failures + 1 if status == "failed" else 0
        rec = opt.best()
        if rec is not None:
            st.best_known = {**st.baseline, **rec.config}
            self.trace.recommendations.append((st.windows_used, dict(rec.config)))
        if status != "ok":
            yield Event(Phase.ROLLBACK, "putting the baseline back", trial=no)
            self._safe_apply(st.baseline)

    def _another_window(self, st: SessionState, cfg: Mapping[str, KnobValue], visit: int) -> bool:
        """The ranking rule: another window while the trial could beat the incumbent by MIN_GAIN but
        has not shown it (its mean is within one standard error of that line)."""
        if visit >= MAX_WINDOWS_PER_VISIT or st.windows_used >= self.policy.tuning.budget:
            return False
        key = self.space.key_of(cfg)
        mine = [o for o in st.obs if not o.reference and self.space.key_of(o.config) == key]
        ys = [self._told(st, o) for o in mine]
        if not ys or any(o.aborted for o in mine):
            return False
        mean = sum(ys) / len(ys)
        se = st.refs.window_se(mine[-1].index) / math.sqrt(len(ys))
        assert self._opt is not None
        rec = self._opt.best()
        inc = 0.0
        if rec is not None and self.space.key_of(rec.config) != key:
            inc = min(0.0, rec.predicted)
        line = inc - MIN_GAIN
        return mean - se < line < mean + se

    # ------------------------------------------------------------------ model values
    def _told(self, st: SessionState, o: WindowObs) -> float:
        if o.reference:
            for i, v in st.refs.reference_ys():
                if i == o.index:
                    return v
            return 0.0
        level = st.refs.level(o.index)
        y = o.log_j - level if level is not None else 0.0
        if o.aborted or o.infeasible:
            return penalised(y, math.log(1.0 + self.policy.guard.max_regression), infeasible=o.infeasible)
        return y

    def _retell(self, st: SessionState) -> None:
        """Every observation of the current regime with its up-to-date reference level."""
        if self._opt is None:
            return
        obs: list[tuple[Mapping[str, KnobValue], float]] = [*st.prior, *st.shared]
        obs += [(o.config, self._told(st, o)) for o in st.obs]
        self._opt.retell(obs)
        self._opt.set_noise(st.refs.noise_sd() * math.sqrt(1.5))

    # ------------------------------------------------------------------ conclusion
    def _conclude(self, st: SessionState) -> Iterator[Event]:
        opt = self._opt
        assert opt is not None
        if self._stop:
            self._safe_apply(st.baseline)
            self._finish(st, None, "stopped on request; baseline restored", stopped=True)
            yield Event(Phase.DONE, self._reason())
            return
        rec = opt.candidate()
        if rec is None or self.space.key_of(rec.config) == st.base_key or rec.predicted > -MIN_GAIN:
            self._safe_apply(st.baseline)
            self._finish(st, None, "no configuration is predicted to beat the baseline; kept")
            yield Event(Phase.DONE, self._reason())
            return
        cand = {**st.baseline, **rec.config}
        simple = {**st.baseline, **opt.simplify(rec.config)}
        if simple != cand and self.space.key_of(simple) != st.base_key:
            yield Event(Phase.CONFIRM, "simplified the candidate to " + _fmt(simple, st.baseline))
            cand = simple
        yield from self._confirm(st, cand)

    def _confirm(self, st: SessionState, cand: dict[str, KnobValue]) -> Iterator[Event]:
        """Interleaved A/B pairs with sequential looks at ``pairs x 2^k`` (k < looks): at each look
        the candidate is deployed when its gain is significant at ``alpha / looks`` (Bonferroni over
        the looks, so the chance of deploying a non-improvement stays <= alpha) and at least
        ``min_effect``; the comparison stops early for futility when even the optimistic bound of
        the gain is below ``min_effect``. Noisy hosts get more pairs, clear cases few."""
        pol = self.policy
        a: list[float] = []
        b: list[float] = []
        looks = [pol.confirm.pairs * 2 ** k for k in range(pol.confirm.looks)]
        alpha = pol.confirm.alpha / len(looks)
        broke: str | None = None
        sd = st.refs.noise_sd()
        verdict: Verdict | None = None
        p = 0
        while broke is None and not self._stop and p < looks[-1]:
            for arm, cfg in (("A", st.baseline), ("B", cand)):
                try:
                    self.env.apply(cfg)
                except PolltunedError as e:
                    broke = f"apply failed during confirmation: {e.message}"
                    break
                idx = st.windows_used + 1000 + 2 * p + (arm == "B")
                w = self.env.measure(idx)
                self.trace.windows.append(("confirm", dict(cfg)))
                s = score(w, pol.objective, baseline_drops_per_s=st.base_drops)
                self._log_window(st, -2, "confirm", cfg, idx, s, None, hist=w.histogram)
                yield Event(Phase.CONFIRM, f"pair {p + 1} {arm}: {_describe(s)}", window=idx,
                            value=s.value if s.ok else None)
                if not s.ok:
                    continue
                if not s.feasible and arm == "B":
                    broke = "candidate broke a constraint during confirmation: " + "; ".join(s.reasons)
                    st.guard_events.append(broke)
                    break
                (a if arm == "A" else b).append(s.value)
                if arm == "B" and a:
                    d = _mean_log(b) - _mean_log(a)
                    lim = guard_limit(pol.guard.max_regression, sd * math.sqrt(1 / len(a) + 1 / len(b)))
                    if d > lim:
                        broke = (f"candidate broke the guard during confirmation: {math.exp(d) - 1:+.0%} vs "
                                 f"the baseline windows next to it (limit +{pol.guard.max_regression:.0%} "
                                 "beyond the noise)")
                        st.guard_events.append(broke)
                        break
            p += 1
            if p in looks and len(a) >= 2 and len(b) >= 2:
                verdict = confirm_verdict(a, b, alpha=alpha, min_effect=pol.confirm.min_effect)
                if verdict.deploy or verdict.ci_high < pol.confirm.min_effect:
                    break  # decided: significant gain, or no chance of a worthwhile one
        if self._stop:
            self._safe_apply(st.baseline)
            self._finish(st, None, "stopped on request; baseline restored", stopped=True)
            yield Event(Phase.DONE, self._reason())
            return
        verdict = confirm_verdict(a, b, alpha=alpha, min_effect=pol.confirm.min_effect)
        if broke is not None:
            verdict = Verdict(verdict.baseline_samples, verdict.candidate_samples, verdict.gain, verdict.ci_low,
                              verdict.ci_high, verdict.p_value, verdict.significant, False, broke)
        deployed = cand if verdict.deploy else st.baseline
        self._safe_apply(deployed)
        reason = ("deployed: " if verdict.deploy else "baseline kept: ") + verdict.reason
        self._finish(st, verdict, reason, deployed=deployed, best=cand)
        yield Event(Phase.DONE, reason)

    # ------------------------------------------------------------------ helpers
    def _safe_apply(self, cfg: Mapping[str, KnobValue]) -> None:
        try:
            self.env.apply(cfg)
        except PolltunedError:
            pass  # the actuator left the host unchanged; the daemon's rollback path handles the rest

    def _log_window(self, st: SessionState, trial: int, phase: str, cfg: Mapping[str, KnobValue], index: int,
                    s: Score, y: float | None, *, status: str | None = None, hist: str | None = None) -> None:
        stat = status or ("ok" if s.ok else "failed")
        extra = {"histogram": hist} if hist is not None else {}  # the window's latency histogram (study store)
        self.store.append("window", session=st.session, trial=trial, phase=phase, config=dict(cfg),
                          index=index, status=stat, value=s.value if s.ok else None, y=y, ratio=y is not None,
                          score=s.to_json(), **extra)

    def _finish(self, st: SessionState, verdict: Verdict | None, reason: str, *,
                deployed: dict[str, KnobValue] | None = None, best: dict[str, KnobValue] | None = None,
                stopped: bool = False, mode: str = "search",
                would_try: Sequence[dict[str, KnobValue]] = ()) -> None:
        dep = deployed if deployed is not None else st.baseline
        rec = self._opt.best() if self._opt is not None and mode == "search" else None
        j_ref = st.j_ref
        best_value = j_ref * math.exp(rec.predicted) if rec is not None and math.isfinite(j_ref) else math.nan
        self._result = TuningResult(
            baseline_config=dict(st.baseline), baseline_value=j_ref,
            best_config=dict(best if best is not None else ({**st.baseline, **rec.config} if rec else st.baseline)),
            best_value=best_value, trials=tuple(st.trials), verdict=verdict, deployed=dict(dep),
            deployed_is_baseline=self.space.key_of(dep) == st.base_key, reason=reason,
            guard_events=tuple(st.guard_events), windows_used=st.windows_used, stopped=stopped, mode=mode,
            noise_sd=st.refs.noise_sd() if len(st.refs) else math.nan,
            dropped_knobs=tuple(sorted(self.dropped_knobs.items())), would_try=tuple(would_try))
        self.store.append("end", session=st.session, result=self._result.to_json())

    def _reason(self) -> str:
        return self._result.reason if self._result else ""


def _mean_log(xs: Sequence[float]) -> float:
    return sum(math.log(x) for x in xs) / len(xs)


def _fmt(cfg: Mapping[str, KnobValue], base: Mapping[str, KnobValue]) -> str:
    diff = [f"{k}={v}" for k, v in cfg.items() if base.get(k) != v]
    return ", ".join(diff) if diff else "(baseline values)"


def _describe(s: Score) -> str:
    if not s.ok:
        return "failed: " + "; ".join(s.reasons)
    return f"J={s.value:.4g} latency={s.latency_us:.1f}µs cpu={s.cpu_cores:.2f}" + (
        "" if s.feasible else " infeasible: " + "; ".join(s.reasons))

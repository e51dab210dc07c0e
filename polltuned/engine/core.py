"""The tuning engine: an ask/tell state machine over a typed :class:`SessionState`.

    IDLE -> (RESUME) -> BASELINE -> PROPOSE (search: trials and references) -> CONFIRM -> DONE
    IDLE -> BASELINE -> OBSERVE -> DONE            (observe mode: list what would be tried)

The engine never touches the world. Its driver (``drive`` below, or the daemon's controller) asks
``next_action()`` and gets an :class:`Apply` (write this configuration; on failure call
``apply_failed``), a :class:`Measure` (measure one window, hand it to ``observe``) or
:class:`Done`. Between actions the driver drains the events (status, progress) and may call
``request_stop()``.

How the phases are sequenced: ``state.phase`` names the next phase handler; each handler is a
short generator that yields the actions of its phase, receives their outcomes (None = applied, a
PolltunedError = not applied, a Window = measured) and returns the next phase. ``_run`` is the
only loop: it looks the handler up in a table and runs it. So the phase a session is in, and
everything it knows, is in ``state``; the handlers' local variables only hold the windows of the
phase in progress (a trial's visit, a confirmation's pairs).

Rules it keeps:

* **measure through drift**: the baseline is measured first (two reference windows) and again
  after every few trial windows (``R R T T T R T T T R …``; every 2 to 6, as often as the measured
  drift demands: ``ReferenceSeries.interval``); every window is told to the optimiser as its
  log-ratio to the baseline level at its time (polltuned.engine.reference), and the told values are
  revised when the next reference arrives. The budget counts every window
  (references, trials, repeats); confirmation windows are extra;
* **more windows where the noise demands it**: a trial gets another window (REPEAT, with its own
  reference when one is due) while its mean log-ratio is within one standard error of beating the
  incumbent by ``MIN_GAIN`` without having shown it — the rule is
  ``mean - se < inc - MIN_GAIN < mean + se`` with ``se = noise x sqrt(1 + 1/m) / sqrt(n)`` and the
  noise estimated from the reference windows — up to ``MAX_WINDOWS_PER_VISIT`` windows;
* the optimiser runs only between windows, never during one; every call passes the window's load
  context (``Window.context``);
* **guard**: a trial whose first window is worse than its reference level by more than
  ``guard.max_regression`` *beyond the window noise* (``objective.guard_limit``), or breaks a
  constraint, is aborted, told as a capped bad number, and the baseline is put back (a GUARD
  event); a failed window is recorded as failed and never told as a number;
* a workload shift (the references jump, ``ReferenceSeries.shift``) restarts the search on the new
  workload (a SHIFT event): observations from before it are no longer told;
* the final pick is the optimiser's recommendation, simplified, re-measured against the baseline
  interleaved A/B/A/B; it is deployed only when the gain is significant and at least
  ``confirm.min_effect``; otherwise the baseline stays and the verdict says why (following the
  load, a look whose gain estimate is below ``confirm.futility`` x min_effect also ends it);
* every window is appended to the Study with its kind; a restart resumes the unfinished session;
  a start with a confirmed deployment on record for the same policy and host (``resume=True``)
  re-applies it and checks it with a short interleaved comparison instead of searching again.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections import Counter
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TypeVar

from polltuned.clock import Clock
from polltuned.engine.actions import Action, Apply, Done, Measure
from polltuned.engine.hold import Entry, HoldState, Pending, RegionMap, distance, log_context
from polltuned.engine.phases import Event, EventKind, Phase, WindowKind, window_kind
from polltuned.engine.session import SessionState, Trace, TrialRecord, TuningResult, WindowObs
from polltuned.errors import PolltunedError, UsageError
from polltuned.objective import Score, guard_limit, model_value, penalised, score
from polltuned.optimiser import Optimiser, Predicting, make_optimiser
from polltuned.optimiser.space import Space
from polltuned.policy.schema import Policy
from polltuned.records import KnobValue, Window
from polltuned.safety import Verdict, confirm_verdict
from polltuned.stats import mean_log
from polltuned.study import Study
from polltuned.study.base import SessionLog

BASELINE_WINDOWS = 2
MAX_FAILED_BASELINE = 3
MAX_CONSECUTIVE_FAILURES = 5
MAX_WINDOWS_PER_VISIT = 2
MIN_GAIN = 0.02
RESUME_PAIRS = 2

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Compared:
    """What an interleaved comparison found: the verdict, both arms' J per window, whether a load
    change cut it short, and the load (context) of its first window, where its decision belongs."""

    verdict: Verdict
    a: list[float]
    b: list[float]
    cut: bool = False
    load: dict[str, float] | None = None
#: what the driver sends back into a phase handler: None (applied), the error (not applied), a window
Reply = Window | PolltunedError | None
#: a phase handler (or a part of one): yields actions, receives their outcomes, returns ``T``
Steps = Generator[Apply | Measure, Reply, T]


class EngineMisuse(UsageError):
    """The driver broke the ask/tell protocol (e.g. asked again without observing the window)."""

    code = "engine-misuse"


class Engine:
    """One tuning session. ``current`` is what the host has now (the session's baseline unless an
    unfinished session is resumed from ``store``)."""

    def __init__(self, policy: Policy, store: Study, *, current: Mapping[str, KnobValue], clock: Clock,
                 optimiser: Optimiser | None = None, host_fingerprint: str | None = None,
                 resume: bool = False, observe: bool = False,
                 dropped_knobs: Mapping[str, str] | None = None, fresh_shared: bool = False,
                 follow: bool = False) -> None:
        self.policy = policy
        self.store = store
        self.clock = clock
        self.space = Space.from_policy(policy)
        self.host_fingerprint = host_fingerprint
        self.dropped_knobs = dict(dropped_knobs or {})
        #: fleet experiment (benchmarks/fleet.py --fresh-shared): re-read the class's observations at
        #: every re-tell, not only at proposals
        self.fresh_shared = fresh_shared
        self.trace = Trace()
        self.state = self._open(current, optimiser, resume=resume, observe=observe or policy.mode == "observe")
        #: follow the load after the first decision (HOLD: fallback, table by region, challengers)
        self.state.follow = follow and self.state.mode != "observe"
        self._events: list[Event] = []
        self._steps = self._run()
        self._pending: Apply | Measure | None = None
        self._reply: Reply = None
        self._started = False

    def _open(self, current: Mapping[str, KnobValue], optimiser: Optimiser | None, *, resume: bool,
              observe: bool) -> SessionState:
        """The session's state: the unfinished session on record continues (its baseline), or a new
        one starts from ``current``. Nothing is written yet (the IDLE handler does)."""
        pol, keys = self.policy, self.space.keys
        resumed = None if observe else self.store.resumable()
        src = resumed.baseline if resumed is not None else current
        base = {k: src[k] for k in keys if k in src}
        opt = optimiser if optimiser is not None else make_optimiser(
            pol.tuning.optimiser, self.space, base, seed=pol.tuning.seed, initial_points=pol.tuning.initial_points,
            safety_limit=math.log(1.0 + pol.guard.max_regression))
        sid = resumed.session if resumed is not None else uuid.uuid4().hex[:12]
        st = SessionState(sid, base, self.space.key_of(base), opt, mode="observe" if observe else "search",
                          resume=resume and not observe and resumed is None, resumed=resumed,
                          budget_end=pol.tuning.budget)
        st.best_known = dict(base)
        return st

    # ------------------------------------------------------------------ the ask/tell API
    def next_action(self) -> Action:
        """The next thing to do. After an Apply, calling this again means it was applied."""
        if isinstance(self._pending, Measure):
            raise EngineMisuse(f"window {self._pending.index} was asked for but never observed")
        reply, self._reply, self._pending = self._reply, None, None
        try:
            act = self._steps.send(reply) if self._started else next(self._steps)
        except StopIteration:
            return self._done()
        self._started = True
        self._pending = act
        return act

    def observe(self, window: Window) -> None:
        """The window measured for the last Measure."""
        if not isinstance(self._pending, Measure):
            raise EngineMisuse("observe() without a Measure to answer")
        self._pending, self._reply = None, window

    def apply_failed(self, error: PolltunedError) -> None:
        """The last Apply raised ``error`` (the host is unchanged)."""
        if not isinstance(self._pending, Apply):
            raise EngineMisuse("apply_failed() without an Apply to answer")
        self._pending, self._reply = None, error

    def drain_events(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    def request_stop(self) -> None:
        self.state.stop = True

    @property
    def result(self) -> TuningResult | None:
        return self.state.result

    @property
    def optimiser(self) -> Optimiser:
        return self.state.optimiser

    def retell(self) -> None:
        """Re-tell the model every observation with its current reference level (public for the
        fleet experiment, which re-reads the class's observations before each recommendation)."""
        self._retell(self.state)

    def _done(self) -> Done:
        if self.state.result is None:
            raise EngineMisuse("the session ended without a result")
        return Done(self.state.result)

    # ------------------------------------------------------------------ sequencing
    def _run(self) -> Steps[None]:
        handlers: dict[Phase, Callable[[], Steps[Phase]]] = {
            Phase.IDLE: self._start, Phase.RESUME: self._resume, Phase.BASELINE: self._baseline,
            Phase.OBSERVE: self._observe, Phase.PROPOSE: self._search, Phase.CONFIRM: self._conclude,
            Phase.HOLD: self._hold,
        }
        while self.state.phase is not Phase.DONE:
            self.state.phase = yield from handlers[self.state.phase]()

    def _emit(self, phase: Phase, message: str, *, kind: EventKind = EventKind.PHASE, trial: int | None = None,
              window: int | None = None, value: float | None = None) -> None:
        self._events.append(Event(phase, message, trial=trial, window=window, value=value, kind=kind))

    def _apply(self, cfg: Mapping[str, KnobValue], kind: WindowKind, reason: str = "") -> Steps[PolltunedError | None]:
        reply = yield Apply(dict(cfg), kind, reason)
        return reply if isinstance(reply, PolltunedError) else None

    def _measure(self, kind: WindowKind, trial: int | None = None, *, at: int | None = None
                 ) -> Steps[tuple[int, Window]]:
        """One window at index ``at`` (the budget windows: their count so far, the reference series'
        time axis) or at the next index of the state's window clock (confirmation, hold)."""
        idx = self.state.index if at is None else at
        self.state.index = max(self.state.index, idx + 1)
        h = self.state.hold
        if h is not None:   # after the first decision: HOLD's accounting of every window
            h.windows += 1
            h.exploring += kind not in (WindowKind.HOLD, WindowKind.FALLBACK)
            h.last_kind = kind.value
        reply = yield Measure(idx, kind, trial)
        if not isinstance(reply, Window):
            raise EngineMisuse(f"window {idx}: expected a Window, got {type(reply).__name__}")
        self.state.context = dict(reply.context)
        return idx, reply

    def _put_back(self, cfg: Mapping[str, KnobValue], kind: WindowKind = WindowKind.REFERENCE) -> Steps[None]:
        """Apply ``cfg``; a failure leaves the host unchanged and the daemon's rollback path handles it."""
        yield from self._apply(cfg, kind, "put back")

    # ------------------------------------------------------------------ IDLE: start / resume
    def _start(self) -> Steps[Phase]:
        st, pol = self.state, self.policy
        yield from ()
        if st.resumed is not None:
            self._replay(st, st.resumed)
            self._emit(Phase.BASELINE, f"resuming session {st.session}: {st.windows_used} windows already measured")
            return Phase.BASELINE
        self.store.append("session", session=st.session, fingerprint=self.store.fingerprint,
                          policy=pol.name, seed=pol.tuning.seed, started=self.clock.wall(),
                          baseline=st.baseline, host=self.host_fingerprint, mode=st.mode)
        if pol.tuning.warm_start and st.mode != "observe":
            st.prior = self.store.prior_observations(st.baseline)
            if st.prior:
                self._emit(Phase.BASELINE, f"warm start: {len(st.prior)} windows from earlier sessions "
                                           "with the same baseline")
        return Phase.RESUME if st.resume else Phase.BASELINE

    def _replay(self, st: SessionState, log: SessionLog) -> None:
        """Rebuild the references and observations of an unfinished session from its windows."""
        for wr in log.windows:
            kind = window_kind(wr.phase)
            if wr.index is not None:
                st.index = max(st.index, wr.index + 1)
            if kind in (WindowKind.REFERENCE, WindowKind.TRIAL, WindowKind.REPEAT):
                idx = wr.index if wr.index is not None else st.windows_used
                st.windows_used = max(st.windows_used, idx + 1)
                if wr.status in ("ok", "aborted") and wr.value is not None and wr.value > 0:
                    ref = kind is WindowKind.REFERENCE
                    if ref:
                        st.refs.add(idx, math.log(wr.value))
                    st.obs.append(WindowObs(idx, self.space.canonical(wr.config), math.log(wr.value), ref,
                                            aborted=wr.status == "aborted"))
                elif wr.status == "failed" and kind is not WindowKind.REFERENCE:
                    st.optimiser.tell_failed(wr.config)
            if wr.trial is not None and wr.trial >= 0:
                st.trial_no = max(st.trial_no, wr.trial + 1)
        self._retell(st)

    def _resume(self) -> Steps[Phase]:
        """A confirmed deployment on record for this policy and host: re-apply it and check it with
        a short interleaved comparison (B A B A: the deployed values are measured first)."""
        st = self.state
        rec = self.store.confirmed_deployment(self.host_fingerprint)
        if rec is None:
            return Phase.BASELINE
        old_base, deployed = rec
        if self.space.key_of(old_base) != st.base_key:
            self._emit(Phase.RESUME, "a confirmed configuration is on record, but the host's values differ "
                                     "from the baseline it was confirmed against: searching again")
            return Phase.BASELINE
        cand = {**st.baseline, **{k: v for k, v in deployed.items() if k in st.baseline}}
        self._emit(Phase.RESUME, "re-applying the confirmed configuration " + _fmt(cand, st.baseline))
        a, b = yield from self._resume_pairs(cand)
        if a is None:
            return Phase.BASELINE
        if st.stop:
            yield from self._put_back(st.baseline)
            self._finish(st, None, "stopped on request; baseline restored", stopped=True, mode="resume")
            self._emit(Phase.DONE, self._reason(), kind=EventKind.STOP)
            return Phase.DONE
        if a and b:
            d = mean_log(b) - mean_log(a)
            if d <= 0.0:
                verdict = Verdict(tuple(a), tuple(b), 1 - math.exp(d), math.nan, math.nan, math.nan, False, True,
                                  f"confirmed configuration re-applied; still {1 - math.exp(d):+.1%} vs "
                                  f"baseline in a {RESUME_PAIRS}-pair check")
                yield from self._put_back(cand, WindowKind.RESUME)
                self._finish(st, verdict, "resumed: " + verdict.reason, deployed=cand, mode="resume")
                self._emit(Phase.DONE, self._reason(), kind=EventKind.DEPLOY)
                return self._decided(verdict, mean_log(b), self._reason(), config=cand, windows=len(a) + len(b))
            self._emit(Phase.RESUME, f"the confirmed configuration is {math.exp(d) - 1:+.1%} vs baseline now: "
                                     "searching again")
        else:
            self._emit(Phase.RESUME, "the short check had no usable windows: searching again")
        yield from self._put_back(st.baseline)
        return Phase.BASELINE

    def _resume_pairs(self, cand: dict[str, KnobValue]) -> Steps[tuple[list[float] | None, list[float]]]:
        """RESUME_PAIRS pairs (deployed, baseline); (None, []) when the deployment could not be applied."""
        st = self.state
        a: list[float] = []
        b: list[float] = []
        for _ in range(RESUME_PAIRS):
            for arm, cfg in (("B", cand), ("A", st.baseline)):
                if st.stop:
                    break
                err = yield from self._apply(cfg, WindowKind.RESUME)
                if err is not None:
                    self._emit(Phase.RESUME, f"could not re-apply it ({err.message}): searching again")
                    yield from self._put_back(st.baseline)
                    return None, []
                idx, w = yield from self._measure(WindowKind.RESUME, at=st.windows_used)
                s = score(w, self.policy.objective)
                self._log_window(st, None, WindowKind.RESUME, cfg, idx, s, None, hist=w.histogram)
                st.windows_used += 1
                self.trace.windows.append((WindowKind.RESUME, dict(cfg)))
                if s.ok and s.feasible:
                    (b if arm == "B" else a).append(s.value)
                self._emit(Phase.RESUME, f"{'deployed' if arm == 'B' else 'baseline'}: {_describe(s)}",
                           window=idx, value=s.value if s.ok else None)
        return a, b

    # ------------------------------------------------------------------ BASELINE and references
    def _reference(self, *, apply: bool = True) -> Steps[Score | None]:
        """One reference window (the baseline), told as its log-ratio to the other references."""
        st = self.state
        if apply:
            err = yield from self._apply(st.baseline, WindowKind.REFERENCE)
            if err is not None:
                self._emit(Phase.ROLLBACK, f"could not put the baseline back: {err.message}", kind=EventKind.GUARD)
                return None
        idx, w = yield from self._measure(WindowKind.REFERENCE, at=st.windows_used)
        s = score(w, self.policy.objective)
        st.windows_used += 1
        st.since_ref = 0
        self.trace.windows.append((WindowKind.REFERENCE, dict(st.baseline)))
        if not s.ok:
            self._log_window(st, None, WindowKind.REFERENCE, st.baseline, idx, s, None, hist=w.histogram)
            self._emit(Phase.BASELINE, "baseline window failed: " + "; ".join(s.reasons), window=idx)
            return s
        if w.drops_per_s is not None:
            st.base_drops = w.drops_per_s
        st.refs.add(idx, math.log(s.value))
        st.obs.append(WindowObs(idx, dict(st.baseline), math.log(s.value), True, context=dict(w.context)))
        self._retell(st)
        y = next((v for i, v in st.refs.reference_ys() if i == idx), None)
        self._log_window(st, None, WindowKind.REFERENCE, st.baseline, idx, s, y, hist=w.histogram)
        self._emit(Phase.MEASURE, f"baseline J={s.value:.4g}", window=idx, value=s.value)
        shift = st.refs.shift()
        if shift is not None:
            self._restart_on_shift(st, shift)
        elif st.refs.suspect():
            st.since_ref = st.refs.interval()  # a second reference next: a shift, or one odd window?
        return s

    def _baseline(self) -> Steps[Phase]:
        st = self.state
        failed = 0
        while len(st.refs) < BASELINE_WINDOWS and not st.stop:
            self._emit(Phase.BASELINE, "measuring the baseline", window=st.windows_used)
            s = yield from self._reference(apply=st.mode != "observe")
            if s is None or not s.ok:
                failed += 1
                if failed >= MAX_FAILED_BASELINE:
                    break
        if len(st.refs) == 0:
            if st.result is None or st.stop:
                self._finish(st, None, "baseline could not be measured; nothing changed", stopped=st.stop)
                self._emit(Phase.DONE, self._reason(), kind=EventKind.STOP if st.stop else EventKind.KEEP)
            return self._decided(None, None, "the baseline could not be measured: the originals stay")
        if st.mode == "observe":
            return Phase.OBSERVE
        if st.hold is not None:
            return Phase.PROPOSE          # a region search: the class was joined (or not) at the start
        st.in_class = self.store.join_class(st.session, st.j_ref, st.refs.noise_sd())
        if st.in_class:
            self._emit(Phase.BASELINE, "this host joined its workload class: the search shares the class's "
                                       "observations and pending trials")
        return Phase.PROPOSE

    def _restart_on_shift(self, st: SessionState, at: int) -> None:
        msg = (f"workload shift: the baseline now scores J={math.exp(st.refs.logs[-1]):.4g} "
               f"(it was {math.exp(st.refs.logs[0]):.4g}); the search restarts on the new workload")
        st.guard_events.append(msg)
        st.refs.start_regime(at)
        st.obs = [o for o in st.obs if o.index >= at]
        st.prior = []
        st.best_known = dict(st.baseline)
        pol = self.policy
        st.optimiser = make_optimiser(st.optimiser.name, self.space, st.baseline, seed=pol.tuning.seed + at,
                                      initial_points=max(2, pol.tuning.initial_points // 2),
                                      safety_limit=math.log(1.0 + pol.guard.max_regression))
        self._retell(st)
        self._emit(Phase.BASELINE, msg, kind=EventKind.SHIFT)

    # ------------------------------------------------------------------ OBSERVE
    def _observe(self) -> Steps[Phase]:
        st = self.state
        yield from ()
        would: list[dict[str, KnobValue]] = []
        for _ in range(max(1, self.policy.tuning.initial_points)):
            c = st.optimiser.ask(remaining=self.policy.tuning.budget, context=st.context)
            would.append(c)
            st.optimiser.tell_failed(c)  # not measured: only so the next ask proposes something else
        self._emit(Phase.OBSERVE, "observe mode: would try " + "; ".join(_fmt(c, st.baseline) for c in would))
        self._finish(st, None, f"observe mode: measured the baseline (J={st.j_ref:.4g}, window noise "
                               f"{st.refs.noise_sd():.2f} in log units); nothing was written",
                     mode="observe", would_try=would)
        self._emit(Phase.DONE, self._reason(), kind=EventKind.KEEP)
        return Phase.DONE

    # ------------------------------------------------------------------ PROPOSE: the search
    def _search(self) -> Steps[Phase]:
        st = self.state
        while st.windows_used < st.budget_end and not st.stop:
            if st.since_ref >= st.refs.interval() and st.windows_used + 1 < st.budget_end:
                self._emit(Phase.BASELINE, "reference window (the baseline, interleaved)", window=st.windows_used)
                yield from self._reference()
                continue
            self._emit(Phase.PROPOSE, "asking the optimiser", trial=st.trial_no)
            pending: list[dict[str, KnobValue]] = []
            if st.in_class:
                # what the other hosts of the class measured (relative to their own baselines) and
                # what they are measuring now (not proposed twice: constant liar)
                st.shared = self.store.shared_observations(st.session, st.baseline)
                pending = self.store.pending_configs(st.session)
                self._retell(st)
            h = st.hold
            if h is not None and h.transfer:
                cfg = h.transfer.pop(0)
            else:
                cfg = st.optimiser.ask(remaining=st.budget_end - st.windows_used, pending=pending,
                                       context=st.context)
            if st.in_class:
                self.store.set_pending(st.session, cfg)
            yield from self._trial(cfg)
            if st.in_class:
                self.store.set_pending(st.session, None)
            if st.consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
                st.guard_events.append(f"{st.consecutive_failures} consecutive failed trials: search stopped")
                break
        return Phase.CONFIRM

    def _trial(self, cfg: dict[str, KnobValue]) -> Steps[None]:
        """One visit of ``cfg``: its first window (TRIAL), maybe more (REPEAT, with a reference
        between them when one is due), then the trial record; the baseline goes back unless ok."""
        st = self.state
        no = st.trial_no
        st.trial_no += 1
        full = {**st.baseline, **cfg}
        self._emit(Phase.APPLY, "apply " + _fmt(cfg, st.baseline), trial=no)
        err = yield from self._apply(full, WindowKind.TRIAL)
        if err is not None:
            st.optimiser.tell_failed(cfg)
            st.trials.append(TrialRecord(no, cfg, "failed", (), f"apply failed: {err.message}"))
            self.store.append("trial", session=st.session, trial=no, config=cfg, status="failed",
                              reason=f"apply failed: {err.message}", windows=0)
            st.consecutive_failures += 1
            self._emit(Phase.ROLLBACK, f"apply failed: {err.message}", kind=EventKind.GUARD, trial=no)
            return
        values: list[float] = []
        status, reason = yield from self._visit(no, cfg, full, values)
        self._emit(Phase.SCORE, f"trial {no} {status}" + (f": {reason}" if reason else ""), trial=no,
                   value=values[-1] if values else None)
        st.trials.append(TrialRecord(no, cfg, status, tuple(values), reason))
        self.store.append("trial", session=st.session, trial=no, config=cfg, status=status, reason=reason,
                          windows=len(values))
        st.consecutive_failures = st.consecutive_failures + 1 if status == "failed" else 0
        rec = st.optimiser.best()
        if rec is not None:
            st.best_known = {**st.baseline, **rec.config}
            self.trace.recommendations.append((st.windows_used, dict(rec.config)))
        if status != "ok":
            self._emit(Phase.ROLLBACK, "putting the baseline back", kind=EventKind.GUARD, trial=no)
            yield from self._put_back(st.baseline)

    def _visit(self, no: int, cfg: dict[str, KnobValue], full: dict[str, KnobValue],
               values: list[float]) -> Steps[tuple[str, str]]:
        """The windows of one visit; (status, reason). ``values`` collects the usable windows' J."""
        st, pol = self.state, self.policy
        visit = 0
        while st.windows_used < st.budget_end and not st.stop:
            if visit > 0 and st.since_ref >= st.refs.interval():
                yield from self._reference()
                if st.windows_used >= st.budget_end:
                    break
                err = yield from self._apply(full, WindowKind.REPEAT)
                if err is not None:
                    return "failed", f"apply failed: {err.message}"
            self._emit(Phase.SETTLE, f"settle {pol.tuning.settle_s:g}s, then measure", trial=no,
                       window=st.windows_used)
            kind = WindowKind.TRIAL if visit == 0 else WindowKind.REPEAT
            outcome = yield from self._trial_window(no, cfg, kind, values)
            visit += 1
            if outcome is not None:
                return outcome
            if not self._another_window(st, cfg, visit):
                break
        return "ok", ""

    def _trial_window(self, no: int, cfg: dict[str, KnobValue], kind: WindowKind,
                      values: list[float]) -> Steps[tuple[str, str] | None]:
        """Measure, score, guard, journal, tell: (status, reason) when the visit ends here."""
        st, pol = self.state, self.policy
        idx, w = yield from self._measure(kind, no, at=st.windows_used)
        st.windows_used += 1
        st.since_ref += 1
        self.trace.windows.append((kind, dict(cfg)))
        s = score(w, pol.objective, baseline_drops_per_s=st.base_drops)
        # decide, journal, then report: a crash after the event never loses the window
        if not s.ok:
            self._log_window(st, no, kind, cfg, idx, s, None, hist=w.histogram)
            self._emit(Phase.MEASURE, _describe(s), trial=no, window=idx)
            st.optimiser.tell_failed(cfg)
            return "failed", "; ".join(s.reasons)
        lj = math.log(s.value)
        level = st.refs.level(idx)
        y = model_value(s.value, level) if level is not None else 0.0
        limit = guard_limit(pol.guard.max_regression, st.refs.window_se(idx))
        aborted = not s.feasible or (kind is WindowKind.TRIAL and y > limit)
        ob = WindowObs(idx, self.space.canonical(cfg), lj, False, aborted=aborted, infeasible=not s.feasible,
                       context=dict(w.context))
        st.obs.append(ob)
        y_told = self._told(st, ob)
        self._log_window(st, no, kind, cfg, idx, s, y_told, status="aborted" if aborted else "ok",
                         hist=w.histogram)
        self._emit(Phase.MEASURE, _describe(s), trial=no, window=idx, value=s.value)
        st.optimiser.tell(cfg, y_told, context=ob.context)
        if values and not aborted:
            st.refs.add_repeat(idx, math.log(values[-1]), lj)
        values.append(s.value)
        if not aborted:
            return None
        reason = ("constraint broken: " + "; ".join(s.reasons)) if not s.feasible else (
            f"objective {s.value:.4g} is {math.exp(y) - 1:+.0%} vs the baseline next to it "
            f"(limit +{pol.guard.max_regression:.0%} beyond the window noise)")
        st.guard_events.append(f"trial {no}: {reason}")
        return "aborted", reason

    def _another_window(self, st: SessionState, cfg: Mapping[str, KnobValue], visit: int) -> bool:
        """The ranking rule: another window while the trial could beat the incumbent by MIN_GAIN but
        has not shown it (its mean is within one standard error of that line)."""
        if visit >= MAX_WINDOWS_PER_VISIT or st.windows_used >= st.budget_end:
            return False
        key = self.space.key_of(cfg)
        mine = [o for o in st.obs if not o.reference and self.space.key_of(o.config) == key]
        ys = [self._told(st, o) for o in mine]
        if not ys or any(o.aborted for o in mine):
            return False
        mean = sum(ys) / len(ys)
        se = st.refs.window_se(mine[-1].index) / math.sqrt(len(ys))
        rec = st.optimiser.best()
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
        if self.fresh_shared and st.in_class:
            st.shared = self.store.shared_observations(st.session, st.baseline)
        outside = [*st.prior, *st.shared]
        obs: list[tuple[Mapping[str, KnobValue], float]] = list(outside)
        contexts: list[Mapping[str, float] | None] = [None] * len(outside)
        obs += [(c, y) for c, y, _ in st.frozen]
        contexts += [ctx for _, _, ctx in st.frozen]
        obs += [(o.config, self._told(st, o)) for o in st.obs]
        contexts += [o.context for o in st.obs]
        st.optimiser.retell(obs, contexts=contexts)
        st.optimiser.set_noise(st.refs.noise_sd() * math.sqrt(1.5))

    # ------------------------------------------------------------------ CONFIRM: the conclusion
    def _conclude(self) -> Steps[Phase]:
        """The search's pick, simplified, confirmed against the baseline (the originals)."""
        st = self.state
        if st.stop:
            return (yield from self._stopped())
        where = self._decision_load()
        rec = self._pick(where)
        if rec is None:
            return (yield from self._keep_originals("no configuration is predicted to beat the baseline; kept",
                                                    where))
        cand = {**st.baseline, **rec}
        simple, shares = self._simplify(rec, where)
        if simple != cand:
            self._emit(Phase.CONFIRM, "simplified the candidate to " + _fmt(simple, st.baseline))
            cand = simple
        too_little = self._predicted_too_little(cand, where)
        if too_little is not None:
            return (yield from self._keep_originals(too_little, where))
        if where is not None and self._far(st.context, where):
            # the load the search measured has left: a confirmation now would judge the candidate on
            # another load (and decide for the wrong region). It waits, as a cut confirmation with no
            # pairs yet, until that load is back; the load now gets its own entry or search.
            return (yield from self._keep_originals(
                "the load the search measured left before the confirmation: the originals for now", where,
                pending=Pending(dict(cand), [], [], shares)))
        c = yield from self._confirm(cand)
        verdict, a, b = c.verdict, c.a, c.b
        if st.stop:
            return (yield from self._stopped())
        deployed = cand if verdict.deploy else st.baseline
        left = verdict.deploy and self._left(c)
        yield from self._put_back(st.baseline if left else deployed, WindowKind.CONFIRM)
        reason = (("deployed: " if verdict.deploy else "baseline kept: ") + verdict.reason
                  + (" (cut short by a load change)" if c.cut else ""))
        if st.result is None:
            self._finish(st, verdict, reason, deployed=deployed, best=cand)
            self._emit(Phase.DONE, reason, kind=EventKind.DEPLOY if verdict.deploy else EventKind.KEEP)
        level = mean_log(b if verdict.deploy else a) if (b if verdict.deploy else a) else None
        pending = Pending(dict(cand), list(a), list(b), shares) if self._resumable(c) else None
        phase = self._decided(verdict if verdict.deploy else None, level, reason, config=deployed,
                              windows=len(a) + len(b), shares=shares, pending=pending, load=c.load)
        if left and phase is Phase.HOLD:
            self._originals_for_the_load_now()
        return phase

    def _keep_originals(self, why: str, where: Mapping[str, float] | None = None, *,
                        pending: Pending | None = None) -> Steps[Phase]:
        """The search ends without a confirmation: the originals go back (and are the session's
        result when it has none yet) and become the entry (of the region at ``where``), with the
        ``pending`` confirmation it left for that load, if any."""
        st = self.state
        yield from self._put_back(st.baseline)
        if st.result is None:
            self._finish(st, None, why)
            self._emit(Phase.DONE, self._reason(), kind=EventKind.KEEP)
        return self._decided(None, None, why, pending=pending, load=where)

    def _decision_load(self) -> dict[str, float] | None:
        """Following the load: the load the search's decision is for — the context of the last
        window in the region most of this search's windows were measured in (the later of a tie),
        so that the pick, its simplification and the model's check are made for the load the
        windows measured, not for whatever load the last window saw; the last context when no window
        has one. None outside follow mode (a single round asks the optimiser at its own last context)."""
        st, hp = self.state, self.policy.hold
        if not st.follow:
            return None
        seen = [dict(o.context) for o in st.obs if o.context]
        if not seen:
            return dict(st.context)
        scratch = RegionMap(hp.region_radius, hp.max_regions)
        return seen[_latest_of_most_common([scratch.assign(c) for c in seen])]

    def _far(self, a: Mapping[str, float], b: Mapping[str, float]) -> bool:
        """Two loads further apart than the region radius."""
        return distance(log_context(a), log_context(b)) > self.policy.hold.region_radius

    def _predicted_too_little(self, cand: Mapping[str, KnobValue],
                              where: Mapping[str, float] | None = None) -> str | None:
        """A region's search (HOLD): its pick is the best of a few noisy windows. When the model, which
        holds every load's windows, predicts less than min_effect for it at this load, the
        confirmation could not deploy it anyway: why the originals stay without spending it; None
        otherwise (and always for the first search)."""
        st = self.state
        if st.hold is None or not isinstance(st.optimiser, Predicting):
            return None
        (m, _), = st.optimiser.predict([cand], context=where)
        if not math.isfinite(m) or m <= math.log(1.0 - self.policy.confirm.min_effect):
            return None
        return (f"the model predicts {1 - math.exp(m):+.1%} for the search's pick {_fmt(cand, st.baseline)} "
                "at this load (< min_effect): the originals stay")

    def _simplify(self, cfg: Mapping[str, KnobValue], where: Mapping[str, float] | None = None
                  ) -> tuple[dict[str, KnobValue], tuple[tuple[str, float], ...]]:
        """Deploy only what matters: the optimiser's own simplification (knobs the model is sure do
        not matter), then, with a model to ask (polltuned.optimiser.Predicting), the knob that
        carries the gain (the largest predicted cost of putting it back) stays, and another knob
        stays beside it when the model's cost of putting it back reaches what the first look of the
        confirmation can resolve (window noise / sqrt(2 x pairs)): its mean (``hold.keep_knobs``
        "likely", the default), or the lower bound, mean - sd, of the difference its reversion
        makes, from the joint posterior ("proven": the burden of proof is on the knob; one the model
        cannot tell from the original, such as a tiny gro_flush_timeout, goes back — fewer knobs, and
        measured 2-4 points less often within 5 % on a fresh family seed). The confirmation that
        follows measures the simplified configuration, so an unsure model is checked with windows.
        Returns the full configuration and each changed knob's share of the predicted gain."""
        st, space = self.state, self.space
        cur = {**st.baseline, **st.optimiser.simplify(cfg, context=where)}
        if space.key_of(cur) == st.base_key:
            cur = {**st.baseline, **cfg}
        opt = st.optimiser
        # only when following the load (the daemon): at budget 30 the extra pass cost the family's
        # median regret 0.238 -> 0.274 (within-5 % 0.22 -> 0.25), so a single round keeps the old rule
        if not isinstance(opt, Predicting) or not st.follow:
            return cur, ()
        tol = st.refs.noise_sd() / math.sqrt(2.0 * self.policy.confirm.pairs)
        proven = self.policy.hold.keep_knobs == "proven"
        main: str | None = None
        while True:
            changed = [k for k in space.keys if cur.get(k) != st.baseline.get(k)]
            if len(changed) <= 1:
                break
            diff = opt.predict([{**cur, k: st.baseline[k]} for k in changed], context=where, against=cur)
            if not all(math.isfinite(m) and math.isfinite(d) for m, d in diff):
                break
            # the knob that carries the gain (the largest predicted cost of putting it back) always
            # stays, however wide its posterior: a short, noisy search knows *that* the pick wins far
            # better than which knob makes it win (the real mix bench lost busy_read=50's +45 % to a
            # busy_poll=2 that stayed when the rule could put back any knob)
            if main is None:
                main = changed[max(range(len(changed)), key=lambda i: diff[i][0])]
            lower = {k: m - d if proven else m for k, (m, d) in zip(changed, diff) if k != main}
            if not lower:
                break
            k = min(lower, key=lambda c: lower[c])
            if lower[k] >= tol:
                break
            cur = {**cur, k: st.baseline[k]}
        return cur, self._shares(opt, cur, where)

    def _shares(self, opt: Predicting, cur: dict[str, KnobValue],
                at: Mapping[str, float] | None) -> tuple[tuple[str, float], ...]:
        """Each changed knob's share of the predicted gain at load ``at``: how much reverting it alone costs."""
        st = self.state
        changed = [k for k in self.space.keys if cur.get(k) != st.baseline.get(k)]
        if not changed:
            return ()
        preds = opt.predict([cur] + [{**cur, k: st.baseline[k]} for k in changed], context=at)
        rise = [max(preds[i + 1][0] - preds[0][0], 0.0) for i in range(len(changed))]
        tot = sum(rise)
        if not math.isfinite(tot) or tot <= 0:
            return tuple((k, 1.0 / len(changed)) for k in changed)
        return tuple((k, r / tot) for k, r in zip(changed, rise))

    def _pick(self, where: Mapping[str, float] | None = None) -> dict[str, KnobValue] | None:
        """What to confirm for the load ``where`` (None: the last one seen): the optimiser's
        candidate (first search), or the best configuration measured in this regime at that load (a
        region's search: the model also holds other regions' windows). None when nothing is
        predicted to beat the baseline by MIN_GAIN."""
        st = self.state
        if st.hold is None:
            rec = st.optimiser.candidate(context=where)
            if rec is None or self.space.key_of(rec.config) == st.base_key or rec.predicted > -MIN_GAIN:
                return None
            return dict(rec.config)
        by: dict[str, list[float]] = {}
        cfgs: dict[str, dict[str, KnobValue]] = {}
        for o in st.obs:
            near = where is None or not o.context or not self._far(o.context, where)
            if near and not o.reference and not o.aborted and not o.infeasible:
                k = self.space.key_of(o.config)
                by.setdefault(k, []).append(self._told(st, o))
                cfgs[k] = dict(o.config)
        best = min(by, key=lambda k: sum(by[k]) / len(by[k]), default=None)
        if best is None or best == st.base_key or sum(by[best]) / len(by[best]) > -MIN_GAIN:
            # nothing this short search measured wins: the model (which holds every load's windows)
            # may still predict a winner at this load; the confirmation then measures it
            rec = st.optimiser.candidate(context=where)
            if rec is None or self.space.key_of(rec.config) == st.base_key or rec.predicted > -MIN_GAIN:
                return None
            return dict(rec.config)
        return cfgs[best]

    def _stopped(self) -> Steps[Phase]:
        st = self.state
        yield from self._put_back(st.baseline)
        self._finish(st, None, "stopped on request; baseline restored", stopped=True)
        self._emit(Phase.DONE, self._reason(), kind=EventKind.STOP)
        return Phase.DONE

    def _confirm(self, cand: dict[str, KnobValue], *, against: dict[str, KnobValue] | None = None,
                 kind: WindowKind = WindowKind.CONFIRM, earlier: Pending | None = None
                 ) -> Steps[Compared]:
        """Interleaved A/B pairs with sequential looks at ``pairs x 2^k`` (k < looks): at each look
        the candidate is deployed when its gain is significant at ``alpha / looks`` (Bonferroni over
        the looks, so the chance of deploying a non-improvement stays <= alpha) and at least
        ``min_effect``; the comparison stops early for futility when even the optimistic bound of
        the gain is below ``min_effect``. Noisy hosts get more pairs, clear cases few. A is the
        baseline (or ``against``: the active entry, for HOLD's challengers and fallback checks).
        Returns the verdict, the J of both arms' windows, whether a load change cut it and the load
        of its first window."""
        st, pol = self.state, self.policy
        a: list[float] = list(earlier.a) if earlier is not None else []
        b: list[float] = list(earlier.b) if earlier is not None else []
        base = against if against is not None else st.baseline
        looks = [pol.confirm.pairs * 2 ** k for k in range(pol.confirm.looks)]
        alpha = pol.confirm.alpha / len(looks)
        broke: str | None = None
        p = min(len(a), len(b))   # a resumed comparison goes on from its pairs (same schedule of looks)
        ctxs: list[dict[str, float]] = []
        cut = False
        while broke is None and not st.stop and p < looks[-1]:
            broke = yield from self._confirm_pair(p, cand, base, a, b, kind, ctxs)
            p += 1
            if broke is not None and kind is WindowKind.CONFIRM:
                before = self._pairs_before_a_break_elsewhere(ctxs)
                if before is not None:
                    # the candidate broke the guard at a load the comparison did not start at: the
                    # originals go back (the guard did its job), but the break says nothing about the
                    # candidate at the starting load, where its pairs so far stay the evidence (cut:
                    # resumable when that load is back)
                    keep = before + (len(earlier.a) if earlier is not None else 0)
                    del a[keep:], b[keep:]
                    cut = True
                    broke = (f"not decided: {broke} at another load; the comparison keeps its first {keep} "
                             "pairs for its own load")
            before = self._pairs_before_the_load_left(ctxs) if broke is None else None
            if before is not None:
                # the load left the region the comparison started in: its later pairs would judge
                # the candidate on another load (and the decision would land in the wrong region).
                # Decide on the pairs of the starting load, as one more look at alpha / looks.
                keep = before + (len(earlier.a) if earlier is not None else 0)
                del a[keep:], b[keep:]
                cut = True
                self._emit(Phase.HOLD if kind is not WindowKind.CONFIRM else Phase.CONFIRM,
                           f"the load changed during the {_DURING[kind]}: decided on its first {keep} pairs")
                break
            # after the cut: a look must not decide on pairs measured at the load that arrived
            if p in looks and len(a) >= 2 and len(b) >= 2:
                v = confirm_verdict(a, b, alpha=alpha, min_effect=pol.confirm.min_effect)
                if v.deploy or v.ci_high < pol.confirm.min_effect:
                    break  # decided: significant gain, or no chance of a worthwhile one
                if (st.follow and pol.confirm.futility > 0 and p < looks[-1]
                        and not v.gain > pol.confirm.futility * pol.confirm.min_effect):
                    break  # following the load: a look showing too little gain to be worth more windows
        verdict = confirm_verdict(a, b, alpha=alpha, min_effect=pol.confirm.min_effect)
        if broke is not None:
            st.guard_events.append(broke)
            self._emit(Phase.HOLD if kind is not WindowKind.CONFIRM else Phase.CONFIRM, broke,
                       kind=EventKind.GUARD)
            verdict = Verdict(verdict.baseline_samples, verdict.candidate_samples, verdict.gain, verdict.ci_low,
                              verdict.ci_high, verdict.p_value, verdict.significant, False, broke)
        return Compared(verdict, a, b, cut, dict(ctxs[0]) if ctxs else None)

    def _pairs_before_the_load_left(self, ctxs: Sequence[Mapping[str, float]]) -> int | None:
        """Follow mode: when the last ``hold.switch_windows`` windows of a comparison are all further
        than the region radius from its first window's load (the daemon would switch there), the
        whole pairs whose two windows both saw that first load; None while the load has not left."""
        n = self.policy.hold.switch_windows
        far = self._far_from_first(ctxs)
        if far is None or len(far) < n + 1 or not all(far[-n:]):
            return None
        return _whole_pairs_near(far, len(far))

    def _pairs_before_a_break_elsewhere(self, ctxs: Sequence[Mapping[str, float]]) -> int | None:
        """Follow mode, after the guard broke in the last pair: when a window of that pair is
        further than the region radius from the comparison's first window's load, the whole pairs
        before it whose two windows both saw that first load; None when the break was at that load."""
        far = self._far_from_first(ctxs)
        if far is None or len(far) < 2:
            return None
        last = len(far) - (2 if len(far) % 2 == 0 else 1)   # the breaking pair's first window
        return _whole_pairs_near(far, last) if any(far[last:]) else None

    def _far_from_first(self, ctxs: Sequence[Mapping[str, float]]) -> list[bool] | None:
        """Follow mode: per window of a comparison, whether its load is further than the region
        radius from the first window's; None outside follow mode or without a first context."""
        if not self.state.follow or not ctxs or not log_context(ctxs[0]):
            return None
        return [self._far(c, ctxs[0]) for c in ctxs]

    def _confirm_pair(self, p: int, cand: dict[str, KnobValue], base: dict[str, KnobValue], a: list[float],
                      b: list[float], kind: WindowKind, ctxs: list[dict[str, float]]) -> Steps[str | None]:
        """Pair ``p``: A (``base``) then B (``cand``); why B broke the guard, if it did. The guard
        judges B's mean against A's windows; a challenger (CHALLENGE) is judged at every window."""
        st, pol = self.state, self.policy
        sd = st.refs.noise_sd()
        for arm, cfg in (("A", base), ("B", cand)):
            err = yield from self._apply(cfg, kind)
            if err is not None:
                return f"apply failed during confirmation: {err.message}"
            idx, w = yield from self._measure(kind)
            ctxs.append(dict(w.context))
            self.trace.windows.append((kind, dict(cfg)))
            s = score(w, pol.objective, baseline_drops_per_s=st.base_drops)
            self._log_window(st, None, kind, cfg, idx, s, None, hist=w.histogram)
            self._emit(Phase.CONFIRM if kind is WindowKind.CONFIRM else Phase.HOLD,
                       ("" if kind is WindowKind.CONFIRM else f"{kind.value} ") + f"pair {p + 1} {arm}: {_describe(s)}",
                       window=idx, value=s.value if s.ok else None)
            if not s.ok:
                continue
            if not s.feasible and arm == "B":
                return f"candidate broke a constraint during {_DURING[kind]}: " + "; ".join(s.reasons)
            (a if arm == "A" else b).append(s.value)
            if arm == "B" and a:
                d = mean_log(b) - mean_log(a)
                lim = guard_limit(pol.guard.max_regression, sd * math.sqrt(1 / len(a) + 1 / len(b)))
                one = math.log(b[-1]) - mean_log(a)
                one_lim = guard_limit(pol.guard.max_regression, sd * math.sqrt(1 + 1 / len(a)))
                if d > lim or (kind is WindowKind.CHALLENGE and one > one_lim):
                    return (f"candidate broke the guard during {_DURING[kind]}: {math.exp(d) - 1:+.0%} vs "
                            f"the {'baseline' if kind is WindowKind.CONFIRM else 'active'} windows next to it "
                            f"(limit +{pol.guard.max_regression:.0%} beyond the noise)")
        return None

    # ------------------------------------------------------------------ HOLD: follow the load
    def _decided(self, verdict: Verdict | None, level: float | None, why: str, *,
                 config: Mapping[str, KnobValue] | None = None, windows: int = 0,
                 shares: tuple[tuple[str, float], ...] = (), pending: Pending | None = None,
                 load: Mapping[str, float] | None = None) -> Phase:
        """A search's decision becomes the table entry of its load region (the originals when
        nothing was confirmed) and the active one; then HOLD, or DONE outside follow mode. ``load``:
        the context the decision was measured at (a comparison's first window); without one, the
        region most of the search's windows were measured in (_search_region)."""
        st = self.state
        if not st.follow or st.stop:
            return Phase.DONE
        hp = self.policy.hold
        if st.hold is None:
            st.hold = HoldState(RegionMap(hp.region_radius, hp.max_regions))
        h = st.hold
        if h.searching is not None:
            region = h.searching
        elif load is not None:
            region = h.regions.assign(load)
        else:
            region = self._search_region(h)
        h.searching = None
        if level is None:
            mean = st.refs.mean_level() if verdict is None else None
            level = mean
        entry = Entry(region, dict(config) if verdict is not None and config is not None else dict(st.baseline),
                      gain=verdict.gain if verdict is not None else 0.0,
                      ci_low=verdict.ci_low if verdict is not None else math.nan,
                      level=level if level is not None else math.nan, windows=windows, confirmed_at=st.index,
                      why=why, is_originals=verdict is None, shares=shares if verdict is not None else ())
        h.table[region] = entry
        if pending is not None:
            h.pending[region] = pending
            why += "; the comparison goes on when this load is back"
        else:
            h.pending.pop(region, None)
        self._activate(entry, level)
        h.note(st.index, f"region {region}: {why}")
        # the reason goes with the decision (the event log and the journal say why, not only what)
        self._emit(Phase.HOLD, f"HOLD: region {region} " + ("deployed " + _fmt(entry.config, st.baseline)
                                                            if verdict is not None else "keeps the originals")
                   + f" ({why})")
        return Phase.HOLD

    def _left(self, c: Compared) -> bool:
        """Following the load: a comparison whose load has gone by the time it decides — cut by a
        load change, or ended in the very window the load changed (too soon to cut it: the last
        window alone is at another load). Its decision belongs to the region of its own load; put in
        force now, it would run on another load (a busy-polling win on a quiet load, 3x worse the
        moment the CPU is shared). The originals are in force instead until the region rules switch
        to the load's own entry (or search it)."""
        st = self.state
        return (st.follow and c.load is not None and bool(log_context(c.load))
                and bool(log_context(st.context)) and self._far(st.context, c.load))

    def _originals_for_the_load_now(self) -> None:
        """After a decision filed for a load that has gone: the originals are in force for the load
        now, as its active entry, without writing it into the table. HOLD's region rules then switch
        to that region's confirmed entry, or search a region that has none."""
        st = self.state
        h = self._hold_state()
        region = h.regions.assign(st.context)
        here = Entry(region, dict(st.baseline), 0.0, math.nan, math.nan, 0, st.index,
                     "the originals while the load the decision was for is away", is_originals=True)
        self._activate(here, None)
        h.note(st.index, f"region {region}: the originals in force (the decision was for the load that left)")
        self._emit(Phase.HOLD, f"the load is now in region {region}: the originals are in force until its "
                               "entry or a search takes over", kind=EventKind.SWITCH)

    def _entry_back(self, entry: Entry, kind: WindowKind, left: bool) -> Steps[None]:
        """After a comparison that leaves ``entry`` its region's (a challenger lost, a fallback
        check kept it or was cut): the entry goes back in force, unless the load left during the
        comparison. Then the entry of another load (busy polling at a shared CPU) would run at the
        load now: the originals are in force instead, as after a decision (_left)."""
        yield from self._put_back(self.state.baseline if left else entry.config, kind)
        if left:
            self._originals_for_the_load_now()

    def _search_region(self, h: HoldState) -> int:
        """The region of the first search's decision when no comparison measured it: the region
        most of the search's windows were measured in (the latest of a tie). The load at the moment
        the search ends can be another one: the originals kept on what the search measured say
        nothing about a load that arrived in its last window, and that load then gets its own search."""
        st = self.state
        seen = [h.regions.assign(o.context) for o in st.obs if o.context]
        if not seen:
            return h.regions.assign(st.context)
        return seen[_latest_of_most_common(seen)]

    def _activate(self, entry: Entry, level: float | None) -> None:
        st = self.state
        h = self._hold_state()
        h.active, h.level = entry, (level if level is not None and math.isfinite(level) else None)
        h.bad_streak = h.region_streak = h.since_switch = 0
        h.region = entry.region
        if st.result is not None:
            st.result = dataclasses.replace(st.result, deployed=dict(entry.config),
                                            deployed_is_baseline=self.space.key_of(entry.config) == st.base_key)

    def _hold_state(self) -> HoldState:
        if self.state.hold is None:
            raise EngineMisuse("HOLD before the first decision")
        return self.state.hold

    def _hold(self) -> Steps[Phase]:
        """HOLD windows under the active entry until stopped; each may start a fallback check, a
        switch, a region search (then BASELINE) or a challenger."""
        st = self.state
        while not st.stop:
            nxt = yield from self._hold_window()
            if nxt is not None:
                return nxt
        h = self._hold_state()
        active = h.active.config if h.active is not None else st.baseline
        yield from self._put_back(active, WindowKind.HOLD)
        verdict = st.result.verdict if st.result is not None else None
        self._finish(st, verdict, "stopped in HOLD; the active entry stays: " + _fmt(active, st.baseline),
                     deployed=dict(active), stopped=True, mode=st.mode)
        self._emit(Phase.DONE, self._reason(), kind=EventKind.STOP)
        return Phase.DONE

    def _hold_window(self) -> Steps[Phase | None]:
        """One HOLD window and the rules in their order: fallback first, then the region's entry
        (switch, or a search for a region never confirmed), then a challenger when one is due."""
        st, hp = self.state, self.policy.hold
        h = self._hold_state()
        active = h.active
        if active is None:
            raise EngineMisuse("HOLD without an active entry")
        idx, w = yield from self._measure(WindowKind.HOLD)
        h.since_switch += 1
        h.credit += hp.explore_share
        self.trace.windows.append((WindowKind.HOLD, dict(active.config)))
        s = score(w, self.policy.objective, baseline_drops_per_s=st.base_drops)
        self._log_window(st, None, WindowKind.HOLD, active.config, idx, s, None, hist=w.histogram)
        region = h.regions.assign(w.context)
        h.region_streak = h.region_streak + 1 if region == h.region else 1
        h.region = region
        self._emit(Phase.HOLD, f"window {idx}: {_describe(s)}; load region {region}, active entry: region "
                               f"{active.region}", window=idx, value=s.value if s.ok else None)
        if not s.ok:
            return None
        if len(st.refs) == 0:   # the baseline was never measured (no traffic then): search once it flows
            h.usable = h.usable + 1
            return self._begin_search(active.region, self.policy.tuning.budget) if h.usable >= hp.drift_windows \
                else None
        entry = h.table.get(region)
        # The load is in another region whose entry (or search) is due: the region rules come first.
        # Judging the active entry against its own region's level there would measure the load change,
        # and a fallback check then spends its windows comparing the wrong pair.
        moving = region != active.region and (entry is not None or hp.retune)
        if not moving and (yield from self._check_level(math.log(s.value))):
            return None
        if moving:
            h.bad_streak = 0
        if h.region_streak >= hp.switch_windows and h.since_switch >= hp.min_switch_interval:
            if entry is None and hp.retune:
                return self._begin_search(region, hp.region_budget)
            if entry is not None and entry != active:
                yield from self._switch(entry)
                return None
        if (region == active.region and region in h.pending and h.region_streak >= hp.switch_windows):
            yield from self._resume_pending(region)
            return None
        # a challenger is measured against the active entry at that entry's own load: never in the
        # window the load arrives from another region (it would win or lose for the wrong region)
        if (h.credit >= 2 * self.policy.confirm.pairs and h.since_switch >= hp.min_switch_interval
                and region == active.region and h.region_streak >= hp.switch_windows):
            yield from self._challenge()
        return None

    def _resumable(self, c: Compared) -> bool:
        """A comparison a load change cut is worth going on with when it has not decided and its
        pairs so far do not argue against the candidate (too few to say, or a gain of at least
        min_effect); one whose gain is below min_effect is decided as it stands."""
        if not c.cut or c.verdict.deploy:
            return False
        few = min(len(c.a), len(c.b)) < 2 or not math.isfinite(c.verdict.gain)
        return few or c.verdict.gain >= self.policy.confirm.min_effect

    def _resume_pending(self, region: int) -> Steps[None]:
        """The load is back in a region whose first confirmation a load change cut: go on with it."""
        st = self.state
        h = self._hold_state()
        pend = h.pending.pop(region)
        self._emit(Phase.CONFIRM, f"load region {region} is back: its confirmation goes on from "
                                  f"{min(len(pend.a), len(pend.b))} pairs")
        c = yield from self._confirm(dict(pend.config), earlier=pend)
        verdict, a, b = c.verdict, c.a, c.b
        if st.stop:
            return
        if self._resumable(c):
            h.pending[region] = Pending(pend.config, list(a), list(b), pend.shares)
            active = h.active
            yield from self._put_back(active.config if active is not None else st.baseline, WindowKind.CONFIRM)
            return
        if not verdict.deploy:
            yield from self._put_back(st.baseline, WindowKind.CONFIRM)
            h.note(st.index, f"region {region}: the resumed confirmation kept the originals ({verdict.reason})")
            self._emit(Phase.HOLD, f"HOLD: region {region} keeps the originals (the resumed confirmation: "
                                   f"{verdict.reason})")
            return
        left = self._left(c)
        yield from self._put_back(st.baseline if left else pend.config, WindowKind.CONFIRM)
        entry = Entry(region, dict(pend.config), verdict.gain, verdict.ci_low, mean_log(b), len(a) + len(b),
                      st.index, "deployed after a resumed confirmation: " + verdict.reason, shares=pend.shares)
        h.table[region] = entry
        self._activate(entry, entry.level)
        h.note(st.index, entry.why)
        self._emit(Phase.HOLD, f"HOLD: region {region} deployed " + _fmt(entry.config, st.baseline)
                   + f" ({entry.why})", kind=EventKind.DEPLOY)
        if left:
            self._originals_for_the_load_now()

    def _check_level(self, lj: float) -> Steps[bool]:
        """Fallback first: J beyond the active entry's level by more than the guard limit (noise-
        aware) for ``fallback_windows`` windows measures it against the originals. True when it did."""
        st, hp = self.state, self.policy.hold
        h = self._hold_state()
        if h.level is None:
            h.level = lj
            return False
        limit = guard_limit(self.policy.guard.max_regression, st.refs.noise_sd() * math.sqrt(1.5))
        h.bad_streak = h.bad_streak + 1 if lj - h.level > limit else 0
        if h.bad_streak < hp.fallback_windows:
            return False
        if h.active is None or h.active.is_originals:
            h.level, h.bad_streak = lj, 0   # the originals got slower: the load moved, nothing to fall back to
            return False
        yield from self._fallback(h.active)
        return True

    def _fallback(self, active: Entry) -> Steps[None]:
        """The active entry against the originals at once, interleaved; the originals replace it
        unless it still wins with the confirmation's confidence."""
        st = self.state
        h = self._hold_state()
        self._emit(Phase.HOLD, f"J above the active entry's level for {h.bad_streak} windows: measuring it "
                               "against the originals", kind=EventKind.FALLBACK)
        c = yield from self._confirm(dict(active.config), against=dict(st.baseline), kind=WindowKind.FALLBACK)
        verdict, a, b = c.verdict, c.a, c.b
        h.fallbacks += 1
        if st.stop:
            return
        if c.cut and not verdict.deploy:
            # the load moved on during the check: the region rules decide what the new load gets
            h.bad_streak = 0
            h.note(st.index, "fallback check cut by a load change: the active entry stays its region's")
            yield from self._entry_back(active, WindowKind.FALLBACK, self._left(c))
            return
        if verdict.deploy:
            h.level, h.bad_streak = mean_log(b), 0
            h.note(st.index, f"fallback check: the active entry still wins ({verdict.reason})")
            self._emit(Phase.HOLD, "the active entry still beats the originals: kept", kind=EventKind.KEEP)
            yield from self._entry_back(active, WindowKind.FALLBACK, self._left(c))
            return
        orig = Entry(h.region, dict(st.baseline), 0.0, math.nan, mean_log(a) if a else math.nan,
                     len(a) + len(b), st.index, f"fell back at window {st.index}: {verdict.reason}",
                     is_originals=True)
        if h.region == active.region:
            h.table[active.region] = orig   # wrong for its own region now
        # else the load is in another region: the entry stays for its own; that region gets searched
        yield from self._put_back(st.baseline, WindowKind.FALLBACK)
        self._activate(orig, orig.level)
        h.note(st.index, orig.why)
        self._emit(Phase.HOLD, "fell back to the originals: " + verdict.reason, kind=EventKind.FALLBACK)

    def _switch(self, entry: Entry) -> Steps[None]:
        """The load moved to a region with a confirmed entry: apply it (journaled like any apply)."""
        st = self.state
        h = self._hold_state()
        err = yield from self._apply(entry.config, WindowKind.HOLD, f"switch to load region {entry.region}")
        if err is not None:
            self._emit(Phase.HOLD, f"switch to region {entry.region} failed: {err.message}", kind=EventKind.GUARD)
            h.since_switch = 0
            return
        h.switches += 1
        self._activate(entry, entry.level)
        h.note(st.index, f"switched to region {entry.region}")
        self._emit(Phase.HOLD, f"load moved to region {entry.region}: switched to its entry "
                               + _fmt(entry.config, st.baseline), kind=EventKind.SWITCH)

    def _begin_search(self, region: int, budget: int) -> Phase:
        """A short search for ``region``: the model keeps every earlier window (frozen with its
        told value and context), the references start again (the originals under this load)."""
        st = self.state
        h = self._hold_state()
        st.frozen += [(dict(o.config), self._told(st, o), dict(o.context)) for o in st.obs]
        st.obs = []
        st.windows_used = max(st.windows_used, st.index)
        st.refs.start_regime(st.windows_used)
        st.since_ref = 0
        st.budget_end = st.windows_used + budget
        h.searching = region
        # the other regions' confirmed deployments are its first trials (one window each): a load
        # next to a known one often wants the same thing, and the model learns the contrast
        first = {self.space.key_of(e.config): dict(e.config) for e in h.table.values()
                 if not e.is_originals and e.region != region}
        # then the policy's seeds all together, at this load (one window; the guard stops it where
        # busy polling hurts): a gain that needs two seeded knobs at once is found by no one-knob
        # seed and rarely by a 4-point design
        joint = self.space.joint_seed(st.baseline)
        if joint is not None and self.space.key_of(joint) not in first:
            first[self.space.key_of(joint)] = joint
        # then a small space-filling design over the whole space: the model's view of a load it has
        # not measured comes from the other loads, and a search that only follows it never tries
        # what they ruled out (busy polling that hurt a shared CPU and pays on a quiet one)
        design = self.space.space_filling(self.policy.hold.region_design, self.policy.tuning.seed + st.index)
        first.update({self.space.key_of(c): c for c in design
                      if self.space.key_of(c) != st.base_key and self.space.key_of(c) not in first})
        h.transfer = list(first.values())
        h.note(st.index, f"region {region}: a {budget}-window search")
        self._emit(Phase.BASELINE, f"load region {region} has no confirmed entry: a {budget}-window search, "
                                   "warm-started from the model")
        return Phase.BASELINE

    def _challenge(self) -> Steps[None]:
        """A challenger for the current load against the active entry, interleaved pairs with the
        confirmation's sequential test; it replaces the entry only when it wins."""
        st = self.state
        h = self._hold_state()
        active = h.active
        if active is None:
            return
        cfg = st.optimiser.ask(remaining=None, context=st.context)
        cand, shares = self._simplify(cfg, st.context)
        if self.space.key_of(cand) == self.space.key_of(active.config) or self.space.key_of(cand) == st.base_key:
            h.credit -= 1.0
            return
        self._emit(Phase.HOLD, "challenger " + _fmt(cand, st.baseline) + f" against region {active.region}'s entry",
                   kind=EventKind.CHALLENGE)
        n0 = st.index
        c = yield from self._confirm(cand, against=dict(active.config), kind=WindowKind.CHALLENGE)
        verdict, a, b = c.verdict, c.a, c.b
        h.credit -= st.index - n0
        y_active = math.log(max(1.0 - active.gain, 1e-9))
        for x in b if a else []:
            st.optimiser.tell(cand, math.log(x) - mean_log(a) + y_active, context=st.context)
        if verdict.deploy and not st.stop:
            keep = 1.0 - active.gain
            new = Entry(active.region, cand, 1.0 - keep * (1.0 - verdict.gain), 1.0 - keep * (1.0 - verdict.ci_low),
                        mean_log(b), len(a) + len(b), st.index, f"challenger won at window {st.index}: "
                        + verdict.reason, shares=shares)
            h.table[active.region] = new
            left = self._left(c)
            yield from self._put_back(st.baseline if left else cand, WindowKind.CHALLENGE)
            self._activate(new, new.level)
            h.note(st.index, new.why)
            self._emit(Phase.HOLD, "challenger replaces the entry: " + verdict.reason, kind=EventKind.DEPLOY)
            if left:
                self._originals_for_the_load_now()
            return
        if st.stop:   # the verdict of an unfinished comparison is not a decision
            yield from self._put_back(active.config, WindowKind.HOLD)
            self._emit(Phase.HOLD, "challenger not decided: stopping (the active entry stays)",
                       kind=EventKind.CHALLENGE)
            return
        self._emit(Phase.HOLD, "challenger lost: " + verdict.reason, kind=EventKind.CHALLENGE)
        yield from self._entry_back(active, WindowKind.HOLD, self._left(c))

    def hold_status(self) -> dict[str, object]:
        """HOLD as status shows it: the load now, the table (active marked, why), exploration."""
        st, h = self.state, self.state.hold
        if h is None:
            return {}
        act = h.active
        return {"context": dict(st.context), "region": h.region, "regions": h.regions.to_json(),
                "table": [{**e.to_json(st.baseline), "active": act is not None and e.region == act.region}
                          for _, e in sorted(h.table.items())],
                "active_region": act.region if act is not None else None,
                "active_why": act.why if act is not None else None,
                "windows": h.windows, "exploring": h.exploring,
                "explore_share": h.exploring / h.windows if h.windows else 0.0,
                "switches": h.switches, "fallbacks": h.fallbacks, "role": h.last_kind,
                "searching": h.searching, "pending": sorted(h.pending), "recent": list(h.log)}

    # ------------------------------------------------------------------ records
    def _log_window(self, st: SessionState, trial: int | None, kind: WindowKind, cfg: Mapping[str, KnobValue],
                    index: int, s: Score, y: float | None, *, status: str | None = None,
                    hist: str | None = None) -> None:
        stat = status or ("ok" if s.ok else "failed")
        extra = {"histogram": hist} if hist is not None else {}  # the window's latency histogram (study store)
        self.store.append("window", session=st.session, trial=trial, phase=kind.value, config=dict(cfg),
                          index=index, status=stat, value=s.value if s.ok else None, y=y, ratio=y is not None,
                          score=s.to_json(), **extra)

    def _finish(self, st: SessionState, verdict: Verdict | None, reason: str, *,
                deployed: dict[str, KnobValue] | None = None, best: dict[str, KnobValue] | None = None,
                stopped: bool = False, mode: str = "search",
                would_try: Sequence[dict[str, KnobValue]] = ()) -> None:
        dep = deployed if deployed is not None else st.baseline
        rec = st.optimiser.best() if mode == "search" else None
        j_ref = st.j_ref
        best_value = j_ref * math.exp(rec.predicted) if rec is not None and math.isfinite(j_ref) else math.nan
        st.mode = mode
        st.result = TuningResult(
            baseline_config=dict(st.baseline), baseline_value=j_ref,
            best_config=dict(best if best is not None else ({**st.baseline, **rec.config} if rec else st.baseline)),
            best_value=best_value, trials=tuple(st.trials), verdict=verdict, deployed=dict(dep),
            deployed_is_baseline=self.space.key_of(dep) == st.base_key, reason=reason,
            guard_events=tuple(st.guard_events), windows_used=st.windows_used, stopped=stopped, mode=mode,
            noise_sd=st.refs.noise_sd() if len(st.refs) else math.nan,
            dropped_knobs=tuple(sorted(self.dropped_knobs.items())), would_try=tuple(would_try))
        self.store.append("end", session=st.session, result=st.result.to_json())

    def _reason(self) -> str:
        return self.state.result.reason if self.state.result else ""


def _latest_of_most_common(labels: Sequence[int]) -> int:
    """The index of the last window whose label (load region) is the most common one; of a tie,
    the label seen last."""
    counts = Counter(labels)
    top = max(counts.values())
    return next(i for i in range(len(labels) - 1, -1, -1) if counts[labels[i]] == top)


def _whole_pairs_near(far: Sequence[bool], end: int) -> int:
    """Leading whole pairs (windows 2k, 2k + 1 before ``end``) with both windows at the first load."""
    pairs = 0
    while 2 * pairs + 1 < end and not far[2 * pairs] and not far[2 * pairs + 1]:
        pairs += 1
    return pairs


_DURING = {WindowKind.CONFIRM: "confirmation", WindowKind.CHALLENGE: "a challenge",
           WindowKind.FALLBACK: "the fallback check"}


def _fmt(cfg: Mapping[str, KnobValue], base: Mapping[str, KnobValue]) -> str:
    diff = [f"{k}={v}" for k, v in cfg.items() if base.get(k) != v]
    return ", ".join(diff) if diff else "(baseline values)"


def _describe(s: Score) -> str:
    if not s.ok:
        return "failed: " + "; ".join(s.reasons)
    return f"J={s.value:.4g} latency={s.latency_us:.1f}µs cpu={s.cpu_cores:.2f}" + (
        "" if s.feasible else " infeasible: " + "; ".join(s.reasons))

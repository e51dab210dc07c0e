"""The controller: DESIGN.md's state machine, driven by an injected clock.

    RECOVER -> BASELINE -> PROPOSE -> APPLY -> SETTLE -> MEASURE -> SCORE -> (PROPOSE | CONFIRM) -> HOLD
                                                                                        |            |
                                                                                   ROLLBACK    drift: re-tune

A reload (SIGHUP) is accepted in every phase and never ends the daemon: a tuning round in progress
ends safely (the engine puts its baseline back), HOLD stops watching, and a new round starts with
the new policy (RELOAD). Knobs the new policy no longer names go back to their originals first.

The search phases (BASELINE … CONFIRM, RESUME, OBSERVE) are the tuning engine's
(polltuned.engine.core.Engine). The controller drives it step by step — ``next_action()``, then
the Apply or Measure against the env, then ``observe``/``apply_failed`` — and relays its typed
events (one Phase enum; guard events recognised by their EventKind), so between any two steps it
can publish status, ping the watchdog and act on a stop or a reload.
The controller adds RECOVER (journal replay and repair before
anything else), HOLD (watch the workload, re-tune on drift, warm-started) and the exit path
(ROLLBACK to the baselines, or keep the deployed configuration, as the policy's on_exit says).

It is a generator: :meth:`Controller.steps` yields after every phase change, window and trial, so
the service loop can ping the watchdog, publish status and react to signals between steps. It
never sleeps except through the injected clock, so tests drive it with a FakeClock.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from polltuned.clock import Clock
from polltuned.engine.actions import Action, Apply, Done, Measure
from polltuned.engine.env import TrialEnv
from polltuned.engine.phases import Event, EventKind, Phase
from polltuned.engine.session import TuningResult
from polltuned.errors import PolltunedError
from polltuned.policy.schema import Policy
from polltuned.records import KnobValue, Window

log = logging.getLogger("polltuned.daemon")

RECOVER = Phase.RECOVER
HOLD = Phase.HOLD
ROLLBACK = Phase.ROLLBACK
STOPPED = Phase.STOPPED
IDLE = Phase.IDLE
RELOAD = Phase.RELOAD

#: the window index of HOLD window 0 (the daemon's HOLD windows are numbered apart from the round's)
HOLD_INDEX_BASE = 10_000
#: events the controller lists as guard events in status (a trial aborted or an apply failed and
#: the baseline went back; the workload shifted under the search)
GUARD_KINDS = frozenset({EventKind.GUARD, EventKind.SHIFT})


class EngineLike(Protocol):
    """polltuned.engine.core.Engine as the controller drives it (tests substitute a fake)."""

    def next_action(self) -> Action: ...
    def observe(self, window: Window) -> None: ...
    def apply_failed(self, error: PolltunedError) -> None: ...
    def drain_events(self) -> list[Event]: ...
    def request_stop(self) -> None: ...


class ActuatorLike(Protocol):
    def read(self, keys: Sequence[str]) -> Mapping[str, KnobValue]: ...
    def rollback(self) -> object: ...
    def is_dirty(self) -> bool: ...


class WatcherLike(Protocol):
    """polltuned.daemon.watch.Watcher: verifies the deployed knobs in HOLD (link events, every
    ``hold.verify_every`` windows) and re-applies / releases / reports per knob."""

    def step(self, *, window: int | None, every: int, deployed: Mapping[str, KnobValue]) -> object: ...


class WorkloadMeter(Protocol):
    """Counters view used in HOLD to notice workload drift: one number per signal per window."""

    def begin(self) -> None: ...
    def end(self) -> Mapping[str, float]: ...


#: builds the engine of one tuning round for (policy, env)
EngineFactory = Callable[[Policy, TrialEnv], EngineLike]


@dataclass
class DriftDetector:
    """Relative drift of each signal against a reference formed by the first ``ref_windows`` windows.

    A signal counts as drifted when |x - ref| / ref > threshold; drift is declared after
    ``needed`` consecutive drifted windows (any signal)."""

    threshold: float
    needed: int
    ref_windows: int = 3
    _samples: dict[str, list[float]] = field(default_factory=dict)
    _ref: dict[str, float] = field(default_factory=dict)
    streak: int = 0
    last: dict[str, float] = field(default_factory=dict)

    def observe(self, signals: Mapping[str, float]) -> bool:
        drifted = False
        self.last = {}
        for name, x in signals.items():
            if not math.isfinite(x):
                continue
            if name not in self._ref:
                self._samples.setdefault(name, []).append(x)
                if len(self._samples[name]) >= self.ref_windows:
                    self._ref[name] = statistics.median(self._samples[name])
                continue
            ref = self._ref[name]
            scale = max(abs(ref), 1e-9)
            rel = abs(x - ref) / scale
            self.last[name] = rel
            if rel > self.threshold:
                drifted = True
        self.streak = self.streak + 1 if drifted else 0
        return self.streak >= self.needed


class Controller:
    def __init__(
        self,
        *,
        policy: Policy,
        actuator: ActuatorLike,
        env: TrialEnv,
        make_engine: EngineFactory,
        clock: Clock,
        meter: WorkloadMeter | None = None,
        max_rounds: int | None = None,
        kept: bool = False,
        forget_kept: Callable[[], None] | None = None,
        watcher: WatcherLike | None = None,
    ) -> None:
        #: the previous run exited cleanly with on_exit = keep, in the journal epoch that is still open
        self.kept = kept
        #: called once recovery has honoured ``kept``: the marker belongs to the previous run only
        self.forget_kept = forget_kept
        self.watcher = watcher
        self.policy = policy
        self.actuator = actuator
        self.env = env
        self.make_engine = make_engine
        self.clock = clock
        self.meter = meter
        self.max_rounds = max_rounds
        self.phase: Phase = IDLE
        self.message = ""
        self.trial: int | None = None
        self.round = 0
        self.events: deque[dict[str, object]] = deque(maxlen=50)
        self.guard_events: deque[dict[str, object]] = deque(maxlen=10)
        self.guard_aborts = 0   # every guard event since start (guard_events keeps the last 10)
        #: the last finished round's result (None before the first one ends)
        self.result: TuningResult | None = None
        self.recovery: dict[str, object] = {}
        self.hold: dict[str, object] = {}
        self.reloads: deque[dict[str, object]] = deque(maxlen=10)
        self._engine: EngineLike | None = None
        self._stop = False
        self._pending_policy: Policy | None = None

    # ---- requests from the service (signal handlers set flags; acted on between steps) ----
    def request_stop(self) -> None:
        self._stop = True
        if self._engine is not None:
            self._engine.request_stop()

    def request_reload(self, policy: Policy) -> None:
        """Re-tune with ``policy``, from any phase: the running round (if any) ends safely first.
        A stop already requested wins (the daemon is on its way out)."""
        if self._stop:
            log.info("reload ignored: the daemon is stopping")
            return
        self._pending_policy = policy
        self.reloads.append({"t": self.clock.wall(), "outcome": "accepted", "policy": policy.name,
                             "phase": self.phase})
        if self._engine is not None:
            self._engine.request_stop()

    def reload_refused(self, message: str) -> None:
        """The service could not load the new configuration: the current policy keeps running."""
        self.reloads.append({"t": self.clock.wall(), "outcome": "refused", "policy": self.policy.name,
                             "phase": self.phase, "message": message})

    @property
    def reload_pending(self) -> bool:
        return self._pending_policy is not None

    @property
    def stopping(self) -> bool:
        return self._stop

    # ---- the state machine ----
    def _set(self, phase: Phase, message: str = "", trial: int | None = None) -> None:
        self.phase = phase
        self.message = message
        self.trial = trial
        entry = {"t": self.clock.wall(), "phase": phase, "message": message, "trial": trial}
        self.events.append(entry)
        log.info("%s%s", phase, f": {message}" if message else "",
                 extra={"phase": phase, "trial": trial, "policy": self.policy.name})

    def recover(self) -> dict[str, object]:
        """Replay the journal and repair: a dirty host (crash, kill -9) goes back to its baselines.

        Exception: the previous daemon exited cleanly with on_exit = keep (``kept``): its deployed
        values stay and tuning continues from them (the journal still holds the originals)."""
        dirty = self.actuator.is_dirty()
        info: dict[str, object] = {"dirty_at_start": dirty, "kept_by_previous_run": self.kept}
        if dirty and self.kept:
            log.info("previous run kept its deployed configuration (on_exit = keep); continuing from it",
                     extra={"phase": RECOVER})
        elif dirty:
            report = self.actuator.rollback()
            info["rollback"] = report   # made JSON by the status document (polltuned.daemon.statusdoc)
            log.warning("journal shows knobs left by an earlier run; restored their original values",
                        extra={"phase": RECOVER})
        if self.kept:
            # honoured once: from here on this run owns the epoch, so a crash of *this* run must be
            # rolled back by ExecStopPost (rollback --if-dirty), not kept
            self.kept = False
            if self.forget_kept is not None:
                self.forget_kept()
        self.recovery = info
        return info

    def steps(self) -> Iterator[str]:
        self._set(RECOVER, "replaying the journal")
        yield self.phase
        self.recover()
        self._set(RECOVER, "host is clean" if not self.recovery["dirty_at_start"] else "repaired an unclean state")
        yield self.phase
        exited = False
        try:
            while not self._stop:
                if self._pending_policy is not None:
                    yield from self._switch_policy()
                    if self._stop:
                        break
                self.round += 1
                yield from self._tune_round()
                if self._pending_policy is not None and not self._stop:
                    continue  # cut short by a reload: the next round runs the new policy
                if self._stop or (self.max_rounds is not None and self.round >= self.max_rounds):
                    break
                retune = yield from self._hold()
                if not retune:
                    break
            exited = True
            yield from self._exit_steps()
        finally:
            if not exited:
                # closed or failed mid-way: still honour on_exit, without yielding
                for _ in self._exit_steps():
                    pass

    def _switch_policy(self) -> Iterator[str]:
        """Adopt the reloaded policy before the next round (RELOAD)."""
        new = self._pending_policy
        assert new is not None
        self._pending_policy = None
        old = self.policy
        dropped = [k for k in old.knobs if k not in new.knobs]
        self.policy = new
        self._set(RELOAD, f"policy reloaded: {old.name} -> {new.name}")
        yield self.phase
        if dropped and self.actuator.is_dirty():
            # the new policy no longer manages these knobs: nothing may stay at a value polltuned chose
            # for them, so the host goes back to its originals and the new round starts from there
            try:
                self.actuator.rollback()
            except PolltunedError as e:
                log.error("reload: restoring knobs the new policy drops failed: %s", e.message)
                raise
            self._set(RELOAD, "restored the originals: the new policy drops " + ", ".join(dropped))
            yield self.phase
        self._set(RELOAD, f"re-tuning with policy {new.name}")
        yield self.phase

    def _tune_round(self) -> Iterator[str]:
        """One round: drive the engine until it is done (its result becomes ``self.result``)."""
        engine = self.make_engine(self.policy, self.env)
        self._engine = engine
        if self._stop:
            engine.request_stop()
        try:
            while True:
                action = engine.next_action()
                yield from self._relay(engine.drain_events())
                if isinstance(action, Done):
                    self.result = action.result
                    return
                self._perform(engine, action)
        finally:
            self._engine = None

    def _relay(self, events: list[Event]) -> Iterator[str]:
        """Publish the engine's events as the controller's phase (one step each)."""
        for ev in events:
            self._set(ev.phase, ev.message, ev.trial)
            if ev.kind in GUARD_KINDS:
                self.guard_events.append({"t": self.clock.wall(), "trial": ev.trial, "message": ev.message})
                self.guard_aborts += 1
            yield self.phase

    def _perform(self, engine: EngineLike, action: Apply | Measure) -> None:
        """Carry out the engine's action against the env and hand the outcome back. An apply that
        raises left the host unchanged (the actuator is transactional): the engine is told so."""
        if isinstance(action, Apply):
            try:
                self.env.apply(action.config)
            except PolltunedError as e:
                engine.apply_failed(e)
            return
        engine.observe(self.env.measure(action.index))

    def _hold(self) -> Generator[str, None, bool]:
        """Watch the deployed configuration; return True to re-tune on sustained drift."""
        hp = self.policy.hold
        det = DriftDetector(threshold=hp.drift_threshold, needed=hp.drift_windows)
        self._set(HOLD, "watching for workload drift")
        self.hold = {"windows": 0, "drift_streak": 0}
        yield self.phase
        i = 0
        usable = 0
        no_baseline = self.result is None or not math.isfinite(self.result.baseline_value)
        while not self._stop and self._pending_policy is None:
            yield from self._sleep_interval()
            if self._stop or self._pending_policy is not None:
                break
            w, signals = self._hold_window(i)
            i += 1
            self._watch(i)          # every hold.verify_every windows
            if no_baseline and w.ok:
                # the last round could not measure a baseline (no traffic yet): tune once the probe works
                usable += 1
                if usable >= hp.drift_windows:
                    self._set(HOLD, f"probe works again for {usable} windows: tuning (the last round had no baseline)")
                    yield self.phase
                    return True
            drift = det.observe(signals)
            self.hold = {"windows": i, "drift_streak": det.streak, "last_window": w.to_json(),
                         "relative_change": det.last, "signals": signals}
            self._set(HOLD, f"window {i}: " + (
                ", ".join(f"{k} {v:+.0%}" for k, v in det.last.items()) if det.last else "collecting reference"))
            yield self.phase
            if drift and hp.retune:
                self._set(HOLD, f"workload drift for {det.streak} windows: re-tuning (warm start)")
                yield self.phase
                return True
        if self._pending_policy is not None and not self._stop:
            self._set(HOLD, "reload requested: re-tuning with the new policy")
            yield self.phase
            return True
        return False

    def _sleep_interval(self) -> Iterator[str]:
        """Sleep one hold interval in slices of at most 1 s, so the service can ping the watchdog
        and react to signals, and a link event on a managed device is verified at once."""
        remaining = self.policy.hold.interval_s
        while remaining > 0 and not self._stop and self._pending_policy is None:
            step = min(remaining, 1.0)
            self.clock.sleep(step)
            remaining -= step
            self._watch(None)
            yield self.phase

    def _hold_window(self, i: int) -> tuple[Window, dict[str, float]]:
        """HOLD window ``i`` under the deployed configuration, with the counters' workload signals
        over it and the objective's latency statistic (``latency_us``)."""
        signals: dict[str, float] = {}
        if self.meter is not None:
            try:
                self.meter.begin()
            except PolltunedError as e:
                log.warning("HOLD: counters unavailable: %s", e.message)
        try:
            w = self.env.measure(HOLD_INDEX_BASE + i)
        except PolltunedError as e:
            w = Window.failed(e.message)
        if self.meter is not None:
            try:
                signals.update(self.meter.end())
            except PolltunedError as e:
                log.warning("HOLD: counters unavailable: %s", e.message)
        stat = w.stat(self.policy.objective.statistic) if w.ok else None
        if stat is not None:
            signals["latency_us"] = stat
        return w, signals

    def _watch(self, window: int | None) -> None:
        if self.watcher is not None:
            deployed = self.result.deployed if self.result is not None else {}
            self.watcher.step(window=window, every=self.policy.hold.verify_every, deployed=deployed)

    def _exit_steps(self) -> Iterator[str]:
        if self.policy.on_exit == "restore":
            self._set(ROLLBACK, "restoring the original values (on_exit = restore)")
            yield self.phase
            try:
                self.actuator.rollback()
            except PolltunedError as e:
                log.error("rollback on exit failed: %s", e.message)
                raise
            self._set(STOPPED, "stopped; host restored")
        else:
            self._set(STOPPED, "stopped; deployed configuration kept (on_exit = keep)")
        yield self.phase


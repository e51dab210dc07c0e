"""The controller: DESIGN.md's state machine, driven by an injected clock.

    RECOVER -> BASELINE -> PROPOSE -> APPLY -> SETTLE -> MEASURE -> SCORE -> (PROPOSE | CONFIRM) -> HOLD
                                                                                        |            |
                                                                                   ROLLBACK    drift: re-tune

A reload (SIGHUP) is accepted in every phase and never ends the daemon: a tuning round in progress
ends safely (the tuner puts its baseline back), HOLD stops watching, and a new round starts with
the new policy (RELOAD). Knobs the new policy no longer names go back to their originals first.

The search phases (BASELINE … CONFIRM, RESUME, OBSERVE) are the tuning engine's
(polltuned.engine.tuner.Tuner): the controller drives its typed events directly (one Phase enum).
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
from typing import Any, Protocol

from polltuned.clock import Clock
from polltuned.engine.env import TrialEnv
from polltuned.engine.phases import Event, Phase
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


class TunerLike(Protocol):
    def run(self) -> Iterator[Event]: ...
    def request_stop(self) -> None: ...
    @property
    def result(self) -> TuningResult | None: ...


class ActuatorLike(Protocol):
    def read(self, keys: Any) -> dict[str, KnobValue]: ...
    def rollback(self) -> Any: ...
    def is_dirty(self) -> bool: ...
    def managed(self) -> Any: ...


class WatcherLike(Protocol):
    """polltuned.daemon.watch.Watcher: verifies the deployed knobs in HOLD (link events, every
    ``hold.verify_every`` windows) and re-applies / releases / reports per knob."""

    def step(self, *, window: int | None, every: int, deployed: Mapping[str, KnobValue]) -> Any: ...


class WorkloadMeter(Protocol):
    """Counters view used in HOLD to notice workload drift: one number per signal per window."""

    def begin(self) -> None: ...
    def end(self) -> Mapping[str, float]: ...


TunerFactory = Callable[[Policy, TrialEnv], TunerLike]


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
        make_tuner: TunerFactory,
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
        self.make_tuner = make_tuner
        self.clock = clock
        self.meter = meter
        self.max_rounds = max_rounds
        self.phase: Phase = IDLE
        self.message = ""
        self.trial: int | None = None
        self.round = 0
        self.events: deque[dict[str, Any]] = deque(maxlen=50)
        self.guard_events: deque[dict[str, Any]] = deque(maxlen=10)
        self.guard_aborts = 0   # every guard event since start (guard_events keeps the last 10)
        self.result: Any = None
        self.recovery: dict[str, Any] = {}
        self.hold: dict[str, Any] = {}
        self.reloads: deque[dict[str, Any]] = deque(maxlen=10)
        self._tuner: TunerLike | None = None
        self._stop = False
        self._pending_policy: Policy | None = None

    # ---- requests from the service (signal handlers set flags; acted on between steps) ----
    def request_stop(self) -> None:
        self._stop = True
        if self._tuner is not None:
            self._tuner.request_stop()

    def request_reload(self, policy: Policy) -> None:
        """Re-tune with ``policy``, from any phase: the running round (if any) ends safely first.
        A stop already requested wins (the daemon is on its way out)."""
        if self._stop:
            log.info("reload ignored: the daemon is stopping")
            return
        self._pending_policy = policy
        self.reloads.append({"t": self.clock.wall(), "outcome": "accepted", "policy": policy.name,
                             "phase": self.phase})
        if self._tuner is not None:
            self._tuner.request_stop()

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

    def recover(self) -> dict[str, Any]:
        """Replay the journal and repair: a dirty host (crash, kill -9) goes back to its baselines.

        Exception: the previous daemon exited cleanly with on_exit = keep (``kept``): its deployed
        values stay and tuning continues from them (the journal still holds the originals)."""
        dirty = self.actuator.is_dirty()
        info: dict[str, Any] = {"dirty_at_start": dirty, "kept_by_previous_run": self.kept}
        if dirty and self.kept:
            log.info("previous run kept its deployed configuration (on_exit = keep); continuing from it",
                     extra={"phase": RECOVER})
        elif dirty:
            report = self.actuator.rollback()
            info["rollback"] = _jsonable(report)
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
        tuner = self.make_tuner(self.policy, self.env)
        self._tuner = tuner
        if self._stop:
            tuner.request_stop()
        try:
            for ev in tuner.run():
                self._set(ev.phase, ev.message, ev.trial)
                if ev.phase is Phase.ROLLBACK or "guard" in ev.message.lower():
                    self.guard_events.append({"t": self.clock.wall(), "trial": ev.trial, "message": ev.message})
                    self.guard_aborts += 1
                yield self.phase
        finally:
            self._tuner = None
        self.result = tuner.result

    def _hold(self) -> Generator[str, None, bool]:
        """Watch the deployed configuration; return True to re-tune on sustained drift."""
        hp = self.policy.hold
        det = DriftDetector(threshold=hp.drift_threshold, needed=hp.drift_windows)
        self._set(HOLD, "watching for workload drift")
        self.hold = {"windows": 0, "drift_streak": 0}
        yield self.phase
        i = 0
        usable = 0
        bv = getattr(self.result, "baseline_value", None)
        no_baseline = self.result is None or (isinstance(bv, float) and not math.isfinite(bv))
        while not self._stop and self._pending_policy is None:
            # sleep in slices so the service can ping the watchdog and react to signals
            remaining = hp.interval_s
            while remaining > 0 and not self._stop and self._pending_policy is None:
                step = min(remaining, 1.0)
                self.clock.sleep(step)
                remaining -= step
                self._watch(None)   # a link event on a managed device: verify at once
                yield self.phase
            if self._stop or self._pending_policy is not None:
                break
            signals: dict[str, float] = {}
            if self.meter is not None:
                try:
                    self.meter.begin()
                except PolltunedError as e:
                    log.warning("HOLD: counters unavailable: %s", e.message)
            try:
                w: Window = self.env.measure(10_000 + i)
            except PolltunedError as e:
                w = Window.failed(e.message)
            if self.meter is not None:
                try:
                    signals.update(self.meter.end())
                except PolltunedError as e:
                    log.warning("HOLD: counters unavailable: %s", e.message)
            i += 1
            self._watch(i)          # every hold.verify_every windows
            if no_baseline and w.ok:
                # the last round could not measure a baseline (no traffic yet): tune once the probe works
                usable += 1
                if usable >= hp.drift_windows:
                    self._set(HOLD, f"probe works again for {usable} windows: tuning (the last round had no baseline)")
                    yield self.phase
                    return True
            stat = w.stat(self.policy.objective.statistic) if w.ok else None
            if stat is not None:
                signals["latency_us"] = stat
            drift = det.observe(signals)
            self.hold = {
                "windows": i,
                "drift_streak": det.streak,
                "last_window": w.to_json(),
                "relative_change": det.last,
                "signals": signals,
            }
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

    def _watch(self, window: int | None) -> None:
        if self.watcher is not None:
            deployed = getattr(self.result, "deployed", None)
            self.watcher.step(window=window, every=self.policy.hold.verify_every,
                              deployed=deployed if isinstance(deployed, Mapping) else {})

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


def _jsonable(obj: Any) -> Any:
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    to_json = getattr(obj, "to_json", None)
    if callable(to_json):
        return to_json()
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, Sequence):
        return [_jsonable(v) for v in obj]
    return str(obj)

"""The controller: DESIGN.md's state machine, driven by an injected clock.

    RECOVER -> engine (BASELINE -> PROPOSE/APPLY/SETTLE/MEASURE/SCORE -> CONFIRM -> HOLD ...) -> ROLLBACK | STOPPED

The tuning session — search, confirmation and HOLD (fallback to the originals, the table of
confirmed deployments by load region, switches, challengers) — is the engine's
(polltuned.engine.core.Engine, ``follow=True``). The controller drives it step by step:
``next_action()``, then the Apply or Measure against the env, then ``observe``/``apply_failed``,
and relays its typed events (one Phase enum; guard events recognised by their EventKind). So
between any two steps it can publish status, ping the watchdog and act on a stop or a reload.
Before each HOLD window it sleeps ``hold.interval_s`` in slices of at most a second (watchdog,
signals, link events verified at once) and after it runs the watcher's verification
(polltuned.daemon.watch, every ``hold.verify_every`` HOLD windows).

The controller adds RECOVER (journal replay and repair before anything else), RELOAD (SIGHUP, in
every phase: the running session ends safely and a new one starts with the new policy; knobs the
new policy no longer names go back to their originals first) and the exit path (ROLLBACK to the
baselines, or keep the deployed configuration, as the policy's on_exit says). ``max_rounds`` ends
the run after that many deploy/keep decisions (or finished sessions).

It is a generator: :meth:`Controller.steps` yields after every phase change and window, and never
sleeps except through the injected clock, so tests drive it with a FakeClock.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Protocol

from polltuned.clock import Clock
from polltuned.engine.actions import Action, Apply, Done, Measure
from polltuned.engine.env import TrialEnv
from polltuned.engine.phases import Event, EventKind, Phase, WindowKind
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

#: events the controller lists as guard events in status (a trial aborted or an apply failed and
#: the baseline went back; the workload shifted under the search; HOLD fell back to the originals)
GUARD_KINDS = frozenset({EventKind.GUARD, EventKind.SHIFT, EventKind.FALLBACK})
#: the engine's decisions ``max_rounds`` counts (a deployment, or the baseline / active entry kept)
DECISION_KINDS = frozenset({EventKind.DEPLOY, EventKind.KEEP})


class EngineLike(Protocol):
    """polltuned.engine.core.Engine as the controller drives it (tests substitute a fake)."""

    def next_action(self) -> Action: ...
    def observe(self, window: Window) -> None: ...
    def apply_failed(self, error: PolltunedError) -> None: ...
    def drain_events(self) -> list[Event]: ...
    def request_stop(self) -> None: ...
    @property
    def result(self) -> TuningResult | None: ...
    def hold_status(self) -> dict[str, object]: ...


class ActuatorLike(Protocol):
    def read(self, keys: Sequence[str]) -> Mapping[str, KnobValue]: ...
    def rollback(self) -> object: ...
    def is_dirty(self) -> bool: ...


class WatcherLike(Protocol):
    """polltuned.daemon.watch.Watcher: verifies the deployed knobs in HOLD (link events, every
    ``hold.verify_every`` windows) and re-applies / releases / reports per knob."""

    def step(self, *, window: int | None, every: int, deployed: Mapping[str, KnobValue]) -> object: ...


#: builds the engine of one tuning round for (policy, env)
EngineFactory = Callable[[Policy, TrialEnv], EngineLike]


class Controller:
    def __init__(
        self,
        *,
        policy: Policy,
        actuator: ActuatorLike,
        env: TrialEnv,
        make_engine: EngineFactory,
        clock: Clock,
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
        self.max_rounds = max_rounds
        self.phase: Phase = IDLE
        self.message = ""
        self.trial: int | None = None
        self.round = 0
        self.events: deque[dict[str, object]] = deque(maxlen=50)
        self.guard_events: deque[dict[str, object]] = deque(maxlen=10)
        self.guard_aborts = 0   # every guard event since start (guard_events keeps the last 10)
        self.decisions = 0      # deploy/keep decisions of the engine since start (max_rounds counts them)
        self.hold_windows = 0   # HOLD windows since start (the watcher's verification schedule)
        #: the last finished round's result (None before the first one ends)
        self.result: TuningResult | None = None
        self.recovery: dict[str, object] = {}
        self.hold: dict[str, object] = {}
        self.reloads: deque[dict[str, object]] = deque(maxlen=10)
        self._engine: EngineLike | None = None
        self._ending = False    # the engine was asked to stop because max_rounds is reached
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
                if self._stop or self._rounds_done():
                    break
                # the session ended on its own (observe mode): nothing to do until a stop or a reload
                if not (yield from self._idle()):
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

    def _rounds_done(self) -> bool:
        return self.max_rounds is not None and (self.round >= self.max_rounds or self.decisions >= self.max_rounds)

    def _tune_round(self) -> Generator[str, None, None]:
        """One engine session: drive it until it is done (its result becomes ``self.result``)."""
        engine = self.make_engine(self.policy, self.env)
        self._engine = engine
        self._ending = False
        if self._stop:
            engine.request_stop()
        try:
            while True:
                action = engine.next_action()
                yield from self._relay(engine, engine.drain_events())
                self.result = engine.result
                self.hold = engine.hold_status()
                if isinstance(action, Done):
                    self.result = action.result
                    return
                yield from self._perform(engine, action)
        finally:
            self._engine = None

    def _relay(self, engine: EngineLike, events: list[Event]) -> Iterator[str]:
        """Publish the engine's events as the controller's phase (one step each); count guard
        events and decisions (``max_rounds`` reached: the engine is asked to stop)."""
        for ev in events:
            self._set(ev.phase, ev.message, ev.trial)
            if ev.kind in GUARD_KINDS:
                self.guard_events.append({"t": self.clock.wall(), "trial": ev.trial, "message": ev.message})
                self.guard_aborts += 1
            if ev.kind in DECISION_KINDS:
                self.decisions += 1
                if self._rounds_done():   # N decisions, or the N-th round (after reloads) decided
                    self._ending = True
                    engine.request_stop()
            yield self.phase

    def _perform(self, engine: EngineLike, action: Apply | Measure) -> Iterator[str]:
        """Carry out the engine's action against the env and hand the outcome back. An apply that
        raises left the host unchanged (the actuator is transactional): the engine is told so. A
        HOLD window waits ``hold.interval_s`` first; a stop or reload during that wait answers it
        with a failed window (the engine then ends the session) instead of measuring one more."""
        if isinstance(action, Apply):
            try:
                self.env.apply(action.config)
            except PolltunedError as e:
                engine.apply_failed(e)
            return
        if action.kind is not WindowKind.HOLD:
            engine.observe(self._measure(action.index))
            return
        if not self._ending:
            yield from self._sleep_interval()
        if self._stop or self._pending_policy is not None or self._ending:
            engine.observe(Window.failed("interrupted: the daemon is stopping or reloading"))
            return
        engine.observe(self._measure(action.index))
        self.hold_windows += 1
        self._watch(self.hold_windows)      # every hold.verify_every HOLD windows

    def _measure(self, index: int) -> Window:
        try:
            return self.env.measure(index)
        except PolltunedError as e:
            return Window.failed(e.message)

    def _idle(self) -> Generator[str, None, bool]:
        """Wait (watching the knobs) until a stop (False) or a reload (True: the next round)."""
        self._set(HOLD, "session ended: waiting for a reload or a stop")
        yield self.phase
        while not self._stop and self._pending_policy is None:
            yield from self._sleep_interval()
        return self._pending_policy is not None and not self._stop

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


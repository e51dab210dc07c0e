"""Controller state machine with fake parts: recovery, relay of tuner phases, hold/drift, exit path."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from polltuned.clock import FakeClock
from polltuned.daemon.controller import HOLD, RECOVER, RELOAD, ROLLBACK, STOPPED, Controller
from polltuned.engine.actions import Action, Apply, Done, Measure
from polltuned.engine.phases import Event, EventKind, Phase, WindowKind
from polltuned.engine.session import TuningResult
from polltuned.errors import PolltunedError
from polltuned.policy.loader import policy_from_dict
from polltuned.policy.schema import Policy
from polltuned.records import Config, KnobValue, Window
from tests.engine_run import result_with


def _policy(**over: Any) -> Policy:
    data: dict[str, Any] = {
        "name": "t",
        "knobs": {"net.core.busy_poll": {"min": 0, "max": 100}},
        "probe": {"kind": "sim", "scenario": "x.py"},
        "hold": {"interval_s": 2.0, "drift_threshold": 0.3, "drift_windows": 2},
    }
    data.update(over)
    return policy_from_dict(data)


@dataclass
class FakeActuator:
    dirty: bool = False
    rollbacks: int = 0
    values: dict[str, KnobValue] = field(default_factory=lambda: {"net.core.busy_poll": 0})

    def read(self, keys: Any) -> dict[str, KnobValue]:
        return {k: self.values[k] for k in keys}

    def rollback(self) -> dict[str, Any]:
        self.rollbacks += 1
        self.dirty = False
        self.values["net.core.busy_poll"] = 0
        return {"restored": 1}

    def is_dirty(self) -> bool:
        return self.dirty

    def managed(self) -> list[Any]:
        return []


class FakeEngine:
    """The engine's ask/tell API with scripted phases: one event per step (APPLY writes the
    actuator), each step an Apply the env ignores; then a DEPLOY decision and HOLD windows (as the
    real engine in follow mode) until stopped; then Done with ``deployed``."""

    def __init__(self, actuator: FakeActuator, phases: list[str], *, baseline_value: float = 1.0) -> None:
        self.actuator = actuator
        self.phases = phases
        self.stopped = False
        self.baseline_value = baseline_value
        self.i = 0
        self.holds = 0
        self.events: list[Event] = []
        self.waiting = False

    def next_action(self) -> Action:
        assert not self.waiting, "asked again without observing the HOLD window"
        if self.stopped:
            return Done(result_with({"net.core.busy_poll": 50}, baseline_value=self.baseline_value))
        if self.i < len(self.phases):
            p = self.phases[self.i]
            if p == "APPLY":
                self.actuator.values["net.core.busy_poll"] = 50
                self.actuator.dirty = True
            self.events.append(Event(Phase(p), f"step {self.i}", trial=self.i))
            self.i += 1
            return Apply({}, WindowKind.TRIAL)
        if self.holds == 0:
            self.events.append(Event(Phase.DONE, "deployed", kind=EventKind.DEPLOY))
        self.events.append(Event(Phase.HOLD, f"hold window {self.holds}"))
        self.holds += 1
        self.waiting = True
        return Measure(100 + self.holds, WindowKind.HOLD)

    def observe(self, window: Window) -> None:
        assert self.waiting
        self.waiting = False

    def apply_failed(self, error: PolltunedError) -> None:
        raise AssertionError("FakeEnv.apply never fails")

    def drain_events(self) -> list[Event]:
        out, self.events = self.events, []
        return out

    def request_stop(self) -> None:
        self.stopped = True

    @property
    def result(self) -> TuningResult | None:
        return None

    def hold_status(self) -> dict[str, object]:
        return {"windows": self.holds} if self.holds else {}


class FakeEnv:
    def __init__(self, latencies: list[float]) -> None:
        self.latencies = latencies
        self.calls = 0

    def current(self) -> dict[str, KnobValue]:
        return {}

    def apply(self, config: Config) -> None:
        pass

    def measure(self, window_index: int) -> Window:
        lat = self.latencies[min(self.calls, len(self.latencies) - 1)]
        self.calls += 1
        return Window(ok=True, latency={"p99": lat}, cpu_cores=0.1)

    def describe(self) -> Mapping[str, object]:
        return {}


def test_recover_rolls_back_dirty_host_before_anything_else() -> None:
    act = FakeActuator(dirty=True, values={"net.core.busy_poll": 77})
    tuners: list[FakeEngine] = []

    def make(p: Policy, e: Any) -> FakeEngine:
        # by the time the first tuner is built, recovery must have restored the host
        assert act.values["net.core.busy_poll"] == 0 and act.rollbacks == 1
        t = FakeEngine(act, ["BASELINE"])
        tuners.append(t)
        return t

    c = Controller(policy=_policy(hold={"retune": False}), actuator=act, env=FakeEnv([100.0]), make_engine=make,
                   clock=FakeClock(), max_rounds=1)
    phases = list(c.steps())
    assert phases[0] == RECOVER
    assert c.recovery["dirty_at_start"] is True
    assert tuners, "engine never built"


def test_relays_tuner_phases_and_restores_on_exit() -> None:
    act = FakeActuator()
    c = Controller(policy=_policy(hold={"retune": False}), actuator=act, env=FakeEnv([100.0]),
                   make_engine=lambda p, e: FakeEngine(act, ["BASELINE", "PROPOSE", "APPLY", "MEASURE", "CONFIRM"]),
                   clock=FakeClock(), max_rounds=1)
    phases = list(c.steps())
    for p in ("BASELINE", "PROPOSE", "APPLY", "MEASURE", "CONFIRM", ROLLBACK, STOPPED):
        assert p in phases
    assert act.rollbacks == 1 and act.values["net.core.busy_poll"] == 0
    assert c.result is not None and c.result.deployed == {"net.core.busy_poll": 50}


def test_on_exit_keep_leaves_deployed_values() -> None:
    act = FakeActuator()
    c = Controller(policy=_policy(on_exit="keep", hold={"retune": False}), actuator=act, env=FakeEnv([1.0]),
                   make_engine=lambda p, e: FakeEngine(act, ["APPLY"]), clock=FakeClock(), max_rounds=1)
    list(c.steps())
    assert act.rollbacks == 0 and act.values["net.core.busy_poll"] == 50
    assert c.phase == STOPPED


def test_hold_windows_wait_the_interval_on_the_clock_and_max_rounds_counts_decisions() -> None:
    act = FakeActuator()
    clock = FakeClock()
    engines: list[FakeEngine] = []

    def make(p: Policy, e: Any) -> FakeEngine:
        engines.append(FakeEngine(act, ["APPLY"]))
        return engines[-1]

    env = FakeEnv([100.0] * 20)
    c = Controller(policy=_policy(), actuator=act, env=env, make_engine=make, clock=clock, max_rounds=1)
    phases = list(c.steps())
    assert len(engines) == 1 and engines[0].stopped, "the first decision did not end a max_rounds=1 run"
    assert phases[-1] == STOPPED and act.rollbacks == 1


def test_hold_windows_sleep_through_the_injected_clock() -> None:
    act = FakeActuator()
    clock = FakeClock()
    env = FakeEnv([100.0] * 50)
    c = Controller(policy=_policy(), actuator=act, env=env, make_engine=lambda p, e: FakeEngine(act, ["APPLY"]),
                   clock=clock)
    for phase in c.steps():
        if phase == HOLD and env.calls >= 5:
            c.request_stop()
    assert env.calls == 5 and sum(clock.slept) >= 2.0 * 5   # interval_s before each HOLD window
    assert c.hold == {"windows": 6}                          # the engine's HOLD status, relayed


def test_stop_request_during_hold_exits_and_restores() -> None:
    act = FakeActuator()
    env = FakeEnv([100.0] * 50)
    c = Controller(policy=_policy(), actuator=act, env=env, make_engine=lambda p, e: FakeEngine(act, ["APPLY"]),
                   clock=FakeClock())
    steps = c.steps()
    for phase in steps:
        if phase == HOLD and env.calls >= 2:
            c.request_stop()
            break
    rest = list(steps)
    assert rest[-1] == STOPPED
    assert act.rollbacks == 1


def test_reload_swaps_policy_and_retunes() -> None:
    act = FakeActuator()
    seen: list[str] = []

    def make(p: Policy, e: Any) -> FakeEngine:
        seen.append(p.name)
        return FakeEngine(act, ["BASELINE", "PROPOSE", "APPLY"])

    c = Controller(policy=_policy(hold={"retune": False}), actuator=act, env=FakeEnv([1.0]), make_engine=make,
                   clock=FakeClock(), max_rounds=2)
    steps = c.steps()
    for phase in steps:
        if phase == "PROPOSE":
            c.request_reload(_policy(name="second", hold={"retune": False}))
            break
    list(steps)
    assert seen[:2] == ["t", "second"]


def test_service_signal_handlers_keep_default_action_in_forked_children(tmp_path: Any) -> None:
    """pyroute2 forks children for netns sockets and SIGTERMs them: they must die, not set our flags."""
    import os
    import signal

    from polltuned.daemon.service import Service
    from polltuned.host.systemd import Notifier

    act = FakeActuator()
    c = Controller(policy=_policy(), actuator=act, env=FakeEnv([1.0]), make_engine=lambda p, e: FakeEngine(act, []),
                   clock=FakeClock())
    svc = Service(controller=c, notifier=Notifier(environ={}), run_dir=str(tmp_path), clock=FakeClock(),
                  build_status=lambda ctl: {}, reload_policy=lambda: _policy())
    old = signal.signal(signal.SIGTERM, svc._on_stop)
    try:
        pid = os.fork()
        if pid == 0:  # child: the inherited handler must re-deliver with the default action (death)
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time_limit = 200
                while time_limit:
                    time_limit -= 1
                    os.sched_yield()
            finally:
                os._exit(7)  # reached only if the signal did not kill us
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        svc._on_stop(signal.SIGTERM, None)  # in the owner process it only sets the flag
        assert svc.flags.stop
    finally:
        signal.signal(signal.SIGTERM, old)


# ---- reload (SIGHUP) in every phase: re-tune with the new policy, never exit because of it ----

def _reload_run(trigger: str, *, when_calls: int = 0, new: Policy | None = None,
                act: FakeActuator | None = None) -> tuple[Controller, list[str], list[str], FakeActuator]:
    """Run a controller for two rounds; request a reload the first time ``trigger`` is yielded."""
    act = act or FakeActuator()
    seen: list[str] = []
    env = FakeEnv([100.0] * 100)

    def make(p: Policy, e: Any) -> FakeEngine:
        seen.append(p.name)
        return FakeEngine(act, ["BASELINE", "PROPOSE", "APPLY", "MEASURE", "CONFIRM"])

    c = Controller(policy=_policy(hold={"interval_s": 2.0, "drift_windows": 50}), actuator=act, env=env,
                   make_engine=make, clock=FakeClock(), max_rounds=2)
    new = new or _policy(name="second", hold={"interval_s": 2.0, "drift_windows": 50})
    phases: list[str] = []
    done = False
    for phase in c.steps():
        phases.append(phase)
        if not done and phase == trigger and env.calls >= when_calls:
            c.request_reload(new)
            done = True
        elif done and phase == HOLD and c.policy.name == new.name:
            c.request_stop()  # the new policy's round is done: end the run (HOLD would last forever)
    assert done, f"phase {trigger} never reached"
    return c, phases, seen, act


def test_reload_in_recover_tunes_the_first_round_with_the_new_policy() -> None:
    c, phases, seen, _act = _reload_run(RECOVER)
    assert seen[0] == "second", "the first round did not use the policy reloaded during RECOVER"
    assert RELOAD in phases and phases.index(RELOAD) < phases.index("BASELINE")
    assert c.reloads[-1]["outcome"] == "accepted" and c.reloads[-1]["phase"] == RECOVER


def test_reload_during_a_tuning_round_ends_it_and_retunes() -> None:
    c, phases, seen, act = _reload_run("PROPOSE")
    assert seen == ["t", "second"]
    # round 1 was cut short (its tuner was stopped before CONFIRM); round 2 ran in full
    first_reload = phases.index(RELOAD)
    assert "CONFIRM" not in phases[:first_reload]
    assert "CONFIRM" in phases[first_reload:]
    assert HOLD not in phases[:first_reload], "a reload mid-round must not go through HOLD"
    assert c.round == 2 and c.policy.name == "second"
    assert phases[-2:] == [ROLLBACK, STOPPED] and act.rollbacks == 1  # only the exit restores


def test_reload_in_hold_retunes_instead_of_exiting() -> None:
    """Issue 10: SIGHUP in HOLD made _hold return False, and the daemon exited (status 0)."""
    c, phases, seen, act = _reload_run(HOLD, when_calls=2)
    assert seen == ["t", "second"], "no new round after a reload in HOLD"
    i = phases.index(RELOAD)
    assert HOLD in phases[:i] and "BASELINE" in phases[i:]
    assert ROLLBACK not in phases[:i] and STOPPED not in phases[:i], "the reload took the exit path"
    assert c.round == 2 and act.rollbacks == 1


def test_reload_that_drops_knobs_restores_the_originals_first() -> None:
    act = FakeActuator()
    new = _policy(name="fewer", knobs={"net.core.busy_read": {"min": 0, "max": 100}},
                  hold={"interval_s": 2.0, "drift_windows": 50})
    c, _phases, _seen, act = _reload_run(HOLD, when_calls=1, new=new, act=act)
    # one rollback at the switch (busy_poll is no longer managed), one at exit
    assert act.rollbacks == 2
    assert any("drops net.core.busy_poll" in e["message"] for e in c.events)


def test_reload_while_stopping_is_ignored() -> None:
    act = FakeActuator()
    c = Controller(policy=_policy(), actuator=act, env=FakeEnv([100.0] * 50),
                   make_engine=lambda p, e: FakeEngine(act, ["APPLY"]), clock=FakeClock())
    steps = c.steps()
    for phase in steps:
        if phase == HOLD:
            c.request_stop()
            c.request_reload(_policy(name="late"))
            break
    rest = list(steps)
    assert rest[-1] == STOPPED and c.policy.name == "t" and not c.reload_pending


# ---- the keep marker belongs to one run ----

def test_recovery_honours_the_keep_marker_once_and_forgets_it() -> None:
    act = FakeActuator(dirty=True, values={"net.core.busy_poll": 50})
    forgotten: list[int] = []

    def make(p: Policy, e: Any) -> FakeEngine:
        # recovery kept the deployed value and dropped the marker before the first trial
        assert act.rollbacks == 0 and act.values["net.core.busy_poll"] == 50
        assert forgotten == [1]
        return FakeEngine(act, ["APPLY"])

    c = Controller(policy=_policy(hold={"retune": False}), actuator=act, env=FakeEnv([1.0]), make_engine=make,
                   clock=FakeClock(), max_rounds=1, kept=True, forget_kept=lambda: forgotten.append(1))
    list(c.steps())
    assert c.recovery["kept_by_previous_run"] is True and "rollback" not in c.recovery
    assert forgotten == [1] and c.kept is False


def test_without_keep_marker_recovery_rolls_back_and_forgets_nothing() -> None:
    act = FakeActuator(dirty=True, values={"net.core.busy_poll": 50})
    forgotten: list[int] = []
    c = Controller(policy=_policy(hold={"retune": False}), actuator=act, env=FakeEnv([1.0]),
                   make_engine=lambda p, e: FakeEngine(act, []), clock=FakeClock(), max_rounds=1,
                   forget_kept=lambda: forgotten.append(1))
    c.recover()
    assert act.rollbacks == 1 and forgotten == []


# ---- the service's side of a reload: RELOADING=1 (+ MONOTONIC_USEC) is always answered by READY=1 ----

def _service(tmp_path: Any, reload_policy: Any, phases: list[str], trigger: str) -> tuple[Any, Controller]:
    from polltuned.daemon.service import Service
    from polltuned.host.systemd import Notifier

    act = FakeActuator()
    holder: dict[str, Any] = {}

    class TriggerEngine(FakeEngine):
        def drain_events(self) -> list[Event]:
            out = super().drain_events()
            if any(ev.phase == trigger for ev in out) and not holder.get("fired"):
                holder["fired"] = True
                holder["svc"].flags.reload = True  # what the SIGHUP handler does
            return out

    c = Controller(policy=_policy(hold={"retune": False}), actuator=act, env=FakeEnv([1.0]),
                   make_engine=lambda p, e: TriggerEngine(act, phases), clock=FakeClock(), max_rounds=1)
    svc = Service(controller=c, notifier=Notifier(environ={}, monotonic_usec=lambda: 123456789),
                  run_dir=str(tmp_path), clock=FakeClock(), build_status=lambda ctl: {"phase": ctl.phase},
                  reload_policy=reload_policy)
    holder["svc"] = svc
    return svc, c


def test_service_reload_announces_and_completes(tmp_path: Any) -> None:
    svc, c = _service(tmp_path, lambda: _policy(name="second", hold={"retune": False}),
                      ["BASELINE", "PROPOSE", "APPLY"], "PROPOSE")
    assert svc.run() == 0
    sent = list(svc.notifier.sent)
    i = next(n for n, m in enumerate(sent) if m.startswith("RELOADING=1"))
    assert "MONOTONIC_USEC=123456789" in sent[i].split("\n")
    assert sum("READY=1" in m for m in sent[:i]) == 1  # the start-up READY=1 came first, once
    after = [m for m in sent[i + 1:] if "READY=1" in m]
    assert after and "reloaded policy second" in after[0], sent[i:i + 5]
    assert c.policy.name == "second" and c.round == 2


def test_service_refused_reload_still_sends_ready_and_keeps_running(tmp_path: Any) -> None:
    from polltuned.errors import PolicyError

    def broken() -> Policy:
        raise PolicyError(["policy.toml: tuning.bogus: unknown field (got x=1)"])

    svc, c = _service(tmp_path, broken, ["BASELINE", "PROPOSE", "APPLY"], "PROPOSE")
    assert svc.run() == 0
    sent = list(svc.notifier.sent)
    i = next(n for n, m in enumerate(sent) if m.startswith("RELOADING=1"))
    ready = next(m for m in sent[i + 1:] if "READY=1" in m)
    assert "reload refused" in ready and "tuning.bogus" in ready
    assert c.policy.name == "t" and c.reloads[-1]["outcome"] == "refused"


def test_service_reload_survives_an_unexpected_error(tmp_path: Any) -> None:
    def crash() -> Policy:
        raise OSError(13, "Permission denied")

    svc, _c = _service(tmp_path, crash, ["BASELINE", "PROPOSE", "APPLY"], "PROPOSE")
    assert svc.run() == 0
    assert any("READY=1" in m and "reload refused: PermissionError" in m for m in svc.notifier.sent)


def test_service_reload_before_ready_sends_no_reloading(tmp_path: Any) -> None:
    """A SIGHUP before start-up finished: the new policy is used, and READY=1 still means 'recovered'."""
    from polltuned.daemon.service import Service
    from polltuned.host.systemd import Notifier

    act = FakeActuator()
    seen: list[str] = []

    def make(p: Policy, e: Any) -> FakeEngine:
        seen.append(p.name)
        return FakeEngine(act, ["APPLY"])

    c = Controller(policy=_policy(hold={"retune": False}), actuator=act, env=FakeEnv([1.0]), make_engine=make,
                   clock=FakeClock(), max_rounds=1)
    svc = Service(controller=c, notifier=Notifier(environ={}), run_dir=str(tmp_path), clock=FakeClock(),
                  build_status=lambda ctl: {}, reload_policy=lambda: _policy(name="early", hold={"retune": False}))
    svc.flags.reload = True  # pending before the first step
    assert svc.run() == 0
    sent = list(svc.notifier.sent)
    assert not any(m.startswith("RELOADING=1") for m in sent)
    assert sum(1 for m in sent if "READY=1" in m) == 1
    assert seen == ["early"]

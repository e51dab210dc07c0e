"""The daemon's GP in a model worker process (issue 14): polltuned.optimiser.proxy, .worker and
polltuned.host.modelproc.

The worker answers exactly what the in-process SkoptOptimiser answers to the same calls, also after
it was stopped (idle) or killed between calls and rebuilt from the state the proxy keeps; a worker
that dies, stalls or answers garbage is a typed error, bounded in time; the daemon's own process
never loads scikit-optimize, scikit-learn or scipy.
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from polltuned.errors import ModelWorkerError, ModelWorkerGone
from polltuned.host.modelproc import PipeProcess, check_trusted, package_root, worker_argv
from polltuned.optimiser import make_optimiser
from polltuned.optimiser.proxy import WorkerOptimiser
from polltuned.optimiser.skopt_backend import SkoptOptimiser
from polltuned.optimiser.space import Space
from polltuned.optimiser.worker import serve, space_from_json, space_to_json
from polltuned.policy.loader import load_policy
from polltuned.policy.schema import Policy
from polltuned.records import KnobValue

REPO = Path(__file__).resolve().parents[1]
KNOBS = ("net.core.busy_read", "net.core.gro_normal_batch", "kernel.timer_migration")


def small_policy() -> Policy:
    pol = load_policy("sim-default")
    return pol.model_copy(update={"knobs": {k: v for k, v in pol.knobs.items() if k in KNOBS}})


def landscape(sp: Space) -> Callable[[dict[str, KnobValue]], float]:
    def f(c: dict[str, KnobValue]) -> float:
        br = float(c.get("net.core.busy_read", 0))
        return math.log(1.0 + 0.4 * abs(br - 50.0) / 50.0) + 0.05 * float(sp.encode(c).sum())
    return f


def real_worker() -> PipeProcess:
    return PipeProcess(worker_argv(idle_s=None))


def pair(seed: int = 4) -> tuple[Space, dict[str, KnobValue], SkoptOptimiser, WorkerOptimiser]:
    sp = Space.from_policy(small_policy())
    base = sp.canonical({d.key: d.off_value for d in sp.dims})
    a = SkoptOptimiser(sp, base, seed=seed, initial_points=4, safety_limit=math.log(2.0))
    b = WorkerOptimiser(sp, base, seed=seed, initial_points=4, safety_limit=math.log(2.0), spawn=real_worker)
    return sp, base, a, b


def test_the_space_round_trips_through_json() -> None:
    sp = Space.from_policy(load_policy("sim-default"))
    back = space_from_json(json.loads(json.dumps(space_to_json(sp))))
    assert back == sp


def test_worker_answers_exactly_as_in_process_also_after_restarts() -> None:
    """A seeded sequence of every call, with context; the worker is stopped (as after an idle
    period) and SIGKILLed between calls: every answer is identical to the in-process optimiser's."""
    sp, base, a, b = pair()
    f = landscape(sp)
    try:
        for i in range(9):
            ctx = {"flows": 1.0 if i % 3 else 4.0}
            ca, cb = a.ask(remaining=12 - i, context=ctx), b.ask(remaining=12 - i, context=ctx)
            assert ca == cb, i
            a.tell(ca, f(ca), context=ctx)
            b.tell(cb, f(cb), context=ctx)
            if i == 2:
                a.tell_failed(base | {"net.core.busy_read": 199})
                b.tell_failed(base | {"net.core.busy_read": 199})
            if i == 4:
                a.set_noise(0.08)
                b.set_noise(0.08)
                b.close()                       # stopped between calls: rebuilt from the kept state
            if i == 6:
                pid = b.worker_pid
                assert pid is not None
                os.kill(pid, signal.SIGKILL)    # died between calls: the next call starts another
            if i >= 3:
                assert a.predict([ca, base], context=ctx) == b.predict([cb, base], context=ctx), i
                assert a.predict([base], context=ctx, against=ca) == b.predict([base], context=ctx, against=cb), i
        obs = [(c, f(c) + 0.01) for c in (base, ca)]
        a.retell(obs, contexts=[{"flows": 1.0}, {"flows": 4.0}])
        b.retell(obs, contexts=[{"flows": 1.0}, {"flows": 4.0}])
        assert a.best() == b.best() and a.candidate() == b.candidate()
        assert a.simplify(ca) == b.simplify(cb)
        assert b.spawns == 3
        assert b.cpu_seconds > 0
    finally:
        b.close()


class FakeProcess:
    """A stand-in for the worker's pipe process (the proxy's spawn result): alive, swallows what it
    is sent; each test scripts its replies (``readline``) and its exit (``close``)."""

    pid = 7

    def alive(self) -> bool:
        return True

    def write_line(self, line: str) -> None:
        pass

    def readline(self, timeout_s: float) -> str:
        raise NotImplementedError

    def close(self, grace_s: float = 2.0) -> int | None:
        return 0


def test_a_worker_that_keeps_dying_is_a_typed_error_after_one_retry() -> None:
    sp = Space.from_policy(small_policy())
    starts: list[int] = []

    class Dead(FakeProcess):
        pid = 4242

        def readline(self, timeout_s: float) -> str:
            raise ModelWorkerGone("the model worker (pid 4242) exited (status -9) without answering")

        def close(self, grace_s: float = 2.0) -> int | None:
            return -9

    def spawn() -> Dead:
        starts.append(1)
        return Dead()

    b = WorkerOptimiser(sp, {}, seed=0, spawn=spawn)
    with pytest.raises(ModelWorkerGone) as e:
        b.ask()
    assert e.value.code == "model-worker-gone" and isinstance(e.value, ModelWorkerError)
    assert len(starts) == 2


@pytest.mark.parametrize("head", ["not json", '{"result": 1}', '{"ok": false, "error": "ValueError: boom"}'])
def test_garbage_or_a_failure_reply_is_a_model_worker_error(head: str) -> None:
    sp = Space.from_policy(small_policy())
    lines = iter(['{"ok": true, "result": null}', "{}", head, "{}"])
    closed: list[int] = []

    class Scripted(FakeProcess):
        def write_line(self, line: str) -> None:
            json.loads(line)   # the proxy sends JSON

        def readline(self, timeout_s: float) -> str:
            return next(lines)

        def close(self, grace_s: float = 2.0) -> int | None:
            closed.append(1)
            return 0

    b = WorkerOptimiser(sp, {}, seed=0, spawn=Scripted)
    with pytest.raises(ModelWorkerError) as e:
        b.best()
    assert e.value.code == "model-worker"
    assert closed == [1]            # the worker that answered garbage is stopped
    if "boom" in head:
        assert "boom" in e.value.message


def test_a_stalled_worker_times_out_instead_of_hanging() -> None:
    p = PipeProcess([sys.executable, "-c", "import sys; sys.stdin.read()"])
    try:
        with pytest.raises(ModelWorkerError, match=r"did not answer within 0\.2 s"):
            p.readline(0.2)
    finally:
        assert p.close(1.0) == 0    # end of input: it exits


def test_the_worker_exits_when_idle_and_at_end_of_input() -> None:
    class Silent(io.StringIO):
        def fileno(self) -> int:
            return r

    r, w = os.pipe()
    try:
        assert serve(Silent(), io.StringIO(), idle_s=0.0) == 0     # nothing arrived within idle_s
    finally:
        os.close(r)
        os.close(w)
    out = io.StringIO()
    assert serve(io.StringIO('{"op": "ask"}\n'), out, idle_s=None) == 0
    assert json.loads(out.getvalue())["ok"] is False and "before init" in out.getvalue()


def test_the_registry_builds_the_worker_optimiser() -> None:
    sp = Space.from_policy(small_policy())
    opt = make_optimiser("skopt-worker", sp, {}, seed=1)
    assert isinstance(opt, WorkerOptimiser) and opt.name == "skopt-worker"
    assert opt.spawns == 0          # nothing is started before the first call


def test_the_worker_runs_this_package_with_this_interpreter_isolated() -> None:
    argv = worker_argv(idle_s=30.0)
    assert argv[:2] == [sys.executable, "-I"] and argv[4] == str(package_root()) == str(REPO)
    assert argv[-2:] == ["--idle-s", "30.0"]
    check_trusted(argv, package_root())   # this checkout is root's (or we are not root)


def test_the_daemon_wiring_puts_the_model_in_a_worker() -> None:
    from polltuned.daemon.wiring import model_in_worker

    pol = load_policy("sim-default")
    assert model_in_worker(pol).tuning.optimiser == "skopt-worker"
    rnd = pol.model_copy(update={"tuning": pol.tuning.model_copy(update={"optimiser": "random"})})
    assert model_in_worker(rnd).tuning.optimiser == "random"


DAEMON_IMPORTS = """
import sys
sys.argv = ["polltuned", "--state-dir", sys.argv[1], "--run-dir", sys.argv[2], "run", "--simulate",
            "busypoll_split", "--sim-speed", "0", "--max-rounds", "1", "--policy", sys.argv[3]]
from polltuned.cli.main import main
rc = main(sys.argv[1:])
print("RC", rc)
print("HEAVY", sorted(m for m in ("skopt", "sklearn", "scipy") if m in sys.modules))
print("PROXY", "polltuned.optimiser.proxy" in sys.modules)
"""


def test_a_daemon_round_never_loads_the_model_libraries(tmp_path: Path) -> None:
    """A whole simulated daemon round (search, confirm, the model asked every window) in one
    process: the GP ran in a worker, and skopt / sklearn / scipy never entered the daemon."""
    policy = tmp_path / "policy.toml"
    policy.write_text(f'include = ["{REPO}/policies/sim-default.toml"]\nname = "worker-test"\n'
                      "[tuning]\nbudget = 8\nwindow_s = 0.01\nsettle_s = 0\n[confirm]\npairs = 2\n"
                      "[hold]\ninterval_s = 0.01\n")
    r = subprocess.run([sys.executable, "-c", DAEMON_IMPORTS, str(tmp_path / "s"), str(tmp_path / "r"), str(policy)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert "RC 0" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert "HEAVY []" in r.stdout, r.stdout[-500:]
    assert "PROXY True" in r.stdout

"""Crash safety, measured: SIGKILL `apply` at random moments (>= 200 kills, including exactly
between the fsync'd intent record and the write), then rollback -> every knob equals its
original. Then truncate the journal at random byte offsets -> rollback never writes a wrong value.

Then lose the journal's head (or all of it): rollback restores every original from the baseline
copy (journal.baselines.json).

Most kills are in-process (os.fork + SIGKILL, ~10 ms each); 20 are real `polltuned apply`
subprocesses stopped by POLLTUNED_TEST_PAUSE_AFTER and killed with SIGKILL.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from polltuned.actuator import PAUSE_ENV, Actuator, JournalRecovered, RollbackReport
from polltuned.clock import FakeClock
from polltuned.errors import JournalError
from polltuned.host.fs import FsHost
from polltuned.journal import COPY_NAME, JOURNAL_NAME, Journal
from polltuned.knobs.registry import KnobRegistry
from tests.test_knobs_faketree import make_tree, tree_values

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """tmpfs when available: SIGKILL leaves the page cache intact, so fsync durability is not what
    these tests measure, and on a shared 2-vCPU VM thousands of disk fsyncs would dominate runtime."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    if base is None:
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="ptk-crash-", dir=base))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)

#: key -> candidate values (never equal to the original)
CANDIDATES: dict[str, list[object]] = {
    "net.core.busy_read": [25, 50, 100],
    "net.core.busy_poll": [25, 50, 200],
    "net.core.gro_normal_batch": [1, 16, 64],
    "kernel.timer_migration": [0],
    "net.core.netdev_budget": [64, 600],
    "eth0:gro_flush_timeout": [5000, 20000],
    "eth0:napi:defer-hard-irqs": [1, 2, 10],
    "ptb/vb:napi_defer_hard_irqs": [2, 4],
    "ptb/vb:napi:irq-suspend-timeout": [100000, 2000000],
    "eth0:irq_affinity": ["spread", "pack-app", "avoid-app"],
    "eth0:coalesce:rx-usecs": [8, 64],
    "module:haltpoll:guest_halt_poll_ns": [100000, 200000],
}


def actuator(root: Path, state: Path) -> Actuator:
    clock = FakeClock()
    host = FsHost(root)
    return Actuator(host, Journal(state, clock=clock), registry=KnobRegistry(host, app_cpus=[1]),
                    app_cpus=[1], clock=clock)


def random_assignment(rng: random.Random) -> dict[str, object]:
    keys = rng.sample(sorted(CANDIDATES), rng.randint(2, 6))
    return {k: rng.choice(CANDIDATES[k]) for k in keys}


def rollback_killed_then_again(root: Path, state: Path, rng: random.Random) -> tuple[bool, RollbackReport]:
    """Apply 1-3 random assignments, SIGKILL a rollback in a child after 0-4 ms, then roll back again.
    Returns whether the child was really killed and the second rollback's report."""
    act = actuator(root, state)
    for _ in range(rng.randint(1, 3)):
        act.apply(random_assignment(rng))
    pid = os.fork()
    if pid == 0:
        try:
            actuator(root, state).rollback()
        except BaseException:
            os._exit(3)
        os._exit(0)
    time.sleep(rng.uniform(0.0, 0.004))
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status), actuator(root, state).rollback()


def kill_in_child(root: Path, state: Path, plan: list[dict[str, object]], pause: str | None,
                  delay_s: float | None) -> bool:
    """Fork; the child applies ``plan`` (several transactions); SIGKILL it at the pause point or after
    ``delay_s``; wait for it. True when the SIGKILL hit the child before it finished."""
    pid = os.fork()
    if pid == 0:  # child
        try:
            if pause:
                os.environ[PAUSE_ENV] = pause
            act = actuator(root, state)
            for a in plan:
                act.apply(a, reason="crash-test")
        except BaseException:
            os._exit(3)
        os._exit(0)
    if pause:
        _, status = os.waitpid(pid, os.WUNTRACED)
        if not os.WIFSTOPPED(status):
            return False
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    else:
        assert delay_s is not None
        time.sleep(delay_s)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def assert_all_original(root: Path, originals: dict[str, str], what: str) -> None:
    now = tree_values(root)
    diff = {k: (originals[k], now[k]) for k in originals if now[k] != originals[k]}
    assert not diff, f"{what}: not restored: {diff}"


@pytest.mark.slow
def test_sigkill_during_apply_then_rollback_restores_everything(fast_dir: Path) -> None:
    tmp_path = fast_dir
    rng = random.Random(20261130)
    kills = 0
    losses = 0
    root = make_tree(tmp_path / "root")
    originals = tree_values(root)
    stages = ["baseline", "intent", "write"]
    completed = 0
    for i in range(400):
        if kills >= 200:
            break
        state = tmp_path / f"st{i}"
        plan = [random_assignment(rng) for _ in range(rng.randint(1, 3))]
        n_steps = sum(len(a) for a in plan)
        if i % 2 == 0:  # exactly after a fsync'd record (intent in half of these)
            stage = "intent" if i % 4 == 0 else rng.choice(stages)
            pause: str | None = f"{stage}:{rng.randint(1, n_steps)}"
            hit = kill_in_child(root, state, plan, pause, None)
        else:  # at a random moment
            hit = kill_in_child(root, state, plan, None, rng.uniform(0.0, 0.01))
        kills += hit
        completed += not hit
        rep = actuator(root, state).rollback()
        assert rep.ok, [x for x in rep.items if x.outcome == "failed"]
        try:
            assert_all_original(root, originals, f"iteration {i} plan={plan}")
        except AssertionError:
            losses += 1
            raise
        assert not actuator(root, state).is_dirty()
        shutil.rmtree(state)
    print(f"crash test: {kills} SIGKILLs mid-apply, {completed} applies finished first, {losses} losses")
    assert kills >= 200 and losses == 0


def _cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    e = dict(os.environ)
    e.update(env or {})
    e["PYTHONPATH"] = str(REPO)
    return subprocess.Popen([sys.executable, "-m", "polltuned", *args], env=e,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.slow
def test_sigkill_real_cli_apply_between_intent_and_write(fast_dir: Path) -> None:
    tmp_path = fast_dir
    rng = random.Random(7)
    root = make_tree(tmp_path / "root")
    originals = tree_values(root)
    for i in range(20):
        state = tmp_path / f"cli{i}"
        a = random_assignment(rng)
        kv = [f"{k}={v}" for k, v in a.items()]
        p = _cli(["--host-root", str(root), "--state-dir", str(state), "apply", "--app-cpus", "1", *kv],
                 {PAUSE_ENV: f"intent:{rng.randint(1, len(a))}"})
        _, status = os.waitpid(p.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), f"apply exited before the intent pause (status {status})"
        os.kill(p.pid, signal.SIGKILL)
        os.waitpid(p.pid, 0)
        p.returncode = -9
        if i % 5 == 0:  # the CLI rollback, as ExecStopPost runs it
            r = _cli(["--host-root", str(root), "--state-dir", str(state), "rollback", "--if-dirty"])
            assert r.wait(30) == 0
        else:
            assert actuator(root, state).rollback().ok
        assert_all_original(root, originals, f"cli iteration {i} {kv}")


@pytest.mark.slow
def test_truncated_journal_never_causes_a_wrong_write(fast_dir: Path) -> None:
    tmp_path = fast_dir
    rng = random.Random(99)
    root = make_tree(tmp_path / "root")
    originals = tree_values(root)
    state = tmp_path / "st"
    plan = [random_assignment(rng) for _ in range(3)]
    act = actuator(root, state)
    for a in plan:
        act.apply(a)
    applied = tree_values(root)
    full = (state / JOURNAL_NAME).read_bytes()
    wrong = 0
    for i in range(120):
        cut = rng.randint(0, len(full))
        for rel, text in applied.items():  # back to the tuned state
            if (root / rel).read_text() != text:
                (root / rel).write_text(text)
        st = tmp_path / f"t{i}"
        st.mkdir()
        (st / JOURNAL_NAME).write_bytes(full[:cut])
        rep = actuator(root, st).rollback()
        assert rep.ok, (cut, rep)
        now = tree_values(root)
        for rel in originals:
            if now[rel] not in (originals[rel], applied[rel]):
                wrong += 1
        shutil.rmtree(st)
    assert wrong == 0


def test_corrupted_middle_record_restores_from_the_copy(tmp_path: Path) -> None:
    """A baseline record silently altered: the journal is refused (CRC), nothing is written from it;
    the originals come from the baseline copy, and the damage is still an error."""
    root = make_tree(tmp_path / "root")
    originals = tree_values(root)
    state = tmp_path / "st"
    act = actuator(root, state)
    act.apply({"net.core.busy_poll": 50, "net.core.busy_read": 50, "eth0:gro_flush_timeout": 20000})
    before = tree_values(root)
    data = bytearray((state / JOURNAL_NAME).read_bytes())
    lines = data.split(b"\n")
    lines[3] = lines[3].replace(b'"value":0', b'"value":9')  # a baseline silently altered
    (state / JOURNAL_NAME).write_bytes(b"\n".join(lines))
    with pytest.raises(JournalError):
        actuator(root, state).apply({"net.core.busy_poll": 10})
    assert tree_values(root) == before
    with pytest.raises(JournalRecovered, match=r"checksum mismatch.*rolled back from the baseline copy"):
        actuator(root, state).rollback()
    assert tree_values(root) == originals


def _cut_head(full: bytes, rng: random.Random) -> bytes:
    """Lose the journal's head: at a random byte, at a record boundary, or everything."""
    r = rng.random()
    if r < 0.1:
        return b""
    if r < 0.5:
        starts = [i + 1 for i, b in enumerate(full) if b == 0x0A][:-1]
        return full[rng.choice(starts):] if starts else b""
    return full[rng.randint(1, len(full) - 1):]


@pytest.mark.slow
def test_head_loss_never_loses_an_original(fast_dir: Path) -> None:
    """The journal loses its head (or everything) after applies — some SIGKILLed mid-way, exactly
    after a fsync'd record — while the host carries polltuned values: rollback restores every
    original from the baseline copy (and says the journal was damaged)."""
    rng = random.Random(424242)
    root = make_tree(fast_dir / "root")
    originals = tree_values(root)
    recovered = losses = killed = 0
    for i in range(120):
        state = fast_dir / f"h{i}"
        plan = [random_assignment(rng) for _ in range(rng.randint(1, 3))]
        if i % 3 == 0:
            n_steps = sum(len(a) for a in plan)
            killed += kill_in_child(root, state, plan, f"{rng.choice(['baseline', 'intent', 'write'])}:"
                                                       f"{rng.randint(1, n_steps)}", None)
        else:
            act = actuator(root, state)
            for a in plan:
                act.apply(a, reason="head-loss")
        jp = state / JOURNAL_NAME
        if not jp.exists():
            continue
        jp.write_bytes(_cut_head(jp.read_bytes(), rng))
        try:
            rep = actuator(root, state).rollback()
            assert rep.ok
        except JournalRecovered as e:
            assert e.report.ok, e.report
            recovered += 1
        now = tree_values(root)
        lost = {k: (originals[k], now[k]) for k in originals if now[k] != originals[k]}
        losses += bool(lost)
        assert not lost, f"iteration {i}: {lost} plan={plan}"
        assert not actuator(root, state).is_dirty()
        shutil.rmtree(state)
    print(f"head loss: 120 journals cut ({killed} after a SIGKILL mid-apply), {recovered} restored "
          f"from the baseline copy, {losses} lost originals")
    assert losses == 0 and recovered >= 60


@pytest.mark.slow
def test_truncated_journal_with_the_copy_restores_or_never_writes_wrong(fast_dir: Path) -> None:
    """Cut at any byte with the copy next to it: a cut that removed baselines the copy has is
    damage and is restored from the copy; any other cut replays as before: never a wrong value."""
    rng = random.Random(77)
    root = make_tree(fast_dir / "root")
    originals = tree_values(root)
    state = fast_dir / "st"
    act = actuator(root, state)
    for a in [random_assignment(rng) for _ in range(3)]:
        act.apply(a)
    applied = tree_values(root)
    full = (state / JOURNAL_NAME).read_bytes()
    copy = (state / COPY_NAME).read_bytes()
    wrong = from_copy = 0
    for i in range(120):
        cut = rng.randint(0, len(full))
        for rel, text in applied.items():
            if (root / rel).read_text() != text:
                (root / rel).write_text(text)
        st = fast_dir / f"t{i}"
        st.mkdir()
        (st / JOURNAL_NAME).write_bytes(full[:cut])
        (st / COPY_NAME).write_bytes(copy)
        try:
            assert actuator(root, st).rollback().ok
        except JournalRecovered as e:
            assert e.report.ok
            from_copy += 1
            assert tree_values(root) == originals, cut
        now = tree_values(root)
        wrong += sum(now[rel] not in (originals[rel], applied[rel]) for rel in originals)
        shutil.rmtree(st)
    print(f"tail cuts with the copy: {from_copy} of 120 restored from the copy, {wrong} wrong values")
    assert wrong == 0 and from_copy > 0


@pytest.mark.slow
def test_sigkill_during_rollback_then_rollback_again(fast_dir: Path) -> None:
    """Rollback itself may be killed (ExecStopPost timeout, power cut): the next one finishes the job."""
    rng = random.Random(5)
    root = make_tree(fast_dir / "root")
    originals = tree_values(root)
    hits = 0
    for i in range(40):
        killed, rep = rollback_killed_then_again(root, fast_dir / f"rb{i}", rng)
        hits += killed
        assert rep.ok, [x for x in rep.items if x.outcome == "failed"]
        assert all(x.outcome != "released" for x in rep.items), rep
        assert_all_original(root, originals, f"rollback-kill iteration {i}")
    assert hits >= 10


class _Killed(BaseException):
    """Stands for SIGKILL inside a knob write: nothing after it runs, no journal record follows."""


def test_rollback_killed_inside_a_composite_restore_is_finished_not_released(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cause of the flaky SIGKILL-during-rollback test: a per-NAPI knob is restored NAPI by NAPI
    (each napi-set is atomic, the knob is not). Killed between two NAPIs, the knob reads
    ``mixed:257=0,258=10`` — neither polltuned's value nor the original — and the next rollback took
    that for an admin change. Rollback now journals an intent before each restore (journal first),
    so the interrupted knob is unsettled and the next rollback finishes it."""
    from polltuned.host.netdev_genl import FileNetdev

    root = make_tree(tmp_path / "root")
    originals = tree_values(root)
    state = tmp_path / "st"
    actuator(root, state).apply({"net.core.busy_poll": 50, "eth0:napi:defer-hard-irqs": 10})
    real_set = FileNetdev.napi_set
    calls: list[int] = []

    def dies_on_second_napi(self: FileNetdev, napi_id: int, values: dict[str, int]) -> None:
        calls.append(napi_id)
        if len(calls) == 2:
            raise _Killed
        real_set(self, napi_id, values)

    monkeypatch.setattr(FileNetdev, "napi_set", dies_on_second_napi)
    with pytest.raises(_Killed):
        actuator(root, state).rollback()
    monkeypatch.setattr(FileNetdev, "napi_set", real_set)
    assert actuator(root, state).read(["eth0:napi:defer-hard-irqs"]) == {
        "eth0:napi:defer-hard-irqs": "mixed:257=0,258=10"}  # really half-restored
    rows = {r.key: r.state for r in actuator(root, state).verify()}
    assert rows["eth0:napi:defer-hard-irqs"] == "interrupted"
    rep = actuator(root, state).rollback()
    assert {i.key: i.outcome for i in rep.items} == {"eth0:napi:defer-hard-irqs": "restored",
                                                       "net.core.busy_poll": "restored"}
    assert rep.clean
    assert_all_original(root, originals, "after the second rollback")

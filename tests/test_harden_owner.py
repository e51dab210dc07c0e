"""Issue 16, defect 5: one owner of the host. `apply` and `rollback` while a daemon runs are
refused (exit 6, naming its pid) unless --force (the daemon rolls back and hands over); a window
during which a measured knob was changed from outside is discarded."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from polltuned.cli.main import main
from polltuned.clock import FakeClock
from polltuned.daemon.status import InstanceLock
from polltuned.engine.env import HostEnv
from polltuned.errors import ExitCode
from polltuned.journal import JOURNAL_NAME
from polltuned.policy.loader import policy_from_dict
from polltuned.records import Window
from tests.test_daemon_process import World, _wait_phase
from tests.test_knobs_faketree import make_tree, tree_values

POLICY = {"name": "t", "knobs": {"net.core.busy_poll": {"min": 0, "max": 100}},
          "probe": {"kind": "sim", "scenario": "gro_batch"}, "tuning": {"settle_s": 0, "window_s": 1}}


class _Act:
    def __init__(self) -> None:
        self.live: dict[str, Any] = {"net.core.busy_poll": 0}

    def read(self, keys: Sequence[str]) -> Mapping[str, Any]:
        return {k: self.live[k] for k in keys}

    def apply(self, assignment: Mapping[str, Any], *, reason: str = "") -> Any:
        self.live.update(assignment)


class _Probe:
    name = "fake"

    def __init__(self, act: _Act, outside: dict[str, Any] | None = None) -> None:
        self.act, self.outside = act, outside

    def start(self) -> None: ...
    def restart(self) -> None: ...
    def close(self) -> None: ...

    def measure(self, duration_s: float, window_index: int) -> Window:
        if self.outside:  # the admin (or `polltuned apply`) writes while the daemon measures
            self.act.live.update(self.outside)
        return Window(ok=True, latency={"p99": 10.0}, cpu_cores=0.1, observations=100, duration_s=duration_s)


def test_window_with_an_outside_write_is_discarded() -> None:
    pol = policy_from_dict(POLICY)
    act = _Act()
    env = HostEnv(pol, act, _Probe(act), clock=FakeClock())
    env.apply({"net.core.busy_poll": 50})
    assert env.measure(0).ok  # the control: nobody else wrote
    act2 = _Act()
    env2 = HostEnv(pol, act2, _Probe(act2, {"net.core.busy_poll": 7}), clock=FakeClock())
    env2.apply({"net.core.busy_poll": 50})
    w = env2.measure(0)
    assert not w.ok and "changed outside polltuned" in (w.error or "") and "net.core.busy_poll 50 -> 7" in w.error
    env2.probe.outside = None  # type: ignore[attr-defined]
    assert env2.measure(1).ok  # only the window the change fell in is discarded
    # written between the apply and the window: discarded too
    act3 = _Act()
    env3 = HostEnv(pol, act3, _Probe(act3), clock=FakeClock())
    env3.apply({"net.core.busy_poll": 50})
    act3.live["net.core.busy_poll"] = 9
    assert not env3.measure(0).ok


def _cli(capsys: pytest.CaptureFixture[str], root: Path, tmp: Path, *argv: str) -> tuple[int, str, str]:
    rc = main(["--host-root", str(root), "--state-dir", str(tmp / "st"), "--run-dir", str(tmp / "run"), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_apply_and_rollback_refused_while_a_daemon_holds_the_host(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    root = make_tree(tmp_path / "root")
    assert _cli(capsys, root, tmp_path, "apply", "net.core.busy_poll=50")[0] == 0
    before = tree_values(root)
    lock = InstanceLock(tmp_path / "run")
    lock.acquire()  # "the daemon" (this process holds the instance lock)
    try:
        for argv in (["apply", "net.core.busy_read=25"], ["rollback"]):
            rc, _, err = _cli(capsys, root, tmp_path, *argv)
            assert rc == int(ExitCode.LOCKED), err
            (line,) = [ln for ln in err.splitlines() if ln.startswith("polltuned: error[")]
            assert "error[locked]" in line and "daemon (pid " in line and "owns the host" in line
            assert tree_values(root) == before
        assert _cli(capsys, root, tmp_path, "apply", "--dry-run", "net.core.busy_read=25")[0] == 0  # writes nothing
    finally:
        lock.release()
    assert _cli(capsys, root, tmp_path, "rollback")[0] == 0


@pytest.mark.slow
def test_apply_during_a_round_is_refused_and_force_hands_over(tmp_path: Path) -> None:
    """The target: `apply` during a daemon's round: exit 6 and the daemon's values untouched; then
    `rollback --force`: the daemon stops its round, rolls back and exits; the host is original."""
    w = World(tmp_path)
    proc = w.start()
    try:
        w.wait_for("READY=1")
        doc = _wait_phase(w, "HOLD")
        assert w.snapshot() != w.originals
        pid = doc.get("pid")
        before = w.snapshot()
        r = w.cli("apply", "net.core.busy_read=77")
        assert r.returncode == int(ExitCode.LOCKED) and f"pid {pid}" in r.stderr, r.stderr
        assert w.snapshot() == before  # the daemon's values untouched (it is in HOLD: nothing moves)
        assert b'"reason":"manual"' not in (w.state / JOURNAL_NAME).read_bytes()
        r = w.cli("rollback", "--force")
        assert r.returncode == 0, r.stdout + r.stderr
        end = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        assert proc.poll() == 0, w.log.read_text()[-2000:]
        assert w.snapshot() == w.originals
        st = w.cli("status", "--json")
        assert st.returncode == 0 and json.loads(st.stdout)["running"] is False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        w.close()

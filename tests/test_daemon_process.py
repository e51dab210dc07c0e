"""The real `polltuned run` process in a simulated world, with our own NOTIFY_SOCKET.

Checks the systemd protocol (READY=1 after recovery, STATUS=, WATCHDOG=1), SIGHUP with a broken
policy (refused, daemon keeps running), SIGTERM (on_exit = restore puts the baselines back),
kill -9 + `rollback --if-dirty` (what ExecStopPost runs), the instance lock, and the status JSON.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from polltuned.policy.loader import load_policy
from polltuned.probes.sim import make_fake_host_tree

REPO = Path(__file__).resolve().parents[1]
PT = [sys.executable, "-m", "polltuned"]

POLICY = """
include = ["{repo}/policies/sim-default.toml"]
name = "daemon-test"
[tuning]
budget = 10
window_s = 0.01
settle_s = 0
[confirm]
pairs = 3
[hold]
interval_s = 0.2
drift_windows = 50
"""

BUSY_READ = "proc/sys/net/core/busy_read"


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "root"
        self.state = tmp / "state"
        self.run = tmp / "run"
        self.policy = tmp / "policy.toml"
        self.policy.write_text(POLICY.format(repo=REPO))
        self.config = tmp / "polltuned.toml"
        self.config.write_text(f'policy = "{self.policy}"\nstatus_interval_s = 0.2\n')
        make_fake_host_tree(self.root, load_policy(str(self.policy)).knobs)
        self.originals = self.snapshot()
        self.sock_path = str(tmp / "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.sock_path)
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        self._closing = False
        # read the notify socket continuously, like systemd does (a full queue would block sd_notify)
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()

    def _read_loop(self) -> None:
        while not self._closing:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> None:
        self._closing = True
        self._reader.join(timeout=2)
        self.sock.close()

    def snapshot(self) -> dict[str, str]:
        return {str(p.relative_to(self.root)): p.read_text() for p in sorted(self.root.rglob("*")) if p.is_file()}

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*PT, "--host-root", str(self.root), "--state-dir", str(self.state),
                               "--run-dir", str(self.run), *args], capture_output=True, text=True, timeout=60,
                              cwd=REPO)

    def start(self) -> subprocess.Popen[str]:
        env = dict(os.environ, NOTIFY_SOCKET=self.sock_path)
        env.pop("INVOCATION_ID", None)
        env.pop("JOURNAL_STREAM", None)
        self.log = self.tmp / "daemon.log"
        # a file, not a pipe nobody reads (a full pipe would block the daemon)
        with open(self.log, "w") as out:
            return subprocess.Popen([*PT, "--host-root", str(self.root), "--state-dir", str(self.state),
                                     "--run-dir", str(self.run), "run", "--config", str(self.config)],
                                    env=env, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=REPO)

    def drain(self) -> None:
        time.sleep(0.3)

    def wait_for(self, pred: str, timeout: float = 150.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(pred in m for m in list(self.messages)):
                return
            time.sleep(0.05)
        raise AssertionError(f"no notify message containing {pred!r}; got {self.messages[-10:]}")

    def wait_any(self, preds: list[str], timeout: float = 150.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(p in m for m in list(self.messages) for p in preds):
                return
            time.sleep(0.05)
        raise AssertionError(f"no notify message containing any of {preds}; got {self.messages[-10:]}")

    def status(self) -> dict[str, object]:
        r = self.cli("status", "--json")
        return json.loads(r.stdout)  # type: ignore[no-any-return]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.close()


def _wait_phase(w: World, phase: str, timeout: float = 150.0) -> dict[str, object]:
    end = time.monotonic() + timeout
    doc: dict[str, object] = {}
    while time.monotonic() < end:
        doc = w.status()
        if doc.get("phase") == phase:
            return doc
        time.sleep(0.2)
    raise AssertionError(f"daemon never reached {phase}; last status {doc.get('phase')}: {doc.get('message')}")


@pytest.mark.slow
def test_notify_reload_and_sigterm_restore(world: World) -> None:
    proc = world.start()
    try:
        world.wait_for("READY=1")
        doc = _wait_phase(world, "HOLD")
        world.drain()
        assert any(m.startswith("STATUS=") or "\nSTATUS=" in m for m in world.messages)
        assert any("WATCHDOG=1" in m for m in world.messages)
        # status JSON in HOLD: running, the deployed busy_read is live, originals are the fixture's
        assert doc["running"] is True and doc["policy"] == "daemon-test"
        knobs = {k["key"]: k for k in doc["knobs"]}  # type: ignore[union-attr,index]
        assert knobs["net.core.busy_read"]["original"] == 0
        res = doc["result"]
        assert isinstance(res, dict) and res["confirmation"]["verdict"].startswith("significant")
        assert knobs["net.core.busy_read"]["current"] == res["deployed"]["net.core.busy_read"] != 0
        assert (world.root / BUSY_READ).read_text().strip() != "0"

        # a second instance refuses to start (lock)
        second = world.cli("run", "--config", str(world.config))
        assert second.returncode == 6 and "already running" in second.stderr

        # SIGHUP with a broken policy: refused, the daemon keeps running the old one
        world.policy.write_text(world.policy.read_text() + "\n[tuning.bogus]\nx = 1\n")
        proc.send_signal(signal.SIGHUP)
        world.wait_for("reload refused")
        time.sleep(0.5)
        assert proc.poll() is None
        assert world.status()["policy"] == "daemon-test"

        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        out = world.log.read_text()
        assert proc.returncode == 0, out
        assert "reload refused" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    world.drain()
    assert any("STOPPING=1" in m for m in world.messages)
    assert world.snapshot() == world.originals, "SIGTERM did not restore every baseline"
    st = world.cli("status", "--json")
    assert st.returncode == 0 and json.loads(st.stdout)["running"] is False
    assert json.loads(st.stdout)["host_dirty"] is False


@pytest.mark.slow
def test_kill9_then_rollback_if_dirty_restores(world: World) -> None:
    proc = world.start()
    try:
        world.wait_for("READY=1")
        _wait_phase(world, "HOLD")
        assert world.snapshot() != world.originals
    finally:
        proc.kill()
        proc.wait()
    st = world.cli("status")
    assert st.returncode == 3, st.stdout + st.stderr   # not running, host dirty
    assert "DIRTY" in st.stdout
    rb = world.cli("rollback", "--if-dirty")
    assert rb.returncode == 0, rb.stderr
    assert world.snapshot() == world.originals
    again = world.cli("rollback", "--if-dirty")
    assert again.returncode == 0 and world.snapshot() == world.originals
    assert world.cli("status").returncode == 0


@pytest.mark.slow
def test_on_exit_keep_survives_execstoppost(world: World) -> None:
    world.policy.write_text('on_exit = "keep"\n' + world.policy.read_text())
    proc = world.start()
    try:
        _wait_phase(world, "HOLD")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    kept = world.snapshot()
    assert kept != world.originals
    assert world.cli("rollback", "--if-dirty").returncode == 0
    assert world.snapshot() == kept, "ExecStopPost undid a configuration the policy said to keep"
    assert world.cli("rollback").returncode == 0
    assert world.snapshot() == world.originals


def _reloading_then_ready(messages: list[str]) -> list[tuple[str, str]]:
    """Each RELOADING=1 message paired with the first READY=1 message after it."""
    pairs = []
    for i, m in enumerate(messages):
        if m.startswith("RELOADING=1"):
            nxt = next((r for r in messages[i + 1:] if "READY=1" in r.split("\n")), "")
            pairs.append((m, nxt))
    return pairs


def _rename_policy(w: World, name: str) -> None:
    w.policy.write_text(w.policy.read_text().replace('name = "', f'name = "{name}"  # was "', 1))


@pytest.mark.slow
def test_sighup_while_tuning_and_in_hold_retunes_with_the_new_policy(world: World) -> None:
    """Issue 10: SIGHUP in any phase reloads and re-tunes; RELOADING=1 is always answered by READY=1."""
    # longer windows so that the first round is surely still running when the first SIGHUP lands
    world.policy.write_text(world.policy.read_text().replace("window_s = 0.01", "window_s = 0.2"))
    proc = world.start()
    try:
        world.wait_for("READY=1")
        # the first round is searching (STATUS= is rate-limited: any tuning phase will do)
        world.wait_any(["STATUS=BASELINE", "STATUS=PROPOSE", "STATUS=APPLY", "STATUS=SETTLE", "STATUS=MEASURE",
                        "STATUS=SCORE"])
        _rename_policy(world, "reloaded-in-tuning")
        proc.send_signal(signal.SIGHUP)
        world.wait_for("reloaded policy reloaded-in-tuning")
        doc = _wait_phase(world, "HOLD")
        assert doc["policy"] == "reloaded-in-tuning"
        reloads = doc["reloads"]
        assert isinstance(reloads, list) and reloads[-1]["outcome"] == "accepted"
        assert reloads[-1]["phase"] not in ("HOLD", "RECOVER", "STOPPED"), reloads
        assert doc["progress"]["round"] == 2  # type: ignore[index]

        _rename_policy(world, "reloaded-in-hold")
        proc.send_signal(signal.SIGHUP)
        world.wait_for("reloaded policy reloaded-in-hold")
        end = time.monotonic() + 150
        while time.monotonic() < end:
            doc = world.status()
            if doc.get("policy") == "reloaded-in-hold" and doc.get("phase") == "HOLD":
                break
            assert proc.poll() is None, "the daemon exited after a reload in HOLD"
            time.sleep(0.2)
        assert doc["policy"] == "reloaded-in-hold" and doc["phase"] == "HOLD", doc.get("phase")
        assert doc["progress"]["round"] == 3  # type: ignore[index]
        assert doc["reloads"][-1]["phase"] == "HOLD"  # type: ignore[index]
        assert proc.poll() is None
        assert isinstance(doc.get("result"), dict)  # round 3 ran to a verdict under the new policy

        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert proc.returncode == 0, world.log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    world.drain()
    msgs = list(world.messages)
    pairs = _reloading_then_ready(msgs)
    assert len(pairs) == 2, msgs
    for reloading, ready in pairs:
        fields = dict(line.split("=", 1) for line in reloading.split("\n"))
        # CLOCK_MONOTONIC in µs, as systemd >= 253 wants it for Type=notify-reload (same clock as ours)
        assert abs(int(fields["MONOTONIC_USEC"]) / 1e6 - time.monotonic()) < 300
        assert ready, f"RELOADING=1 never answered by READY=1: {msgs}"
    assert world.snapshot() == world.originals


@pytest.mark.slow
def test_keep_marker_covers_one_run_only(world: World) -> None:
    """Issue 10: after a clean exit with on_exit = keep, the next run starts from the kept values, and
    a crash of that next run is rolled back by ExecStopPost (rollback --if-dirty)."""
    world.policy.write_text('on_exit = "keep"\n' + world.policy.read_text())
    proc = world.start()
    try:
        _wait_phase(world, "HOLD")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    kept = world.snapshot()
    assert kept != world.originals
    marker = json.loads((world.state / "kept.json").read_text())
    journal = [json.loads(line) for line in (world.state / "journal.jsonl").read_text().splitlines()]
    epochs = [r["epoch"] for r in journal if r["type"] == "epoch"]
    assert marker["epoch"] == epochs[-1], "the keep marker does not name the journal epoch it covers"
    assert world.cli("rollback", "--if-dirty").returncode == 0
    assert world.snapshot() == kept  # ExecStopPost after the clean keep exit: values stay

    # the next run honours the marker (no restore at start) and removes it
    proc = world.start()
    try:
        world.wait_for("READY=1")
        doc = _wait_phase(world, "HOLD")
        assert doc["recovery"]["kept_by_previous_run"] is True  # type: ignore[index]
        assert "rollback" not in doc["recovery"]  # type: ignore[operator]
        assert not (world.state / "kept.json").exists(), "the keep marker survived the start of a new run"
    finally:
        proc.kill()  # crash (kill -9) of the second run
        proc.wait()
    assert world.snapshot() != world.originals
    rb = world.cli("rollback", "--if-dirty")
    assert rb.returncode == 0, rb.stderr
    assert "keeping the deployed configuration" not in rb.stdout
    assert world.snapshot() == world.originals, "a crash after a new start was not rolled back"

"""Issue 16, items 6-8: every crash and wrong exit code of the sweep, each reproduced first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from polltuned.cli.main import main
from polltuned.daemon.render import render_status
from polltuned.errors import ExitCode
from tests.test_knobs_faketree import make_tree, tree_values

BP = "proc/sys/net/core/busy_poll"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "root")


def _policy(tmp: Path, probe: str, tuning: str = "", name: str = "p.toml") -> Path:
    p = tmp / name
    p.write_text('name = "t"\n[knobs."net.core.busy_poll"]\nmin = 0\nmax = 100\n'
                 f"[probe]\n{probe}\n" + (f"[tuning]\n{tuning}\n" if tuning else "")
                 + '[objective]\ncombine = "latency"\n')
    return p


def _cli(capsys: pytest.CaptureFixture[str], tree: Path, tmp: Path, *argv: str,
         state: Path | None = None, run: Path | None = None) -> tuple[int, str, str]:
    rc = main(["--host-root", str(tree), "--state-dir", str(state or tmp / "st"),
               "--run-dir", str(run or tmp / "run"), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _errors(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("polltuned: error[")]


PY = json.dumps(sys.executable)


@pytest.mark.parametrize("probe, why", [
    ('kind = "command"\nargv = ["/nonexistent/polltuned-probe"]\nregex = \'p99=(?P<p99>\\d+)\'', "could not"),
    ('kind = "command"\nargv = [""]\nregex = \'p99=(?P<p99>\\d+)\'', ""),
    (f'kind = "command"\nargv = [{PY}, "-c", "print(1)"]\nregex = \'p99=(?P<p99>\\d+)\'', ""),
    ('kind = "sim"\nscenario = "/nonexistent/scenario.py"', "no such file"),
])
def test_check_fails_when_its_probe_window_fails(tree: Path, tmp_path: Path, probe: str, why: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Item 6: `check POLICY` said ready (exit 0) although its probe window failed."""
    pol = _policy(tmp_path, probe)
    rc, out, err = _cli(capsys, tree, tmp_path, "check", str(pol), "--probe-window", "0.2")
    assert rc == int(ExitCode.PROBE), (out, err)
    assert "is ready" not in out
    (line,) = _errors(err)
    assert "error[probe-failed]" in line and "probe window failed" in line and why in line


@pytest.mark.parametrize("text, what", [
    ("a = " + "[" * 2000 + "]" * 2000, "nested too deeply"),
    ('name = "t"\n[knobs."net.core.busy_poll"]\nmin = 0\nmax = 100\n[probe]\nkind = "command"\nargv = ["x"]\n'
     "regex = '(unclosed'\n", "not a valid regular expression"),
    ('name = "t"\n[knobs."net.core.busy_poll"]\nmin = 0\nmax = 100\n[probe]\nkind = "sim"\nscenario = "gro_batch"\n'
     "[tuning]\nsettle_s = 1e300\n", "settle_s"),
    ('name = "t"\n[knobs."net.core.busy_poll"]\nmin = 0\nmax = 100\n[probe]\nkind = "sim"\nscenario = "gro_batch"\n'
     "[tuning]\nwindow_s = 1e308\n", "window_s"),
    ('name = "t"\n[knobs."net.core.busy_poll"]\nmin = 0\nmax = 100\n[probe]\nkind = "sim"\nscenario = "gro_batch"\n'
     "[tuning]\nbudget = true\n", "budget"),
])
def test_bad_policies_are_policy_invalid_not_internal(tree: Path, tmp_path: Path, text: str, what: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Item 7/8: RecursionError, a regex that crashed `run`, OverflowError / "interval inf s", and
    `budget = true` taken as 1: each is one policy-invalid line (exit 2) for check and run."""
    pol = tmp_path / "bad.toml"
    pol.write_text(text)
    for argv in (["check", str(pol), "--no-probe"], ["run", "--policy", str(pol), "--max-rounds", "1"]):
        rc, _, err = _cli(capsys, tree, tmp_path, *argv)
        assert rc == int(ExitCode.USAGE), (argv, err)
        lines = _errors(err)
        assert lines and all("error[policy-invalid]" in ln for ln in lines) and what in err, err
        assert "internal" not in err


@pytest.mark.parametrize("argv", [
    ["run", "--simulate", "gro_batch", "--sim-speed", "nan"],
    ["run", "--simulate", "gro_batch", "--sim-speed", "inf"],
    ["check", "balanced", "--probe-window", "nan"],
    ["check", "balanced", "--probe-window", "-1"],
    ["check", "balanced", "--probe-window", "1e308"],
])
def test_non_finite_cli_numbers_are_usage_errors(tree: Path, tmp_path: Path, argv: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _cli(capsys, tree, tmp_path, *argv)
    assert rc == int(ExitCode.USAGE) and len(_errors(err)) == 1 and "error[usage]" in err


def test_state_and_run_dir_that_are_files(tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 8: --state-dir on a file was os-error; --run-dir on a file let apply succeed and status fail."""
    f = tmp_path / "afile"
    f.write_text("x\n")
    before = tree_values(tree)
    rc, _, err = _cli(capsys, tree, tmp_path, "rollback", state=f)
    assert rc == int(ExitCode.USAGE) and "--state-dir" in err and "not a directory" in err
    rc, _, err = _cli(capsys, tree, tmp_path, "apply", "net.core.busy_poll=50", run=f)
    assert rc == int(ExitCode.USAGE) and "--run-dir" in err
    assert tree_values(tree) == before


def test_policy_unreadable_by_the_user_is_permission(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Item 8: a policy the user may not read gave policy-invalid (2), not permission (5)."""
    pol = _policy(tmp_path, 'kind = "sim"\nscenario = "gro_batch"')
    real = Path.read_text

    def denied(self: Path, *a: object, **kw: object) -> str:
        if self == pol:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", denied)
    rc, _, err = _cli(capsys, tree, tmp_path, "check", str(pol), "--no-probe")
    assert rc == int(ExitCode.PERMISSION) and "error[permission]" in err


def test_status_after_a_crash_does_not_say_replaying() -> None:
    """Item 8: after a crash, status said "ended in phase RECOVER — replaying the journal"."""
    text = render_status({"policy": "p", "phase": "RECOVER", "message": "replaying the journal"},
                         running=False, dirty=True)
    assert "replaying" not in text and "did not stop normally" in text and "RECOVER" in text
    text = render_status({"policy": "p", "phase": "STOPPED", "message": "stopped; host restored"},
                         running=False, dirty=False)
    assert "ended in phase STOPPED" in text


@pytest.fixture
def ro_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "polltuned-test", str(mnt)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_read_only_state_dir_rollback_restores_and_says_so(tree: Path, tmp_path: Path, ro_tmpfs: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Item 7: a read-only state dir made rollback fail with os-error (exit 1); now every knob is
    restored and the command says the journal could not record it (state-not-writable, exit 7)."""
    st = ro_tmpfs / "state"
    originals = tree_values(tree)
    rc, _, err = _cli(capsys, tree, tmp_path, "apply", "net.core.busy_poll=50", "net.core.busy_read=25", state=st)
    assert rc == 0, err
    r = subprocess.run(["mount", "-o", "remount,ro", str(ro_tmpfs)], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot remount read-only: {r.stderr.strip()}")
    try:
        rc, out, err = _cli(capsys, tree, tmp_path, "rollback", state=st)
        assert tree_values(tree) == originals, (out, err)
        assert rc == int(ExitCode.JOURNAL) and "error[state-not-writable]" in err and "internal" not in err
        rc, _, err = _cli(capsys, tree, tmp_path, "apply", "net.core.busy_poll=5", state=st)
        assert rc == int(ExitCode.JOURNAL) and "state-not-writable" in err
        assert tree_values(tree) == originals
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(ro_tmpfs)], check=False)
    rc, _, _ = _cli(capsys, tree, tmp_path, "rollback", state=st)
    assert rc == 0 and tree_values(tree) == originals

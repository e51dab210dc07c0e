"""Bad input gets one line: odd CLI values, non-finite numbers, non-UTF-8 policies, a non-root user.
Each case: exactly one ``polltuned: error[<code>]`` line (plus at most one hint line) on stderr,
the named exit code, no traceback, and the fake tree (and the journal) untouched."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from polltuned.cli.main import main
from polltuned.errors import ExitCode
from tests.test_knobs_faketree import make_tree, tree_values

REPO = Path(__file__).resolve().parents[1]


def assert_one_error(err: str, code: str) -> str:
    """The stderr of a failed command: one error line of ``code``, at most one hint line."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    errs = [ln for ln in lines if ln.startswith("polltuned: error[")]
    hints = [ln for ln in lines if ln.startswith("  hint: ")]
    assert len(errs) == 1 and len(hints) <= 1 and len(lines) == len(errs) + len(hints), err
    assert errs[0].startswith(f"polltuned: error[{code}]: "), err
    return errs[0]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "root")


# -- CLI values ----------------------------------------------------------------------------------

ODD_VALUES = [
    ("net.core.busy_poll=²", "knob-value", "'²' is not an integer"),
    ("net.core.busy_poll=٣", "knob-value", "'٣' is not an integer"),      # Arabic-Indic three
    ("net.core.busy_poll=５", "knob-value", "is not an integer"),          # fullwidth five
    ("net.core.busy_poll=", "usage", "expected KEY=VALUE"),
    ("net.core.busy_poll=  ", "usage", "expected KEY=VALUE"),
    ("net.core.busy_poll=-1", "knob-value", "-1 is outside 0..2147483647"),
    ("net.core.busy_poll=99999999999", "knob-value", "99999999999 is outside"),
    ("net.core.busy_poll=" + "9" * 5000, "knob-value", "(5000 digits) is outside"),  # beyond int()'s limit
    ("net.core.busy_poll=1e3", "knob-value", "'1e3' is not an integer"),
    ("net.core.busy_poll=inf", "knob-value", "'inf' is not an integer"),
    ("net.core.busy_poll=nan", "knob-value", "'nan' is not an integer"),
    ("net.core.busy_poll=0x10", "knob-value", "'0x10' is not an integer"),
    ("net.core.busy_poll=5\n6", "knob-value", "'5\\n6' is not an integer"),
    ("net.core.busy_poll", "usage", "expected KEY=VALUE"),
    ("=50", "usage", "expected KEY=VALUE"),
    ("nét.core.busy_poll=5", "knob-unknown", "unknown sysctl"),
    ("net.core.busy_poll\x1b[2J=5", "knob-unknown", "\\x1b[2J"),          # a terminal escape is shown, not run
    ("eth0:irq_affinity=²", "knob-value", "is not one of"),
    ("eth9:gro_flush_timeout=5", "knob-unsupported", "no device eth9"),
]


@pytest.mark.parametrize("dry", [False, True], ids=["apply", "dry-run"])
@pytest.mark.parametrize("arg,code,text", ODD_VALUES, ids=[repr(a[0][:30]) for a in ODD_VALUES])
def test_odd_apply_values_one_line(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   arg: str, code: str, text: str, dry: bool) -> None:
    before = tree_values(root)
    state = tmp_path / "st"
    rc, out, err = run(capsys, "--host-root", str(root), "--state-dir", str(state), "apply",
                       *(["--dry-run"] if dry else []), "net.core.busy_read=5", arg)
    line = assert_one_error(err, code)
    assert text in line and "\n" not in line and "\x1b" not in line
    assert rc == {"usage": 2, "knob-value": 2, "knob-unknown": 2, "knob-unsupported": 4}[code]
    assert out == "" and tree_values(root) == before
    assert not state.exists()  # validation happens before the journal is even opened


BAD_OPTIONS = [
    ("top", "--interval", ["inf", "nan", "-1", "0", "²", "1e999", "", "3601"]),
    ("top", "--count", ["-1", "٣", "9" * 40, "1.5"]),
    ("sim", "--trials", ["0", "inf", "²", "1000000000000", "-3"]),
    ("sim", "--seed", ["-1", str(2**40), "٣"]),
    ("bench", "--budget", ["2", "²", "nan"]),
    ("bench", "--window", ["inf", "0", "-0.5", "nan"]),
    ("bench", "--rounds", ["0", "1e3"]),
    ("run", "--max-rounds", ["0", "-5", "²", "inf"]),
    ("run", "--log-level", ["verbose", ""]),
    ("sim", "--optimiser", ["bayes"]),
]


@pytest.mark.parametrize("cmd,opt,values", BAD_OPTIONS, ids=[f"{c} {o}" for c, o, _ in BAD_OPTIONS])
def test_odd_option_values_one_line(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    cmd: str, opt: str, values: list[str]) -> None:
    for v in values:
        rc, _, err = run(capsys, "--host-root", str(root), "--state-dir", str(tmp_path / "st"), cmd, opt, v)
        line = assert_one_error(err, "usage")
        assert rc == 2 and f"argument {opt}" in line, (v, err)
    assert not (tmp_path / "st").exists()


@pytest.mark.parametrize("argv,text", [
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["status", "--frob"], "unrecognized arguments: --frob"),
    (["apply"], "the following arguments are required: KEY=VALUE"),
    (["--state-dir"], "argument --state-dir: expected one argument"),
    (["check", "a", "b"], "unrecognized arguments: b"),
    (["man", "--out", "x"], "unrecognized arguments: --out x"),  # no abbreviations
])
def test_argparse_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], text: str) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == "" and text in assert_one_error(err, "usage")
    assert "usage:" not in err


# -- policies and the daemon config --------------------------------------------------------------

POLICY = 'name = "t"\nnic = "eth0"\n[knobs."net.core.busy_poll"]\nmin = 0\nmax = 100\n' \
         '[probe]\nkind = "sim"\nscenario = "cliff"\n'


@pytest.mark.parametrize("extra,text", [
    ("[tuning]\nwindow_s = inf\n", "tuning.window_s: Input should be a finite number (got inf)"),
    ("[tuning]\nsettle_s = inf\n", "tuning.settle_s: Input should be a finite number (got inf)"),
    ("[tuning]\nsettle_s = nan\n", "tuning.settle_s: Input should be a finite number (got nan)"),
    ("[guard]\nmax_regression = 1e400\n", "guard.max_regression: Input should be a finite number (got inf)"),
    ("[hold]\ninterval_s = -inf\n", "hold.interval_s"),
    ("[objective]\ncpu_weight = inf\n", "objective.cpu_weight: Input should be a finite number"),
    ("[tuning]\nseed = 99999999999999999\n", "tuning.seed: Input should be less than or equal to 4294967295"),
])
def test_non_finite_policy_floats_refused(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          extra: str, text: str) -> None:
    p = tmp_path / "p.toml"
    p.write_text(POLICY + extra)
    rc, out, err = run(capsys, "--host-root", str(root), "check", str(p))
    assert rc == 2 and out == ""
    assert text in assert_one_error(err, "policy-invalid")


def test_base_policy_is_valid(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "p.toml"
    p.write_text(POLICY)
    rc, out, err = run(capsys, "--host-root", str(root), "check", str(p))
    assert rc == 0 and err == "" and "is ready on this host" in out


def test_non_utf8_policy_and_config_one_line(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "latin1.toml"
    p.write_bytes(POLICY.replace('"t"', '"caf\xe9"').encode("latin-1"))
    rc, _, err = run(capsys, "--host-root", str(root), "check", str(p))
    assert rc == 2 and f"{p}: not UTF-8 text: byte 0xe9 at offset 11" in assert_one_error(err, "policy-invalid")
    cfg = tmp_path / "polltuned.toml"
    cfg.write_text("status_interval_s = inf\n")
    rc, _, err = run(capsys, "--state-dir", str(tmp_path / "st"), "history", "--config", str(cfg))
    assert rc == 2 and "status_interval_s: Input should be a finite number" in assert_one_error(err, "policy-invalid")
    cfg.write_bytes(b"policy = \"\xff\"\n")
    rc, _, err = run(capsys, "--state-dir", str(tmp_path / "st"), "history", "--config", str(cfg))
    assert rc == 2 and "not UTF-8 text: byte 0xff" in assert_one_error(err, "policy-invalid")


def test_non_utf8_policy_in_a_real_process(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_bytes(b'name = "\xff\xfe"\n')
    r = subprocess.run([sys.executable, "-m", "polltuned", "check", str(p)], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert "not UTF-8 text" in assert_one_error(r.stderr, "policy-invalid")


# -- permissions ---------------------------------------------------------------------------------

def test_unreadable_journal_simulated(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Without root to drop: the state files raise EACCES -> one permission line, exit 5."""
    state = tmp_path / "st"
    g = ["--host-root", str(root), "--state-dir", str(state), "--run-dir", str(tmp_path / "run")]
    assert run(capsys, *g, "apply", "net.core.busy_poll=50")[0] == 0
    real = Path.read_bytes

    def denied(self: Path) -> bytes:
        if self.parent == state:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", denied)
    for cmd in (["status"], ["verify"], ["rollback"], ["rollback", "--if-dirty"], ["apply", "--dry-run",
                                                                                    "net.core.busy_poll=5"]):
        rc, _, err = run(capsys, *g, *cmd)
        line = assert_one_error(err, "permission")
        assert rc == 5 and str(state) in line and "Permission denied" in line, (cmd, err)
    assert (root / "proc/sys/net/core/busy_poll").read_text() == "50\n"


def _nobody() -> int | None:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return None


@pytest.fixture
def world_readable_tree() -> Iterator[Path]:
    """A fake tree a non-root user can read (pytest's tmp_path is 0700), with a root-owned state
    dir (0700) holding a journal and a run dir (0750) holding the daemon lock, as installed."""
    d = Path(tempfile.mkdtemp(prefix="ptk-nobody-", dir="/tmp"))
    try:
        os.chmod(d, 0o755)
        make_tree(d / "root")
        for p in (d / "root").rglob("*"):
            os.chmod(p, 0o755 if p.is_dir() else (p.stat().st_mode | 0o444))
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _as_nobody() -> list[str] | None:
    """A launcher that runs the interpreter as nobody with no capabilities (setpriv(1)), or None."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or _nobody() is None or setpriv is None:
        return None
    cmd = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    probe = subprocess.run([*cmd, sys.executable, "-c", "import os; print(os.geteuid())"], capture_output=True,
                           text=True, cwd="/", timeout=60)
    return cmd if probe.returncode == 0 and probe.stdout.strip() == str(_nobody()) else None


@pytest.mark.skipif(_as_nobody() is None, reason="needs root, a nobody user and setpriv(1) to run the CLI as nobody")
def test_cli_as_nobody_one_permission_line(world_readable_tree: Path) -> None:
    d = world_readable_tree
    g = ["--host-root", str(d / "root"), "--state-dir", str(d / "st"), "--run-dir", str(d / "run")]
    assert main([*g, "apply", "net.core.busy_poll=50"]) == 0
    os.chmod(d / "st", 0o700)
    (d / "run").mkdir(mode=0o750)
    (d / "run" / "polltuned.lock").write_text("")
    os.chmod(d / "run" / "polltuned.lock", 0o640)
    before = tree_values(d / "root")
    journal = (d / "st" / "journal.jsonl").read_bytes()
    launcher = _as_nobody()
    assert launcher is not None
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": "/"}
    cases = [(["status"], "polltuned.lock"), (["status", "--json"], "polltuned.lock"),
             (["verify"], "journal"), (["rollback"], "journal"), (["rollback", "--if-dirty"], "journal"),
             (["apply", "net.core.busy_poll=5"], "busy_poll"), (["apply", "--dry-run", "net.core.busy_poll=5"],
                                                                "busy_poll"),
             (["history", "--policy", "sim-default"], "st")]
    for cmd, what in cases:
        r = subprocess.run([*launcher, sys.executable, "-m", "polltuned", *g, *cmd], capture_output=True,
                           text=True, cwd=d, env=env, timeout=60)
        line = assert_one_error(r.stderr, "permission")
        assert r.returncode == int(ExitCode.PERMISSION), (cmd, r.stderr)
        assert what in line and ("Permission denied" in line or "not writable" in line), (cmd, line)
    assert tree_values(d / "root") == before
    assert (d / "st" / "journal.jsonl").read_bytes() == journal
    assert main([*g, "rollback"]) == 0


# -- the last line of defence --------------------------------------------------------------------

def test_unexpected_exception_is_one_line_unless_debug(capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import polltuned.cli.verify as verify

    def boom(args: object) -> int:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(verify, "run", boom)
    rc, _, err = run(capsys, "verify")
    assert rc == 1 and "unexpected RuntimeError: boom\\nsecond line" in assert_one_error(err, "internal")
    with pytest.raises(RuntimeError):
        main(["--debug", "verify"])


def test_host_root_must_be_a_proc_sys_tree(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped --host-root must not make every knob look vanished: rollback would journal them
    "gone" and forget their originals."""
    state = tmp_path / "st"
    assert run(capsys, "--host-root", str(root), "--state-dir", str(state), "apply", "net.core.busy_poll=50")[0] == 0
    journal = (state / "journal.jsonl").read_bytes()
    (tmp_path / "empty").mkdir()
    for bad, text in ((tmp_path / "nope", "no such directory"), (tmp_path / "empty", "neither proc/ nor sys/")):
        for cmd in (["rollback"], ["verify"], ["status"], ["check"], ["apply", "net.core.busy_poll=1"],
                    ["top", "--once"]):
            rc, _, err = run(capsys, "--host-root", str(bad), "--state-dir", str(state), "--run-dir",
                             str(tmp_path / "run"), *cmd)
            assert rc == 2 and text in assert_one_error(err, "usage"), (cmd, err)
    assert (state / "journal.jsonl").read_bytes() == journal
    assert run(capsys, "--host-root", str(root), "--state-dir", str(state), "rollback")[0] == 0
    assert (root / "proc/sys/net/core/busy_poll").read_text() == "0\n"

"""Issue 16, defect 3: root runs nothing a non-root user can write. As root, a policy, config,
include or scenario file that is group/other-writable, not owned by root, or below a directory that
is, is refused (exit 5, one line naming file, owner and mode) before anything in it runs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from polltuned.cli.main import main
from polltuned.errors import ExitCode
from polltuned.trust import UntrustedFile, require_trusted, untrusted_reason
from tests.test_knobs_faketree import make_tree

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the trust checks apply to root only")
NOBODY = 65534


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "root")


def _marker_policy(d: Path, marker: Path, name: str = "p.toml") -> Path:
    argv = json.dumps([sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')\nprint('p99=1')"])
    p = d / name
    p.write_text('name = "t"\n[knobs."net.core.busy_poll"]\nmin = 0\nmax = 100\n'
                 f"[probe]\nkind = \"command\"\nargv = {argv}\nregex = 'p99=(?P<p99>[\\d.]+)'\n")
    return p


def _cli(capsys: pytest.CaptureFixture[str], tree: Path, tmp: Path, *argv: str) -> tuple[int, str, str]:
    rc = main(["--host-root", str(tree), "--state-dir", str(tmp / "st"), "--run-dir", str(tmp / "run"), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error(err: str) -> str:
    (line,) = [ln for ln in err.splitlines() if ln.startswith("polltuned: error[")]
    return line


def test_untrusted_reason_rules(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o755)
    f = d / "f.toml"
    f.write_text("x = 1\n")
    os.chmod(f, 0o644)
    stat = os.stat
    assert untrusted_reason(f, euid=0, stat=stat) is None or os.stat(f).st_uid != 0
    assert untrusted_reason(f, euid=1000) is None  # not root: nothing to protect
    os.chmod(f, 0o666)
    if os.geteuid() == 0:
        why = untrusted_reason(f, euid=0)
        assert why is not None and "mode 0666" in why and "writable by group and other" in why
        os.chmod(f, 0o644)
        os.chmod(d, 0o777)
        why = untrusted_reason(f, euid=0)
        assert why is not None and str(d) in why and "(directory)" in why and "mode 0777" in why
        os.chmod(d, 0o1777)  # sticky and root-owned (like /tmp): root's entries cannot be replaced
        assert untrusted_reason(f, euid=0) is None
        os.chmod(d, 0o755)
        os.chown(f, NOBODY, NOBODY)
        why = untrusted_reason(f, euid=0)
        assert why is not None and "not owned by root" in why
        with pytest.raises(UntrustedFile) as ei:
            require_trusted(f, "policy", euid=0)
        assert ei.value.exit_code == ExitCode.PERMISSION and ei.value.code == "untrusted-file"
        # a symlink from a trusted place to a file someone else owns is refused too
        link = tmp_path / "link.toml"
        link.symlink_to(f)
        assert untrusted_reason(link, euid=0) is not None


@root_only
@pytest.mark.parametrize("how", ["world-writable", "not-root-owned", "group-writable-dir"])
def test_check_refuses_an_untrusted_policy_and_never_runs_its_probe(tree: Path, tmp_path: Path, how: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "MARKER"
    d = tmp_path / "pol"
    d.mkdir()
    pol = _marker_policy(d, marker)
    if how == "world-writable":
        os.chmod(pol, 0o666)
    elif how == "not-root-owned":
        os.chown(pol, NOBODY, NOBODY)
    else:
        os.chmod(d, 0o775)
    rc, _, err = _cli(capsys, tree, tmp_path, "check", str(pol), "--probe-window", "0.2")
    assert rc == int(ExitCode.PERMISSION), err
    line = _one_error(err)
    assert "error[untrusted-file]" in line and "owned by" in line and "mode 0" in line
    assert not marker.exists()
    # run: refused the same way before anything starts
    rc, _, err = _cli(capsys, tree, tmp_path, "run", "--policy", str(pol), "--max-rounds", "1")
    assert rc == int(ExitCode.PERMISSION) and "untrusted-file" in err
    assert not marker.exists()


@root_only
def test_a_trusted_policy_does_run_its_probe(tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The control: the same policy, root-owned and 0644, runs its probe (so the marker test could fail)."""
    marker = tmp_path / "MARKER"
    d = tmp_path / "pol"
    d.mkdir()
    pol = _marker_policy(d, marker)
    _cli(capsys, tree, tmp_path, "check", str(pol), "--probe-window", "0.2")
    assert marker.exists()


@root_only
def test_untrusted_include_config_and_scenario(tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "pol"
    d.mkdir()
    marker = tmp_path / "MARKER"
    _marker_policy(d, marker, "base.toml")
    inc = d / "base.toml"
    os.chmod(inc, 0o646)
    top = d / "top.toml"
    top.write_text('include = ["base.toml"]\nname = "top"\n')
    rc, _, err = _cli(capsys, tree, tmp_path, "check", str(top), "--probe-window", "0.2")
    assert rc == int(ExitCode.PERMISSION) and "include file" in _one_error(err) and "base.toml" in err
    assert not marker.exists()
    # the daemon's config
    os.chmod(inc, 0o644)
    cfg = d / "polltuned.toml"
    cfg.write_text(f'policy = "{top}"\n')
    os.chown(cfg, NOBODY, NOBODY)
    rc, _, err = _cli(capsys, tree, tmp_path, "run", "--config", str(cfg), "--max-rounds", "1")
    assert rc == int(ExitCode.PERMISSION) and "config file" in _one_error(err)
    assert not marker.exists()
    # a scenario file: imported (executed) only when root-owned and not writable by others
    scen = d / "evil.py"
    scen.write_text(f"open({str(marker)!r}, 'w').write('imported')\n"
                    "def measure(config, rng):\n    return {'p99_us': 1.0, 'cpu_cores': 0.1}\n"
                    "def expected(config):\n    return {'p99_us': 1.0, 'cpu_cores': 0.1}\n")
    os.chmod(scen, 0o666)
    sp = d / "sim.toml"
    sp.write_text(f'name = "s"\n[knobs."net.core.busy_poll"]\nmin = 0\nmax = 100\n'
                  f'[probe]\nkind = "sim"\nscenario = "{scen}"\n')
    rc, _, err = _cli(capsys, tree, tmp_path, "check", str(sp), "--probe-window", "0.2")
    assert rc == int(ExitCode.PERMISSION) and "scenario file" in _one_error(err)
    assert not marker.exists()


def test_policy_path_errors_say_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str], tree: Path) -> None:
    """Issue 16 item 8: a directory or a symlink loop is not "no such policy file"."""
    d = tmp_path / "adir.toml"
    d.mkdir()
    rc, _, err = _cli(capsys, tree, tmp_path, "check", str(d), "--no-probe")
    assert rc == int(ExitCode.USAGE) and "is a directory" in err
    loop = tmp_path / "loop.toml"
    loop.symlink_to(loop.name)
    rc, _, err = _cli(capsys, tree, tmp_path, "check", str(loop), "--no-probe")
    assert rc == int(ExitCode.USAGE) and "symlink loop" in err

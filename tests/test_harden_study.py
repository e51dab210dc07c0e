"""Issue 16, items 9 and 10: the study database and its directory are private (0600/0700) like
the journal, and the study is keyed by what the policy asks for, not by what this host offers
today: a vanished device, a renamed NIC or a dropped knob keeps history, warm start and resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from polltuned.cli.main import main
from polltuned.clock import FakeClock
from polltuned.daemon.wiring import build_daemon
from polltuned.policy.loader import load_policy
from polltuned.probes.sim import make_fake_host_tree
from polltuned.study.base import _applies, fingerprint
from polltuned.study.select import open_local

REPO = Path(__file__).resolve().parents[1]


def _policy_file(tmp: Path, extra_knob: str = "") -> Path:
    p = tmp / "p.toml"
    p.write_text(f'include = ["{REPO}/policies/sim-default.toml"]\nname = "fp"\n'
                 "[tuning]\nbudget = 8\n[confirm]\npairs = 3\n[hold]\ninterval_s = 1\n" + extra_knob)
    return p


def test_study_files_are_private(tmp_path: Path) -> None:
    pol = load_policy(str(_policy_file(tmp_path)))
    st = tmp_path / "state"
    s = open_local(st, pol, clock=FakeClock())
    s.append("session", session="s1", fingerprint=s.fingerprint, policy="fp", seed=0, started=1.0, baseline={})
    s.close()
    d = st / "studies"
    assert d.stat().st_mode & 0o777 == 0o700
    files = [p for p in d.iterdir() if p.is_file()]
    assert files and all(p.stat().st_mode & 0o777 == 0o600 for p in files), [(p, oct(p.stat().st_mode)) for p in files]
    # an older polltuned's 0755/0644 is tightened at the next open
    d.chmod(0o755)
    for p in files:
        p.chmod(0o644)
    open_local(st, pol, clock=FakeClock()).close()
    assert d.stat().st_mode & 0o777 == 0o750 & 0o755
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in d.iterdir() if p.is_file() and p.name.endswith("sqlite3"))


def test_fingerprint_ignores_the_nic_name(tmp_path: Path) -> None:
    pol = load_policy(str(_policy_file(tmp_path)))
    assert pol.nic == "sim0"
    renamed = load_policy(str(_policy_file(tmp_path)), nic="sim1")
    assert set(pol.knobs) != set(renamed.knobs)  # the keys name the device
    assert fingerprint(pol) == fingerprint(renamed)


def test_windows_of_a_changed_knob_set_apply_where_they_can() -> None:
    want = {"a": "0", "b": "8"}
    assert _applies({"a": 5, "b": 16, "gone": 0}, {"a": 0, "b": 8, "gone": 0}, want) == {"a": 5, "b": 16}
    assert _applies({"a": 5, "b": 16, "gone": 3}, {"a": 0, "b": 8, "gone": 0}, want) is None  # it was tuned then
    assert _applies({"a": 5}, {"a": 0}, want) is None  # b not set in that window


def test_history_survives_a_knob_the_host_no_longer_has(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: the daemon ran where one of the policy's knobs is missing (a vanished
    device); `history --policy P` must show its windows, and the study is the policy's study."""
    pol_file = _policy_file(tmp_path)
    pol = load_policy(str(pol_file))
    root = tmp_path / "root"
    missing = "net.core.gro_normal_batch"
    assert missing in pol.knobs
    make_fake_host_tree(root, [k for k in pol.knobs if k != missing])
    d = build_daemon(policy=pol, host_root=str(root), state_dir=str(tmp_path / "state"), clock=FakeClock(),
                     max_rounds=1)
    for _ in d.controller.steps():
        pass
    assert missing in d.dropped_knobs
    assert d.study is not None and d.study.fingerprint == fingerprint(pol)
    common = ["--host-root", str(root), "--state-dir", str(tmp_path / "state")]
    assert main([*common, "history", "--policy", str(pol_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["windows"], "history lost the daemon's windows"
    assert os.path.exists(tmp_path / "state" / "studies")

"""The systemd unit: `systemd-analyze verify` passes and the sandbox exposure stays <= 4.0."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UNIT = REPO / "polltuned.service"

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


def _unit_for_this_checkout(tmp_path: Path) -> Path:
    # verify checks that ExecStart exists: point it at this checkout's entry point
    exe = shutil.which("polltuned") or str(REPO / ".venv" / "bin" / "polltuned")
    p = tmp_path / "polltuned.service"
    p.write_text(UNIT.read_text().replace("/usr/local/bin/polltuned", exe))
    return p


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    r = subprocess.run(["systemd-analyze", "verify", str(_unit_for_this_checkout(tmp_path))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "polltuned.service" not in r.stderr, r.stderr


def test_security_exposure_at_most_4(tmp_path: Path) -> None:
    r = subprocess.run(["systemd-analyze", "security", "--offline=true", str(_unit_for_this_checkout(tmp_path))],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 4.0


def test_unit_contract() -> None:
    text = UNIT.read_text()
    for line in ("Type=notify", "ExecStopPost=/usr/local/bin/polltuned rollback --if-dirty", "Restart=on-failure",
                 "WatchdogSec="):
        assert line in text


def test_group_is_the_same_in_unit_tmpfiles_sysusers_and_installer() -> None:
    """The unit's Group=, the tmpfiles.d owner group and the sysusers.d entry name one group, which
    config/install.sh creates (issue 10: tmpfiles named a group the set-up never created)."""
    unit_groups = re.findall(r"^Group=(\S+)$", UNIT.read_text(), re.M)
    assert unit_groups == ["polltuned"]
    tmpfiles = [ln.split() for ln in (REPO / "config/tmpfiles.d/polltuned.conf").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    assert {(t[1], t[2], t[3], t[4]) for t in tmpfiles} == {("/var/lib/polltuned", "0750", "root", "polltuned"),
                                                         ("/run/polltuned", "0750", "root", "polltuned")}
    sysusers = [ln.split() for ln in (REPO / "config/sysusers.d/polltuned.conf").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    assert sysusers == [["g", "polltuned", "-"]]
    install = (REPO / "config/install.sh").read_text()
    assert "groupadd --system polltuned" in install and "sysusers.d/polltuned.conf" in install
    assert "RuntimeDirectoryMode=0750" in UNIT.read_text() and "StateDirectoryMode=0750" in UNIT.read_text()

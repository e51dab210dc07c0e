"""The status document in every phase of a real (in-process, simulated-world) daemon, and its text form."""

from __future__ import annotations

import json
from pathlib import Path

from polltuned.clock import FakeClock
from polltuned.daemon.render import render_status
from polltuned.daemon.status import daemon_running, read_status, write_status
from polltuned.daemon.statusdoc import build_status
from polltuned.daemon.wiring import Daemon, build_daemon
from polltuned.policy.loader import load_policy
from polltuned.probes.sim import make_fake_host_tree

REPO = Path(__file__).resolve().parents[1]


def _sim_daemon(tmp_path: Path, name: str, budget: int) -> tuple[Path, Path, Daemon]:
    """(policy file, fake host root, daemon) for a short simulated run, one tuning round."""
    pol_file = tmp_path / "p.toml"
    pol_file.write_text(f'include = ["{REPO}/policies/sim-default.toml"]\nname = "{name}"\n'
                        f"[tuning]\nbudget = {budget}\n[confirm]\npairs = 3\n[hold]\ninterval_s = 1\n")
    pol = load_policy(str(pol_file))
    root = tmp_path / "root"
    make_fake_host_tree(root, pol.knobs)
    d = build_daemon(policy=pol, host_root=str(root), state_dir=str(tmp_path / "state"), clock=FakeClock(),
                     max_rounds=1)
    return pol_file, root, d


def test_status_in_every_phase(tmp_path: Path) -> None:
    _, _, d = _sim_daemon(tmp_path, "st", 10)
    pol = d.policy
    seen: dict[str, dict[str, object]] = {}
    for phase in d.controller.steps():
        doc = build_status(d, d.controller)
        json.dumps(doc)  # serialisable in every phase
        assert doc["phase"] == phase == d.controller.phase
        assert doc["policy"] == "st"
        assert {k["key"] for k in doc["knobs"]} == set(pol.knobs)  # type: ignore[union-attr]
        render_status(doc, running=True, dirty=None)
        seen.setdefault(phase, doc)
    for p in ("RECOVER", "BASELINE", "PROPOSE", "APPLY", "MEASURE", "SCORE", "CONFIRM", "ROLLBACK", "STOPPED"):
        assert p in seen, f"phase {p} never published (saw {sorted(seen)})"
    # while tuning, originals are the fake tree's defaults and owners are polltuned once touched
    mid = seen["CONFIRM"]
    rows = {k["key"]: k for k in mid["knobs"]}  # type: ignore[union-attr]
    assert rows["net.core.busy_read"]["original"] == 0
    assert rows["net.core.busy_read"]["owner"].startswith("polltuned")
    final = seen["STOPPED"]
    res = final["result"]
    assert isinstance(res, dict)
    assert res["confirmation"]["verdict"] in ("significant: deployed", "not deployed: baseline kept")
    ci = res["confirmation"]["ci"]
    assert ci[0] is None or ci[0] <= res["confirmation"]["gain"] <= (ci[1] if ci[1] is not None else 1e9)
    # after ROLLBACK the live values equal the originals again
    assert all(k["current"] == k["original"] for k in final["knobs"])  # type: ignore[union-attr]


def test_status_file_roundtrip_and_not_running(tmp_path: Path) -> None:
    write_status(tmp_path, {"phase": "HOLD", "policy": "x", "knobs": []})
    doc = read_status(tmp_path)
    assert doc is not None and doc["v"] == 1 and doc["phase"] == "HOLD"
    assert not daemon_running(tmp_path)
    text = render_status(doc, running=False, dirty=True)
    assert "not running" in text and "DIRTY" in text and "polltuned rollback" in text
    assert "clean" in render_status(doc, running=False, dirty=False)


def test_history_and_report_from_the_study(tmp_path: Path, capsys: object) -> None:
    from polltuned.cli.main import main

    pol_file, root, d = _sim_daemon(tmp_path, "hist", 8)
    for _ in d.controller.steps():
        pass
    common = ["--host-root", str(root), "--state-dir", str(tmp_path / "state")]
    assert main([*common, "history", "--policy", str(pol_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    phases = {w["phase"] for w in out["windows"]}
    assert out["policy"] == "hist" and "reference" in phases and "trial" in phases
    assert all(isinstance(w["config"], dict) for w in out["windows"])
    png = tmp_path / "r.png"
    assert main([*common, "report", "--policy", str(pol_file), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stopped_daemon_with_unreadable_journal_is_not_called_clean() -> None:
    """A member of group polltuned cannot read the root-only journal: unknown, not 'clean'."""
    text = render_status({}, running=False, dirty=None)
    assert "unknown" in text and "clean" not in text and "DIRTY" not in text

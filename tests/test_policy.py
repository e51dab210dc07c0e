"""Policy schema, loader (includes, one line per problem) and the shipped policies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from polltuned.errors import PolicyError
from polltuned.policy.loader import load_policy

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.stem for p in (REPO / "policies").glob("*.toml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_policies_load_and_resolve_nic(name: str) -> None:
    pol = load_policy(name, nic="test0")  # the bench policy leaves nic to its world
    assert pol.name == name
    assert not any("{nic}" in k for k in pol.knobs)


def test_required_workload_policies_are_shipped() -> None:
    for name in ("latency-critical", "throughput", "balanced", "virt-host", "colocated"):
        assert name in SHIPPED


def test_nic_override(tmp_path: Path) -> None:
    pol = load_policy("latency-critical", nic="ens5")
    assert "ens5:gro_flush_timeout" in pol.knobs
    dep = pol.knobs["ens5:napi:irq-suspend-timeout"].requires_nonzero
    assert dep == ["ens5:napi_defer_hard_irqs", "ens5:gro_flush_timeout"]


def _write(tmp: Path, text: str, name: str = "p.toml") -> Path:
    p = tmp / name
    p.write_text(text)
    return p


BAD = """
name = "bad"
[probe]
kind = "sockperf"
port = 70000
[tuning]
budget = 0
speed = 3
[knobs."net.core.busy_poll"]
min = 50
max = 10
"""


def test_every_problem_one_line_with_file_field_and_value(tmp_path: Path) -> None:
    p = _write(tmp_path, BAD)
    with pytest.raises(PolicyError) as ei:
        load_policy(str(p))
    probs = ei.value.problems
    assert len(probs) == 4, probs
    joined = "\n".join(probs)
    assert all(line.startswith(f"{p}: ") for line in probs)
    assert "probe.port" in joined and "(got 70000)" in joined
    assert "tuning.budget" in joined and "(got 0)" in joined
    assert "tuning.speed: unknown field" in joined
    assert "knobs.net.core.busy_poll: max must be >= min (got max=10, min=50)" in joined


def test_cli_check_bad_policy_exit_2_no_traceback(tmp_path: Path) -> None:
    p = _write(tmp_path, BAD)
    r = subprocess.run([sys.executable, "-m", "polltuned", "check", str(p)], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("polltuned: error[policy-invalid]")]
    assert len(lines) == 4, r.stderr


def test_includes_merge_and_cycles(tmp_path: Path) -> None:
    _write(tmp_path, 'name = "base"\n[probe]\nkind = "sim"\nscenario = "x"\n'
                     '[knobs."net.core.busy_poll"]\nmin = 0\nmax = 100\n[tuning]\nbudget = 12\n', "base.toml")
    child = _write(tmp_path, 'include = ["base.toml"]\nname = "child"\n[tuning]\nwindow_s = 2\n', "child.toml")
    pol = load_policy(str(child))
    assert pol.name == "child" and pol.tuning.budget == 12 and pol.tuning.window_s == 2
    assert "net.core.busy_poll" in pol.knobs
    _write(tmp_path, 'include = ["b.toml"]\n', "a.toml")
    _write(tmp_path, 'include = ["a.toml"]\n', "b.toml")
    with pytest.raises(PolicyError, match="cycle"):
        load_policy(str(tmp_path / "a.toml"))


def test_knob_spec_invariants(tmp_path: Path) -> None:
    base = 'name = "x"\n[probe]\nkind = "sim"\nscenario = "s"\n'
    cases = {
        '[knobs."net.core.busy_poll"]\nmin = 0\nmax = 10\nscale = "log"\n': "log scale needs min > 0 or zero_is_off",
        '[knobs."net.core.busy_poll"]\nmin = 0\nmax = 10\nseeds = [20]\n': "seed 20 outside [0, 10]",
        '[knobs."kernel.timer_migration"]\ntype = "categorical"\nvalues = []\n': "non-empty 'values'",
        '[knobs."net.core.busy_poll"]\nmin = 0\nmax = 10\nrequires_nonzero = ["b"]\n':
            "'b' is not a knob of this policy",
    }
    for body, msg in cases.items():
        p = _write(tmp_path, base + body)
        with pytest.raises(PolicyError) as ei:
            load_policy(str(p))
        assert msg in str(ei.value), (body, ei.value.problems)

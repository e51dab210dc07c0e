"""CLI: check [--json] [POLICY], apply, verify, rollback [--if-dirty] — on a fake tree, and
`check --json` on this VM compared with the kernel files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from polltuned.cli.main import main
from polltuned.host.fs import FsHost
from tests.test_knobs_faketree import make_tree


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "root")


def test_apply_verify_rollback_cycle(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = ["--host-root", str(root), "--state-dir", str(tmp_path / "st")]
    rc, out, _ = run(capsys, *g, "apply", "net.core.busy_poll=50", "eth0:gro_flush_timeout=20000")
    assert rc == 0 and "net.core.busy_poll: 0 -> 50" in out and "eth0:gro_flush_timeout: 0 -> 20000" in out
    (root / "sys/class/net/eth0/gro_flush_timeout").write_text("1000\n")  # the admin
    rc, out, _ = run(capsys, *g, "verify", "--json")
    rows = {r["key"]: r for r in json.loads(out)}
    assert rows["net.core.busy_poll"]["state"] == "holds"
    assert rows["eth0:gro_flush_timeout"]["state"] == "admin-changed"
    assert rows["eth0:gro_flush_timeout"]["live"] == 1000
    rc, out, _ = run(capsys, *g, "rollback")
    assert rc == 0 and "net.core.busy_poll: restored 0" in out and "eth0:gro_flush_timeout: released" in out
    assert (root / "sys/class/net/eth0/gro_flush_timeout").read_text() == "1000\n"
    assert (root / "proc/sys/net/core/busy_poll").read_text() == "0\n"
    rc, out, _ = run(capsys, *g, "rollback", "--if-dirty")
    assert rc == 0 and out == ""


def test_apply_bounds_error_exit_code(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = ["--host-root", str(root), "--state-dir", str(tmp_path / "st")]
    rc, _, err = run(capsys, *g, "apply", "net.core.busy_read=10", "net.core.busy_poll=70000000000")
    assert rc == 2
    assert "polltuned: error[knob-value]: net.core.busy_poll: 70000000000 is outside 0..2147483647" in err
    assert (root / "proc/sys/net/core/busy_read").read_text() == "0\n"
    rc, _, err = run(capsys, *g, "apply", "net.core.busy_read")
    assert rc == 2 and "KEY=VALUE" in err
    rc, _, err = run(capsys, *g, "apply", "eth9:threaded=1")
    assert rc == 4 and "no device eth9" in err


def test_check_json_fake_tree(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--host-root", str(root), "check", "--json")
    assert rc == 0
    rep = json.loads(out)
    rows = {r["key"]: r for r in rep["knobs"]}
    assert rows["net.core.busy_poll"]["value"] == 0 and rows["net.core.busy_poll"]["writable"]
    assert rows["net.core.netdev_budget_usecs"]["domain"]["min"] == 8000
    assert rows["module:kvm:halt_poll_ns"]["present"] and not rows["module:kvm:halt_poll_ns"]["writable"]
    assert rows["eth0:threaded"]["domain"]["max"] == 1
    assert rows["vhost:affinity"]["reason"].startswith("no vhost workers")
    assert rep["managed_irqs"] == [{"irq": 36, "name": "virtio1-req.0", "reason": rep["managed_irqs"][0]["reason"]}]
    assert rep["vhost"]["busyloop"] == ("vhost busy-loop timeout: owned by the VMM (QEMU -netdev tap,poll-us=N); "
                                        "not a host knob")
    assert not rep["vhost"]["vhost_net_loaded"]


def test_check_detects_tuned_and_irqbalance(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (root / "etc/tuned/network-latency").mkdir(parents=True)
    (root / "etc/tuned/active_profile").write_text("network-latency\n")
    (root / "etc/tuned/network-latency/tuned.conf").write_text(
        "[main]\ninclude=latency-performance\n[sysctl]\nnet.core.busy_read=50\nnet.core.busy_poll=50\n")
    (root / "proc/4242").mkdir(parents=True)
    (root / "proc/4242/comm").write_text("irqbalance\n")
    rc, out, _ = run(capsys, "--host-root", str(root), "check", "--json")
    assert rc == 0
    owners = {o["name"]: o for o in json.loads(out)["owners"]}
    assert owners["tuned"]["knobs"] == ["net.core.busy_poll", "net.core.busy_read"]
    assert "releases" in owners["tuned"]["action"]
    assert owners["irqbalance"]["active"] and "irq_affinity" in owners["irqbalance"]["knobs"][0]


def test_check_policy(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pol = tmp_path / "p.toml"
    pol.write_text('name = "t"\nnic = "eth0"\n'
                   '[knobs."net.core.busy_poll"]\nmin = 0\nmax = 100\n'
                   '[knobs."{nic}:napi:irq-suspend-timeout"]\nmin = 0\nmax = 1000000\n'
                   '[knobs."net.core.netdev_budget_usecs"]\nmin = 2000\nmax = 16000\n'
                   '[knobs."vhost:affinity"]\ntype = "categorical"\nvalues = ["kernel-default", "pack-app"]\n'
                   '[probe]\nkind = "sim"\nscenario = "cliff"\n')
    rc, out, _ = run(capsys, "--host-root", str(root), "check", str(pol))
    # knobs the host lacks are dropped and a range the kernel refuses is narrowed: the policy still runs
    assert rc == 0, out
    assert "dropped: vhost:affinity: no vhost workers" in out
    assert "narrowed: net.core.netdev_budget_usecs: range 2000..16000 clamped to 8000..16000" in out
    assert "3 of 4 knobs tuned here: net.core.busy_poll, eth0:napi:irq-suspend-timeout, " in out
    assert not [x for x in out.splitlines() if x.startswith("polltuned: check:")]
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "t"\n[knobs]\n[probe]\nkind = "sim"\nscenario = "x"\n')
    rc, _, err = run(capsys, "--host-root", str(root), "check", str(bad))
    assert rc == 2 and "error[policy-invalid]" in err


@pytest.mark.skipif(not os.path.exists("/proc/sys/net/core/busy_poll"), reason="needs the host netns /proc")
def test_check_json_on_this_vm_matches_the_files(capsys: pytest.CaptureFixture[str]) -> None:
    """Read-only: compares `check --json` with the kernel files of this machine."""
    host = FsHost("/")
    rc, out, _ = run(capsys, "check", "--json")
    assert rc == 0
    rep = json.loads(out)
    rows = {r["key"]: r for r in rep["knobs"]}
    for key in ("net.core.busy_read", "net.core.busy_poll", "net.core.gro_normal_batch", "kernel.timer_migration",
                "net.core.netdev_budget", "net.core.netdev_budget_usecs"):
        assert rows[key]["value"] == int(host.read_text("/proc/sys/" + key.replace(".", "/"))), key
    assert rep["vhost"]["vhost_net_loaded"] == host.exists("/sys/module/vhost_net")
    if not host.exists("/sys/module/vhost_net"):
        assert rep["vhost"]["reason"].startswith("vhost_net not loaded")
    managed = sorted(int(n) for n in host.glob("/proc/irq", "[0-9]*")
                     if host.exists(f"/proc/irq/{n}/smp_affinity_list")
                     and not host.is_writable(f"/proc/irq/{n}/smp_affinity_list"))
    assert [m["irq"] for m in rep["managed_irqs"]] == managed
    hp = "/sys/module/haltpoll/parameters/guest_halt_poll_ns"
    row = rows["module:haltpoll:guest_halt_poll_ns"]
    assert row["present"] == host.exists(hp)
    if host.exists(hp):
        assert row["value"] == int(host.read_text(hp)) and row["writable"] == host.is_writable(hp)
    kvm = "/sys/module/kvm/parameters/halt_poll_ns"
    if host.exists(kvm):
        assert rows["module:kvm:halt_poll_ns"]["writable"] == host.is_writable(kvm)
    release = host.read_text("/proc/sys/kernel/osrelease").strip()
    assert rep["kernel"] == release
    if release.startswith("6.18") and rep["napi_set"]["present"]:
        assert rep["napi_set"]["threaded_busy_poll"] is False
        assert rep["napi_set"]["attrs"]["threaded"]["max"] == 1
        for dev in (d for d in host.glob("/sys/class/net", "*") if d != "lo"):
            assert rows[f"{dev}:threaded"]["domain"]["max"] == 1
    for dev in (d for d in host.glob("/sys/class/net", "*") if d != "lo"):
        r = rows[f"{dev}:gro_flush_timeout"]
        assert r["value"] == int(host.read_text(f"/sys/class/net/{dev}/gro_flush_timeout"))

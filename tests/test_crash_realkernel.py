"""Real kernel (root, serialised by the real_kernel lock): apply real values to the real sysctls and
to a veth's sysfs + per-NAPI settings inside a test namespace pair (ptk*), SIGKILL the apply
process, roll back with the CLI, and check every value is back. The host is restored in
``finally`` even when the test fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from polltuned.actuator import PAUSE_ENV
from polltuned.host import netns as nsh
from polltuned.host.fs import FsHost
from polltuned.knobs.registry import KnobRegistry

REPO = Path(__file__).resolve().parents[1]
NS_A, NS_B = "ptkr-a", "ptkr-b"
SYSCTLS = ("net.core.busy_read", "net.core.busy_poll", "net.core.gro_normal_batch", "kernel.timer_migration")
DEV = f"{NS_B}/vb"
ASSIGN = {
    "net.core.busy_read": 50, "net.core.busy_poll": 50, "net.core.gro_normal_batch": 16,
    "kernel.timer_migration": 0,
    f"{DEV}:napi_defer_hard_irqs": 2, f"{DEV}:gro_flush_timeout": 20000,
    f"{DEV}:napi:defer-hard-irqs": 3, f"{DEV}:napi:irq-suspend-timeout": 2_000_000,
}
NAPI_KEYS = (f"{DEV}:napi:defer-hard-irqs", f"{DEV}:napi:gro-flush-timeout", f"{DEV}:napi:irq-suspend-timeout")
SYSFS_KEYS = (f"{DEV}:napi_defer_hard_irqs", f"{DEV}:gro_flush_timeout", f"{DEV}:threaded")


def _sysctl_path(k: str) -> str:
    return "/proc/sys/" + k.replace(".", "/")


@pytest.fixture
def veth_world(real_kernel: None) -> Iterator[None]:
    host = FsHost("/")
    saved = {k: host.read_text(_sysctl_path(k)) for k in SYSCTLS}
    try:
        nsh.del_netns(NS_A)
        nsh.del_netns(NS_B)
        nsh.add_netns(NS_A)
        nsh.add_netns(NS_B)
        nsh.add_veth_pair(NS_A, "va", "198.18.7.1", NS_B, "vb", "198.18.7.2")
        cp = nsh.ethtool(["-K", "vb", "gro", "on"], netns=NS_B)  # GRO on -> veth gets a NAPI
        assert cp.returncode == 0, cp.stderr
        yield
    finally:
        for k, v in saved.items():  # restore the host no matter what
            if host.read_text(_sysctl_path(k)) != v:
                host.write_text(_sysctl_path(k), v)
        nsh.del_netns(NS_A)
        nsh.del_netns(NS_B)


def _cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    e = dict(os.environ)
    e.update(env or {})
    e["PYTHONPATH"] = str(REPO)
    return subprocess.Popen([sys.executable, "-m", "polltuned", *args], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.realkernel
@pytest.mark.slow
@pytest.mark.parametrize("pause", ["intent:8", "write:5", "baseline:3"])
def test_kill9_apply_then_rollback_restores_real_knobs(veth_world: None, tmp_path: Path, pause: str) -> None:
    reg = KnobRegistry(FsHost("/"))
    keys = (*SYSCTLS, *SYSFS_KEYS, *NAPI_KEYS)
    if not reg.get(f"{DEV}:napi:irq-suspend-timeout").availability().present:
        pytest.skip("netdev napi-set unavailable on this kernel")
    original = {k: reg.get(k).read() for k in keys}
    state = tmp_path / "state"
    p = _cli(["--state-dir", str(state), "apply", *[f"{k}={v}" for k, v in ASSIGN.items()]], {PAUSE_ENV: pause})
    _, status = os.waitpid(p.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), p.stderr.read() if p.stderr else status
    if pause.startswith("intent"):  # 7 knobs were written before the kill: the host really changed
        fresh = KnobRegistry(FsHost("/"))
        assert fresh.get("net.core.busy_poll").read() == 50
        assert fresh.get(f"{DEV}:napi:defer-hard-irqs").read() == 3
    os.kill(p.pid, signal.SIGKILL)
    os.waitpid(p.pid, 0)
    p.returncode = -9
    r = _cli(["--state-dir", str(state), "rollback"])
    out, err = r.communicate(timeout=60)
    assert r.returncode == 0, (out, err)
    fresh = KnobRegistry(FsHost("/"))
    assert {k: fresh.get(k).read() for k in keys} == original
    v = _cli(["--state-dir", str(state), "verify"])
    vout, _ = v.communicate(timeout=60)
    assert b"clean" in vout


@pytest.mark.realkernel
def test_real_irq_affinity_strategy_and_rollback(real_kernel: None, tmp_path: Path) -> None:
    """Writes eth0's queue IRQ affinities (spread), rolls back with the CLI; restores in finally."""
    host = FsHost("/")
    reg = KnobRegistry(host, app_cpus=[1])
    knob = reg.get("eth0:irq_affinity") if host.exists("/sys/class/net/eth0") else None
    if knob is None or not knob.availability().writable:
        pytest.skip("no eth0 with settable queue IRQs")
    saved = {irq: host.read_text(f"/proc/irq/{irq}/smp_affinity_list") for irq in knob.settable_irqs()[0]}
    state = tmp_path / "state"
    try:
        p = _cli(["--state-dir", str(state), "apply", "eth0:irq_affinity=spread"])
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert b"->" in out
        lists = [host.read_text(f"/proc/irq/{irq}/smp_affinity_list").strip() for irq in sorted(saved)]
        assert all("-" not in x and "," not in x for x in lists)  # one CPU each
        r = _cli(["--state-dir", str(state), "rollback"])
        assert r.wait(60) == 0
        assert {irq: host.read_text(f"/proc/irq/{irq}/smp_affinity_list") for irq in saved} == saved
    finally:
        for irq, v in saved.items():
            if host.read_text(f"/proc/irq/{irq}/smp_affinity_list") != v:
                host.write_text(f"/proc/irq/{irq}/smp_affinity_list", v)

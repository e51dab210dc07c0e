"""A fake /proc + /sys tree with every kind of knob (shared by the knob/actuator/crash tests),
and tests of the pure parts of the knob layer against it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from polltuned.errors import HostError, KnobValueError, ParseError, UsageError
from polltuned.host.cpus import format_cpu_list, parse_cpu_list
from polltuned.host.fs import TMP_SUFFIX, FsHost
from polltuned.host.netdev_genl import parse_policy_dump
from polltuned.knobs.base import check_value, int_domain
from polltuned.knobs.irq import expand_strategy, is_queue_irq_name
from polltuned.knobs.registry import KnobRegistry
from polltuned.knobs.sysctl import budget_usecs_min, parse_kconfig_hz

ORIGINALS: dict[str, str] = {
    "proc/sys/net/core/busy_read": "0",
    "proc/sys/net/core/busy_poll": "0",
    "proc/sys/net/core/gro_normal_batch": "8",
    "proc/sys/net/core/netdev_budget": "300",
    "proc/sys/net/core/netdev_budget_usecs": "8000",
    "proc/sys/net/core/somaxconn": "4096",
    "proc/sys/kernel/timer_migration": "1",
    "proc/sys/kernel/osrelease": "6.18.44-fake",
    "proc/config": "CONFIG_HZ_250=y\nCONFIG_HZ=250\n",
    "sys/devices/system/cpu/online": "0-1",
    "sys/class/net/eth0/ifindex": "2",
    "sys/class/net/eth0/napi_defer_hard_irqs": "0",
    "sys/class/net/eth0/gro_flush_timeout": "0",
    "sys/class/net/eth0/threaded": "0",
    "sys/class/net/eth0/device/msi_irqs/37": "msix",
    "sys/class/net/eth0/device/msi_irqs/38": "msix",
    "sys/class/net/eth0/device/msi_irqs/39": "msix",
    "sys/kernel/irq/37/actions": "virtio2-config",
    "sys/kernel/irq/38/actions": "virtio2-input.0",
    "sys/kernel/irq/39/actions": "virtio2-output.0",
    "proc/irq/37/smp_affinity_list": "0-1",
    "proc/irq/38/smp_affinity_list": "0-1",
    "proc/irq/39/smp_affinity_list": "0-1",
    "netdev/policy": "defer-hard-irqs 2147483647\ngro-flush-timeout 18446744073709551615\n"
                     "irq-suspend-timeout 18446744073709551615\nthreaded 1\n",
    "netdev/-/eth0/257/defer-hard-irqs": "0",
    "netdev/-/eth0/257/gro-flush-timeout": "0",
    "netdev/-/eth0/257/irq-suspend-timeout": "0",
    "netdev/-/eth0/258/defer-hard-irqs": "0",
    "netdev/-/eth0/258/gro-flush-timeout": "0",
    "netdev/-/eth0/258/irq-suspend-timeout": "0",
    "netns/ptb/sys/class/net/vb/ifindex": "5",
    "netns/ptb/sys/class/net/vb/napi_defer_hard_irqs": "0",
    "netns/ptb/sys/class/net/vb/gro_flush_timeout": "0",
    "netns/ptb/sys/class/net/vb/threaded": "0",
    "netdev/ptb/vb/300/irq-suspend-timeout": "0",
    "netdev/ptb/vb/300/defer-hard-irqs": "0",
    "netdev/ptb/vb/300/gro-flush-timeout": "0",
    "ethtool/-/eth0/coalesce": "rx_coalesce_usecs 0\nrx_max_coalesced_frames 1\nuse_adaptive_rx_coalesce 0",
    "sys/module/haltpoll/parameters/guest_halt_poll_ns": "0",
    "sys/module/kvm/parameters/halt_poll_ns": "200000",
    "proc/irq/36/smp_affinity_list": "0-1",
    "sys/kernel/irq/36/actions": "virtio1-req.0",
}
READ_ONLY = ("sys/module/kvm/parameters/halt_poll_ns", "proc/irq/36/smp_affinity_list")


def make_tree(root: Path) -> Path:
    for rel, text in ORIGINALS.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + ("\n" if not text.endswith("\n") else ""))
    for rel in READ_ONLY:
        os.chmod(root / rel, 0o444)
    return root


def tree_values(root: Path) -> dict[str, str]:
    return {rel: (root / rel).read_text() for rel in ORIGINALS}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "root")


# ---- pure parsers / helpers ------------------------------------------------------------------

def test_cpu_list_roundtrip() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpu_list([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"
    assert parse_cpu_list("") == []
    with pytest.raises(ParseError):
        parse_cpu_list("3-1")


def test_kconfig_hz_and_budget_usecs_min() -> None:
    assert parse_kconfig_hz("# c\nCONFIG_HZ_250=y\nCONFIG_HZ=250\n") == 250
    assert parse_kconfig_hz("CONFIG_NO_HZ=y\n") is None
    assert budget_usecs_min(250) == 8000
    assert budget_usecs_min(1000) == 2000
    assert budget_usecs_min(None) == 20000


def test_check_value_bounds_and_types() -> None:
    d = int_domain(0, 2**31 - 1)
    assert check_value("net.core.busy_poll", d, "50") == 50
    with pytest.raises(KnobValueError, match=r"net.core.busy_poll: 70000000000 is outside 0..2147483647"):
        check_value("net.core.busy_poll", d, 70_000_000_000)
    for bad in (-1, "abc", 1.5, True, None, "5e3"):
        with pytest.raises(KnobValueError):
            check_value("net.core.busy_poll", d, bad)


def test_policy_dump_parser_detects_threaded_busy_poll() -> None:
    ops = {11: 5, 14: 10}
    pol_618 = {10: {2: (4, 0, 4294967295), 5: (4, 0, 2147483647), 6: (17, 0, -1), 7: (17, 0, -1), 8: (4, 0, 1)}}
    caps = parse_policy_dump(ops, pol_618)
    assert caps.present and caps.attrs["threaded"] == (0, 1)
    assert caps.attrs["gro-flush-timeout"] == (0, 2**64 - 1)
    assert caps.attrs["defer-hard-irqs"] == (0, 2**31 - 1)
    pol_later = {10: {**pol_618[10], 8: (4, 0, 2)}}
    assert parse_policy_dump(ops, pol_later).attrs["threaded"] == (0, 2)
    assert not parse_policy_dump({11: 5}, {}).present


def test_irq_strategy_expansion() -> None:
    assert expand_strategy("spread", [39, 38], [0, 1], []) == {38: [0], 39: [1]}
    assert expand_strategy("pack-app", [38, 39], [0, 1, 2, 3], [2, 3]) == {38: [2, 3], 39: [2, 3]}
    assert expand_strategy("avoid-app", [38], [0, 1, 2, 3], [2, 3]) == {38: [0, 1]}
    with pytest.raises(ValueError):
        expand_strategy("avoid-app", [38], [0, 1], [0, 1])
    assert is_queue_irq_name("virtio2-input.0") and is_queue_irq_name("i40e-eth0-TxRx-3")
    assert not is_queue_irq_name("virtio2-config") and not is_queue_irq_name("virtio1-req.0")


# ---- registry against the fake tree ---------------------------------------------------------

def test_registry_builds_every_kind(tree: Path) -> None:
    reg = KnobRegistry(FsHost(tree), app_cpus=[1])
    want = {
        "net.core.busy_poll": 0, "kernel.timer_migration": 1, "eth0:gro_flush_timeout": 0,
        "ptb/vb:napi_defer_hard_irqs": 0, "eth0:napi:defer-hard-irqs": 0, "ptb/vb:napi:irq-suspend-timeout": 0,
        "eth0:irq_affinity": "38:0-1;39:0-1", "eth0:coalesce:rx-frames": 1,
        "module:haltpoll:guest_halt_poll_ns": 0,
    }
    for key, val in want.items():
        k = reg.get(key)
        assert k.availability().present, key
        assert k.read() == val, key
    assert reg.get("net.core.netdev_budget_usecs").domain.lo == 8000
    assert reg.get("net.core.netdev_budget").domain.lo == 1
    assert reg.get("eth0:threaded").domain.hi == 1
    av = reg.get("module:kvm:halt_poll_ns").availability()
    assert av.present and not av.writable
    assert not reg.get("vhost:affinity").availability().present
    for bad in ("net.core.nope", "eth0:bogus", "module:kvm", "a/b/c:threaded"):
        with pytest.raises(UsageError):
            reg.get(bad)


def test_sysfs_snapshot_carries_both_layers(tree: Path) -> None:
    reg = KnobRegistry(FsHost(tree))
    k = reg.get("eth0:gro_flush_timeout")
    assert k.snapshot() == {"sysfs": 0, "napi": {"257": 0, "258": 0}}
    (tree / "netdev/-/eth0/258/gro-flush-timeout").write_text("777\n")
    k.write(5000)
    assert not k.matches({"sysfs": 0, "napi": {"257": 0, "258": 777}})
    k.restore({"sysfs": 0, "napi": {"257": 0, "258": 777}})
    assert (tree / "sys/class/net/eth0/gro_flush_timeout").read_text() == "0\n"
    assert (tree / "netdev/-/eth0/258/gro-flush-timeout").read_text() == "777\n"


def test_init_net_only_reason(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "r")
    (root / "proc/sys/net/core/busy_poll").unlink()
    av = KnobRegistry(FsHost(root)).get("net.core.busy_poll").availability()
    assert not av.present and "init_net" in av.reason


def test_fake_tree_writes_are_atomic_like_the_kernels(tree: Path) -> None:
    """procfs/sysfs stores are atomic; the fake tree's writes too (temporary file renamed over the
    target): a process killed mid-write can never leave an empty or half-written value behind."""
    h = FsHost(tree)
    p = tree / "proc/irq/38/smp_affinity_list"
    p.chmod(0o640)
    before = p.stat().st_ino
    h.write_text("/proc/irq/38/smp_affinity_list", "1\n")
    assert p.read_text() == "1\n" and p.stat().st_ino != before  # replaced, not truncated in place
    assert p.stat().st_mode & 0o777 == 0o640
    assert h.listdir("/proc/irq/38") == ["smp_affinity_list"]  # no temporary file left or listed
    (p.parent / f".smp_affinity_list{TMP_SUFFIX}").write_text("stale from a killed writer")
    assert h.glob("/proc/irq/38", "*") == ["smp_affinity_list"]
    with pytest.raises(HostError) as ei:  # a missing attribute is not created
        h.write_text("/proc/irq/99/smp_affinity_list", "1\n")
    assert ei.value.errno == errno.ENOENT and not (tree / "proc/irq/99").exists()

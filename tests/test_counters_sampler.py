"""Sampler on recorded/generated trees: NIC map, degrade-don't-crash, absent vs disabled."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from polltuned.clock import FakeClock
from polltuned.counters import COLLECTORS, Sampler
from polltuned.counters.nicmap import discover_nic
from polltuned.errors import UsageError
from polltuned.host.fs import FsHost
from polltuned.metrics.window import rates
from tests.fixtures.gen_large_host import NIC, Spec, cached_tree, nic_irqs

VM = Path(__file__).parent / "fixtures" / "vm"
SYN = Path(__file__).parent / "fixtures" / "synthetic"


def test_registry_is_explicit_and_interrupts_opt_in() -> None:
    assert set(COLLECTORS) == {"stat", "softirqs", "interrupts", "irq_percpu", "schedstat", "loadavg",
                               "softnet", "pressure", "links", "procs"}
    assert COLLECTORS["interrupts"].default is False
    assert all(c.default for n, c in COLLECTORS.items() if n != "interrupts")


def test_vm_fixture_nic_map_virtio() -> None:
    host = FsHost(VM / "snap1")
    eth0 = discover_nic(host, "eth0")
    assert [(q.irq, q.queue) for q in eth0.irqs] == [(38, "rx-0"), (39, "tx-0")]
    assert [q.irq for q in eth0.other_irqs] == [37] and eth0.source == "msi_irqs"
    ifb = discover_nic(host, "ifb0")
    assert ifb.irqs == () and ifb.note is not None and "no hardware IRQs" in ifb.note


def test_vm_fixture_sample_and_rates() -> None:
    clock = FakeClock()
    a = Sampler(FsHost(VM / "snap1"), clock=clock, pids=lambda: [1, 999999]).sample()
    clock.advance(1.0)
    b = Sampler(FsHost(VM / "snap2"), clock=clock, pids=lambda: [1, 999999]).sample()
    assert set(a.families) == {"stat", "softirqs", "irq_percpu", "loadavg", "softnet", "pressure", "links",
                               "procs"}
    assert a.unavailable == {"schedstat": "absent on this kernel: /proc/schedstat"}
    assert a.procs is not None and set(a.procs) == {1}          # vanished pid tolerated
    r = rates(a, b)
    # capture_vm.py sent exactly 1000 loopback datagrams between the snapshots
    assert sum(c.net_rx_per_s or 0 for c in r.cpu.values()) == pytest.approx(1000.0)
    assert r.cpu[1].runq_wait_s_per_s is None and "schedstat" in r.unavailable
    assert r.unavailable["pressure.irq"].startswith("absent on this kernel")
    assert r.nic is not None and set(r.nic["eth0"].irqs_per_s) == {"rx-0", "tx-0"}


def test_large_host_nic_map() -> None:
    info = discover_nic(FsHost(cached_tree(Spec())), NIC)
    assert len(info.irqs) == 64 and info.rx_queues == 64
    assert [q.irq for q in info.irqs] == nic_irqs(Spec())[:-1]
    assert info.irqs[5].queue == "combined-5" and len(info.other_irqs) == 1


def _break(tree: Path, rel: str, text: str, tmp: Path) -> Path:
    dst = tmp / "tree"
    shutil.copytree(tree, dst, symlinks=True)
    p = dst / rel
    p.write_text(text)
    return dst


def test_malformed_family_disabled_with_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tree = _break(VM / "snap1", "proc/softirqs", "                CPU0 CPU1\n NET_RX: 1 banana\n", tmp_path)
    s = Sampler(FsHost(tree), clock=FakeClock())
    with caplog.at_level(logging.INFO, logger="polltuned.counters"):
        a = s.sample()
        b = s.sample()
    assert "softirqs" not in a.families and "stat" in a.families
    reason = b.unavailable["softirqs"]
    assert "parse error" in reason and "/proc/softirqs:2" in reason and "banana" in reason
    lines = [r for r in caplog.records if "softirqs" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    # metric reported unavailable, never zero
    clock = FakeClock()
    s2 = Sampler(FsHost(tree), clock=clock)
    x = s2.sample()
    clock.advance(1)
    r = rates(x, s2.sample())
    assert r.cpu[0].net_rx_per_s is None and r.cpu[0].system is not None
    assert "softirqs" in r.unavailable


def test_absent_files_reported_not_zero(tmp_path: Path) -> None:
    dst = tmp_path / "t"
    shutil.copytree(VM / "snap1", dst, symlinks=True)
    (dst / "proc/net/softnet_stat").unlink()
    clock = FakeClock()
    s = Sampler(FsHost(dst), clock=clock)
    a = s.sample()
    clock.advance(1)
    r = rates(a, s.sample())
    assert r.unavailable["softnet"] == "absent on this kernel: /proc/net/softnet_stat"
    assert all(c.time_squeeze_per_s is None for c in r.cpu.values())


def test_schedstat_and_psi_irq_present(tmp_path: Path) -> None:
    trees = []
    for i, name in enumerate(("schedstat_v15.txt", "schedstat_v17.txt")):
        dst = tmp_path / f"t{i}"
        shutil.copytree(VM / f"snap{i + 1}", dst, symlinks=True)
        shutil.copy(SYN / name, dst / "proc/schedstat")
        (dst / "proc/pressure/irq").write_text(f"full avg10=0.00 avg60=0.00 avg300=0.00 total={1000 + i * 250000}\n")
        trees.append(dst)
    clock = FakeClock()
    a = Sampler(FsHost(trees[0]), clock=clock).sample()
    clock.advance(2.0)
    b = Sampler(FsHost(trees[1]), clock=clock).sample()
    r = rates(a, b)
    assert r.cpu[0].runq_wait_s_per_s == pytest.approx(0.25)   # 0.5 s of waiting over 2 s
    assert r.cpu[1].runq_wait_s_per_s == 0.0
    assert r.system.psi_irq_full == pytest.approx(0.125)
    assert "schedstat" not in r.unavailable and "pressure.irq" not in r.unavailable


def test_unknown_family_and_unknown_nic() -> None:
    with pytest.raises(UsageError, match="unknown counter family 'nope'"):
        Sampler(FsHost(VM / "snap1"), clock=FakeClock(), families=["stat", "nope"])
    s = Sampler(FsHost(VM / "snap1"), clock=FakeClock(), nic="eth9")
    with pytest.raises(UsageError, match="no such network interface: eth9"):
        s.sample()


def test_opt_in_interrupts_on_vm_fixture() -> None:
    clock = FakeClock()
    fams = ["stat", "interrupts"]
    a = Sampler(FsHost(VM / "snap1"), clock=clock, families=fams).sample()
    clock.advance(1)
    b = Sampler(FsHost(VM / "snap2"), clock=clock, families=fams).sample()
    r = rates(a, b)
    assert a.interrupts is not None and "38" in a.interrupts.rows
    assert all(c.all_irqs_per_s is not None and c.all_irqs_per_s >= 0 for c in r.cpu.values())
    assert "softirqs" not in r.unavailable       # not requested -> not reported as unavailable


@pytest.mark.parametrize("rel,family,text,needle", [
    ("proc/stat", "stat", "cpu  1 2 3 4\ncpu0 1 2 x 4\n", "/proc/stat:2"),
    ("proc/net/softnet_stat", "softnet", "0000001\n", "/proc/net/softnet_stat:1"),
    ("proc/loadavg", "loadavg", "0.1 0.2\n", "/proc/loadavg:1"),
    ("proc/pressure/cpu", "pressure", "some avg10=x avg60=0 avg300=0 total=1\n", "/proc/pressure/cpu:1"),
    ("sys/kernel/irq/38/per_cpu_count", "irq_percpu", "0,21x3\n", "/sys/kernel/irq/38/per_cpu_count:1"),
    ("proc/schedstat", "schedstat", "version 17\ncpu0 1 2\n", "/proc/schedstat:2"),
    ("sys/devices/pci0000:00/0000:00:03.0/virtio2/net/eth0/statistics/rx_packets", "links", "-5\n",
     "rx_packets:1"),
])
def test_each_family_degrades_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture, rel: str, family: str,
                                    text: str, needle: str) -> None:
    tree = _break(VM / "snap1", rel, text, tmp_path)
    clock = FakeClock()
    s = Sampler(FsHost(tree), clock=clock, pids=lambda: [1])
    with caplog.at_level(logging.WARNING, logger="polltuned.counters"):
        a = s.sample()
        clock.advance(1)
        b = s.sample()
    assert family not in a.families and family not in b.families
    assert needle in b.unavailable[family]
    assert len([r for r in caplog.records if family in r.getMessage()]) == 1
    others = {"stat", "softirqs", "irq_percpu", "loadavg", "softnet", "pressure", "links", "procs"} - {family}
    assert others <= set(b.families)
    r = rates(a, b)
    assert family in r.unavailable


def test_napi_irq_makes_an_unnamed_vector_a_queue_irq() -> None:
    host = FsHost(VM / "snap1")
    seen: list[int] = []

    def napis(ifindex: int) -> list[tuple[int, int | None]]:
        seen.append(ifindex)
        return [(257, 37), (258, None), (259, 38)]   # 37 is "virtio2-config" by name

    info = discover_nic(host, "eth0", napis=napis)
    assert seen == [4]                                 # ifindex read from the tree
    assert [(q.irq, q.queue) for q in info.irqs] == [(37, "napi-257"), (38, "rx-0"), (39, "tx-0")]
    assert info.other_irqs == () and info.source == "msi_irqs+napi"
    assert discover_nic(host, "eth0").source == "msi_irqs"   # fake tree: no netlink by default


def test_vanished_queue_irq_triggers_nic_map_refresh(tmp_path: Path) -> None:
    dst = tmp_path / "t"
    shutil.copytree(VM / "snap1", dst, symlinks=True)
    clock = FakeClock()
    s = Sampler(FsHost(dst), clock=clock, nic="eth0")
    a = s.sample()
    assert a.irq_percpu is not None and set(a.irq_percpu) == {38, 39}
    # "ethtool -L": the TX vector is freed and a new one (40) takes its place
    shutil.rmtree(dst / "sys/kernel/irq/39")
    msi = dst / "sys/devices/pci0000:00/0000:00:03.0/msi_irqs"
    (msi / "39").unlink()
    (msi / "40").write_text("msix\n")
    (dst / "sys/kernel/irq/40").mkdir(exist_ok=True)
    (dst / "sys/kernel/irq/40/actions").write_text("virtio2-output.0\n")
    (dst / "sys/kernel/irq/40/per_cpu_count").write_text("5,6\n")
    clock.advance(1)
    b = s.sample()                        # IRQ 39 missing: its rate is unavailable, map marked stale
    assert b.irq_percpu is not None and set(b.irq_percpu) == {38}
    clock.advance(1)
    c = s.sample()                        # map re-read before this sample
    assert c.irq_percpu is not None and set(c.irq_percpu) == {38, 40}
    assert [(q.irq, q.queue) for q in c.nics["eth0"].irqs] == [(38, "rx-0"), (40, "tx-0")]
    r = rates(b, c)
    assert r.nic is not None and r.nic["eth0"].irqs_per_s["tx-0"] is None   # no previous count: n/a

"""rates(): exact values on the generated large host, 32-bit wrap, reset, hotplug, busy_cores."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest

from polltuned.clock import FakeClock
from polltuned.counters import Sampler, Snapshot
from polltuned.counters.irq_percpu import parse_per_cpu_count
from polltuned.counters.softnet import parse_softnet
from polltuned.counters.stat import parse_stat
from polltuned.host.fs import FsHost
from polltuned.metrics.window import MetricUnavailable, delta32, rates
from tests.fixtures.gen_large_host import NIC, Spec, cached_tree, increments, nic_irqs


@pytest.fixture(scope="module")
def large_rates():  # type: ignore[no-untyped-def]
    spec = Spec()
    t0, t1 = cached_tree(spec), cached_tree(spec, step=2)
    clock = FakeClock()
    a = Sampler(FsHost(t0), clock=clock).sample()
    clock.advance(2.0)
    b = Sampler(FsHost(t1), clock=clock).sample()
    return spec, increments(spec), rates(a, b)


def test_large_host_rates_match_generator(large_rates) -> None:  # type: ignore[no-untyped-def]
    spec, inc, r = large_rates
    assert len(r.cpu) == 256 and r.interval_s == 2.0
    for c in (0, 17, 255):
        cr = r.cpu[c]
        assert cr.net_rx_per_s == inc.softirq[3][c] and cr.net_tx_per_s == inc.softirq[2][c]
        assert cr.system == pytest.approx(inc.stat[c][2] / 100)
        assert cr.softirq == pytest.approx(inc.stat[c][6] / 100)
        assert cr.rx_packets_per_s == inc.softnet[c][0]          # crosses the 32-bit wrap
        assert cr.time_squeeze_per_s == inc.softnet[c][2]
        assert cr.runq_wait_s_per_s == pytest.approx(inc.run_delay_ns[c] / 1e9)
        want_irq = sum(inc.irq[n][c] for n in nic_irqs(spec))
        assert cr.irqs_per_s == want_irq
    nic = r.nic[NIC]
    assert nic.rx_packets_per_s == inc.link["rx_packets"] and nic.rx_drops_per_s == inc.link["rx_dropped"]
    assert nic.irqs_per_s["combined-7"] == sum(inc.irq[nic_irqs(spec)[7]])
    assert r.system.psi_cpu_some == pytest.approx(0.05) and r.system.psi_irq_full == pytest.approx(0.002)
    assert r.unavailable == {}
    busy = r.busy_cores()
    assert busy == pytest.approx(sum((s[2] + s[5] + s[6]) / 100 for s in inc.stat))
    assert r.busy_cores([0], fields=("user",)) == pytest.approx(inc.stat[0][0] / 100)
    js = r.to_json()
    assert js["cpu"]["0"]["net_rx_per_s"] == inc.softirq[3][0] and js["nic"][NIC]["irqs_per_s"]


def test_delta32() -> None:
    assert delta32(5, 9) == 4
    assert delta32(2**32 - 10, 5) == 15          # wrap
    assert delta32(1_000_000_000, 5) is None     # implausible wrap: a reset


def _snap(t: float, cpus: dict[int, int], softnet: dict[int, int] | None = None,
          irq: dict[int, list[int]] | None = None) -> Snapshot:
    """A snapshot built through the real parsers from kernel-format text."""
    stat = "cpu  0 0 0 0 0 0 0 0 0 0\n" + "".join(
        f"cpu{c} 0 0 {v} {100 - v} 0 0 0 0 0 0\n" for c, v in cpus.items())
    fams: dict[str, object] = {"stat": parse_stat(stat)}
    if softnet is not None:
        fams["softnet"] = parse_softnet("".join(
            " ".join(f"{x:08x}" for x in [v, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, c, 0, 0]) + "\n"
            for c, v in softnet.items()))
    if irq is not None:
        fams["irq_percpu"] = {n: parse_per_cpu_count(",".join(map(str, v)) + "\n", "/x", n)
                              for n, v in irq.items()}
    return Snapshot(t=t, families=MappingProxyType(fams), unavailable={})


def test_hotplug_cpu_only_in_one_snapshot_gets_no_rate() -> None:
    a = _snap(0.0, {0: 10, 1: 20}, softnet={0: 5, 1: 5})
    b = _snap(1.0, {0: 30, 2: 50}, softnet={0: 10, 2: 7})
    r = rates(a, b)
    assert set(r.cpu) == {0}
    assert r.cpu[0].rx_packets_per_s == 5
    with pytest.raises(MetricUnavailable, match="cpu1"):
        r.busy_cores([0, 1])


def test_reset_gives_none_not_garbage() -> None:
    a = _snap(0.0, {0: 50}, softnet={0: 1_000_000_000}, irq={40: [100, 7]})
    b = _snap(1.0, {0: 10}, softnet={0: 5}, irq={40: [50, 9]})
    r = rates(a, b)
    assert r.cpu[0].system is None and r.unavailable["stat.cpu0"] == "counter reset"
    assert r.cpu[0].rx_packets_per_s is None
    assert r.cpu[0].irqs_per_s is None           # 100 -> 50 on cpu0 of IRQ 40 is a reset
    with pytest.raises(MetricUnavailable, match="unavailable"):
        r.busy_cores()


def test_irq_wrap_per_cpu() -> None:
    a = _snap(0.0, {0: 1, 1: 1}, irq={40: [2**32 - 5, 10]})
    b = _snap(0.5, {0: 2, 1: 2}, irq={40: [5, 30]})
    r = rates(a, b)
    assert r.cpu[0].irqs_per_s == 20.0 and r.cpu[1].irqs_per_s == 40.0


def test_time_order_and_unknown_field() -> None:
    a = _snap(1.0, {0: 1})
    with pytest.raises(MetricUnavailable, match="time order"):
        rates(a, a)
    r = rates(a, _snap(2.0, {0: 2}))
    with pytest.raises(MetricUnavailable, match="unknown field 'bogus'"):
        r.busy_cores(fields=("bogus",))
    assert r.cpu[0].net_rx_per_s is None and r.procs_cpu_cores is None


def test_vm_fixture_busy_cores_matches_stat(tmp_path: Path) -> None:
    vm = Path(__file__).parent / "fixtures" / "vm"
    clock = FakeClock()
    a = Sampler(FsHost(vm / "snap1"), clock=clock, families=["stat"]).sample()
    clock.advance(1)
    b = Sampler(FsHost(vm / "snap2"), clock=clock, families=["stat"]).sample()
    r = rates(a, b)
    sa, sb = a.stat, b.stat
    assert sa is not None and sb is not None
    for c in r.cpu:
        total = sum(getattr(sb.cpus[c], f) - getattr(sa.cpus[c], f)
                    for f in ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"))
        assert r.cpu[c].system == pytest.approx((sb.cpus[c].system - sa.cpus[c].system) / total)


def test_to_json_matches_cpu_objects_and_nan_is_none() -> None:
    vm = Path(__file__).parent / "fixtures" / "vm"
    clock = FakeClock()
    a = Sampler(FsHost(vm / "snap1"), clock=clock).sample()
    clock.advance(1)
    b = Sampler(FsHost(vm / "snap2"), clock=clock).sample()
    r = rates(a, b)
    js = r.to_json()
    assert set(js["cpu"]) == {"0", "1"}
    for c in r.cpu:
        assert js["cpu"][str(c)] == r.cpu[c].to_json()
    assert js["cpu"]["1"]["runq_wait_s_per_s"] is None and js["cpu"]["1"]["net_rx_per_s"] == 1000.0
    ids, vals = r.cpu_column("net_rx_per_s")
    assert ids == [0, 1] and vals[1] == 1000.0

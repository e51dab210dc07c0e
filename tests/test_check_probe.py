"""`polltuned check POLICY`: what the objective needs, whether the probe can give it by design, one short
probe window; the NIC link-rate stand-in for throughput/drops; dropped knobs in the daemon's status."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from polltuned.cli.main import main
from polltuned.clock import FakeClock
from polltuned.counters.sampler import Sampler
from polltuned.daemon.render import render_status
from polltuned.daemon.statusdoc import build_status
from polltuned.daemon.wiring import build_daemon
from polltuned.errors import KnobUnsupported
from polltuned.host.fs import FsHost
from polltuned.knobs.registry import KnobRegistry
from polltuned.policy.loader import load_policy, policy_from_dict
from polltuned.policy.schema import SimProbe
from polltuned.probes.capabilities import command_statistics, needs
from polltuned.probes.factory import make_probe
from polltuned.probes.linkrate import LinkRateProbe, with_link_rates
from polltuned.records import Window
from tests.fixtures.compat_trees import build_tree

STATS = "sys/class/net/eth0/statistics"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return build_tree(tmp_path / "root", "6.18")


def _policy_file(tmp: Path, probe: str, objective: str = "", nic: str | None = "eth0") -> Path:
    p = tmp / "p.toml"
    p.write_text('name = "t"\n' + (f'nic = "{nic}"\n' if nic else "")
                 + '[knobs."net.core.busy_poll"]\nmin = 0\nmax = 100\n'
                 + f"[probe]\n{probe}\n" + (f"[objective]\n{objective}\n" if objective else ""))
    return p


def _check(capsys: pytest.CaptureFixture[str], tree: Path, pol: Path, *extra: str) -> tuple[int, dict[str, dict]]:
    rc = main(["--host-root", str(tree), "check", str(pol), "--json", *extra])
    doc = json.loads(capsys.readouterr().out)
    return rc, {r["input"]: r for r in doc["probe"]["inputs"]} | {"_doc": doc}


# ---- capabilities by design (pure) ---------------------------------------------------------------

def test_needs_by_design() -> None:
    base = {"name": "t", "knobs": {"net.core.busy_poll": {"min": 0, "max": 10}}}
    tcp = policy_from_dict({**base, "nic": "eth0", "probe": {"kind": "tcp_rtt", "port": 1},
                            "objective": {"combine": "cpu_per_throughput",
                                          "constraints": {"max_drops_increase_per_s": 0}}})
    n = {x.name: x for x in needs(tcp)}
    assert n["p99"].available and n["cpu"].needed and n["cpu"].available
    assert n["throughput"].needed and n["throughput"].available and "NIC eth0" in n["throughput"].source
    assert n["drops"].needed and n["drops"].available
    no_nic = policy_from_dict({**base, "probe": {"kind": "tcp_rtt"}, "objective": {"combine": "cpu_per_throughput"}})
    t = {x.name: x for x in needs(no_nic)}["throughput"]
    assert t.needed and t.available is False and "does not measure throughput" in t.source
    netns = policy_from_dict({**base, "nic": "ns/veth0", "probe": {"kind": "tcp_rtt"},
                              "objective": {"constraints": {"max_drops_increase_per_s": 1}}})
    assert {x.name: x for x in needs(netns)}["drops"].available is False
    sim = policy_from_dict({**base, "probe": {"kind": "sim", "scenario": "x"}, "objective": {"statistic": "p50"}})
    s = {x.name: x for x in needs(sim)}
    assert s["p50"].available is None and s["cpu"].available and s["throughput"].available is None
    prom = policy_from_dict({**base, "probe": {"kind": "prometheus", "url": "http://x", "metric": "m"},
                             "objective": {"statistic": "p90"}})
    pn = {x.name: x for x in needs(prom)}
    assert pn["p90"].available and pn["throughput"].available and pn["throughput"].source == "probe prometheus"
    assert {x.name: x for x in needs(tcp, proc_stat=False)}["cpu"].available is False


def test_command_statistics() -> None:
    from polltuned.policy.schema import CommandProbe

    assert command_statistics(CommandProbe(argv=["x"], regex=r"p99=(?P<p99>\d+) t=(?P<throughput>\d+)")) == {
        "p99", "throughput"}
    assert command_statistics(CommandProbe(argv=["x"], regex=r"lat=(\d+)")) >= {"p99", "p50", "mean"}  # type: ignore[operator]
    assert command_statistics(CommandProbe(argv=["x"], statistic_map={"p50": "$.a"})) == {"p50"}
    with pytest.raises(ValueError, match="not a valid regular expression"):  # issue 16: refused at load
        CommandProbe(argv=["x"], regex=r"(")


# ---- check with a window ---------------------------------------------------------------------------

def test_check_sim_probe_window_reports_every_input(tree: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    pol = _policy_file(tmp_path, 'kind = "sim"\nscenario = "gro_batch"', 'combine = "cpu_per_throughput"')
    rc, rows = _check(capsys, tree, pol)
    assert rc == 0
    assert rows["p99"]["measured"] and "µs" in rows["p99"]["detail"]
    assert rows["cpu"]["measured"] and rows["cpu"]["detail"].endswith("cores")
    assert rows["throughput"]["needed"] and rows["throughput"]["measured"]
    assert rows["throughput"]["detail"].endswith("from the probe")
    assert rows["_doc"]["probe"]["window_s"] == 2.0
    # the fake tree has no cpuidle: check says idle polling is not visible (issue 15.4)
    assert "no POLL state" in rows["_doc"]["idle_poll"] and "not counted" in rows["_doc"]["idle_poll"]


def test_check_says_idle_polling_is_counted_where_cpuidle_shows_it(tree: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    d = tree / "sys/devices/system/cpu/cpu0/cpuidle/state0"
    d.mkdir(parents=True)
    (d / "name").write_text("POLL\n")
    (d / "time").write_text("12\n")
    pol = _policy_file(tmp_path, 'kind = "sim"\nscenario = "gro_batch"')
    main(["--host-root", str(tree), "check", str(pol), "--no-probe"])
    assert "idle polling: counted in CPU (cpuidle POLL state)" in capsys.readouterr().out


def test_check_command_probe_window(tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = json.dumps([sys.executable, "-c", "print('p99=12.5 thr=300')"])
    pol = _policy_file(tmp_path, f'kind = "command"\nargv = {argv}\n'
                                 "regex = 'p99=(?P<p99>[\\d.]+) thr=(?P<throughput>[\\d.]+)'",
                       'combine = "cpu_per_throughput"\n[objective.constraints]\nmax_drops_increase_per_s = 0')
    rc, rows = _check(capsys, tree, pol, "--probe-window", "0.2")
    assert rc == 0
    assert rows["p99"]["detail"].startswith("12.5 µs")
    assert rows["throughput"]["detail"] == "300.0/s from the probe"
    assert rows["cpu"]["measured"]                     # /proc/stat of the tree
    assert rows["drops"]["detail"] == "0.0 drops/s on the NIC"   # the tree's link counters do not move


def test_check_needs_editing_when_the_probe_cannot_give_the_statistic(tree: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    pol = _policy_file(tmp_path, "kind = \"command\"\nargv = [\"true\"]\nregex = 'p50=(?P<p50>\\d+)'")
    rc = main(["--host-root", str(tree), "check", str(pol), "--no-probe"])
    out = capsys.readouterr().out
    assert rc == 2
    (line,) = [x for x in out.splitlines() if x.startswith("polltuned: check: needs editing: ")]
    assert "the objective needs p99 (objective.statistic)" in line and "names no 'p99' (it names p50)" in line
    assert str(pol) in line


def test_check_needs_editing_for_throughput_without_a_source(tree: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    pol = _policy_file(tmp_path, 'kind = "tcp_rtt"\nport = 5201', 'combine = "cpu_per_throughput"', nic=None)
    rc = main(["--host-root", str(tree), "check", str(pol), "--no-probe"])
    out = capsys.readouterr().out
    assert rc == 2
    assert "needs editing: the objective needs throughput (combine = cpu_per_throughput) but probe tcp_rtt " \
           "does not measure throughput" in out
    assert "probe: p99 (needed: objective.statistic): yes by design [probe tcp_rtt]" in out


def test_shipped_throughput_policy_gets_throughput_by_design(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--host-root", str(tree), "check", "throughput", "--no-probe"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "probe: throughput (needed: combine = cpu_per_throughput): yes by design [NIC eth0 link statistics" in out


# ---- the NIC link-rate stand-in ------------------------------------------------------------------

class _Inner:
    name = "fake"

    def __init__(self, tree: Path, clock: FakeClock, window: Window, bump: dict[str, int]) -> None:
        self.tree, self.clock, self.window, self.bump = tree, clock, window, bump
        self.closed = False

    def start(self) -> None: ...
    def restart(self) -> None: ...

    def close(self) -> None:
        self.closed = True

    def measure(self, duration_s: float, window_index: int) -> Window:
        for f, d in self.bump.items():
            p = self.tree / STATS / f
            p.write_text(f"{int(p.read_text()) + d}\n")
        self.clock.sleep(duration_s)
        return self.window


def _wrapped(tree: Path, window: Window, *, throughput: bool = True, drops: bool = True,
             nic: str = "eth0") -> tuple[LinkRateProbe, _Inner]:
    clock = FakeClock()
    inner = _Inner(tree, clock, window, {"rx_packets": 1000, "tx_packets": 500, "rx_dropped": 20})
    sampler = Sampler(FsHost(tree), clock=clock, nic=nic, families=("links",))
    return LinkRateProbe(inner, sampler, nic, throughput=throughput, drops=drops), inner


def test_link_rates_fill_throughput_and_drops(tree: Path) -> None:
    p, inner = _wrapped(tree, Window(ok=True, latency={"p99": 50.0}))
    w = p.measure(2.0, 0)
    assert w.throughput_pps == pytest.approx(750.0) and w.drops_per_s == pytest.approx(10.0)
    assert w.extra["nic_packets_per_s"] == pytest.approx(750.0) and w.latency == {"p99": 50.0}
    p.close()
    assert inner.closed


def test_link_rates_keep_what_the_probe_measured_and_failed_windows(tree: Path) -> None:
    p, _ = _wrapped(tree, Window(ok=True, latency={"p99": 5.0}, throughput_pps=42.0))
    assert p.measure(1.0, 0).throughput_pps == 42.0
    p, _ = _wrapped(tree, Window(ok=True, latency={"p99": 5.0}), throughput=False)
    w = p.measure(1.0, 0)
    assert w.throughput_pps is None and w.drops_per_s == pytest.approx(20.0)
    failed = Window.failed("no traffic")
    p, _ = _wrapped(tree, failed)
    assert p.measure(1.0, 0) is failed


def test_link_rates_missing_nic_leaves_the_window_alone(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    p, _ = _wrapped(tree, Window(ok=True, latency={"p99": 5.0}), nic="eth9")
    lg = logging.getLogger("polltuned")
    old = lg.propagate
    lg.propagate = True
    try:
        with caplog.at_level(logging.WARNING, logger="polltuned.probes"):
            w1, w2 = p.measure(1.0, 0), p.measure(1.0, 1)
    finally:
        lg.propagate = old
    assert w1.throughput_pps is None and w2.throughput_pps is None
    assert len([r for r in caplog.records if "link statistics of eth9 unavailable" in r.message]) == 1


def test_with_link_rates_only_when_needed(tree: Path) -> None:
    host, clock = FsHost(tree), FakeClock()
    thr = load_policy("throughput")
    probe = make_probe(thr.probe, host, clock=clock, policy=thr)
    assert isinstance(probe, LinkRateProbe) and probe.throughput and probe.drops and probe.name == "tcp_rtt"
    bal = load_policy("balanced")   # latency_x_cpu, no drops constraint
    assert not isinstance(make_probe(bal.probe, host, clock=clock, policy=bal), LinkRateProbe)
    assert not isinstance(make_probe(thr.probe, host, clock=clock), LinkRateProbe)   # no policy (bench)
    netns = thr.model_copy(update={"nic": "ns/veth0"})
    assert not isinstance(with_link_rates(probe.inner, host, clock, netns), LinkRateProbe)


# ---- status and reload -----------------------------------------------------------------------------

def test_status_shows_dropped_knobs_and_reload_refits(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "r", "6.6")
    pol = load_policy("latency-critical")
    pol = pol.model_copy(update={"probe": SimProbe(kind="sim", scenario="busypoll_split")})
    d = build_daemon(policy=pol, host_root=str(tree), state_dir=str(tmp_path / "st"), clock=FakeClock(),
                     max_rounds=1)
    assert list(d.dropped_knobs) == ["eth0:napi:irq-suspend-timeout"]
    assert "eth0:napi:irq-suspend-timeout" not in d.controller.policy.knobs
    doc = build_status(d, d.controller)
    assert doc["dropped_knobs"] == d.dropped_knobs
    text = render_status(doc, running=True, dirty=None)
    assert "not tuned on this host (dropped at start):" in text
    assert "  eth0:napi:irq-suspend-timeout: netdev napi-set not in the family policy (kernel before 6.13)" in text
    # a reload is fitted the same way; a policy with nothing usable is refused and changes nothing
    virt = load_policy("virt-host").model_copy(update={"probe": SimProbe(kind="sim", scenario="busypoll_split")})
    fitted = d.fit(virt)
    assert set(fitted.knobs) == {"eth0:napi_defer_hard_irqs", "eth0:gro_flush_timeout"}
    assert set(d.dropped_knobs) == {"module:kvm:halt_poll_ns", "module:kvm:halt_poll_ns_grow", "vhost:affinity"}
    nothing = policy_from_dict({"name": "n", "probe": {"kind": "sim", "scenario": "cliff"},
                                "knobs": {"module:kvm:halt_poll_ns": {"min": 0, "max": 10}}})
    with pytest.raises(KnobUnsupported):
        d.fit(nothing)
    assert "vhost:affinity" in d.dropped_knobs


def test_bench_fitting_is_detect(tmp_path: Path) -> None:
    from polltuned.engine.builder import prepare_policy

    tree = build_tree(tmp_path / "r", "6.1")
    pol = load_policy("bench", nic="eth0")
    fitted, dropped = prepare_policy(pol, SimpleNamespace(registry=KnobRegistry(FsHost(tree))))
    assert list(dropped) == ["eth0:napi:irq-suspend-timeout"]
    assert set(fitted.knobs) == set(pol.knobs) - set(dropped)

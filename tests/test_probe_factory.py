"""make_probe dispatches on the policy's probe kind."""

from __future__ import annotations

from pathlib import Path

from polltuned.clock import FakeClock
from polltuned.host.fs import FsHost
from polltuned.policy.schema import CommandProbe, PrometheusProbe, SockperfProbe, TcpRttProbe
from polltuned.policy.schema import SimProbe as SimConfig
from polltuned.probes.command import CommandProbe as CommandImpl
from polltuned.probes.factory import make_probe
from polltuned.probes.prometheus import PrometheusProbe as PrometheusImpl
from polltuned.probes.sockperf import SockperfProbe as SockperfImpl
from polltuned.probes.tcp_rtt import TcpRttProbe as TcpRttImpl


def test_kinds() -> None:
    host = FsHost("/")
    c = FakeClock()
    sp = make_probe(SockperfProbe(sessions=2), host, clock=c, client_cpus=[0, 1], server_cpus=[1])
    assert isinstance(sp, SockperfImpl) and sp.name == "sockperf"
    assert isinstance(make_probe(TcpRttProbe(port=80), host, clock=c), TcpRttImpl)
    assert isinstance(make_probe(PrometheusProbe(url="http://127.0.0.1:9/m", metric="m"), host, clock=c),
                      PrometheusImpl)
    cp = make_probe(CommandProbe(argv=["true"], regex="(?P<p99>x)"), host, clock=c)
    assert isinstance(cp, CommandImpl) and cp.name == "command"


def test_sim_kind(tmp_path: Path) -> None:
    p = make_probe(SimConfig(scenario="busypoll_split"), FsHost(tmp_path), clock=FakeClock())
    assert hasattr(p, "measure") and hasattr(p, "restart")

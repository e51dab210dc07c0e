"""Build the probe a policy asks for (explicit dispatch on ``kind``)."""

from __future__ import annotations

from collections.abc import Sequence

from polltuned.clock import Clock
from polltuned.errors import UsageError
from polltuned.host.exec import Runner, SubprocessRunner
from polltuned.host.fs import Host
from polltuned.policy.schema import CommandProbe as CommandConfig
from polltuned.policy.schema import Policy
from polltuned.policy.schema import PrometheusProbe as PrometheusConfig
from polltuned.policy.schema import SimProbe as SimConfig
from polltuned.policy.schema import SockperfProbe as SockperfConfig
from polltuned.policy.schema import TcpRttProbe as TcpRttConfig
from polltuned.probes.base import Probe
from polltuned.probes.command import CommandProbe
from polltuned.probes.linkrate import with_link_rates
from polltuned.probes.prometheus import PrometheusProbe
from polltuned.probes.sim import make_sim_probe
from polltuned.probes.sockperf import SockperfProbe
from polltuned.probes.tcp_rtt import TcpRttProbe

ProbeConfig = SockperfConfig | TcpRttConfig | PrometheusConfig | CommandConfig | SimConfig


def make_probe(
    cfg: ProbeConfig,
    host: Host,
    *,
    clock: Clock,
    runner: Runner | None = None,
    client_cpus: Sequence[int] | None = None,
    server_cpus: Sequence[int] | None = None,
    policy: Policy | None = None,
    seed: int = 0,
) -> Probe:
    """The probe for ``cfg``. ``runner`` defaults to the real subprocess runner;
    ``client_cpus``/``server_cpus`` are sockperf layout overrides (the bench's workloads);
    ``policy``/``seed`` are passed to the simulated probe. With ``policy``, a probe that does not
    measure the throughput or drops the objective needs gets them from the policy's NIC link
    statistics (polltuned.probes.linkrate)."""
    probe = _make(cfg, host, clock=clock, runner=runner, client_cpus=client_cpus, server_cpus=server_cpus,
                  policy=policy, seed=seed)
    if policy is None or isinstance(cfg, SimConfig):
        return probe

    return with_link_rates(probe, host, clock, policy.model_copy(update={"probe": cfg}))


def _make(
    cfg: ProbeConfig,
    host: Host,
    *,
    clock: Clock,
    runner: Runner | None,
    client_cpus: Sequence[int] | None,
    server_cpus: Sequence[int] | None,
    policy: Policy | None,
    seed: int,
) -> Probe:

    def real_runner() -> Runner:
        if runner is not None:
            return runner

        return SubprocessRunner()

    if isinstance(cfg, SockperfConfig):
        return SockperfProbe(cfg, real_runner(), clock=clock, client_cpus=client_cpus, server_cpus=server_cpus)
    if isinstance(cfg, TcpRttConfig):
        return TcpRttProbe(cfg, clock=clock)
    if isinstance(cfg, PrometheusConfig):
        return PrometheusProbe(cfg, clock=clock)
    if isinstance(cfg, CommandConfig):
        return CommandProbe(cfg, real_runner(), clock=clock)
    if isinstance(cfg, SimConfig):
        # polltuned.probes.sim belongs to the simulation engine; imported by name to keep the
        # dependency one-way and lazy.

        return make_sim_probe(cfg, host, clock=clock, policy=policy, seed=seed)
    raise UsageError(f"probe.kind: unknown probe {getattr(cfg, 'kind', cfg)!r}")


def probe_opens_fresh_sockets(cfg: ProbeConfig) -> bool:
    """Whether the sockets whose latency ``cfg``'s probe measures are created fresh in every window.

    ``net.core.busy_read`` is copied into a socket when it is created (accepted sockets are cloned
    from their listener), so it can only act on a probe whose sockets are fresh per window;
    ``net.core.busy_poll`` acts at poll/select/epoll time on every socket at once.

    * sockperf: fresh when ``restart_server`` (server and client started per window);
    * sim: the simulated world models fresh sockets;
    * tcp_rtt, prometheus: they watch a long-running application's sockets: not fresh;
    * command: what the policy declares (``fresh_sockets``, default false).
    """
    if isinstance(cfg, SockperfConfig):
        return cfg.restart_server
    if isinstance(cfg, SimConfig):
        return True
    if isinstance(cfg, TcpRttConfig | PrometheusConfig):
        return False
    if isinstance(cfg, CommandConfig):
        return cfg.fresh_sockets
    raise UsageError(f"probe.kind: unknown probe {getattr(cfg, 'kind', cfg)!r}")

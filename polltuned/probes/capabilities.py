"""What a policy's objective needs from every window, and whether its probe can deliver it by design.

Inputs of the objective (polltuned.objective): the latency ``statistic``; CPU cores for
``latency_x_cpu``, ``latency_cpu_budget``, ``cpu_per_throughput`` or a CPU budget; throughput for
``cpu_per_throughput`` or a throughput floor; drops for ``max_drops_increase_per_s``.

Sources by design (pure, from the policy alone):

==========  ===============================================  ==========================================
probe       latency statistics                               throughput
==========  ===============================================  ==========================================
tcp_rtt     p50 p90 p99 p999 mean max (sock_diag RTT)         no (NIC link statistics stand in)
sockperf    p50 p90 p99 p999 mean max                        yes (message rate)
prometheus  p50 p90 p99 p999 mean                            yes (request rate)
command     the names its regex groups / statistic_map give  when it names throughput(_pps)
sim         p99 always, p50/p999/mean if the scenario does   if the scenario reports it
==========  ===============================================  ==========================================

CPU comes from the counters (/proc/stat) for every probe but sim (the scenario reports it).
Drops come from the NIC link statistics (or the sim scenario). ``None`` = only a window can tell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from polltuned.policy.schema import CommandProbe, Policy
from polltuned.probes.linkrate import needs_drops, needs_throughput
from polltuned.records import LATENCY_STATS

_ALL = frozenset(LATENCY_STATS)
_STATS = {"tcp_rtt": _ALL, "sockperf": _ALL, "prometheus": frozenset({"p50", "p90", "p99", "p999", "mean"})}
_NATIVE_THROUGHPUT = {"tcp_rtt": False, "sockperf": True, "prometheus": True}


@dataclass(frozen=True)
class Need:
    """One input of the objective: whether it is needed, why, and whether the probe can give it."""

    name: str            # "p99", "cpu", "throughput", "drops"
    needed: bool
    why: str             # which part of the objective needs it ("" when not needed)
    available: bool | None   # by design: True / False / None (only a window can tell)
    source: str          # where it comes from, or why it cannot


def command_statistics(cfg: CommandProbe) -> frozenset[str] | None:
    """Names a command probe can report (None: cannot tell from the config)."""
    if cfg.statistic_map:
        return frozenset(cfg.statistic_map)
    if cfg.regex:
        try:
            rx = re.compile(cfg.regex)
        except re.error:
            return None
        names = frozenset(rx.groupindex)
        if names:
            return names
        return _ALL if rx.groups else frozenset()
    return _ALL  # a single json_path number stands for every statistic


def needs(policy: Policy, *, proc_stat: bool = True) -> list[Need]:
    """The four inputs (statistic, cpu, throughput, drops) of ``policy``'s objective, with their
    sources by design. ``proc_stat``: whether /proc/stat is readable on this host."""
    obj = policy.objective
    probe = policy.probe
    kind = probe.kind
    nic = policy.nic_device
    out: list[Need] = []

    stat = obj.statistic
    if isinstance(probe, CommandProbe):
        names = command_statistics(probe)
        avail: bool | None = None if names is None else stat in names
        src = "the command's output" + ("" if avail is not False else
                                        f": its regex/statistic_map names no {stat!r} (it names "
                                        f"{', '.join(sorted(names or [])) or 'nothing'})")
    elif kind == "sim":
        avail = True if stat == "p99" else None
        src = "the scenario (p99 always; other statistics if it reports them)"
    else:
        avail = stat in _STATS[kind]
        src = f"probe {kind}"
    out.append(Need(stat, True, "objective.statistic", avail, src))

    cpu_needed = obj.combine in ("latency_x_cpu", "latency_cpu_budget", "cpu_per_throughput") or (
        obj.constraints.cpu_budget_cores is not None)
    if kind == "sim":
        out.append(Need("cpu", cpu_needed, f"combine = {obj.combine}" if cpu_needed else "", True,
                        "the scenario's cpu_cores"))
    else:
        out.append(Need("cpu", cpu_needed, f"combine = {obj.combine}" if cpu_needed else "", proc_stat,
                        "system+softirq+irq time from /proc/stat" if proc_stat else "/proc/stat is not readable"))

    tp_needed = needs_throughput(obj)
    tp_why = ("combine = cpu_per_throughput" if obj.combine == "cpu_per_throughput"
              else "constraints.throughput_floor_pps" if tp_needed else "")
    if kind == "sim":
        tp_avail: bool | None = None
        tp_src = "the scenario (if it reports throughput_pps)"
    elif isinstance(probe, CommandProbe):
        names = command_statistics(probe)
        tp_avail = None if names is None else bool(names & {"throughput", "throughput_pps"})
        tp_src = "the command's throughput(_pps)"
    else:
        tp_avail = _NATIVE_THROUGHPUT[kind]
        tp_src = f"probe {kind}"
    if tp_avail is not True and nic is not None and kind != "sim":
        tp_avail, tp_src = True, (f"NIC {nic} link statistics (rx+tx packets/s)" if tp_avail is False
                                  else f"{tp_src}, else NIC {nic} link statistics (rx+tx packets/s)")
    elif tp_avail is False:
        tp_src = (f"probe {kind} does not measure throughput and the policy has no host-netns nic whose link "
                  "statistics could stand in") if tp_avail is False else tp_src
    out.append(Need("throughput", tp_needed, tp_why, tp_avail, tp_src))

    dr_needed = needs_drops(obj)
    if kind == "sim":
        out.append(Need("drops", dr_needed, "constraints.max_drops_increase_per_s" if dr_needed else "", None,
                        "the scenario (if it reports drops_per_s)"))
    else:
        out.append(Need("drops", dr_needed, "constraints.max_drops_increase_per_s" if dr_needed else "",
                        nic is not None,
                        f"NIC {nic} link statistics (rx+tx dropped/s)" if nic is not None
                        else "no host-netns nic whose link statistics give drops"))
    return out

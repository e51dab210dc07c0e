"""``polltuned check POLICY``: can this policy run on this host, as written?

1. Knobs: :func:`polltuned.engine.compat.detect`, exactly what the daemon does at start — the knobs
   tuned here, those dropped (with the reason: absent on this kernel, read-only, ...) and those whose
   range or values were narrowed to what this kernel accepts.
2. What the objective needs from each window (statistic, CPU, throughput, drops) and whether the
   probe can give it by design (:mod:`polltuned.probes.capabilities`).
3. One short probe window (``--probe-window S``, default the policy's window_s capped at 2 s; the
   probe's own timeouts are cut to S + 10 s; ``--no-probe`` skips it): one line per input saying
   whether the window produced it. A window without traffic is reported, not an error.

Exit codes: 0 ready (dropped knobs are normal on older kernels: the daemon tunes the rest);
2 the policy needs editing, one ``polltuned: check: needs editing: ...`` line per problem saying what
to change in which file (also for an invalid policy file); 4 none of its knobs exists on this host.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from polltuned.cli._knobs_common import app_cpus
from polltuned.clock import FakeClock, SystemClock
from polltuned.counters.sampler import Sampler
from polltuned.engine.builder import fit_policy
from polltuned.engine.compat import APP_STRATEGIES, Compat
from polltuned.errors import ExitCode, HostError, PermissionNeeded, PolltunedError, ProbeError, UsageError
from polltuned.host.fs import Host
from polltuned.knobs.registry import KnobRegistry
from polltuned.metrics.cpu_scope import CpuScope, IdlePoll, make_cpu_scope
from polltuned.metrics.window import NicRates, rates
from polltuned.policy import load_policy
from polltuned.policy.loader import find_policy
from polltuned.policy.schema import CommandProbe, Policy, PrometheusProbe, SockperfProbe, TcpRttProbe
from polltuned.probes.capabilities import Need, needs
from polltuned.probes.factory import ProbeConfig, make_probe
from polltuned.records import Window


def app_cpus_edits(compat: Compat, original: Policy, file: str) -> list[str]:
    """'needs editing' lines for knobs offering pack-app/avoid-app while app_cpus is empty."""
    out = []
    for key in compat.needs_app_cpus:
        offered = [v for v in (original.knobs[key].values or []) if v in APP_STRATEGIES]
        out.append(f"app_cpus is empty but knobs.\"{key}\" offers {', '.join(map(str, offered))}: "
                   f"set app_cpus = [...] (the CPUs the service runs on) in {file}, or remove those values")
    return out


def probe_edits(rows: list[Need], file: str) -> list[str]:
    """'needs editing' lines for inputs the objective needs that the probe cannot give by design."""
    return [f"the objective needs {n.name} ({n.why}) but {n.source}: change [probe] or [objective] in {file}"
            for n in rows if n.needed and n.available is False]


def bounded_probe(cfg: ProbeConfig, seconds: float) -> ProbeConfig:
    """The probe config with its time limits cut to one short check window."""
    if isinstance(cfg, (SockperfProbe, CommandProbe)):
        return cfg.model_copy(update={"timeout_s": min(cfg.timeout_s, seconds + 10.0)})
    if isinstance(cfg, PrometheusProbe):
        return cfg.model_copy(update={"timeout_s": min(cfg.timeout_s, 5.0)})
    if isinstance(cfg, TcpRttProbe):
        return cfg.model_copy(update={"sample_interval_s": min(cfg.sample_interval_s, seconds / 2)})
    return cfg


@dataclass(frozen=True)
class WindowResult:
    """One check window: the probe's own window and, over the same interval, the counters the
    daemon charges (CPU from /proc/stat, the NIC's link rates)."""

    window: Window
    cpu_cores: float | None = None
    cpu_error: str = ""
    nic: NicRates | None = None
    nic_error: str = ""
    #: the daemon's CPU scope for this policy (polltuned.metrics.cpu_scope), as it described itself
    cpu_scope: str = ""


def probe_window(policy: Policy, host: Host, seconds: float) -> WindowResult:
    """Run the policy's probe for one window of ``seconds``, sampling /proc/stat and the policy's
    host-netns NIC around it. Never raises for a probe failure (a failed window says why)."""

    sim = policy.probe.kind == "sim"
    clock = FakeClock() if sim else SystemClock()  # a simulated window needs no wall time
    cfg = bounded_probe(policy.probe, seconds)
    nic = policy.nic_device
    families = () if sim else (("stat", "links") if nic else ("stat",))
    sampler: Any = None
    scope: CpuScope | None = None
    probe: Any = None
    res = WindowResult(Window.failed("not run"))
    try:
        probe = make_probe(cfg, host, clock=clock, seed=policy.tuning.seed,
                           policy=policy.model_copy(update={"probe": cfg}) if sim else None)
        probe.start()
        s0: Any = None
        if families:
            sampler = Sampler(host, clock=clock, nic=nic, families=families)
            try:
                s0 = sampler.sample()
                # CPU as the daemon charges it: the one CPU account, idle polling included
                scope = make_cpu_scope(policy, host, sampler, sampler.nics, clock=clock)
                scope.begin()
            except PolltunedError as e:
                res = dataclasses.replace(res, cpu_error=e.message, nic_error=e.message)
                scope = None
        w: Window = probe.measure(seconds, 0)
        res = dataclasses.replace(res, window=w)
        if sim:
            return dataclasses.replace(res, cpu_cores=w.cpu_cores)
        if sampler is not None and s0 is not None:
            try:
                r = rates(s0, sampler.sample())
            except (PolltunedError, ValueError) as e:
                return dataclasses.replace(res, cpu_error=str(e), nic_error=str(e))
            if scope is not None:
                try:
                    c = scope.end()
                    res = dataclasses.replace(res, cpu_cores=c.cores, cpu_scope=c.scope)
                except PolltunedError as e:
                    res = dataclasses.replace(res, cpu_error=e.message)
            if nic is not None:
                nr = (r.nic or {}).get(nic)
                res = dataclasses.replace(res, nic=nr, nic_error="" if nr is not None else
                                          r.unavailable.get(f"links.{nic}", r.unavailable.get("links", "no counters")))
    except PermissionNeeded:
        raise  # an untrusted scenario file (or no permission): refused, not a failed window
    except (PolltunedError, OSError) as e:
        res = dataclasses.replace(res, window=Window.failed(
            f"the probe could not run: {e.message if isinstance(e, PolltunedError) else e}"))
    finally:
        for obj in (probe, sampler):
            if obj is not None:
                with contextlib.suppress(PolltunedError, OSError):
                    obj.close()
    return res


def measured(n: Need, res: WindowResult) -> tuple[bool, str]:
    """Did the check window deliver input ``n``? (yes/no, the value and its source, or the reason).
    CPU, throughput and drops are judged on their own sources even when the probe's window failed."""
    w = res.window
    if n.name == "cpu":
        c = res.cpu_cores
        scope = f" ({res.cpu_scope})" if res.cpu_scope else ""
        return (c is not None), (f"{c:.3f} cores{scope}" if c is not None
                                 else (res.cpu_error or f"window failed: {w.error}"))
    if n.name == "throughput":
        if w.ok and w.throughput_pps is not None:
            return True, f"{w.throughput_pps:.1f}/s from the probe"
        pps = res.nic.packets_per_s if res.nic is not None else None
        if pps is not None:
            return True, f"{pps:.1f} packets/s on the NIC" + (" (no traffic during the window)" if pps <= 0 else "")
        return False, res.nic_error or (f"window failed: {w.error}" if not w.ok else "no throughput figure")
    if n.name == "drops":
        if w.ok and w.drops_per_s is not None:
            return True, f"{w.drops_per_s:.1f} drops/s from the probe"
        d = res.nic.drops_per_s if res.nic is not None else None
        if d is not None:
            return True, f"{d:.1f} drops/s on the NIC"
        return False, res.nic_error or (f"window failed: {w.error}" if not w.ok else "no drops figure")
    if not w.ok:
        return False, f"window failed: {w.error}"
    v = w.stat(n.name)
    if v is None:
        return False, f"the window has no {n.name} (it has {', '.join(sorted(w.latency)) or 'no latency'})"
    return True, f"{v:.1f} µs over {w.observations} observations"


def check_policy(args: argparse.Namespace, host: Host) -> int:
    pol = load_policy(args.policy, nic=args.nic)
    file = str(find_policy(args.policy))
    if args.app_cpus:
        pol = pol.model_copy(update={"app_cpus": app_cpus(args)})

    # the knobs the probe cannot see (busy_read under a probe of long-lived sockets), then what the
    # host lacks: the daemon's own fitting (exit 4 if nothing is left), printed below, not logged
    fitted = fit_policy(pol, KnobRegistry(host, app_cpus=pol.app_cpus), logger=None)
    assert fitted.compat is not None  # a host was given
    compat, dropped = fitted.compat, fitted.dropped
    rows = needs(pol, proc_stat=host.exists("/proc/stat"))
    edits = app_cpus_edits(compat, pol, file) + probe_edits(rows, file)
    seconds = args.probe_window if args.probe_window is not None else min(pol.tuning.window_s, 2.0)
    window = None if args.no_probe else probe_window(compat.policy, host, seconds)
    inputs: list[dict[str, Any]] = []
    for n in rows:
        row: dict[str, Any] = {"input": n.name, "needed": n.needed, "why": n.why, "by_design": n.available,
                               "source": n.source}
        if window is not None:
            row["measured"], row["detail"] = measured(n, window)
        inputs.append(row)
    release = ""
    with contextlib.suppress(HostError):
        release = host.read_text("/proc/sys/kernel/osrelease").strip()
    # halt polling (guest_halt_poll_ns) spins in the cpuidle POLL state, which /proc/stat counts as
    # idle: the CPU account adds it where cpuidle exposes that state; say when it does not
    poll = IdlePoll(host)
    poll.read()
    idle_poll = "counted in CPU (cpuidle POLL state)" if poll.missing is None else poll.missing
    if args.json:
        print(json.dumps({"policy": pol.name, "file": file, "kernel": release, "knobs": list(compat.policy.knobs),
                          "dropped": dropped, "narrowed": dict(compat.narrowed),
                          "needs_editing": edits, "idle_poll": idle_poll,
                          "probe": {"kind": pol.probe.kind, "window_s": None if window is None else seconds,
                                    "inputs": inputs}}, indent=2))
        return _verdict(file, edits, window)
    print(f"policy {pol.name!r} ({file}), kernel {release or '?'}: {len(compat.policy.knobs)} of {len(pol.knobs)} "
          f"knobs tuned here: {', '.join(compat.policy.knobs)}")
    for key, why in dropped.items():
        print(f"dropped: {key}: {why}")
    for key, why in compat.narrowed.items():
        print(f"narrowed: {key}: {why}")
    for r in inputs:
        head = f"probe: {r['input']}" + (f" (needed: {r['why']})" if r["needed"] else " (not needed)")
        if "measured" in r:
            verdict = ("yes, " if r["measured"] else "no, ") + r["detail"]
        else:
            verdict = {True: "yes", False: "no", None: "only a window can tell"}[r["by_design"]] + " by design"
        print(f"{head}: {verdict} [{r['source']}]")
    print(f"idle polling: {idle_poll}")
    for e in edits:
        print(f"polltuned: check: needs editing: {e}")
    if not edits and (window is None or window.window.ok):
        print(f"policy {pol.name!r} is ready on this host"
              + (f"; {len(dropped)} knob(s) dropped (listed above)" if dropped else ""))
    return _verdict(file, edits, window)


def _verdict(file: str, edits: list[str], window: WindowResult | None = None) -> int:
    """Exit 0 when ready; otherwise the one error line every failing command prints (exit 2 when
    the policy needs editing, 8 when its probe window failed)."""
    if edits:
        raise UsageError(f"{file}: needs editing before it can work on this host ({len(edits)} thing(s), "
                         "listed above)", code="policy-needs-editing")
    if window is not None and not window.window.ok:
        raise ProbeError(f"{file}: the probe window failed: {window.window.error or 'no reason given'}",
                         hint="fix the probe (argv, regex, scenario) or check with --no-probe")
    return int(ExitCode.OK)

"""``polltuned check [POLICY] [--json]``: every knob on this host — present, writable, current
value, domain, and why not when unusable — plus other owners of the same knobs (tuned,
irqbalance). With POLICY: what the daemon would tune here, what it drops and why, and whether the
probe produces what the objective needs (polltuned.cli.check_policy)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from polltuned.cli._knobs_common import add_app_cpus, app_cpus, make_host
from polltuned.cli._types import finite_float
from polltuned.cli.check_policy import check_policy
from polltuned.errors import ExitCode, HostError, PolltunedError
from polltuned.host.fs import Host
from polltuned.knobs.base import Knob
from polltuned.knobs.owners import detect_owners
from polltuned.knobs.registry import KnobRegistry
from polltuned.knobs.sysctl import SYSCTLS
from polltuned.knobs.vhost import VMM_OWNED_NOTE, vhost_threads


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("policy", nargs="?", default=None, metavar="POLICY",
                   help="check this policy against this host instead of listing all knobs: knobs tuned and "
                        "dropped here, one probe window; exit 0 ready, 2 needs editing (each line says what), "
                        "4 no knob of it exists here")
    p.add_argument("--nic", default=None, metavar="DEV",
                   help="the NIC (for {nic} in a policy, or to limit the listing)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-probe", action="store_true",
                   help="with POLICY: skip the probe window (knobs and what the probe can give by design only)")
    p.add_argument("--probe-window", type=finite_float(0, 3600), default=None, metavar="S",
                   help="with POLICY: length of the one probe window in seconds (default: window_s, at most 2)")
    add_app_cpus(p)


def knob_row(k: Knob) -> dict[str, Any]:
    row: dict[str, Any] = {"key": k.key, "kind": k.kind, "domain": k.domain.to_json()}
    try:
        av = k.availability()
    except PolltunedError as e:
        row.update(present=False, writable=False, value=None, reason=e.message, notices=[])
        return row
    value: Any = None
    reason = av.reason
    if av.present:
        try:
            value = k.read()
        except PolltunedError as e:
            reason = reason or f"read failed: {e.message}"
    row.update(present=av.present, writable=av.writable, value=value, reason=reason, notices=list(av.notices))
    return row


def host_report(host: Host, reg: KnobRegistry, devices: list[str] | None) -> dict[str, Any]:
    rows = []
    for key in reg.catalogue_keys(devices):
        try:
            rows.append(knob_row(reg.get(key)))
        except PolltunedError as e:
            rows.append({"key": key, "present": False, "writable": False, "value": None, "reason": e.message})
    caps = reg.napi_caps()
    release = ""
    try:
        release = host.read_text("/proc/sys/kernel/osrelease").strip()
    except HostError:
        pass
    vhost_loaded = host.exists("/sys/module/vhost_net")
    workers = len(vhost_threads(host))
    owners = detect_owners(host, list(SYSCTLS))
    managed = []
    for n in host.glob("/proc/irq", "[0-9]*"):
        if host.exists(f"/proc/irq/{n}/smp_affinity_list") and not host.is_writable(f"/proc/irq/{n}/smp_affinity_list"):
            name = ""
            if host.exists(f"/sys/kernel/irq/{n}/actions"):
                name = host.read_text(f"/sys/kernel/irq/{n}/actions").strip()
            managed.append({"irq": int(n), "name": name,
                            "reason": "managed IRQ: smp_affinity is read-only (0444), writes fail EPERM; skipped"})
    managed.sort(key=lambda d: int(str(d["irq"])))
    return {
        "kernel": release,
        "knobs": rows,
        "managed_irqs": managed,
        "napi_set": {"present": caps.present, "reason": caps.reason,
                     "threaded_busy_poll": caps.present and caps.attrs.get("threaded", (0, 1))[1] >= 2,
                     "attrs": {k: {"min": lo, "max": hi} for k, (lo, hi) in caps.attrs.items()}},
        "vhost": {"vhost_net_loaded": vhost_loaded,
                  "reason": "" if vhost_loaded else "vhost_net not loaded (no /sys/module/vhost_net): not a vhost host",
                  "busyloop": VMM_OWNED_NOTE, "workers": workers,
                  "workers_note": "" if workers else "no vhost workers"},
        "owners": [{"name": o.name, "active": o.active, "knobs": list(o.knobs), "detail": o.detail,
                    "action": o.action} for o in owners],
    }


def run(args: argparse.Namespace) -> int:
    host = make_host(args)
    if args.policy is not None:
        return check_policy(args, host)
    reg = KnobRegistry(host, app_cpus=app_cpus(args))
    devices = [args.nic] if args.nic else None
    rep = host_report(host, reg, devices)
    if args.json:
        print(json.dumps(rep, indent=2, default=str))
        return int(ExitCode.OK)
    print(f"kernel {rep['kernel'] or '?'}")
    for r in rep["knobs"]:
        state = "ok" if r["present"] and r["writable"] else ("read-only" if r["present"] else "absent")
        dom = r.get("domain") or {}
        drange = (" one of " + ",".join(dom.get("choices", []))) if dom.get("kind") == "choice" else \
            (f" {dom.get('min')}..{dom.get('max')}" if dom else "")
        line = f"{r['key']:<44} {state:<9} value={r['value'] if r['value'] is not None else '-'}{drange}"
        if r.get("reason"):
            line += f"  [{r['reason']}]"
        for n in r.get("notices", []):
            line += f"  ({n})"
        print(line)
    print(rep["vhost"]["busyloop"])
    if not rep["vhost"]["workers"]:
        print("vhost:affinity: no vhost workers")
    for m in rep["managed_irqs"]:
        print(f"irq {m['irq']} ({m['name']}): {m['reason']}")
    if rep["napi_set"]["present"] and not rep["napi_set"]["threaded_busy_poll"]:
        print("threaded busy-poll (threaded=2): not supported by this kernel")
    for o in rep["owners"]:
        print(f"owner {o['name']}: {o['detail']}; {o['action']}")
    return int(ExitCode.OK)

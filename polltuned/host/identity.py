"""What makes two hosts (or two boots of one host) the same for a tuning result.

A confirmed configuration is re-applied at start only on a host with the same fingerprint: kernel
release (/proc/sys/kernel/osrelease), the NIC's driver (the basename of the
/sys/class/net/DEV/device/driver link), its RX queue count (/sys/class/net/DEV/queues/rx-N) and the
number of CPUs (/sys/devices/system/cpu/cpuN). What cannot be read is recorded as "?", so a host
that loses a file gets a different fingerprint rather than an error.

A *workload class* (hosts that may share one study, polltuned.study) adds the CPU model
(/proc/cpuinfo) and the probe's target to these facts: ``class_facts`` / ``class_fingerprint``.
``host_fingerprint`` itself is unchanged, so confirmed deployments recorded before stay valid.
``host_id`` names one host inside its class (hostname + machine-id).
"""

from __future__ import annotations

import hashlib
import json

from polltuned.errors import HostError
from polltuned.host.fs import Host


def host_facts(host: Host, nic: str | None) -> dict[str, str]:
    facts: dict[str, str] = {}
    try:
        facts["kernel"] = host.read_text("/proc/sys/kernel/osrelease").strip()
    except HostError:
        facts["kernel"] = "?"
    facts["cpus"] = str(len(host.glob("/sys/devices/system/cpu", "cpu[0-9]*")) or "?")
    if nic and "/" not in nic:
        try:
            facts["driver"] = host.readlink(f"/sys/class/net/{nic}/device/driver").rsplit("/", 1)[-1]
        except HostError:
            facts["driver"] = "?"
        facts["rx_queues"] = str(len(host.glob(f"/sys/class/net/{nic}/queues", "rx-*")) or "?")
        facts["nic"] = nic
    elif nic:
        facts["nic"] = nic
    return facts


def host_fingerprint(host: Host, nic: str | None) -> str:
    facts = host_facts(host, nic)
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def cpu_model(cpuinfo: str) -> str:
    """The CPU model from /proc/cpuinfo text (pure): x86 ``model name``; arm64 ``CPU implementer``
    + ``CPU part``; else ``cpu``/``Processor`` lines; "?" when none is there."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip() not in fields:
            fields[k.strip()] = " ".join(v.split())
    if fields.get("model name"):
        return fields["model name"]
    if "CPU implementer" in fields and "CPU part" in fields:
        return f"arm {fields['CPU implementer']}/{fields['CPU part']}"
    for k in ("cpu", "Processor", "cpu model"):
        if fields.get(k):
            return fields[k]
    return "?"


def class_facts(host: Host, nic: str | None, probe_target: str) -> dict[str, str]:
    """host_facts plus the CPU model and the probe's target: what hosts sharing a study share."""
    facts = host_facts(host, nic)
    try:
        facts["cpu_model"] = cpu_model(host.read_text("/proc/cpuinfo"))
    except HostError:
        facts["cpu_model"] = "?"
    facts["probe"] = probe_target
    return facts


def class_fingerprint(host: Host, nic: str | None, probe_target: str) -> str:
    facts = class_facts(host, nic, probe_target)
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def host_id(host: Host) -> str:
    """This host's name in a fleet: ``hostname-<machine-id prefix>`` (cloned images that kept one
    machine-id still differ by hostname, and the other way round)."""
    try:
        name = host.read_text("/proc/sys/kernel/hostname").strip() or "?"
    except HostError:
        name = "?"
    try:
        mid = host.read_text("/etc/machine-id").strip()[:12] or "?"
    except HostError:
        mid = "?"
    return f"{name}-{mid}"

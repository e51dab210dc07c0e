"""What makes two hosts (or two boots of one host) the same for a tuning result.

A confirmed configuration is re-applied at start only on a host with the same fingerprint: kernel
release (/proc/sys/kernel/osrelease), the NIC's driver (the basename of the
/sys/class/net/DEV/device/driver link), its RX queue count (/sys/class/net/DEV/queues/rx-N) and the
number of CPUs (/sys/devices/system/cpu/cpuN). What cannot be read is recorded as "?", so a host
that loses a file gets a different fingerprint rather than an error.
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

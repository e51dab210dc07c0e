"""Named network namespaces: sysfs of a device inside one, and ``ip`` helpers.

Why a subprocess: /sys/class/net shows the devices of the netns that *mounted* sysfs, so setns(2)
alone does not reveal another namespace's devices; ``ip netns exec NS`` creates a private mount
namespace and remounts /sys for NS. polltuned runs ``ip netns exec NS cat FILE`` to read and
``ip netns exec NS tee FILE`` to write (a single write(2), like sysctl(8)); about 3-6 ms per access,
fine for a handful of knob operations per trial.

Fake trees (tests): the sysfs of namespace NS lives under ``ROOT/netns/NS/`` (so
``ROOT/netns/ptb/sys/class/net/vb/gro_flush_timeout``).
"""

from __future__ import annotations

import errno as errno_mod
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from polltuned.errors import HostError
from polltuned.host.fs import FsHost, Host

_NS_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_TIMEOUT_S = 10.0

# strerror text (as printed by coreutils) -> errno, to keep errno semantics across the subprocess
_ERRNO_BY_TEXT = {os.strerror(n): n for n in (
    errno_mod.ENOENT, errno_mod.EINVAL, errno_mod.ERANGE, errno_mod.EPERM, errno_mod.EACCES,
    errno_mod.EOPNOTSUPP, errno_mod.EBUSY, errno_mod.ENODEV, errno_mod.EOVERFLOW, errno_mod.EIO)}


def valid_netns_name(name: str) -> bool:
    return bool(_NS_RE.match(name)) and name not in (".", "..")


def _errno_from_text(text: str) -> int | None:
    for msg, n in _ERRNO_BY_TEXT.items():
        if msg in text:
            return n
    return None


def run_ip(args: Sequence[str], *, netns: str | None = None, check: bool = True,
           input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``ip [-n NS] ARGS`` (iproute2), bounded in time; HostError on failure when ``check``."""
    argv = ["ip"] + (["-n", netns] if netns else []) + list(args)
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, input=input_text)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HostError(f"{' '.join(argv)}: {e}") from e
    if check and cp.returncode != 0:
        raise HostError(f"{' '.join(argv)}: {cp.stderr.strip() or 'exit ' + str(cp.returncode)}",
                        errno=_errno_from_text(cp.stderr))
    return cp


def netns_exec(netns: str, argv: Sequence[str], *, input_text: str | None = None
               ) -> subprocess.CompletedProcess[str]:
    if not valid_netns_name(netns):
        raise HostError(f"invalid netns name {netns!r}")
    full = ["ip", "netns", "exec", netns, *argv]
    try:
        return subprocess.run(full, capture_output=True, text=True, timeout=_TIMEOUT_S, input=input_text)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HostError(f"{' '.join(full)}: {e}") from e


def list_netns(host: Host) -> list[str]:
    """Named network namespaces (/run/netns on a real host, ROOT/netns in a fake tree)."""
    if host.is_real:
        return host.glob("/run/netns", "*")
    return host.glob("/netns", "*")


def netns_exists(host: Host, name: str) -> bool:
    return valid_netns_name(name) and name in list_netns(host)


class NetnsSysfsHost:
    """A Host whose /sys (and /proc) are those seen inside named netns ``netns`` (real host only)."""

    def __init__(self, netns: str) -> None:
        if not valid_netns_name(netns):
            raise HostError(f"invalid netns name {netns!r}")
        self.netns = netns
        self.root = Path("/")

    @property
    def is_real(self) -> bool:
        return True

    def path(self, p: str) -> Path:
        return Path(p)

    def _gone(self) -> bool:
        return not os.path.exists(f"/run/netns/{self.netns}")

    def read_text(self, p: str) -> str:
        cp = netns_exec(self.netns, ["cat", p])
        if cp.returncode != 0:
            en = errno_mod.ENOENT if self._gone() else _errno_from_text(cp.stderr)
            raise HostError(f"cannot read {p} in netns {self.netns}: {cp.stderr.strip()}", errno=en)
        return cp.stdout

    def exists(self, p: str) -> bool:
        return netns_exec(self.netns, ["test", "-e", p]).returncode == 0

    def listdir(self, p: str) -> list[str]:
        cp = netns_exec(self.netns, ["ls", "-1", p])
        if cp.returncode != 0:
            en = errno_mod.ENOENT if self._gone() else _errno_from_text(cp.stderr)
            raise HostError(f"cannot list {p} in netns {self.netns}: {cp.stderr.strip()}", errno=en)
        return sorted(x for x in cp.stdout.splitlines() if x)

    def glob(self, directory: str, pattern: str) -> list[str]:
        import fnmatch

        try:
            return [n for n in self.listdir(directory) if fnmatch.fnmatch(n, pattern)]
        except HostError:
            return []

    def write_text(self, p: str, data: str) -> None:
        # tee writes its whole stdin with one write(2) for small payloads
        cp = netns_exec(self.netns, ["tee", p], input_text=data)
        if cp.returncode != 0:
            en = errno_mod.ENOENT if self._gone() else _errno_from_text(cp.stderr)
            raise HostError(f"writing {data.strip()!r} to {p} in netns {self.netns} failed: "
                            f"{cp.stderr.strip()}", errno=en)

    def is_writable(self, p: str) -> bool:
        return netns_exec(self.netns, ["test", "-w", p]).returncode == 0

    def readlink(self, p: str) -> str:
        cp = netns_exec(self.netns, ["readlink", p])
        if cp.returncode != 0:
            raise HostError(f"cannot readlink {p} in netns {self.netns}", errno=_errno_from_text(cp.stderr))
        return cp.stdout.strip()


def device_host(host: Host, netns: str | None) -> Host:
    """The Host through which device sysfs files of ``netns`` (None = host netns) are reached."""
    if netns is None:
        return host
    if not valid_netns_name(netns):
        raise HostError(f"invalid netns name {netns!r}")
    if host.is_real:
        return NetnsSysfsHost(netns)
    return FsHost(host.root / "netns" / netns)


# --- iproute2 helpers for tests and the embedded world ------------------------------------------

def add_netns(name: str) -> None:
    run_ip(["netns", "add", name])


def del_netns(name: str) -> None:
    run_ip(["netns", "del", name], check=False)


def add_veth_pair(ns_a: str, dev_a: str, addr_a: str, ns_b: str, dev_b: str, addr_b: str,
                  *, prefixlen: int = 30) -> None:
    """veth ``dev_a``@``ns_a`` <-> ``dev_b``@``ns_b`` with IPv4 addresses, both up, GRO on
    (so the veth gets NAPI instances that napi-get/napi-set can see)."""
    run_ip(["link", "add", dev_a, "type", "veth", "peer", "name", dev_b, "netns", ns_b], netns=ns_a)
    run_ip(["addr", "add", f"{addr_a}/{prefixlen}", "dev", dev_a], netns=ns_a)
    run_ip(["addr", "add", f"{addr_b}/{prefixlen}", "dev", dev_b], netns=ns_b)
    run_ip(["link", "set", dev_a, "up"], netns=ns_a)
    run_ip(["link", "set", dev_b, "up"], netns=ns_b)


def ethtool(args: Sequence[str], *, netns: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = (["ip", "netns", "exec", netns] if netns else []) + ["ethtool", *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HostError(f"{' '.join(argv)}: {e}") from e

"""ethtool interrupt coalescing get/set through pyroute2's legacy SIOCETHTOOL ioctl path.

``ETHTOOL_GCOALESCE``/``ETHTOOL_SCOALESCE`` move the whole ``struct ethtool_coalesce``
(read-modify-write; the kernel keeps kernel-only fields). Drivers without coalescing support
fail with EOPNOTSUPP (veth). A device in a named netns is reached by switching this thread into
the namespace (``pyroute2.netns.pushns``/``popns``, a per-thread setns) for the ioctl.

Fake trees: ``ROOT/ethtool/NS/DEV/coalesce`` (NS ``-`` = host netns) with ``name value`` lines
using the ioctl field names; a missing file behaves like EOPNOTSUPP.
"""

from __future__ import annotations

import errno as errno_mod
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from polltuned.errors import HostError
from polltuned.host.fs import Host


def parse_coalesce_file(text: str) -> dict[str, int]:
    """Fake-tree format: one ``field value`` pair per line."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


@contextmanager
def _in_netns(netns: str | None) -> Iterator[None]:
    if netns is None:
        yield
        return
    from pyroute2 import netns as pnetns

    pnetns.pushns(netns)
    try:
        yield
    finally:
        pnetns.popns()


def _wrap(dev: str, what: str, e: Exception) -> HostError:
    name = type(e).__name__
    if name == "NotSupportedError":
        return HostError(f"{dev}: coalesce {what}: {os.strerror(errno_mod.EOPNOTSUPP)}", errno=errno_mod.EOPNOTSUPP)
    if name == "NoSuchDevice":
        return HostError(f"{dev}: coalesce {what}: {os.strerror(errno_mod.ENODEV)}", errno=errno_mod.ENODEV)
    en = getattr(e, "errno", None) or getattr(e, "code", None)
    return HostError(f"{dev}: coalesce {what}: {name}", errno=en if isinstance(en, int) else None)


def get_coalesce(host: Host, netns: str | None, dev: str) -> dict[str, int]:
    if not host.is_real:
        p = f"/ethtool/{netns or '-'}/{dev}/coalesce"
        if not host.exists(p):
            raise HostError(f"{dev}: coalesce get: {os.strerror(errno_mod.EOPNOTSUPP)}", errno=errno_mod.EOPNOTSUPP)
        return parse_coalesce_file(host.read_text(p))
    try:
        from pyroute2 import Ethtool

        with _in_netns(netns), Ethtool() as et:
            return {str(k): int(v) for k, v in et.get_coalesce(dev).items()}
    except OSError as e:
        raise HostError(f"{dev}: coalesce get: {os.strerror(e.errno or 0)}", errno=e.errno) from e
    except Exception as e:  # pyroute2 wraps ioctl failures (NotSupportedError, NoSuchDevice...)
        raise _wrap(dev, "get", e) from e


def set_coalesce(host: Host, netns: str | None, dev: str, values: Mapping[str, int]) -> None:
    if not host.is_real:
        cur = get_coalesce(host, netns, dev)
        cur.update(values)
        target = host.path(f"/ethtool/{netns or '-'}/{dev}/coalesce")
        tmp = target.with_name(".coalesce.tmp")  # atomic, like the kernel's SCOALESCE
        tmp.write_text("".join(f"{k} {v}\n" for k, v in cur.items()))
        os.replace(tmp, target)
        return
    try:
        from pyroute2 import Ethtool

        with _in_netns(netns), Ethtool() as et:
            et.set_coalesce(dev, dict(values))
    except OSError as e:
        raise HostError(f"{dev}: coalesce set {dict(values)}: {os.strerror(e.errno or 0)}", errno=e.errno) from e
    except Exception as e:
        raise _wrap(dev, f"set {dict(values)}", e) from e

"""rtnetlink access (pyroute2, imported lazily): per-link ``rtnl_link_stats64``.

``RTM_GETSTATS`` with ``filter_mask = IFLA_STATS_FILTER_BIT(IFLA_STATS_LINK_64)`` (= 1) and the
ifindex returns only the 64-bit stats block — the cheapest per-device poll (knobs.md 4.8).
One IPRoute socket is kept open for the reader's lifetime; call ``close()``.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence
from typing import Any

from polltuned.errors import HostError

#: stats64 fields polltuned keeps (names as in struct rtnl_link_stats64 / pyroute2)
FIELDS = ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_dropped", "tx_dropped",
          "rx_errors", "tx_errors")


class NetlinkLinkStats:
    """Reads stats64 for the named links in the caller's network namespace."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = list(names)
        self._ipr: Any = None
        self._index: dict[str, int] = {}

    def open(self) -> None:
        """Open the socket now (imports pyroute2), so the first sample is not slowed by it."""
        try:
            self._open()
        except OSError as e:
            raise HostError(f"cannot open rtnetlink socket: {e}", errno=e.errno) from e

    def _open(self) -> Any:
        if self._ipr is None:
            from pyroute2 import IPRoute

            self._ipr = IPRoute()
        return self._ipr

    def read(self) -> Mapping[str, Mapping[str, int]]:
        """name -> stats; a link that vanished is left out (the caller reports it)."""
        try:
            ipr = self._open()
        except OSError as e:
            raise HostError(f"cannot open rtnetlink socket: {e}", errno=e.errno) from e
        from pyroute2.netlink.exceptions import NetlinkError

        out: dict[str, Mapping[str, int]] = {}
        for name in self._names:
            try:
                idx = self._index.get(name)
                if idx is None:
                    found = ipr.link_lookup(ifname=name)
                    if not found:
                        continue
                    idx = self._index[name] = int(found[0])
                msgs = ipr.stats("get", ifindex=idx, filter_mask=1)
            except NetlinkError as e:
                self._index.pop(name, None)
                if e.code in (errno.ENODEV, errno.ENOENT):
                    continue
                raise HostError(f"RTM_GETSTATS for {name} failed: {e}", errno=e.code) from e
            except OSError as e:
                raise HostError(f"RTM_GETSTATS for {name} failed: {e}", errno=e.errno) from e
            s = msgs[0].get_attr("IFLA_STATS_LINK_64") if msgs else None
            if s is None:
                raise HostError(f"RTM_GETSTATS for {name}: no IFLA_STATS_LINK_64 in the reply")
            out[name] = {f: int(s[f]) for f in FIELDS}
        return out

    def close(self) -> None:
        if self._ipr is not None:
            try:
                self._ipr.close()
            finally:
                self._ipr = None

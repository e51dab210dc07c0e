"""Per-link statistics (stats64): rx/tx packets, bytes, dropped, errors.

On the real host (``host.is_real``) through rtnetlink RTM_GETSTATS (polltuned.host.netlink); on a
fake tree from ``/sys/class/net/DEV/statistics/<field>`` (one ``%llu`` per file,
net/core/net-sysfs.c netstat_show()). Counters are u64; a decrease means the device was reset.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from dataclasses import dataclass

from polltuned.counters._util import uint
from polltuned.counters.base import Reader, SampleContext
from polltuned.errors import HostError, ParseError
from polltuned.host.fs import Host
from polltuned.host.netlink import FIELDS, NetlinkLinkStats

WIDTH_BITS = 64


@dataclass(frozen=True)
class LinkStats:
    rx_packets: int
    tx_packets: int
    rx_bytes: int
    tx_bytes: int
    rx_dropped: int
    tx_dropped: int
    rx_errors: int
    tx_errors: int


def parse_stat_file(text: str, path: str) -> int:
    """One sysfs statistics file: ``%llu\\n``."""
    body = text.strip()
    lines = body.split("\n")
    if len(lines) != 1:
        raise ParseError(path, 2, "expected a single value")
    return uint(body, path, 1, "counter")


class _SysfsLinks:
    def __init__(self, host: Host, names: list[str]) -> None:
        self._host = host
        self._names = names

    def read(self) -> Mapping[str, LinkStats]:
        out: dict[str, LinkStats] = {}
        for name in self._names:
            vals: list[int] = []
            try:
                for f in FIELDS:
                    p = f"/sys/class/net/{name}/statistics/{f}"
                    vals.append(parse_stat_file(self._host.read_text(p), p))
            except HostError as e:
                if e.errno == errno.ENOENT:
                    continue  # link vanished
                raise
            out[name] = LinkStats(*vals)
        return out

    def close(self) -> None:
        return None


class _NetlinkLinks:
    def __init__(self, names: list[str]) -> None:
        self._nl = NetlinkLinkStats(names)
        self._nl.open()

    def read(self) -> Mapping[str, LinkStats]:
        return {n: LinkStats(*(s[f] for f in FIELDS)) for n, s in self._nl.read().items()}

    def close(self) -> None:
        self._nl.close()


class LinksCollector:
    name = "links"
    default = True
    doc = "per-link stats64 (rtnetlink RTM_GETSTATS; sysfs statistics/* on a fake tree)"

    def start(self, host: Host, ctx: SampleContext) -> Reader:
        names = list(ctx.nic_map)
        if host.is_real:
            return _NetlinkLinks(names)
        return _SysfsLinks(host, names)

"""rtnetlink access: per-link ``rtnl_link_stats64`` (pyroute2, imported lazily) and link
notifications (RTMGRP_LINK) for HOLD's watcher.

``RTM_GETSTATS`` with ``filter_mask = IFLA_STATS_FILTER_BIT(IFLA_STATS_LINK_64)`` (= 1) and the
ifindex returns only the 64-bit stats block — the cheapest per-device poll (knobs.md 4.8).
One IPRoute socket is kept open for the reader's lifetime; call ``close()``.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from polltuned.errors import HostError
from polltuned.host.fs import Host

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


# ---- link notifications (RTMGRP_LINK) -----------------------------------------------------------
#
# HOLD's watcher re-verifies the deployed knobs when a managed device changes: a link down/up or a
# driver reset re-creates NAPIs (with the kernel's default values) and may re-request IRQs. The
# socket is a plain non-blocking AF_NETLINK/NETLINK_ROUTE socket bound to the RTMGRP_LINK group,
# drained between HOLD steps: pyroute2 0.9's IPRSocket runs an asyncio loop per call and its get()
# blocks with no timeout, while the messages needed here (RTM_NEWLINK/RTM_DELLINK: ifindex, flags,
# IFLA_IFNAME, IFLA_OPERSTATE) are decoded by :func:`parse_link_messages` in a few lines.

NETLINK_ROUTE = 0
RTMGRP_LINK = 1
RTM_NEWLINK = 16
RTM_DELLINK = 17
NLMSG_ERROR = 2
NLMSG_OVERRUN = 4
IFLA_IFNAME = 3
IFLA_OPERSTATE = 16
IFF_UP = 0x1
IFF_RUNNING = 0x40
#: RFC 2863 operstates as in include/uapi/linux/if.h (IF_OPER_*)
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")

_NLMSGHDR = struct.Struct("=IHHII")      # struct nlmsghdr: len, type, flags, seq, pid
_IFINFOMSG = struct.Struct("=BxHiII")    # struct ifinfomsg: family, pad, type, index, flags, change
_RTATTR = struct.Struct("=HH")           # struct rtattr: len, type (payload 4-byte aligned)


@dataclass(frozen=True)
class LinkEvent:
    """One link notification: ``kind`` new (RTM_NEWLINK: created or changed), del (RTM_DELLINK), or
    lost (the socket overflowed, ENOBUFS: events were dropped, anything may have changed)."""

    kind: Literal["new", "del", "lost"]
    ifindex: int = 0
    ifname: str = ""
    up: bool | None = None          # IFF_UP
    running: bool | None = None     # IFF_RUNNING (carrier)
    operstate: str = ""

    def describe(self) -> str:
        if self.kind == "lost":
            return "link events lost (socket overflow)"
        if self.kind == "del":
            return f"{self.ifname or self.ifindex} removed"
        state = self.operstate or ("up" if self.up else "down")
        return f"{self.ifname or self.ifindex} {state}"


def _align4(n: int) -> int:
    return (n + 3) & ~3


def parse_link_messages(data: bytes) -> list[LinkEvent]:
    """Pure: the RTM_NEWLINK/RTM_DELLINK messages of one netlink datagram, in order. Other message
    types are skipped; a truncated message ends the parse (the kernel never sends one)."""
    out: list[LinkEvent] = []
    pos = 0
    while pos + _NLMSGHDR.size <= len(data):
        length, mtype, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, pos)
        if length < _NLMSGHDR.size or pos + length > len(data):
            break
        body = pos + _NLMSGHDR.size
        if mtype == NLMSG_OVERRUN:
            out.append(LinkEvent("lost"))
        elif mtype in (RTM_NEWLINK, RTM_DELLINK) and length >= _NLMSGHDR.size + _IFINFOMSG.size:
            _fam, _type, index, flags, _change = _IFINFOMSG.unpack_from(data, body)
            name, oper = "", ""
            a = body + _IFINFOMSG.size
            end = pos + length
            while a + _RTATTR.size <= end:
                alen, atype = _RTATTR.unpack_from(data, a)
                if alen < _RTATTR.size or a + alen > end:
                    break
                payload = data[a + _RTATTR.size:a + alen]
                if atype == IFLA_IFNAME:
                    name = payload.split(b"\0", 1)[0].decode("utf-8", "replace")
                elif atype == IFLA_OPERSTATE and payload:
                    oper = OPERSTATES[payload[0]] if payload[0] < len(OPERSTATES) else str(payload[0])
                a += _align4(alen)
            out.append(LinkEvent("new" if mtype == RTM_NEWLINK else "del", index, name,
                                 bool(flags & IFF_UP), bool(flags & IFF_RUNNING), oper))
        pos += _align4(length)
    return out


def encode_link_message(event: LinkEvent, seq: int = 0) -> bytes:
    """Inverse of parse_link_messages for one event (tests and the fake source build datagrams)."""
    attrs = b""
    for atype, payload in ((IFLA_IFNAME, event.ifname.encode() + b"\0"),
                           (IFLA_OPERSTATE, bytes([OPERSTATES.index(event.operstate)])
                            if event.operstate in OPERSTATES else b"")):
        if payload:
            alen = _RTATTR.size + len(payload)
            attrs += _RTATTR.pack(alen, atype) + payload + b"\0" * (_align4(alen) - alen)
    flags = (IFF_UP if event.up else 0) | (IFF_RUNNING if event.running else 0)
    body = _IFINFOMSG.pack(0, 0, event.ifindex, flags, 0) + attrs
    mtype = RTM_DELLINK if event.kind == "del" else RTM_NEWLINK
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), mtype, 0, seq, 0) + body


class LinkEventSource(Protocol):
    def poll(self) -> list[LinkEvent]:
        """Every notification received since the last call; never blocks."""
        ...

    def close(self) -> None: ...


class NetlinkLinkEvents:
    """RTMGRP_LINK notifications of the caller's network namespace (the host's devices)."""

    def __init__(self) -> None:
        try:
            s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
                              NETLINK_ROUTE)
        except OSError as e:
            raise HostError(f"cannot open an rtnetlink socket for link events: {e.strerror}", errno=e.errno) from e
        try:
            s.bind((0, RTMGRP_LINK))
        except OSError as e:
            s.close()
            raise HostError(f"cannot subscribe to rtnetlink link events (RTMGRP_LINK): {e.strerror}",
                            errno=e.errno) from e
        self._sock: socket.socket | None = s

    def poll(self) -> list[LinkEvent]:
        out: list[LinkEvent] = []
        while self._sock is not None:
            try:
                data = self._sock.recv(65536)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.ENOBUFS:   # the kernel dropped notifications: say so, keep going
                    out.append(LinkEvent("lost"))
                    continue
                raise HostError(f"rtnetlink link events: {e.strerror}", errno=e.errno) from e
            if not data:
                break
            out += parse_link_messages(data)
        return out

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class FileLinkEvents:
    """Fake link notifications for fake trees (tests, ``polltuned run --simulate``): datagrams
    appended to ``ROOT/netlink/link-events`` as lines of hex (``encode_link_message(...).hex()``);
    each poll returns the lines added since the previous one."""

    PATH = "/netlink/link-events"

    def __init__(self, host: Host) -> None:
        self.host = host
        self._seen = len(self._lines())

    def _lines(self) -> list[str]:
        if not self.host.exists(self.PATH):
            return []
        return [ln for ln in self.host.read_text(self.PATH).splitlines() if ln.strip()]

    def poll(self) -> list[LinkEvent]:
        lines = self._lines()
        new, self._seen = lines[self._seen:], len(lines)
        out: list[LinkEvent] = []
        for ln in new:
            try:
                out += parse_link_messages(bytes.fromhex(ln.strip()))
            except ValueError:
                out.append(LinkEvent("lost"))
        return out

    def close(self) -> None:
        pass


def open_link_events(host: Host) -> LinkEventSource:
    """The host's link notifications: rtnetlink on a real host, the fake file on a fake tree."""
    if host.is_real:
        return NetlinkLinkEvents()
    return FileLinkEvents(host)

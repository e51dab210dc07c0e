"""TCP socket RTTs from the kernel through sock_diag (NETLINK_SOCK_DIAG, inet_diag).

The kernel answers an inet_diag dump of established TCP sockets with one ``inet_diag_msg`` per socket
and, when ``INET_DIAG_INFO`` is requested, a ``struct tcp_info`` (include/uapi/linux/tcp.h) whose
``tcpi_rtt``/``tcpi_rttvar`` are the smoothed RTT and its variance in µs. This is what ``ss -ti``
prints as ``rtt:<srtt>/<rttvar>`` (in ms there).

A named network namespace is entered only for the creation of the netlink socket (pyroute2
pushns/popns); the socket stays bound to that namespace afterwards.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from polltuned.errors import HostError

_SS_ESTABLISHED = 1  # include/net/tcp_states.h: TCP_ESTABLISHED
_INET_DIAG_INFO = 2  # include/uapi/linux/inet_diag.h: INET_DIAG_INFO (extension bit = 1 << (2 - 1))


@dataclass(frozen=True)
class TcpSock:
    src: str
    sport: int
    dst: str
    dport: int
    rtt_us: float
    rttvar_us: float


class SockDiag:
    """A reusable sock_diag netlink socket (optionally inside a named netns)."""

    def __init__(self, netns: str | None = None) -> None:
        from pyroute2 import DiagSocket

        self.netns = netns
        if netns is not None and not os.path.exists(os.path.join("/run/netns", netns)):
            # pyroute2's pushns() would *create* a missing namespace (O_CREAT): refuse instead
            raise HostError(f"network namespace {netns!r} does not exist (no /run/netns/{netns})")
        try:
            if netns is not None:
                from pyroute2 import netns as pr_netns

                pr_netns.pushns(netns)
                try:
                    self._ds = DiagSocket()
                finally:
                    pr_netns.popns()
            else:
                self._ds = DiagSocket()
            self._ds.bind()
        except OSError as e:
            where = f" in netns {netns}" if netns else ""
            raise HostError(f"cannot open a sock_diag netlink socket{where}: {e}", errno=e.errno) from e

    def established_tcp(self, families: Sequence[int] = (socket.AF_INET, socket.AF_INET6)) -> list[TcpSock]:
        out: list[TcpSock] = []
        for fam in families:
            try:
                msgs = self._ds.get_sock_stats(family=fam, states=1 << _SS_ESTABLISHED,
                                               extensions=1 << (_INET_DIAG_INFO - 1))
            except OSError as e:
                raise HostError(f"sock_diag dump failed: {e}", errno=e.errno) from e
            for m in msgs:
                info = m.get_attr("INET_DIAG_INFO")
                if info is None:
                    continue
                rtt = info.get("tcpi_rtt")
                if rtt is None:
                    continue
                out.append(TcpSock(str(m["idiag_src"]), int(m["idiag_sport"]), str(m["idiag_dst"]),
                                   int(m["idiag_dport"]), float(rtt), float(info.get("tcpi_rttvar") or 0)))
        return out

    def close(self) -> None:
        self._ds.close()

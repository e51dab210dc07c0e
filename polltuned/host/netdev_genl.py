"""The ``netdev`` generic-netlink family: napi-get, napi-set, queue-get and policy detection.

pyroute2 0.9.7 has no netdev family (knobs.md section 5), so this module defines the message
class itself (attribute ids from include/uapi/linux/netdev.h, Documentation/netlink/specs/netdev.yaml):

* commands: ``QUEUE_GET = 10``, ``NAPI_GET = 11``, ``NAPI_SET = 14``;
* napi attributes: ``IFINDEX=1 u32``, ``ID=2 u32``, ``IRQ=3 u32``, ``PID=4 u32``,
  ``DEFER_HARD_IRQS=5 u32 (0..S32_MAX)``, ``GRO_FLUSH_TIMEOUT=6 uint (ns)``,
  ``IRQ_SUSPEND_TIMEOUT=7 uint (ns)``, ``THREADED=8 u32 (0..1 on 6.18; 2 = busy-poll later)``.

``uint`` (NLA_UINT) attributes arrive as 4 or 8 little-endian bytes; they are decoded as raw
bytes and sent as 8-byte u64 (the kernel accepts both).

Feature detection reads the family policy (CTRL_CMD_GETPOLICY): ``napi-set`` (op 14) present means
6.13+, and its per-attribute maxima give the accepted ranges (threaded max 2 => threaded busy-poll).
The socket is opened in the namespace of the device (``netns=``), because napi ids are looked up
in the netns of the socket.

Fake trees (tests, ``host.is_real`` false) use :class:`FileNetdev`: ``ROOT/netdev/policy``
(lines ``attr max``: the napi-set policy) and one file per value ``ROOT/netdev/NS/DEV/NAPI_ID/ATTR``
(NS ``-`` for the host netns). It follows the same contract, including ENOENT for unknown ids.
Older kernels are faked by what is missing, as the real family reports it (knobs.md section 2):
no ``ROOT/netdev`` at all = no netdev family (before 6.3); ``ROOT/netdev/ops`` lists the family's
operations when it is not the full 6.13+ set (``dev-get`` only before 6.8, ``napi-get`` without
``napi-set`` before 6.13; napi-get then reports NAPIs without per-NAPI config attributes).
"""

from __future__ import annotations

import errno as errno_mod
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from polltuned.errors import HostError, ParseError
from polltuned.host.fs import Host

CMD_QUEUE_GET = 10
CMD_NAPI_GET = 11
CMD_NAPI_SET = 14

#: napi-set attribute name (kernel spelling) -> netlink attribute id
NAPI_ATTR_IDS: dict[str, int] = {
    "defer-hard-irqs": 5,
    "gro-flush-timeout": 6,
    "irq-suspend-timeout": 7,
    "threaded": 8,
}
NL_ATTR_TYPE_UINT = 17


@dataclass(frozen=True)
class NapiInfo:
    id: int
    ifindex: int
    irq: int | None = None
    pid: int | None = None
    values: Mapping[str, int] = field(default_factory=dict)   # napi-set attribute name -> value


@dataclass(frozen=True)
class NapiSetCaps:
    """What ``napi-set`` accepts on this kernel: attribute name -> (min, max)."""

    present: bool
    attrs: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    reason: str = ""


class NetdevApi(Protocol):
    def caps(self) -> NapiSetCaps: ...
    def napis(self, ifindex: int) -> list[NapiInfo]: ...
    def napi_set(self, napi_id: int, values: Mapping[str, int]) -> None: ...


U64_MAX = 2**64 - 1


def parse_policy_dump(ops: Mapping[int, int], policies: Mapping[int, Mapping[int, tuple[int, int | None, int | None]]]
                      ) -> NapiSetCaps:
    """Pure: napi-set capabilities from a decoded CTRL_CMD_GETPOLICY dump.

    ``ops``: op number -> index of its DO policy (``CTRL_ATTR_OP_POLICY``/``CTRL_ATTR_POLICY_DO``).
    ``policies``: policy index -> attribute id -> (NL_POLICY_TYPE_ATTR_TYPE, MIN_VALUE, MAX_VALUE).
    pyroute2 prints an unsigned 2^64-1 maximum as -1 (knobs.md section 5), mapped back here.
    """
    idx = ops.get(CMD_NAPI_SET)
    if idx is None:
        return NapiSetCaps(False, reason="netdev napi-set not in the family policy (kernel before 6.13)")
    pol = policies.get(idx, {})
    attrs: dict[str, tuple[int, int]] = {}
    for name, aid in NAPI_ATTR_IDS.items():
        if aid not in pol:
            continue
        typ, lo, hi = pol[aid]
        if hi is None or hi < 0:
            hi = U64_MAX if typ == NL_ATTR_TYPE_UINT else 2**32 - 1
        attrs[name] = (lo or 0, hi)
    return NapiSetCaps(True, attrs)


def _policy_from_pyroute2(msgs: Iterable[Any]) -> NapiSetCaps:
    ops: dict[int, int] = {}
    policies: dict[int, dict[int, tuple[int, int | None, int | None]]] = {}
    for m in msgs:
        op_pol = m.get_attr("CTRL_ATTR_OP_POLICY")
        if op_pol is not None:
            for name, val in op_pol["attrs"]:
                if name.startswith("OP("):
                    op = int(name[3:-1])
                    do = dict(val["attrs"]).get("CTRL_ATTR_POLICY_DO")
                    if do is not None:
                        ops[op] = int(do)
        pol = m.get_attr("CTRL_ATTR_POLICY")
        if pol is not None:
            for pname, pval in pol["attrs"]:
                pidx = int(pname[len("POLICY("):-1])
                for aname, aval in pval["attrs"]:
                    aid = int(aname[len("ATTR("):-1])
                    d = dict(aval["attrs"])
                    policies.setdefault(pidx, {})[aid] = (
                        int(d.get("NL_POLICY_TYPE_ATTR_TYPE", 0)),
                        d.get("NL_POLICY_TYPE_ATTR_MIN_VALUE_U", d.get("NL_POLICY_TYPE_ATTR_MIN_VALUE_S")),
                        d.get("NL_POLICY_TYPE_ATTR_MAX_VALUE_U", d.get("NL_POLICY_TYPE_ATTR_MAX_VALUE_S")),
                    )
    return parse_policy_dump(ops, policies)


def _le_uint(raw: Any) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, int):
        return raw
    return int.from_bytes(bytes(raw), "little")


class GenlNetdev:
    """Real netdev genl access through pyroute2 (lazy import), in netns ``netns`` (None = ours)."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        #: napis()'s socket, kept between calls (opening one inside a netns forks a helper); a
        #: failure or an empty dump on a kept socket is retried once on a fresh one
        self._sock: Any = None
        self._cls: tuple[Any, Any] | None = None

    def close(self) -> None:
        s, self._sock = self._sock, None
        if s is not None:
            try:
                s.close()
            except OSError:
                pass

    def _classes(self) -> tuple[Any, Any]:
        from pyroute2.netlink import genlmsg

        def napi_attrs(timeout_type: str) -> tuple[tuple[str, str], ...]:
            # replies carry the 64-bit timeouts as NLA_UINT (4 or 8 bytes: decoded by hand from cdata);
            # requests send them as u64, which the kernel accepts
            return (
                ("NETDEV_A_NAPI_UNSPEC", "none"),
                ("NETDEV_A_NAPI_IFINDEX", "uint32"),
                ("NETDEV_A_NAPI_ID", "uint32"),
                ("NETDEV_A_NAPI_IRQ", "uint32"),
                ("NETDEV_A_NAPI_PID", "uint32"),
                ("NETDEV_A_NAPI_DEFER_HARD_IRQS", "uint32"),
                ("NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT", timeout_type),
                ("NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT", timeout_type),
                ("NETDEV_A_NAPI_THREADED", "uint32"),
            )

        class napi_reply(genlmsg):  # type: ignore[misc]
            nla_map = napi_attrs("cdata")

        class napi_request(genlmsg):  # type: ignore[misc]
            nla_map = napi_attrs("uint64")

        return napi_reply, napi_request

    def _socket(self, reply_cls: Any) -> Any:
        from pyroute2.netlink.exceptions import NetlinkError
        from pyroute2.netlink.generic import GenericNetlinkSocket

        kw: dict[str, Any] = {"netns": self.netns} if self.netns else {}
        try:
            s = GenericNetlinkSocket(**kw)
            s.bind("netdev", reply_cls)
        except NetlinkError as e:
            raise HostError(f"netdev genl family unavailable: {os.strerror(e.code)}", errno=e.code) from e
        except OSError as e:
            raise HostError(f"netdev genl socket{' in netns ' + self.netns if self.netns else ''}: {e}",
                            errno=e.errno) from e
        return s

    def caps(self) -> NapiSetCaps:
        reply, _ = self._classes()
        try:
            s = self._socket(reply)
        except HostError as e:
            return NapiSetCaps(False, reason=f"netdev genl family not available ({e.message}; kernel before 6.3?)")
        try:
            return _policy_from_pyroute2(s.policy("netdev"))
        except Exception as e:  # policy dump unsupported on very old kernels
            return NapiSetCaps(False, reason=f"netdev family policy dump failed: {e}")
        finally:
            s.close()

    def napis(self, ifindex: int) -> list[NapiInfo]:
        from pyroute2.netlink.exceptions import NetlinkError

        if self._cls is None:
            self._cls = self._classes()
        reply = self._cls[0]
        for attempt in (1, 2):
            kept = self._sock is not None
            if self._sock is None:
                self._sock = self._socket(reply)
            try:
                out = _napi_dump(self._sock, reply, ifindex)
            except (NetlinkError, OSError) as e:
                self.close()
                if kept and attempt == 1:
                    continue
                code = e.code if isinstance(e, NetlinkError) else (e.errno or 0)
                raise HostError(f"napi-get ifindex {ifindex}: {os.strerror(code)}", errno=code) from e
            if out or not kept or attempt == 2:
                return out
            self.close()   # nothing on a kept socket: the namespace may have been re-created; ask afresh
        raise AssertionError("unreachable")

    def napi_set(self, napi_id: int, values: Mapping[str, int]) -> None:
        from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
        from pyroute2.netlink.exceptions import NetlinkError

        reply, request = self._classes()
        s = self._socket(reply)
        try:
            m = request()
            m["cmd"] = CMD_NAPI_SET
            m["version"] = 1
            m["attrs"].append(["NETDEV_A_NAPI_ID", napi_id])
            for name, v in values.items():
                m["attrs"].append(["NETDEV_A_NAPI_" + name.upper().replace("-", "_"), int(v)])
            tuple(s.nlm_request(m, msg_type=s.prid, msg_flags=NLM_F_REQUEST | NLM_F_ACK))
        except NetlinkError as e:
            raise HostError(f"napi-set id {napi_id} {dict(values)}: {os.strerror(e.code)}", errno=e.code) from e
        finally:
            s.close()


class FileNetdev:
    """Fake netdev family over files (see module doc); used when the Host is a fake tree."""

    def __init__(self, host: Host, netns: str | None, ifname_by_index: Mapping[int, str]) -> None:
        self.host = host
        self.ns = netns or "-"
        self.ifname_by_index = dict(ifname_by_index)

    def _ops(self) -> set[str] | None:
        """The family's operations from ``/netdev/ops``; None = the full 6.13+ set."""
        if not self.host.exists("/netdev/ops"):
            return None
        return {ln.strip() for ln in self.host.read_text("/netdev/ops").splitlines() if ln.strip()}

    def caps(self) -> NapiSetCaps:
        p = "/netdev/policy"
        if not self.host.exists("/netdev"):
            return NapiSetCaps(False, reason="netdev genl family not available (kernel before 6.3)")
        ops = self._ops()
        if not self.host.exists(p) or (ops is not None and "napi-set" not in ops):
            return NapiSetCaps(False, reason="netdev napi-set not in the family policy (kernel before 6.13)")
        attrs: dict[str, tuple[int, int]] = {}
        for line in self.host.read_text(p).splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in NAPI_ATTR_IDS:
                attrs[parts[0]] = (0, int(parts[1]))
        return NapiSetCaps(True, attrs)

    def _dir(self, ifindex: int) -> str:
        name = self.ifname_by_index.get(ifindex)
        if name is None:
            raise HostError(f"napi-get: no device with ifindex {ifindex}", errno=errno_mod.ENODEV)
        return f"/netdev/{self.ns}/{name}"

    def napis(self, ifindex: int) -> list[NapiInfo]:
        if not self.host.exists("/netdev"):
            raise HostError("netdev genl family unavailable (kernel before 6.3)", errno=errno_mod.EOPNOTSUPP)
        ops = self._ops()
        if ops is not None and "napi-get" not in ops:
            raise HostError(f"napi-get ifindex {ifindex}: {os.strerror(errno_mod.EOPNOTSUPP)} (kernel before 6.8)",
                            errno=errno_mod.EOPNOTSUPP)
        d = self._dir(ifindex)
        out = []
        for nid in self.host.glob(d, "*"):
            vals: dict[str, int] = {}
            for a in self.host.glob(f"{d}/{nid}", "*"):
                if a in NAPI_ATTR_IDS:
                    text = self.host.read_text(f"{d}/{nid}/{a}").strip()
                    try:
                        vals[a] = int(text)
                    except ValueError:
                        raise ParseError(f"{d}/{nid}/{a}", 1, f"expected an integer, got {text[:40]!r}") from None
            out.append(NapiInfo(int(nid), ifindex, None, None, vals))
        return sorted(out, key=lambda n: n.id)

    def napi_set(self, napi_id: int, values: Mapping[str, int]) -> None:
        caps = self.caps()
        if not caps.present:
            raise HostError(f"napi-set id {napi_id}: {os.strerror(errno_mod.EOPNOTSUPP)} ({caps.reason})",
                            errno=errno_mod.EOPNOTSUPP)
        for base in self.host.glob(f"/netdev/{self.ns}", "*"):
            d = f"/netdev/{self.ns}/{base}/{napi_id}"
            if self.host.exists(d):
                for name, v in values.items():
                    lo, hi = caps.attrs.get(name, (0, U64_MAX))
                    if not lo <= v <= hi:
                        raise HostError(f"napi-set id {napi_id}: {os.strerror(errno_mod.ERANGE)}",
                                        errno=errno_mod.ERANGE)
                for name, v in values.items():  # atomic per attribute, like the kernel's napi-set
                    target = self.host.path(f"{d}/{name}")
                    tmp = target.with_name(f".{name}.tmp")
                    tmp.write_text(f"{v}\n")
                    os.replace(tmp, target)
                return
        raise HostError(f"napi-set id {napi_id}: {os.strerror(errno_mod.ENOENT)}", errno=errno_mod.ENOENT)


def _napi_dump(s: Any, reply: Any, ifindex: int) -> list[NapiInfo]:
    """One NAPI_GET dump for ``ifindex`` on the genl socket ``s`` (pyroute2)."""
    from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST

    m = reply()
    m["cmd"] = CMD_NAPI_GET
    m["version"] = 1
    m["attrs"].append(["NETDEV_A_NAPI_IFINDEX", ifindex])
    out = []
    for r in s.nlm_request(m, msg_type=s.prid, msg_flags=NLM_F_REQUEST | NLM_F_DUMP):
        if r.get_attr("NETDEV_A_NAPI_IFINDEX") != ifindex:
            continue
        vals: dict[str, int] = {}
        for name, attr in (("defer-hard-irqs", "NETDEV_A_NAPI_DEFER_HARD_IRQS"),
                           ("gro-flush-timeout", "NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT"),
                           ("irq-suspend-timeout", "NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT"),
                           ("threaded", "NETDEV_A_NAPI_THREADED")):
            v = _le_uint(r.get_attr(attr))
            if v is not None:
                vals[name] = v
        out.append(NapiInfo(int(r.get_attr("NETDEV_A_NAPI_ID")), ifindex,
                            r.get_attr("NETDEV_A_NAPI_IRQ"), r.get_attr("NETDEV_A_NAPI_PID"), vals))
    return sorted(out, key=lambda n: n.id)

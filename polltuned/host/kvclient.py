"""A small memcached GET client, closed-loop or open-loop at a set rate, that prints latency as JSON.

    python -m polltuned.host.kvclient --server 198.18.230.2 --port 11211 --connections 4 \\
        --duration 2 --keys 1000 --value-size 64 --preload [--rate 20000 --arrivals poisson]

Debian packages no memcached client that reports latency percentiles (libmemcached-tools'
memslap prints only totals; memtier_benchmark is not packaged), so polltuned ships this one for
the bench's ``memcached`` workload. It is also an example of a ``command`` probe client.

Closed loop (no ``--rate``): opens ``--connections`` TCP connections (TCP_NODELAY), optionally stores ``--keys``
keys of ``--value-size`` bytes (``set ... noreply``, then one ``version`` round trip to sync), then
for ``--duration`` seconds keeps exactly one ``get`` outstanding per connection (closed loop) and
records each request's latency from just before ``send`` to the end of its ``END\\r\\n``. One
thread, one epoll (``selectors``), the same few Python operations per request: the client's own
overhead is small (a few µs) and constant across configurations. Keys are visited in a fixed
stride order, so every run asks the same sequence.

Open loop (``--rate R`` requests/s, ``--arrivals poisson|uniform``, ``--depth D``, ``--seed S``):
requests are sent on a schedule fixed before the run whatever the replies do, pipelined up to
``--depth`` per connection, and each is timed from its *intended* send time, so a server stall
is counted for every request scheduled during it (no coordinated omission; see
polltuned.host.openloop for the schedule, the queueing and the bounds).

Output (stdout, one JSON document): ``{"v": 1, "mode": "closed"|"open", "requests": N,
"duration_s": S, "throughput_rps": R, "latency_us": {"p50", "p90", "p99", "p999", "mean", "max",
"min"}, "misses": M, "connections": C, "histogram": {"format": "hdrhistogram-v2-compressed",
"unit": "ns", "count", "encoded", ...}}`` (polltuned.histogram); open loop adds ``rate_rps``,
``arrivals``, ``offered`` (requests scheduled in the window), ``achieved_rps`` (replies per second
during the window; also ``throughput_rps``), ``sent_rps``, ``behind_schedule`` (requests sent more
than 1 ms after their intended time), ``unanswered``, ``service_latency_us`` (from the actual
send), ``send_lag_us`` and ``depth``. Exit 0 on success; 2 on a usage error; 1 when the server does
not answer (connect failure, 2 s without any reply, a closed connection, an error reply), with one
line on stderr. Every run is bounded: ``--duration`` at most 600 s, an open-loop schedule at most
5 million requests.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
from collections.abc import Sequence

from polltuned.host.openloop import (
    ARRIVALS,
    Arrivals,
    LoadError,
    check_schedule,
    closed_loop_document,
    open_loop_document,
    percentiles_us,
    run_closed_loop,
    run_open_loop,
    schedule_ns,
)

STALL_S = 2.0
MAX_DURATION_S = 600.0
MAX_DEPTH = 1024

__all__ = ["KvError", "main", "parse_get_replies", "percentiles_us", "result_document", "run", "run_open"]


def result_document(latencies_ns: Sequence[int], duration_s: float, misses: int, connections: int) -> dict[str, object]:
    """Pure: the JSON document the closed-loop client prints (openloop's, with ``misses``)."""
    return closed_loop_document(latencies_ns, duration_s, misses, connections)


KvError = LoadError


def parse_get_replies(buf: bytes) -> tuple[list[bool], int]:
    """Pure: the complete single-key ``get`` replies at the start of ``buf`` (True for a miss: a
    bare ``END``; False for ``VALUE <key> <flags> <bytes>\\r\\n<data>\\r\\nEND``) and the bytes they
    take (memcached protocol.txt, "Retrieval command"). Raises KvError on an error reply."""
    flags: list[bool] = []
    pos = 0
    n = len(buf)
    while pos < n:
        if buf.startswith(b"END\r\n", pos):
            flags.append(True)
            pos += 5
            continue
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            break
        line = buf[pos:eol]
        if not line.startswith(b"VALUE "):
            raise KvError(f"server replied {line[:80]!r}")
        parts = line.split()
        try:
            size = int(parts[3])
        except (IndexError, ValueError):
            raise KvError(f"malformed VALUE line {line[:80]!r}") from None
        end = eol + 2 + size + 2
        if n < end + 5:
            break
        if buf[end:end + 5] != b"END\r\n":
            raise KvError(f"expected END after one value, got {buf[end:end + 16]!r}")
        flags.append(False)
        pos = end + 5
    return flags, pos


class _GetWire:
    def __init__(self, keys: int, offset: int = 0) -> None:
        self._reqs = [b"get k%d\r\n" % i for i in range(keys)]
        self._keys = keys
        self._stride = 7919 if keys % 7919 else 1
        self._offset = offset

    def request(self, i: int) -> bytes:
        return self._reqs[(self._offset + i * self._stride) % self._keys]

    def parse(self, buf: bytes) -> tuple[list[bool], int]:
        return parse_get_replies(buf)


def _connect(server: str, port: int, timeout_s: float) -> socket.socket:
    s = socket.create_connection((server, port), timeout=timeout_s)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _recv_until(s: socket.socket, end: bytes) -> bytes:
    buf = b""
    while not buf.endswith(end):
        chunk = s.recv(65536)
        if not chunk:
            raise KvError("server closed the connection")
        buf += chunk
    return buf


def preload(s: socket.socket, keys: int, value_size: int) -> None:
    value = b"x" * value_size
    batch = b"".join(b"set k%d 0 0 %d noreply\r\n%s\r\n" % (i, value_size, value) for i in range(keys))
    s.sendall(batch + b"version\r\n")
    reply = _recv_until(s, b"\r\n")
    if not reply.startswith(b"VERSION"):
        raise KvError(f"preload failed: {reply[:80]!r}")


def run(server: str, port: int, connections: int, duration_s: float, keys: int,
        value_size: int, do_preload: bool, warmup_s: float) -> dict[str, object]:
    """Closed loop over ``connections`` (polltuned.host.openloop.run_closed_loop with memcached GETs)."""
    socks = [_connect(server, port, STALL_S) for _ in range(connections)]
    try:
        if do_preload:
            preload(socks[0], keys, value_size)
        lat, misses, elapsed = run_closed_loop(socks, _GetWire(keys), warmup_s, duration_s)
        return result_document(lat, elapsed, misses, connections)
    finally:
        for s in socks:
            s.close()


def run_open(server: str, port: int, connections: int, duration_s: float, keys: int, value_size: int,
             do_preload: bool, warmup_s: float, *, rate: float, arrivals: Arrivals, depth: int,
             seed: int) -> dict[str, object]:
    """Open loop at ``rate`` requests/s (see the module docstring)."""
    rng = random.Random(seed)
    warm = schedule_ns(rate, warmup_s, arrivals, rng)
    start = int(warmup_s * 1e9)
    meas = schedule_ns(rate, duration_s, arrivals, rng, start_ns=start)
    socks = [_connect(server, port, STALL_S) for _ in range(connections)]
    try:
        if do_preload:
            preload(socks[0], keys, value_size)
        res = run_open_loop(socks, _GetWire(keys), warm + meas, len(warm), (start, start + int(duration_s * 1e9)),
                            depth=depth)
        return open_loop_document(res, rate=rate, arrivals=arrivals, connections=connections, depth=depth)
    finally:
        for s in socks:
            s.close()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m polltuned.host.kvclient", description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--port", type=int, default=11211)
    ap.add_argument("--connections", type=int, default=1)
    ap.add_argument("--duration", type=float, default=2.0, help="seconds of measurement")
    ap.add_argument("--warmup", type=float, default=0.0, help="seconds before recording starts")
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--value-size", type=int, default=64)
    ap.add_argument("--preload", action="store_true", help="store the keys first (set noreply)")
    ap.add_argument("--rate", type=float, default=None,
                    help="open loop: requests/s, sent on schedule and timed from the intended send time")
    ap.add_argument("--arrivals", choices=ARRIVALS, default="poisson", help="open loop: the schedule's arrivals")
    ap.add_argument("--depth", type=int, default=64, help="open loop: requests in flight per connection at most")
    ap.add_argument("--seed", type=int, default=0, help="open loop: seed of the Poisson schedule")
    a = ap.parse_args(argv)
    if not (0 < a.duration <= MAX_DURATION_S) or not (0 <= a.warmup <= 60):
        print(f"kvclient: --duration must be in (0, {MAX_DURATION_S:g}] and --warmup in [0, 60]", file=sys.stderr)
        return 2
    if not (1 <= a.connections <= 1024) or a.keys < 1 or not (1 <= a.value_size <= 1_000_000):
        print("kvclient: --connections in [1, 1024], --keys >= 1, --value-size in [1, 1e6]", file=sys.stderr)
        return 2
    if a.rate is not None:
        try:
            check_schedule(a.rate, a.duration + a.warmup)
        except ValueError as e:
            print(f"kvclient: --rate: {e}", file=sys.stderr)
            return 2
    if not (1 <= a.depth <= MAX_DEPTH):
        print(f"kvclient: --depth in [1, {MAX_DEPTH}]", file=sys.stderr)
        return 2
    try:
        if a.rate is None:
            doc = run(a.server, a.port, a.connections, a.duration, a.keys, a.value_size, a.preload, a.warmup)
        else:
            doc = run_open(a.server, a.port, a.connections, a.duration, a.keys, a.value_size, a.preload, a.warmup,
                           rate=a.rate, arrivals=a.arrivals, depth=a.depth, seed=a.seed)
    except (OSError, KvError, ValueError) as e:
        print(f"kvclient: {a.server}:{a.port}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(doc, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

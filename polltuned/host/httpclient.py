"""A small HTTP/1.1 keep-alive GET client, closed-loop or open-loop at a set rate, that prints latency as JSON.

    python -m polltuned.host.httpclient --url http://198.18.230.2:8080/index.html --connections 4 \\
        --duration 2 [--rate 5000 --arrivals poisson]

Why polltuned ships one: Debian packages wrk but not wrk2, and none of its HTTP load generators
(wrk, hey, siege, httperf, h2load, ab) times requests from their *intended* send time: wrk, hey
and siege are closed loops; hey's ``-q`` and httperf's/h2load's ``--rate`` pace the sends but
time each request from its actual send, so a server stall is sampled once (coordinated omission).
This one is the open-loop engine of polltuned.host.openloop with an HTTP/1.1 wire.

Closed loop (no ``--rate``): one request outstanding per keep-alive connection, the next sent
when the reply has arrived (as wrk does). Open loop (``--rate R`` requests/s, ``--arrivals
poisson|uniform``, ``--depth D``, ``--seed S``): requests follow a schedule fixed before the run
and are timed from their intended send time; ``--depth`` (default 1: no pipelining, as browsers
and wrk) bounds the requests in flight per connection, and a request that finds every connection
busy waits in the client, still timed from its intended time: give enough ``--connections`` for
the rate (``behind_schedule`` says when there were too few).

Replies must carry Content-Length (a static file server's do; chunked replies are refused). A
status >= 400 counts in ``non2xx``. Output (stdout, one JSON document): as kvclient's
(``mode``, ``requests``, ``duration_s``, ``throughput_rps``, ``latency_us``, ``histogram``, and in
open loop ``rate_rps``, ``achieved_rps``, ``behind_schedule``, ``service_latency_us``, ...), with
``non2xx`` for kvclient's ``misses``. Exit 0 on success; 2 on a usage error; 1 when the server
does not answer (connect failure, 2 s without any reply, a closed connection, a malformed reply).
Every run is bounded: ``--duration`` at most 600 s, a schedule at most 5 million requests.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import socket
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from polltuned.host.openloop import (
    ARRIVALS,
    STALL_S,
    LoadError,
    check_schedule,
    closed_loop_document,
    open_loop_document,
    run_closed_loop,
    run_open_loop,
    schedule_ns,
)

MAX_DURATION_S = 600.0
MAX_DEPTH = 64
_STATUS = re.compile(rb"^HTTP/1\.[01] (\d{3})")
_HEADER_END = b"\r\n\r\n"


def parse_http_replies(buf: bytes) -> tuple[list[bool], int]:
    """Pure: the complete HTTP/1.1 replies at the start of ``buf`` (True for a status >= 400) and
    the bytes they take (RFC 9112 §6: the body length is Content-Length; no body for 1xx/204/304).
    Raises LoadError on a malformed reply, a chunked one or ``Connection: close``."""
    flags: list[bool] = []
    pos = 0
    while True:
        end = buf.find(_HEADER_END, pos)
        if end < 0:
            if len(buf) - pos > 65536:
                raise LoadError("reply header longer than 64 KiB")
            break
        head = buf[pos:end]
        m = _STATUS.match(head)
        if m is None:
            raise LoadError(f"not an HTTP/1.x reply: {head[:60]!r}")
        status = int(m.group(1))
        length: int | None = None
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise LoadError(f"bad Content-Length {value[:20]!r}") from None
            elif name == b"transfer-encoding" and value != b"identity":
                raise LoadError(f"Transfer-Encoding {value.decode(errors='replace')} replies are not supported")
            elif name == b"connection" and value == b"close":
                raise LoadError("the server closes the connection (Connection: close): no keep-alive")
        if length is None:
            if status in (204, 304) or 100 <= status < 200:
                length = 0
            else:
                raise LoadError(f"HTTP {status} reply without Content-Length")
        body_end = end + 4 + length
        if len(buf) < body_end:
            break
        flags.append(status >= 400)
        pos = body_end
    return flags, pos


class _GetWire:
    def __init__(self, host: str, path: str) -> None:
        self._req = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: polltuned-httpclient\r\n\r\n".encode()

    def request(self, i: int) -> bytes:
        return self._req

    def parse(self, buf: bytes) -> tuple[list[bool], int]:
        return parse_http_replies(buf)


def _connect(host: str, port: int) -> socket.socket:
    s = socket.create_connection((host, port), timeout=STALL_S)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def parse_url(url: str) -> tuple[str, int, str, str]:
    """Pure: (host, port, path, Host header) of an ``http://`` URL; ValueError otherwise."""
    u = urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"--url must be http://host[:port]/path (got {url!r})")
    port = u.port or 80
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    return u.hostname, port, path, u.netloc


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m polltuned.host.httpclient", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--connections", type=int, default=1)
    ap.add_argument("--duration", type=float, default=2.0, help="seconds of measurement")
    ap.add_argument("--warmup", type=float, default=0.0, help="seconds before recording starts")
    ap.add_argument("--rate", type=float, default=None,
                    help="open loop: requests/s, sent on schedule and timed from the intended send time")
    ap.add_argument("--arrivals", choices=ARRIVALS, default="poisson", help="open loop: the schedule's arrivals")
    ap.add_argument("--depth", type=int, default=1, help="open loop: requests in flight per connection (pipelining)")
    ap.add_argument("--seed", type=int, default=0, help="open loop: seed of the Poisson schedule")
    a = ap.parse_args(argv)
    try:
        host, port, path, host_header = parse_url(a.url)
    except ValueError as e:
        print(f"httpclient: {e}", file=sys.stderr)
        return 2
    if not (0 < a.duration <= MAX_DURATION_S) or not (0 <= a.warmup <= 60):
        print(f"httpclient: --duration must be in (0, {MAX_DURATION_S:g}] and --warmup in [0, 60]", file=sys.stderr)
        return 2
    if not (1 <= a.connections <= 1024) or not (1 <= a.depth <= MAX_DEPTH):
        print(f"httpclient: --connections in [1, 1024], --depth in [1, {MAX_DEPTH}]", file=sys.stderr)
        return 2
    if a.rate is not None:
        try:
            check_schedule(a.rate, a.duration + a.warmup)
        except ValueError as e:
            print(f"httpclient: --rate: {e}", file=sys.stderr)
            return 2
    wire = _GetWire(host_header, path)
    socks: list[socket.socket] = []
    try:
        socks = [_connect(host, port) for _ in range(a.connections)]
        if a.rate is None:
            lat, non2xx, secs = run_closed_loop(socks, wire, a.warmup, a.duration)
            doc = closed_loop_document(lat, secs, non2xx, a.connections, misses_key="non2xx")
        else:
            rng = random.Random(a.seed)
            warm = schedule_ns(a.rate, a.warmup, a.arrivals, rng)
            start = int(a.warmup * 1e9)
            meas = schedule_ns(a.rate, a.duration, a.arrivals, rng, start_ns=start)
            res = run_open_loop(socks, wire, warm + meas, len(warm), (start, start + int(a.duration * 1e9)),
                                depth=a.depth)
            doc = open_loop_document(res, rate=a.rate, arrivals=a.arrivals, connections=a.connections,
                                     depth=a.depth, misses_key="non2xx")
    except (OSError, LoadError, ValueError) as e:
        print(f"httpclient: {a.url}: {e}", file=sys.stderr)
        return 1
    finally:
        for s in socks:
            s.close()
    print(json.dumps(doc, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

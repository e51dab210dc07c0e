"""Open-loop load over keep-alive TCP connections, timed from each request's *intended* send time.

A closed-loop client (one request outstanding, the next sent when the reply arrives) stops sending
while the server stalls: a stall is sampled once instead of once for every request that would have
arrived meanwhile (coordinated omission). Here requests follow a schedule fixed before the run
(``--rate`` R requests/s, ``--arrivals``):

* ``uniform``: one request every 1/R s;
* ``poisson``: a Poisson process conditioned on its count: the N = round(R x D) arrival times of a
  D-second segment are the sorted values of N uniform times (the order statistics of uniforms are
  exactly a Poisson process given N), so the offered count is exactly R x D while inter-arrivals
  are exponential. Seeded (``--seed``): every run with the same seed asks the same schedule.

Each request's latency runs from its intended send time to the end of its reply, whatever the
client or the connection was doing in between: when the server stalls, every request scheduled
during the stall carries the wait it would have seen. A request goes out on the next connection
(round robin) that has fewer than ``depth`` requests in flight (pipelined on the connection, as
memcached and HTTP/1.1 allow); when every connection is full it waits in the client's queue, still
timed from its intended time. It is *behind schedule* when it left more than ``LATE_NS`` (1 ms)
after its intended time (the client or its connections could not keep up); ``service`` latencies,
from the actual send, are reported too (what a client that ignores coordinated omission reports).

Bounded: the schedule holds at most ``MAX_REQUESTS`` requests; after the last intended time the
client waits at most ``drain_s`` for outstanding replies (those left are ``unanswered``), and it
fails when nothing at all arrives for ``STALL_S`` while requests are outstanding.

The loop uses ``select(2)`` (selectors.SelectSelector), whose timeout has microsecond resolution:
epoll's and poll's are whole milliseconds, which would send a 2000 req/s schedule in pairs.
"""

from __future__ import annotations

import math
import random
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from polltuned.histogram import LatencyHistogram, document

Arrivals = Literal["poisson", "uniform"]
ARRIVALS: tuple[Arrivals, ...] = ("poisson", "uniform")
LATE_NS = 1_000_000
STALL_S = 2.0
MAX_REQUESTS = 5_000_000
MAX_RATE = 1_000_000.0
#: a send due sooner than this is not waited for in select(): the timer's slack (50 µs) would make it late
SPIN_S = 20e-6


class LoadError(Exception):
    """The server does not answer, closed a connection or answered with an error."""


def check_schedule(rate: float, duration_s: float) -> None:
    """Raise ValueError unless a schedule of ``rate`` requests/s for ``duration_s`` is allowed."""
    if not (math.isfinite(rate) and 0 < rate <= MAX_RATE):
        raise ValueError(f"rate must be finite and in (0, {MAX_RATE:g}] requests/s (got {rate!r})")
    if not (math.isfinite(duration_s) and duration_s >= 0):
        raise ValueError(f"duration must be finite and >= 0 (got {duration_s!r})")
    if round(rate * duration_s) > MAX_REQUESTS:
        raise ValueError(f"{round(rate * duration_s)} requests in the schedule: more than {MAX_REQUESTS} "
                         f"(lower --rate or --duration)")


def schedule_ns(rate: float, duration_s: float, arrivals: Arrivals, rng: random.Random,
                start_ns: int = 0) -> list[int]:
    """Pure (given ``rng``): the intended send times, ns from ``start_ns``, of round(rate x duration)
    requests in ``[start_ns, start_ns + duration)``, sorted (see the module docstring)."""
    check_schedule(rate, duration_s)
    n = round(rate * duration_s)
    span = duration_s * 1e9
    if arrivals == "uniform":
        return [start_ns + int(i * 1e9 / rate) for i in range(n)]
    if arrivals == "poisson":
        return sorted(start_ns + int(rng.random() * span) for _ in range(n))
    raise ValueError(f"unknown arrivals {arrivals!r} (one of {', '.join(ARRIVALS)})")


def percentiles_us(latencies_ns: Sequence[int]) -> dict[str, float]:
    """Pure: nearest-rank percentiles (p50/p90/p99/p999), mean, max and min in µs."""
    if not latencies_ns:
        raise ValueError("no latency samples")
    xs = sorted(latencies_ns)
    n = len(xs)

    def rank(q: float) -> float:
        return xs[min(n - 1, max(0, math.ceil(q * n - 1e-9) - 1))] / 1e3

    return {"p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99), "p999": rank(0.999),
            "mean": sum(xs) / n / 1e3, "max": xs[-1] / 1e3, "min": xs[0] / 1e3}


def rounded(d: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in d.items()}


def histogram_document(latencies_ns: Sequence[int]) -> Mapping[str, object]:
    return document(LatencyHistogram.of_ns(latencies_ns))


class Wire(Protocol):
    """A request/reply protocol the loop speaks (memcached text, HTTP/1.1)."""

    def request(self, i: int) -> bytes:
        """The bytes of request number ``i``."""
        ...

    def parse(self, buf: bytes) -> tuple[list[bool], int]:
        """The complete replies at the start of ``buf`` (one flag each: True for a miss, or an
        error status) and the bytes they take. Raises LoadError on a reply that ends the run."""
        ...


@dataclass
class OpenLoopResult:
    latencies_ns: list[int] = field(default_factory=list)  # measured requests, from the intended time
    service_ns: list[int] = field(default_factory=list)    # the same requests, from the actual send
    send_lag_ns: list[int] = field(default_factory=list)   # actual - intended send, measured requests
    offered: int = 0                 # requests scheduled in the measurement window
    sent_in_window: int = 0          # requests that left during the window (actual time)
    completed_in_window: int = 0     # replies that arrived during the window
    behind_schedule: int = 0         # measured requests sent more than LATE_NS late
    unanswered: int = 0              # measured requests without a reply at the end of the drain
    misses: int = 0                  # measured replies the protocol counts as misses / errors
    duration_s: float = 0.0


@dataclass
class _Conn:
    sock: socket.socket
    inflight: deque[tuple[int, int, int]] = field(default_factory=deque)  # (intended, actual, index)
    out: bytearray = field(default_factory=bytearray)
    buf: bytes = b""


def run_open_loop(socks: Sequence[socket.socket], wire: Wire, sched_ns: Sequence[int], first_measured: int,
                  window_ns: tuple[int, int], *, depth: int, drain_s: float = 1.0,
                  perf: Callable[[], int] = time.perf_counter_ns) -> OpenLoopResult:
    """Send the requests of ``sched_ns`` (intended times, ns from the start, sorted) on ``socks``
    and time each from its intended send time. Requests from index ``first_measured`` on are
    measured (the ones before are warm-up); ``window_ns`` = (start, end) of the measurement window,
    ns from the start, for the achieved rate."""
    if not socks or depth < 1:
        raise ValueError("needs at least one connection and depth >= 1")
    conns = [_Conn(s) for s in socks]
    sel = selectors.SelectSelector()
    for c, s in enumerate(socks):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, c)
    n = len(sched_ns)
    res = OpenLoopResult(offered=n - first_measured, duration_s=(window_ns[1] - window_ns[0]) / 1e9)
    pending: deque[int] = deque()
    t0 = perf()
    win_start, win_end = t0 + window_ns[0], t0 + window_ns[1]
    drain_deadline = t0 + (sched_ns[-1] if n else 0) + int(drain_s * 1e9)
    nxt = rr = inflight_total = 0
    nconns = len(conns)
    last_reply = t0
    writing: set[int] = set()

    def flush(c: int) -> None:
        cn = conns[c]
        try:
            k = cn.sock.send(cn.out)
        except BlockingIOError:
            k = 0
        del cn.out[:k]
        want = bool(cn.out)
        if want != (c in writing):
            sel.modify(cn.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0), c)
            if want:
                writing.add(c)
            else:
                writing.discard(c)

    try:
        while True:
            now = perf()
            while nxt < n and t0 + sched_ns[nxt] <= now:
                pending.append(nxt)
                nxt += 1
            # dispatch what is due to connections with room (round robin); one send per connection
            if pending:
                t_send = perf()
                dirty: set[int] = set()
                while pending:
                    for k in range(nconns):
                        c = (rr + k) % nconns
                        if len(conns[c].inflight) < depth:
                            break
                    else:
                        break  # every connection is full: the rest wait, timed from their intended times
                    rr = (c + 1) % nconns
                    i = pending.popleft()
                    cn = conns[c]
                    intended = t0 + sched_ns[i]
                    cn.out += wire.request(i)
                    cn.inflight.append((intended, t_send, i))
                    dirty.add(c)
                    inflight_total += 1
                    if i >= first_measured:
                        lag = t_send - intended
                        res.send_lag_ns.append(lag)
                        if lag > LATE_NS:
                            res.behind_schedule += 1
                    if win_start <= t_send < win_end:
                        res.sent_in_window += 1
                for c in dirty:
                    flush(c)
            if nxt >= n and not pending and inflight_total == 0:
                break
            if nxt >= n and now > drain_deadline:
                break
            if pending:
                timeout = STALL_S  # every connection is full: wait for a reply
            elif nxt < n:
                timeout = (t0 + sched_ns[nxt] - now) / 1e9
                if timeout < SPIN_S:
                    timeout = 0.0  # due in a few µs: poll for replies and go round again

            else:
                timeout = max(0.0, (drain_deadline - now) / 1e9)
            if inflight_total:
                timeout = min(timeout, STALL_S)
            events = sel.select(timeout)
            if not events:
                if inflight_total:
                    oldest = min(cn.inflight[0][1] for cn in conns if cn.inflight)
                    if perf() - max(last_reply, oldest) > STALL_S * 1e9:
                        raise LoadError(f"no reply for {STALL_S:g} s")
                continue
            for key, mask in events:
                c = key.data
                cn = conns[c]
                if mask & selectors.EVENT_WRITE:
                    flush(c)
                if not mask & selectors.EVENT_READ:
                    continue
                chunk = cn.sock.recv(262144)
                t = perf()
                if not chunk:
                    raise LoadError("server closed the connection")
                buf = cn.buf + chunk
                flags, used = wire.parse(buf)
                cn.buf = buf[used:]
                if len(flags) > len(cn.inflight):
                    raise LoadError(f"{len(flags)} replies for {len(cn.inflight)} requests in flight")
                if flags:
                    last_reply = t
                for miss in flags:
                    intended, actual, i = cn.inflight.popleft()
                    inflight_total -= 1
                    if win_start <= t < win_end:
                        res.completed_in_window += 1
                    if i >= first_measured:
                        res.latencies_ns.append(t - intended)
                        res.service_ns.append(t - actual)
                        res.misses += miss
    finally:
        sel.close()
    res.unanswered = (sum(1 for cn in conns for (_, _, i) in cn.inflight if i >= first_measured)
                      + sum(1 for i in pending if i >= first_measured))
    return res


def run_closed_loop(socks: Sequence[socket.socket], wire: Wire, warmup_s: float, duration_s: float,
                    perf: Callable[[], int] = time.perf_counter_ns) -> tuple[list[int], int, float]:
    """Closed loop: exactly one request outstanding per connection, the next sent when its reply
    has arrived, timed from just before its send. Returns (latencies ns, misses, seconds measured)."""
    sel = selectors.DefaultSelector()
    bufs = [b""] * len(socks)
    sent_at = [0] * len(socks)
    counter = [c * 7919 for c in range(len(socks))]
    lat: list[int] = []
    misses = 0
    try:
        for c, s in enumerate(socks):
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, c)
        t_start = perf()
        t_record = t_start + int(warmup_s * 1e9)
        t_end = t_record + int(duration_s * 1e9)
        for c, s in enumerate(socks):
            sent_at[c] = perf()
            s.sendall(wire.request(counter[c]))
        now = t_start
        while now < t_end:
            events = sel.select(STALL_S)
            if not events:
                raise LoadError(f"no reply for {STALL_S:g} s")
            for key, _ in events:
                c = key.data
                s = socks[c]
                chunk = s.recv(262144)
                now = perf()
                if not chunk:
                    raise LoadError("server closed the connection")
                flags, used = wire.parse(bufs[c] + chunk)
                bufs[c] = (bufs[c] + chunk)[used:]
                if not flags:
                    continue
                if len(flags) > 1:
                    raise LoadError(f"{len(flags)} replies for one request in flight")
                if now >= t_record:
                    lat.append(now - sent_at[c])
                    misses += flags[0]
                if now >= t_end:
                    continue
                counter[c] += 1
                sent_at[c] = perf()
                s.sendall(wire.request(counter[c]))
        return lat, misses, (now - t_record) / 1e9
    finally:
        sel.close()


def closed_loop_document(latencies_ns: Sequence[int], duration_s: float, misses: int, connections: int,
                         misses_key: str = "misses") -> dict[str, object]:
    """Pure: the JSON document a closed-loop client prints."""
    return {"v": 1, "mode": "closed", "requests": len(latencies_ns), "duration_s": round(duration_s, 4),
            "throughput_rps": round(len(latencies_ns) / duration_s, 1) if duration_s > 0 else 0.0,
            "latency_us": rounded(percentiles_us(latencies_ns)), misses_key: misses, "connections": connections,
            "histogram": histogram_document(latencies_ns)}


def open_loop_document(res: OpenLoopResult, *, rate: float, arrivals: str, connections: int,
                       depth: int, misses_key: str = "misses") -> dict[str, object]:
    """Pure: the JSON document an open-loop client prints (see kvclient / httpclient)."""
    if not res.latencies_ns:
        raise ValueError("no latency samples (no reply to any measured request)")
    d = res.duration_s
    lag = sorted(res.send_lag_ns)

    def lag_at(q: float) -> float:
        return round(lag[min(len(lag) - 1, max(0, math.ceil(q * len(lag)) - 1))] / 1e3, 3) if lag else 0.0

    achieved = res.completed_in_window / d if d > 0 else 0.0
    return {
        "v": 1, "mode": "open", "arrivals": arrivals, "rate_rps": rate, "offered": res.offered,
        "requests": len(res.latencies_ns), "duration_s": round(d, 4),
        "throughput_rps": round(achieved, 1), "achieved_rps": round(achieved, 1),
        "sent_rps": round(res.sent_in_window / d, 1) if d > 0 else 0.0,
        "behind_schedule": res.behind_schedule, "unanswered": res.unanswered,
        "latency_us": rounded(percentiles_us(res.latencies_ns)),
        "service_latency_us": rounded(percentiles_us(res.service_ns)),
        "send_lag_us": {"p50": lag_at(0.5), "p99": lag_at(0.99), "max": lag_at(1.0)},
        misses_key: res.misses, "connections": connections, "depth": depth,
        "histogram": histogram_document(res.latencies_ns),
    }

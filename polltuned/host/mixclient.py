"""The client side of ``polltuned bench --workload mix``: one window of whatever load is current.

    python -m polltuned.host.mixclient --phase-file STATE/mix/phase.json --server 198.18.230.2 \\
        --port 11211 --duration 2 [--log STATE/mix/windows.jsonl]

The bench keeps one sockperf server running in ``ptb-s`` for the whole run and changes the client
side between phases by rewriting ``--phase-file`` (``{"v": 1, "phase": 2, "layout": "shared",
"sessions": 4, "client_cpus": [1]}``, written atomically). The daemon under test runs this module
as its ``command`` probe, inside ``ptb-c``, once per window, and is told nothing: the phase file is
read here, not by the daemon, and the JSON printed on stdout carries only latencies and rate.

Each run starts ``sessions`` fresh ``sockperf ping-pong`` clients (UDP, 64 B, ``--full-rtt``),
session *i* pinned to ``client_cpus[i % len]``, for ``--duration`` seconds (whole seconds, at least
1; sockperf takes no fractions) and merges their statistics (polltuned.probes.sockperf). Fresh
clients every window: ``net.core.busy_read`` reaches their sockets; the server's socket predates
every knob change, so on the server side only ``busy_poll`` (its epoll) acts.

A memcached phase (``"app": "memcached", "rate": R`` in the phase file; the bench's ``kv-low`` /
``kv-high`` loads, served by one long-running memcached) runs ONE open-loop
``python -m polltuned.host.kvclient`` instead: ``sessions`` TCP connections, GETs of a preloaded key
set sent on a Poisson schedule at ``R`` requests/s whatever the replies do, each timed from its
intended send time (a stall is counted for every request scheduled during it), pinned to
``client_cpus[0]``, for ``--duration`` seconds.

Output (stdout, one JSON document): ``{"v": 1, "latency_us": {"p50", "p90", "p99", "p999", "mean",
"max"}, "throughput_rps": R, "observations": N, "sessions": S}``. With ``--log`` one line per run
is appended (start and end wall time, phase, layout, sessions, p50/p99, rate, ok, error): the
bench's record of which load each window really ran. Exit 0 on success, 1 when a client failed
(one line on stderr), 2 on a usage error or an unreadable phase file. Bounded: ``--duration`` at
most 600 s, every client killed 20 s after its duration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from polltuned.errors import ProbeError
from polltuned.host.exec import SubprocessRunner
from polltuned.host.sockperf_output import merge_results, parse_sockperf

MAX_DURATION_S = 600.0
CLIENT_GRACE_S = 20.0
#: the applications a phase can load (the bench keeps one server of that kind running)
APPS = ("sockperf", "memcached")
#: the memcached phases' key set (the bench-memcached client's)
KV_KEYS, KV_VALUE_SIZE = 1000, 64
MAX_RATE = 200_000.0


@dataclass(frozen=True)
class PhaseLoad:
    """The client side of one phase: how many sessions, on which CPUs (cycled per session)."""

    phase: int
    layout: str
    sessions: int
    client_cpus: tuple[int, ...]
    #: sockperf ping-pong sessions, or one open-loop memcached client at ``rate`` requests/s
    app: str = "sockperf"
    rate: float | None = None

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"v": 1, "phase": self.phase, "layout": self.layout, "sessions": self.sessions,
                                  "client_cpus": list(self.client_cpus)}
        if self.app != "sockperf":
            doc["app"] = self.app
        if self.rate is not None:
            doc["rate"] = self.rate
        return doc

    def cpu_of(self, session: int) -> int | None:
        return self.client_cpus[session % len(self.client_cpus)] if self.client_cpus else None


class MixClientError(Exception):
    pass


def parse_phase(text: str) -> PhaseLoad:
    """Pure: the phase file's contents. Raises MixClientError naming what is wrong."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise MixClientError(f"phase file is not JSON ({e.msg})") from None
    if not isinstance(doc, Mapping):
        raise MixClientError("phase file: not a JSON object")
    try:
        phase, layout, sessions, cpus = doc["phase"], doc["layout"], doc["sessions"], doc["client_cpus"]
    except KeyError as e:
        raise MixClientError(f"phase file: missing {e.args[0]!r}") from None
    if not isinstance(phase, int) or isinstance(phase, bool) or phase < 0:
        raise MixClientError(f"phase file: phase must be an integer >= 0 (got {phase!r})")
    if not isinstance(layout, str) or not layout:
        raise MixClientError(f"phase file: layout must be a name (got {layout!r})")
    if not isinstance(sessions, int) or isinstance(sessions, bool) or not 1 <= sessions <= 64:
        raise MixClientError(f"phase file: sessions must be 1..64 (got {sessions!r})")
    if not isinstance(cpus, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                             for c in cpus):
        raise MixClientError(f"phase file: client_cpus must be a list of CPU numbers (got {cpus!r})")
    app, rate = doc.get("app", "sockperf"), doc.get("rate")
    if app not in APPS:
        raise MixClientError(f"phase file: app must be one of {', '.join(APPS)} (got {app!r})")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)
                             or not 0 < float(rate) <= MAX_RATE):
        raise MixClientError(f"phase file: rate must be requests/s in (0, {MAX_RATE:g}] (got {rate!r})")
    if app == "memcached" and rate is None:
        raise MixClientError("phase file: a memcached phase needs its rate (requests/s)")
    return PhaseLoad(phase=phase, layout=layout, sessions=sessions, client_cpus=tuple(cpus), app=app,
                     rate=float(rate) if rate is not None else None)


def write_phase(path: str, load: PhaseLoad) -> None:
    """Atomically replace the phase file (the bench's side): a client never reads half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(load.to_json()) + "\n")
    os.replace(tmp, path)


def client_argv(server: str, port: int, seconds: int) -> list[str]:
    """Pure: one sockperf ping-pong session (the bench's message size and percentile output)."""
    return ["sockperf", "ping-pong", "-i", server, "-p", str(port), "-m", "64", "-t", str(seconds), "--full-rtt"]


def result_document(merged: Any, sessions: int) -> dict[str, object]:
    """Pure: the JSON printed for a merged polltuned.probes.sockperf.SockperfResult."""
    lat = {"p50": merged.pct(50.0), "p90": merged.pct(90.0), "p99": merged.pct(99.0),
           "p999": merged.pct(99.9), "mean": merged.mean_us, "max": merged.max_us}
    return {"v": 1, "latency_us": {k: round(v, 3) for k, v in lat.items()},
            "throughput_rps": round(merged.msg_rate, 1), "observations": merged.observations,
            "sessions": sessions}


def log_line(load: PhaseLoad | None, t0: float, t1: float, doc: Mapping[str, Any] | None,
             error: str | None) -> dict[str, object]:
    """Pure: the ``--log`` record of one run."""
    lat = doc.get("latency_us", {}) if doc is not None else {}
    return {"v": 1, "t0": round(t0, 3), "t1": round(t1, 3),
            "phase": load.phase if load is not None else None,
            "layout": load.layout if load is not None else None,
            "sessions": load.sessions if load is not None else None,
            "p50": lat.get("p50"), "p99": lat.get("p99"),
            "rate": doc.get("throughput_rps") if doc is not None else None,
            "ok": error is None, "error": error}


def kv_argv(load: PhaseLoad, server: str, port: int, duration_s: float) -> list[str]:
    """Pure: the open-loop memcached client of a memcached phase (one process, ``sessions`` connections)."""
    return [sys.executable, "-m", "polltuned.host.kvclient", "--server", server, "--port", str(port),
            "--connections", str(load.sessions), "--duration", f"{duration_s:g}", "--keys", str(KV_KEYS),
            "--value-size", str(KV_VALUE_SIZE), "--preload", "--rate", f"{load.rate:g}", "--arrivals", "poisson",
            "--seed", str(load.phase)]


def kv_document(out: str, sessions: int) -> dict[str, object]:
    """Pure: the mix client's document from kvclient's JSON (latencies, achieved rate, requests)."""
    try:
        doc = json.loads(out)
        lat = doc["latency_us"]
        keep = {k: round(float(lat[k]), 3) for k in ("p50", "p90", "p99", "p999", "mean", "max")}
        rate, n = float(doc["throughput_rps"]), int(doc["requests"])
    except (ValueError, KeyError, TypeError) as e:
        raise MixClientError(f"memcached client: unreadable output ({type(e).__name__}: {e})") from None
    if n < 1:
        raise MixClientError("memcached client: no requests answered in the window")
    return {"v": 1, "latency_us": keep, "throughput_rps": round(rate, 1), "observations": n, "sessions": sessions}


def _run_kv(load: PhaseLoad, *, server: str, port: int, duration_s: float, runner: Any) -> dict[str, object]:
    cpu = load.cpu_of(0)
    proc = runner.spawn(kv_argv(load, server, port, duration_s), cpus=[cpu] if cpu is not None else None)
    try:
        res = proc.wait(duration_s + CLIENT_GRACE_S)
    finally:
        if proc.running():
            proc.stop(0.5)
    if res.timed_out:
        raise MixClientError("memcached client timed out")
    if res.returncode != 0:
        raise MixClientError(f"memcached client failed: {res.describe()}")
    return kv_document(res.stdout, load.sessions)


def run_window(load: PhaseLoad, *, server: str, port: int, duration_s: float, runner: Any) -> dict[str, object]:
    """Run the phase's sessions once, in parallel (a memcached phase: its one open-loop client);
    the merged result as :func:`result_document`. Raises MixClientError when a session failed."""

    if load.app == "memcached":
        return _run_kv(load, server=server, port=port, duration_s=duration_s, runner=runner)
    seconds = max(1, round(duration_s))
    clients = []
    try:
        for i in range(load.sessions):
            cpu = load.cpu_of(i)
            clients.append(runner.spawn(client_argv(server, port, seconds), cpus=[cpu] if cpu is not None else None))
        deadline = time.monotonic() + seconds + CLIENT_GRACE_S
        outs = [c.wait(max(0.1, deadline - time.monotonic())) for c in clients]
    finally:
        for c in clients:
            if c.running():
                c.stop(0.5)
    results = []
    for i, res in enumerate(outs):
        if res.timed_out:
            raise MixClientError(f"sockperf session {i} timed out")
        if res.returncode != 0:
            raise MixClientError(f"sockperf session {i} failed: {res.describe()}")
        try:
            results.append(parse_sockperf(res.stdout + "\n" + res.stderr))
        except ProbeError as e:
            raise MixClientError(f"sockperf session {i}: {e.message}") from None
    return result_document(merge_results(results), load.sessions)


def _append(path: str, rec: Mapping[str, object]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(rec) + "\n").encode())
    finally:
        os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m polltuned.host.mixclient", description=__doc__.split("\n\n")[0])
    ap.add_argument("--phase-file", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--port", type=int, default=11211)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--log", default=None)
    a = ap.parse_args(argv)
    if not 0 < a.duration <= MAX_DURATION_S:
        print(f"mixclient: --duration must be in (0, {MAX_DURATION_S:g}] s", file=sys.stderr)
        return 2

    t0 = time.time()
    load: PhaseLoad | None = None
    try:
        with open(a.phase_file, encoding="utf-8") as f:
            load = parse_phase(f.read())
    except (OSError, MixClientError) as e:
        print(f"mixclient: {a.phase_file}: {e}", file=sys.stderr)
        if a.log:
            _append(a.log, log_line(None, t0, time.time(), None, str(e)))
        return 2
    try:
        doc = run_window(load, server=a.server, port=a.port, duration_s=a.duration, runner=SubprocessRunner())
    except MixClientError as e:
        print(f"mixclient: {e}", file=sys.stderr)
        if a.log:
            _append(a.log, log_line(load, t0, time.time(), None, str(e)))
        return 1
    if a.log:
        _append(a.log, log_line(load, t0, time.time(), doc, None))
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

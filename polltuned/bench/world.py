"""The embedded default world: two network namespaces joined by a veth pair, with veth NAPI active.

::

    ptb-c (client)                         ptb-s (server)
    ptbc 198.18.230.1/24  <--- veth --->   ptbs 198.18.230.2/24
    sockperf clients                       fresh sockperf server(s) per window
    or wrk / kvclient, fresh per window    or nginx / memcached, started once per run

NAPI fixture (vm-bench.md §1): a veth only uses its NAPI instance for local traffic when the
receiving end has GRO on and the *sending* end has TSO off (or rx-udp-gro-forwarding, which holds
UDP in the GRO list and pins RTT to the busy_read value: not what we want). Without veth NAPI,
busy polling and NAPI deferral cannot act at all, so setup() turns GRO on and TSO off on both ends
and checks (one short sockperf run) that packets really went through the veth NAPI poll (``ethtool -S``
``rx_queue_0_xdp_packets`` counts every packet the veth NAPI handled).

Workloads (vm-bench.md §6) differ only in layout and competing load:
  single     one session, client on CPU0, server on CPU1 (busy polling wins)
  parallel   4 sessions to one server socket on CPU0, clients alternating CPU0/CPU1 (busy polling
             loses badly)
  shared-cpu client and server on CPU0 (busy polling loses badly)
  cpu-hog    single + ``stress-ng --cpu 1`` pinned to the client's CPU (busy polling wins the tail)
  nginx      nginx serving a small static file over HTTP/1.1 keep-alive on CPU1; a fresh
             ``wrk --latency`` per window on CPU0 (policy ``bench-nginx``, a ``command`` probe)
  memcached  memcached on CPU1; a fresh ``python -m polltuned.host.kvclient`` (closed-loop GETs of a
             preloaded key set, JSON percentiles) per window on CPU0 (policy ``bench-memcached``)

The application servers (nginx, memcached) are started once per run and never restarted, as in
production: their accepted sockets are cloned from a listener created before any knob change, so
busy_read does not reach the server side, while busy_poll acts on their epoll at once. Their
configuration, document root and logs live in ``<state dir>/bench-app/`` (never /etc/nginx).

Crash safety: a marker file in the state dir lists what setup() created; setup() first removes
anything a previous (crashed) run left: processes inside ``ptb-*`` namespaces (nginx, memcached,
clients), the namespaces, the application directory, the marker. All traffic stays inside
198.18.0.0/15 (RFC 2544 benchmarking range).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import shutil
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from polltuned.clock import Clock
from polltuned.errors import HostError, UsageError
from polltuned.host.exec import Runner, Spawned, kill_pid
from polltuned.host.fs import Host

log = logging.getLogger("polltuned.bench")

NS_PREFIX = "ptb-"
BENCH_NET = ipaddress.ip_network("198.18.0.0/15")
MARKER = "bench-world.json"
APP_DIR = "bench-app"
NGINX_PORT = 8080
MEMCACHED_PORT = 11211
#: the small static file nginx serves (bytes)
STATIC_FILE_BYTES = 128


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    sessions: int = 1
    client_cpus: tuple[int, ...] = (0,)
    server_cpus: tuple[int, ...] = (1,)
    hog_cpus: tuple[int, ...] = ()
    #: the server application: sockperf (fresh per window, measured by the sockperf probe) or a
    #: long-running nginx / memcached measured by the ``command`` probe of ``policy``
    app: Literal["sockperf", "nginx", "memcached"] = "sockperf"
    #: the policy this workload is tuned with by default (the client's connections/threads are
    #: in its probe's argv)
    policy: str = "bench"


WORKLOADS: dict[str, Workload] = {
    "single": Workload("single", "one ping-pong session, client CPU0, server CPU1"),
    "parallel": Workload("parallel", "4 parallel sessions to one server on CPU0, clients CPU0/CPU1",
                         sessions=4, client_cpus=(0, 1), server_cpus=(0,)),
    "shared-cpu": Workload("shared-cpu", "client and server share CPU0", server_cpus=(0,)),
    "cpu-hog": Workload("cpu-hog", "single session + stress-ng CPU hog on the client's CPU0",
                        hog_cpus=(0,)),
    "nginx": Workload("nginx", "nginx (static file, HTTP/1.1 keep-alive) on CPU1, a fresh wrk --latency "
                      "per window on CPU0", app="nginx", policy="bench-nginx"),
    "memcached": Workload("memcached", "memcached on CPU1, a fresh closed-loop GET client (kvclient) "
                          "per window on CPU0", app="memcached", policy="bench-memcached"),
}


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise UsageError(f"--workload: unknown workload {name!r}",
                         hint="one of: " + ", ".join(WORKLOADS)) from None


def clamp_cpus(cpus: Sequence[int], ncpus: int) -> tuple[int, ...]:
    """Map a layout written for 2 CPUs onto ``ncpus`` (a 1-CPU host puts everything on CPU0)."""
    return tuple(sorted({c % max(1, ncpus) for c in cpus}, key=list(cpus).index))


@dataclass(frozen=True)
class WorldConfig:
    client_ns: str = "ptb-c"
    server_ns: str = "ptb-s"
    client_dev: str = "ptbc"
    server_dev: str = "ptbs"
    client_addr: str = "198.18.230.1"
    server_addr: str = "198.18.230.2"
    prefix_len: int = 24
    port: int = 11211

    def check(self) -> None:
        for ns in (self.client_ns, self.server_ns):
            if not ns.startswith(NS_PREFIX):
                raise UsageError(f"bench namespace {ns!r} must start with {NS_PREFIX!r}")
        for a in (self.client_addr, self.server_addr):
            if ipaddress.ip_address(a) not in BENCH_NET:
                raise UsageError(f"bench address {a} is outside {BENCH_NET} (benchmarking range only)")

    @property
    def nic(self) -> str:
        """The policy's ``{nic}``: the server's veth end, in its namespace (``NETNS/DEV``)."""
        return f"{self.server_ns}/{self.server_dev}"


@dataclass
class DefaultWorld:
    """Create, check and tear down the netns + veth world. Not thread-safe; one per bench run."""

    host: Host
    runner: Runner
    clock: Clock
    state_dir: Path
    workload: Workload = field(default_factory=lambda: WORKLOADS["single"])
    config: WorldConfig = field(default_factory=WorldConfig)
    ncpus: int = 2
    hog_timeout_s: int = 3600
    kill: Callable[[int, int], None] = kill_pid
    _hog: Spawned | None = None
    _app: Spawned | None = None
    _up: bool = False
    _owner_pid: int = 0

    # -- layout for the probe --------------------------------------------------------------------

    @property
    def client_cpus(self) -> tuple[int, ...]:
        return clamp_cpus(self.workload.client_cpus, self.ncpus)

    @property
    def server_cpus(self) -> tuple[int, ...]:
        return clamp_cpus(self.workload.server_cpus, self.ncpus)

    # -- lifecycle --------------------------------------------------------------------------------

    def _ip(self, *args: str, netns: str | None = None) -> None:
        self.runner.run(["ip", *args], timeout_s=10.0, netns=netns, check=True)

    def leftovers(self) -> list[str]:
        """Namespaces of ours that exist right now (a crashed run's, or this run's)."""
        return [n for n in self.host.glob("/run/netns", NS_PREFIX + "*")]

    def cleanup_leftovers(self) -> list[str]:
        """Remove what a previous run left: processes in ``ptb-*`` namespaces, the namespaces, the marker.
        Returns the namespaces removed."""
        removed: list[str] = []
        for ns in self.leftovers():
            self._kill_netns_pids(ns)
            res = self.runner.run(["ip", "netns", "del", ns], timeout_s=10.0)
            if res.ok:
                removed.append(ns)
            else:
                log.warning("bench: could not delete leftover netns %s: %s", ns, res.describe())
        self._remove_app_dir()
        marker = self.state_dir / MARKER
        if marker.exists():
            marker.unlink()
        if removed:
            log.warning("bench: removed leftovers of a previous run: %s", ", ".join(removed))
        return removed

    @property
    def app_dir(self) -> Path:
        return self.state_dir / APP_DIR

    def _remove_app_dir(self) -> None:
        d = self.app_dir
        if d.is_symlink() or d.is_file():
            d.unlink()
        elif d.exists():
            shutil.rmtree(d, ignore_errors=True)

    def _kill_netns_pids(self, ns: str) -> None:
        res = self.runner.run(["ip", "netns", "pids", ns], timeout_s=10.0)
        pids = [int(p) for p in res.stdout.split() if p.isdigit()]
        for p in pids:
            if p != os.getpid():
                self.kill(p, signal.SIGKILL)

    def setup(self) -> None:
        c = self.config
        c.check()
        self._owner_pid = os.getpid()
        self.cleanup_leftovers()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / MARKER).write_text(json.dumps(
            {"v": 1, "namespaces": [c.client_ns, c.server_ns], "pid": os.getpid(),
             "created": self.clock.wall(), "workload": self.workload.name,
             "app_dir": str(self.app_dir) if self.workload.app != "sockperf" else None}) + "\n")
        self._up = True
        try:
            self._ip("netns", "add", c.client_ns)
            self._ip("netns", "add", c.server_ns)
            self._ip("link", "add", c.client_dev, "netns", c.client_ns, "type", "veth",
                     "peer", "name", c.server_dev, "netns", c.server_ns)
            for ns, dev, addr in ((c.client_ns, c.client_dev, c.client_addr),
                                  (c.server_ns, c.server_dev, c.server_addr)):
                self._ip("-n", ns, "addr", "add", f"{addr}/{c.prefix_len}", "dev", dev)
                self._ip("-n", ns, "link", "set", "lo", "up")
                self._ip("-n", ns, "link", "set", dev, "up")
                # NAPI fixture: GRO on (NAPI instances exist), TSO off (veth_xmit sends to NAPI)
                self.runner.run(["ethtool", "-K", dev, "gro", "on", "tso", "off"], timeout_s=10.0,
                                netns=ns, check=True)
            self.check_napi()
            if self.workload.hog_cpus:
                self.start_hog()
            if self.workload.app != "sockperf":
                self.start_app()
        except BaseException:
            self.teardown()
            raise

    def napi_packets(self, ns: str, dev: str) -> int:
        """veth ``rx_queue_0_xdp_packets``: packets that went through the veth NAPI poll."""
        res = self.runner.run(["ethtool", "-S", dev], timeout_s=10.0, netns=ns, check=True)
        return parse_napi_packets(res.stdout)

    def check_napi(self) -> None:
        c = self.config
        before = self.napi_packets(c.server_ns, c.server_dev)
        server = self.runner.spawn(["sockperf", "server", "-i", c.server_addr, "-p", str(c.port)],
                                   netns=c.server_ns)
        try:
            self.clock.sleep(0.3)
            probe = self.runner.run(["sockperf", "ping-pong", "-i", c.server_addr, "-p", str(c.port),
                                     "-m", "64", "-t", "1"], timeout_s=20.0, netns=c.client_ns)
        finally:
            server.stop(0.5)
        if not probe.ok or "No messages were received" in probe.stdout + probe.stderr:
            raise HostError(f"bench world: no sockperf round trips over the veth: {probe.describe()}")
        after = self.napi_packets(c.server_ns, c.server_dev)
        if after - before < 3:
            raise HostError(
                f"bench world: veth NAPI is not in use on {c.server_dev} "
                f"(rx_queue_0_xdp_packets {before} -> {after})",
                hint="needs GRO on the receiver and TSO off on the sender (kernel >= 5.x veth NAPI)")

    def start_hog(self) -> None:
        self._hog = self.runner.spawn(
            ["stress-ng", "--cpu", "1", "--cpu-method", "int64", "--timeout", f"{self.hog_timeout_s}s",
             "--quiet"], netns=self.config.client_ns, cpus=clamp_cpus(self.workload.hog_cpus, self.ncpus))
        self.clock.sleep(0.3)
        if not self._hog.running():
            res = self._hog.stop(0.1)
            raise HostError(f"bench world: stress-ng did not start: {res.describe()}")

    def stop_hog(self) -> None:
        hog, self._hog = self._hog, None
        if hog is not None:
            hog.stop(1.0)

    # -- the long-running application server (nginx, memcached) --------------------------------------

    @property
    def app_port(self) -> int:
        return {"nginx": NGINX_PORT, "memcached": MEMCACHED_PORT}.get(self.workload.app, self.config.port)

    def app_argv(self) -> list[str]:
        """The server's command line (files it needs are written by :meth:`write_app_files`)."""
        c, d = self.config, self.app_dir
        if self.workload.app == "nginx":
            return ["nginx", "-p", f"{d}/", "-e", str(d / "error.log"), "-c", str(d / "nginx.conf")]
        if self.workload.app == "memcached":
            # -U 0: no UDP listener; -t 1: one worker thread (the server's CPU is pinned anyway)
            return ["memcached", "-u", "nobody", "-l", c.server_addr, "-p", str(MEMCACHED_PORT), "-U", "0",
                    "-t", "1", "-c", "1024", "-m", "64"]
        raise UsageError(f"workload {self.workload.name}: no long-running server for app {self.workload.app!r}")

    def write_app_files(self) -> None:
        self._remove_app_dir()
        d = self.app_dir
        d.mkdir(parents=True, mode=0o700)
        if self.workload.app == "nginx":
            (d / "www").mkdir()
            (d / "tmp").mkdir()
            body = ("polltuned bench static file\n" * 8)[:STATIC_FILE_BYTES - 1] + "\n"
            (d / "www" / "index.html").write_text(body)
            (d / "nginx.conf").write_text(nginx_conf(d, self.config.server_addr, NGINX_PORT))

    def start_app(self) -> None:
        c = self.config
        self.write_app_files()
        self._app = self.runner.spawn(self.app_argv(), netns=c.server_ns, cpus=self.server_cpus)
        deadline = self.clock.monotonic() + 5.0
        while True:
            if not self._app.running():
                res = self._app.stop(0.1)
                self._app = None
                raise HostError(f"bench world: {self.workload.app} did not start: {res.describe()}",
                                hint=self._app_log_tail())
            if self.app_listening():
                return
            if self.clock.monotonic() > deadline:
                raise HostError(f"bench world: {self.workload.app} is not listening on "
                                f"{c.server_addr}:{self.app_port} after 5 s", hint=self._app_log_tail())
            self.clock.sleep(0.1)

    def app_listening(self) -> bool:
        res = self.runner.run(["ss", "-Hltn", "sport", "=", f":{self.app_port}"], timeout_s=5.0,
                              netns=self.config.server_ns)
        return res.ok and parse_listening(res.stdout, self.config.server_addr, self.app_port)

    def app_running(self) -> bool:
        return self._app is not None and self._app.running()

    def _app_log_tail(self) -> str:
        p = self.app_dir / "error.log"
        try:
            lines = p.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def stop_app(self) -> None:
        app, self._app = self._app, None
        if app is not None:
            app.stop(2.0)

    def teardown(self) -> None:
        """Idempotent: stop the hog, kill whatever runs in our namespaces, delete them, drop the marker.

        A no-op in any process but the one that ran setup(): libraries that fork (pyroute2 enters
        namespaces from a forked child) must never unwind into our teardown."""
        if self._owner_pid and os.getpid() != self._owner_pid:
            return
        self.stop_hog()
        self.stop_app()
        c = self.config
        for ns in (c.client_ns, c.server_ns):
            if ns in self.leftovers():
                self._kill_netns_pids(ns)
                res = self.runner.run(["ip", "netns", "del", ns], timeout_s=10.0)
                if not res.ok:
                    log.error("bench: could not delete netns %s: %s", ns, res.describe())
        if self.workload.app != "sockperf":
            self._remove_app_dir()
        marker = self.state_dir / MARKER
        if marker.exists():
            marker.unlink()
        self._up = False

    def describe(self) -> dict[str, object]:
        c = self.config
        return {"workload": self.workload.name, "sessions": self.workload.sessions,
                "client": f"{c.client_ns}/{c.client_dev} {c.client_addr} cpus {list(self.client_cpus)}",
                "server": f"{c.server_ns}/{c.server_dev} {c.server_addr} cpus {list(self.server_cpus)}",
                "hog_cpus": list(clamp_cpus(self.workload.hog_cpus, self.ncpus)),
                "nic": c.nic, "app": self.workload.app,
                "app_port": self.app_port if self.workload.app != "sockperf" else None}


def parse_napi_packets(ethtool_stats: str) -> int:
    """Pure: sum of ``rx_queue_N_xdp_packets`` in ``ethtool -S`` output of a veth
    (drivers/net/veth.c veth_rq_stats_desc: "xdp_packets" per rx queue)."""
    total = 0
    found = False
    for line in ethtool_stats.splitlines():
        name, _, value = line.strip().partition(":")
        if name.startswith("rx_queue_") and name.endswith("_xdp_packets"):
            try:
                total += int(value.strip())
                found = True
            except ValueError:
                continue
    if not found:
        raise HostError("ethtool -S shows no rx_queue_*_xdp_packets counter (not a veth?)")
    return total


def nginx_conf(app_dir: Path, addr: str, port: int) -> str:
    """Pure: a self-contained nginx.conf: one worker, epoll, HTTP/1.1 keep-alive without a request
    limit, no access log, every path (pid, logs, temp dirs, document root) inside ``app_dir``.

    Workers run as root: the document root is inside the bench's state directory (0750 root), which
    an unprivileged worker could not read; the server listens only on ``addr`` inside the bench's
    own namespace."""
    d = str(app_dir).rstrip("/")
    temp = "\n".join(f"    {k}_temp_path {d}/tmp/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""# written by polltuned bench; removed with the bench world
daemon off;
master_process on;
worker_processes 1;
user root root;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{
    worker_connections 1024;
    use epoll;
}}
http {{
    access_log off;
    sendfile on;
    tcp_nodelay on;
    keepalive_timeout 600s;
    keepalive_requests 1000000000;
{temp}
    default_type text/html;
    server {{
        listen {addr}:{port} backlog=1024;
        root {d}/www;
        location / {{ }}
    }}
}}
"""


def parse_listening(ss_output: str, addr: str, port: int) -> bool:
    """Pure: whether ``ss -Hltn`` output shows a TCP listener on ``addr:port`` (or the wildcard)."""
    for line in ss_output.splitlines():
        cols = line.split()
        if len(cols) < 4 or cols[0] != "LISTEN":
            continue
        host, _, p = cols[3].rpartition(":")
        if p == str(port) and host.strip("[]") in (addr, "0.0.0.0", "*", "::"):
            return True
    return False

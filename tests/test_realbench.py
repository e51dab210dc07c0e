"""Real-application bench pieces without the kernel: wrk / kvclient output through the command
probe (recorded real outputs), units, the shipped bench-nginx / bench-memcached policies, the
world's nginx/memcached helpers with a scripted runner, the kvclient against a loopback fake
server, and the oracle's pure parts."""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from polltuned.bench.world import WORKLOADS, DefaultWorld, nginx_conf, parse_listening
from polltuned.clock import FakeClock
from polltuned.errors import HostError, ProbeError, UsageError
from polltuned.host.exec import ExecResult
from polltuned.host.fs import FsHost
from polltuned.host.kvclient import main as kv_main
from polltuned.host.kvclient import percentiles_us, result_document
from polltuned.policy.loader import load_policy
from polltuned.policy.schema import CommandProbe as Cfg
from polltuned.policy.schema import PrometheusProbe, SimProbe, SockperfProbe, TcpRttProbe
from polltuned.probes.command import (
    CommandProbe,
    expand_argv,
    extract_statistics,
    parse_quantity,
    statistics_to_window,
    to_statistic,
)
from polltuned.probes.factory import probe_opens_fresh_sockets
from polltuned.records import Window

FIX = Path(__file__).parent / "fixtures" / "bench"
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------- units


@pytest.mark.parametrize(("text", "stat", "us"), [
    ("84.00us", "p50", 84.0), ("1.68ms", "p99", 1680.0), ("2.01s", "max", 2.01e6), ("500ns", "p50", 0.5),
    ("12µs", "p90", 12.0), ("1.5m", "max", 90e6), ("7", "p99", 7.0), (3, "p99", 3.0),
])
def test_time_units_to_us(text: object, stat: str, us: float) -> None:
    assert to_statistic(stat, text, 1.0, "x") == pytest.approx(us)


def test_bare_numbers_use_unit_scale_and_metric_suffixes() -> None:
    assert to_statistic("p99", "0.5", 1000.0, "x") == pytest.approx(500.0)       # ms printed bare
    assert to_statistic("p99", "2ms", 1000.0, "x") == pytest.approx(2000.0)      # own unit wins
    assert to_statistic("throughput", "92.40k", 1.0, "x") == pytest.approx(92400.0)
    assert to_statistic("throughput", "1.2M", 1.0, "x") == pytest.approx(1.2e6)
    assert to_statistic("requests", "183318", 1.0, "x") == 183318.0
    with pytest.raises(ProbeError, match="unknown time unit 'k'"):
        to_statistic("p99", "3k", 1.0, "g")
    with pytest.raises(ProbeError, match="unknown suffix 'ms'"):
        to_statistic("throughput", "3ms", 1.0, "g")
    with pytest.raises(ProbeError, match="not a number"):
        parse_quantity("fast", "g")
    with pytest.raises(ProbeError, match="not finite"):
        parse_quantity("nan", "g")
    with pytest.raises(ProbeError, match="not a number"):
        parse_quantity(True, "g")


def test_expand_argv_placeholders() -> None:
    argv = ["wrk", "-d", "{window_s_int}s", "--duration", "{window_s}", "{python}", "{other}"]
    assert expand_argv(argv, window_s=2.0, python="/py") == ["wrk", "-d", "2s", "--duration", "2", "/py", "{other}"]
    assert expand_argv(argv, window_s=1.5, python="/py")[2:5] == ["2s", "--duration", "1.5"]
    assert expand_argv(argv, window_s=0.3, python="/py")[2] == "1s"     # wrk needs >= 1 whole second


# ------------------------------------------------------------------------------- recorded outputs


def _nginx_probe() -> Cfg:
    probe = load_policy("bench-nginx", nic="ptb-s/ptbs").probe
    assert isinstance(probe, Cfg)
    return probe


def test_wrk_recorded_outputs_through_the_shipped_policy() -> None:
    cfg = _nginx_probe()
    a = extract_statistics(cfg, (FIX / "wrk_us.txt").read_text())
    assert a == {"p50": 84.0, "p90": 97.0, "p99": 699.0, "requests": 183318.0, "throughput": 91642.69}
    b = extract_statistics(cfg, (FIX / "wrk_ms.txt").read_text())
    assert b["p99"] == pytest.approx(1680.0) and b["p50"] == 74.0       # "1.68ms"
    w = statistics_to_window(b, 2.1)
    assert w.ok and w.latency["p99"] == pytest.approx(1680.0) and w.throughput_pps == pytest.approx(103359.70)
    assert w.extra == {"requests": 217016.0}


def test_wrk_socket_errors_are_recorded() -> None:
    s = extract_statistics(_nginx_probe(), (FIX / "wrk_socket_errors_edited.txt").read_text())
    assert s["timeouts"] == 7 and s["read_errors"] == 2 and s["non2xx"] == 3
    assert s["p99"] == pytest.approx(1680.0) and s["throughput"] == pytest.approx(103359.70)


def test_wrk_without_distribution_fails_the_window() -> None:
    out = "Running 2s test @ http://198.18.230.2:8080/\n  unable to connect to 198.18.230.2:8080 Connection refused\n"
    with pytest.raises(ProbeError, match="did not match"):
        extract_statistics(_nginx_probe(), out)


def test_kvclient_recorded_output_through_the_shipped_policy() -> None:
    probe = load_policy("bench-memcached", nic="ptb-s/ptbs").probe
    assert isinstance(probe, Cfg)
    doc = json.loads((FIX / "kvclient.json").read_text())
    s = extract_statistics(probe, (FIX / "kvclient.json").read_text())
    assert s["p99"] == doc["latency_us"]["p99"] and s["p50"] == doc["latency_us"]["p50"]
    assert s["throughput"] == doc["throughput_rps"] and s["misses"] == 0
    w = statistics_to_window(s, 1.0)
    assert w.latency["p999"] == doc["latency_us"]["p999"] and w.throughput_pps == doc["throughput_rps"]


class Recorder:
    def __init__(self, res: ExecResult) -> None:
        self.res = res
        self.calls: list[tuple[list[str], str | None, Sequence[int] | None]] = []

    def run(self, argv: Sequence[str], *, timeout_s: float, netns: str | None = None,
            cpus: Sequence[int] | None = None, check: bool = False) -> ExecResult:
        self.calls.append((list(argv), netns, cpus))
        return self.res

    def spawn(self, argv: Sequence[str], *, netns: str | None = None, cpus: Sequence[int] | None = None) -> object:
        raise AssertionError("not used")


def test_command_probe_runs_in_netns_on_cpus_with_placeholders() -> None:
    cfg = _nginx_probe()
    rec = Recorder(ExecResult(("wrk",), 0, (FIX / "wrk_us.txt").read_text(), "", duration_s=2.0))
    w = CommandProbe(cfg, rec, clock=FakeClock(), python="/venv/bin/python").measure(2.0, 0)  # type: ignore[arg-type]
    assert w.ok and w.latency["p99"] == 699.0
    argv, netns, cpus = rec.calls[0]
    assert netns == "ptb-c" and list(cpus or []) == [0]
    assert argv[argv.index("-d") + 1] == "2s" and not any("{" in a for a in argv)
    mc = load_policy("bench-memcached", nic="ptb-s/ptbs").probe
    assert isinstance(mc, Cfg)
    rec2 = Recorder(ExecResult(("py",), 0, (FIX / "kvclient.json").read_text(), "", duration_s=1.0))
    w2 = CommandProbe(mc, rec2, clock=FakeClock(), python="/venv/bin/python").measure(1.5, 0)  # type: ignore[arg-type]
    assert w2.ok and rec2.calls[0][0][:3] == ["/venv/bin/python", "-m", "polltuned.host.kvclient"]
    assert rec2.calls[0][0][rec2.calls[0][0].index("--duration") + 1] == "1.5"


# ------------------------------------------------------------------------------- fresh sockets


def test_probe_opens_fresh_sockets() -> None:
    assert probe_opens_fresh_sockets(SockperfProbe(restart_server=True)) is True
    assert probe_opens_fresh_sockets(SockperfProbe(restart_server=False)) is False
    assert probe_opens_fresh_sockets(SimProbe(scenario="busypoll_split")) is True
    assert probe_opens_fresh_sockets(TcpRttProbe(port=80)) is False
    assert probe_opens_fresh_sockets(PrometheusProbe(url="http://127.0.0.1:9/m", metric="m")) is False
    assert probe_opens_fresh_sockets(Cfg(argv=["x"], regex="(?P<p99>1)")) is False
    assert probe_opens_fresh_sockets(Cfg(argv=["x"], regex="(?P<p99>1)", fresh_sockets=True)) is True
    # the bench clients (wrk, kvclient) open new connections every window: busy_read reaches them
    # (not the long-running server's accepted sockets), so the knob is not inert and stays tuned
    for name in ("bench-nginx", "bench-memcached"):
        assert probe_opens_fresh_sockets(load_policy(name, nic="n").probe) is True
    assert probe_opens_fresh_sockets(load_policy("bench", nic="n").probe) is True


def test_new_policies_pass_check() -> None:
    """`polltuned check` validates them against this host (read-only): the only problems are the
    per-device knobs of the bench veth, which exists only while a bench runs."""
    import subprocess

    for name in ("bench-nginx", "bench-memcached"):
        r = subprocess.run([sys.executable, "-m", "polltuned", "check", name, "--nic", "ptb-s/ptbs", "--json",
                            "--no-probe"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "error[" not in r.stderr, r.stderr
        doc = json.loads(r.stdout)
        assert doc["policy"] == name and "net.core.busy_poll" in doc["knobs"]
        # the clients open fresh sockets every window: busy_read stays tuned
        assert "net.core.busy_read" in doc["knobs"]
        assert all("ptb-s/ptbs" in k for k in doc["dropped"]), doc["dropped"]


# ------------------------------------------------------------------------------- world helpers


def test_nginx_conf_keeps_everything_in_its_dir() -> None:
    conf = nginx_conf(Path("/state/bench-app"), "198.18.230.2", 8080)
    assert "listen 198.18.230.2:8080" in conf and "daemon off;" in conf and "worker_processes 1;" in conf
    paths = [w.rstrip(";") for w in conf.split() if w.startswith("/") and w != "/"]  # "location /"
    assert paths and all(p.startswith("/state/bench-app/") for p in paths), paths
    assert "keepalive_requests 1000000000;" in conf and "access_log off;" in conf
    assert "/etc/nginx" not in conf and "/var/log" not in conf


def test_parse_listening() -> None:
    out = "LISTEN 0      511    198.18.230.2:8080  0.0.0.0:*\nLISTEN 0 1024 198.18.230.2:11211 0.0.0.0:*\n"
    assert parse_listening(out, "198.18.230.2", 8080)
    assert parse_listening(out, "198.18.230.2", 11211)
    assert not parse_listening(out, "198.18.230.2", 80)
    assert parse_listening("LISTEN 0 5 *:8080 *:*\n", "198.18.230.2", 8080)
    assert not parse_listening("", "198.18.230.2", 8080)


class FakeProc:
    def __init__(self, argv: Sequence[str], alive: bool) -> None:
        self.argv = tuple(argv)
        self._alive = alive
        self.stopped = False

    @property
    def pid(self) -> int:
        return 4242

    def running(self) -> bool:
        return self._alive and not self.stopped

    def wait(self, timeout_s: float) -> ExecResult:
        return ExecResult(self.argv, 0, "", "")

    def stop(self, grace_s: float = 1.0) -> ExecResult:
        self.stopped = True
        return ExecResult(self.argv, 1, "", "failed to bind")


class WorldRunner:
    def __init__(self, listening_after: int = 1, alive: bool = True) -> None:
        self.spawned: list[tuple[list[str], str | None, Sequence[int] | None, FakeProc]] = []
        self.runs: list[list[str]] = []
        self.listening_after = listening_after
        self.alive = alive
        self.ss_calls = 0

    def run(self, argv: Sequence[str], *, timeout_s: float, netns: str | None = None,
            cpus: Sequence[int] | None = None, check: bool = False) -> ExecResult:
        self.runs.append(list(argv))
        if argv[0] == "ss":
            self.ss_calls += 1
            out = "LISTEN 0 511 198.18.230.2:8080 0.0.0.0:*\nLISTEN 0 1024 198.18.230.2:11211 0.0.0.0:*\n"
            return ExecResult(tuple(argv), 0, out if self.ss_calls >= self.listening_after else "", "")
        return ExecResult(tuple(argv), 0, "", "")

    def spawn(self, argv: Sequence[str], *, netns: str | None = None, cpus: Sequence[int] | None = None) -> FakeProc:
        p = FakeProc(argv, self.alive)
        self.spawned.append((list(argv), netns, cpus, p))
        return p


@pytest.mark.parametrize("app", ["nginx", "memcached"])
def test_world_starts_app_once_pinned_in_server_ns_and_cleans_up(tmp_path: Path, app: str) -> None:
    runner = WorldRunner(listening_after=3)
    clock = FakeClock()
    world = DefaultWorld(FsHost(tmp_path), runner, clock, tmp_path / "state", workload=WORKLOADS[app])
    world.start_app()
    argv, netns, cpus, proc = runner.spawned[0]
    assert argv[0] == app and netns == "ptb-s" and list(cpus or []) == [1]
    assert runner.ss_calls == 3 and world.app_running()
    if app == "nginx":
        conf = (tmp_path / "state" / "bench-app" / "nginx.conf").read_text()
        assert str(tmp_path / "state" / "bench-app") in conf
        assert (tmp_path / "state" / "bench-app" / "www" / "index.html").stat().st_size == 128
        assert "-c" in argv and argv[argv.index("-c") + 1].endswith("bench-app/nginx.conf")
    else:
        assert argv[argv.index("-l") + 1] == "198.18.230.2" and argv[argv.index("-p") + 1] == "11211"
    assert world.describe()["app"] == app
    world.teardown()
    assert proc.stopped and not (tmp_path / "state" / "bench-app").exists()


def test_world_app_that_dies_is_an_error(tmp_path: Path) -> None:
    runner = WorldRunner(alive=False)
    world = DefaultWorld(FsHost(tmp_path), runner, FakeClock(), tmp_path / "state", workload=WORKLOADS["nginx"])
    with pytest.raises(HostError, match="nginx did not start"):
        world.start_app()


def test_world_app_never_listening_times_out(tmp_path: Path) -> None:
    runner = WorldRunner(listening_after=10**6)
    world = DefaultWorld(FsHost(tmp_path), runner, FakeClock(), tmp_path / "state", workload=WORKLOADS["memcached"])
    with pytest.raises(HostError, match="not listening"):
        world.start_app()


def test_cleanup_leftovers_removes_a_crashed_runs_app_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "bench-app" / "www").mkdir(parents=True)
    (state / "bench-app" / "nginx.conf").write_text("x")
    (state / "bench-world.json").write_text("{}")
    (tmp_path / "run" / "netns").mkdir(parents=True)
    world = DefaultWorld(FsHost(tmp_path), WorldRunner(), FakeClock(), state)
    assert world.cleanup_leftovers() == []
    assert not (state / "bench-app").exists() and not (state / "bench-world.json").exists()


def test_workloads_name_their_policies() -> None:
    assert WORKLOADS["nginx"].policy == "bench-nginx" and WORKLOADS["nginx"].app == "nginx"
    assert WORKLOADS["memcached"].policy == "bench-memcached" and WORKLOADS["memcached"].app == "memcached"
    assert all(WORKLOADS[n].policy == "bench" for n in ("single", "parallel", "shared-cpu", "cpu-hog"))


def test_install_script_installs_the_servers_and_clients() -> None:
    text = (REPO / "config" / "install.sh").read_text()
    pkgs = text[text.index("apt_pkgs=("):text.index(")", text.index("apt_pkgs=("))].split()
    for p in ("nginx", "wrk", "memcached", "sockperf"):
        assert p in pkgs


# ------------------------------------------------------------------------------- kvclient


def test_percentiles_nearest_rank() -> None:
    ns = [i * 1000 for i in range(1, 1001)]        # 1..1000 µs
    p = percentiles_us(ns)
    assert p["p50"] == 500.0 and p["p90"] == 900.0 and p["p99"] == 990.0 and p["p999"] == 999.0
    assert p["max"] == 1000.0 and p["min"] == 1.0 and p["mean"] == pytest.approx(500.5)
    assert percentiles_us([7000])["p99"] == 7.0
    with pytest.raises(ValueError):
        percentiles_us([])
    doc = result_document(ns, 2.0, 3, 4)
    assert doc["requests"] == 1000 and doc["throughput_rps"] == 500.0 and doc["misses"] == 3


@pytest.fixture
def fake_memcached() -> Iterator[tuple[int, list[bytes]]]:
    """A tiny memcached-text-protocol server on loopback: set noreply, version, get."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(5)
    store: dict[bytes, bytes] = {}
    seen: list[bytes] = []
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        buf = b""
        with conn:
            while not stop.is_set():
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while b"\r\n" in buf:
                    line, rest = buf.split(b"\r\n", 1)
                    parts = line.split()
                    if parts and parts[0] == b"set":
                        n = int(parts[4])
                        if len(rest) < n + 2:
                            break
                        store[parts[1]] = rest[:n]
                        buf = rest[n + 2:]
                        continue
                    buf = rest
                    seen.append(parts[0] if parts else b"")
                    if parts[:1] == [b"version"]:
                        conn.sendall(b"VERSION 1.6.18\r\n")
                    elif parts[:1] == [b"get"]:
                        v = store.get(parts[1])
                        if v is None:
                            conn.sendall(b"END\r\n")
                        else:
                            conn.sendall(b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (parts[1], len(v), v))

    def accept() -> None:
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1], seen
    finally:
        stop.set()
        srv.close()


def test_kvclient_closed_loop_against_a_fake_server(fake_memcached: tuple[int, list[bytes]],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    port, seen = fake_memcached
    rc = kv_main(["--server", "127.0.0.1", "--port", str(port), "--connections", "2", "--duration", "0.3",
                  "--keys", "50", "--value-size", "16", "--preload"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    assert doc["requests"] > 10 and doc["misses"] == 0 and doc["connections"] == 2
    lat = doc["latency_us"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p999"] <= lat["max"]
    assert seen.count(b"version") == 1 and seen.count(b"get") >= doc["requests"]


def test_kvclient_without_preload_counts_misses(fake_memcached: tuple[int, list[bytes]],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    port, _ = fake_memcached
    assert kv_main(["--server", "127.0.0.1", "--port", str(port), "--duration", "0.2", "--keys", "5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["misses"] == doc["requests"] > 0


def test_kvclient_errors(capsys: pytest.CaptureFixture[str]) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                               # nothing listens there now
    assert kv_main(["--server", "127.0.0.1", "--port", str(port), "--duration", "0.2"]) == 1
    assert "kvclient: 127.0.0.1:" in capsys.readouterr().err
    assert kv_main(["--server", "127.0.0.1", "--duration", "9999"]) == 2


# ------------------------------------------------------------------------------- oracle (pure)


def _oracle() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pt_oracle", REPO / "benchmarks" / "oracle.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_oracle_grid_schedule_and_aggregate() -> None:
    from polltuned.policy.schema import Objective

    o = _oracle()
    g = o.grid("ptb-s/ptbs")
    assert len(g) == 32 and len({lab for lab, _ in g}) == 32
    on = dict(g)["br50 bp25 defer"]
    assert on["ptb-s/ptbs:napi_defer_hard_irqs"] == 2 and on["ptb-s/ptbs:gro_flush_timeout"] == 20000
    defaults = {"net.core.busy_read": 0, "net.core.busy_poll": 0, "ptb-s/ptbs:napi_defer_hard_irqs": 0,
                "ptb-s/ptbs:gro_flush_timeout": 0, "net.core.gro_normal_batch": 8}
    off = o.resolve(dict(g)["br0 bp0"], defaults)
    assert off == defaults
    order = o.schedule(32, 3, seed=1)
    assert len(order) == 96 and all(sorted(order[i * 32:(i + 1) * 32]) == list(range(32)) for i in range(3))
    assert order[:32] != order[32:64] and o.schedule(32, 3, seed=1) == order
    obj = Objective(statistic="p99", combine="latency", cpu_weight=0.0)

    def w(p99: float) -> Window:
        return Window(ok=True, latency={"p99": p99}, cpu_cores=0.5)

    results = [(0, w(100.0)), (1, w(10.0)), (0, w(120.0)), (1, w(12.0)), (2, w(1.0)), (2, Window.failed("x")),
               (2, Window.failed("y")), (0, w(110.0)), (1, w(11.0))]
    agg = o.aggregate(["a", "b", "c"], [{"k": 0}, {"k": 1}, {"k": 2}], results, obj)
    assert agg["best"]["label"] == "b"                     # c has 1 of 3 windows valid: not eligible
    assert agg["indistinguishable_from_best"] == []        # a's CI is far above b's
    rows = {r["label"]: r for r in agg["configs"]}
    assert rows["a"]["objective"] == pytest.approx((100 * 120 * 110) ** (1 / 3), rel=1e-3)
    lo, hi = rows["b"]["objective_ci95"]
    assert 0 < lo < rows["b"]["objective"] < hi


def test_load_oracle(tmp_path: Path) -> None:
    from polltuned.bench.session import load_oracle

    f = tmp_path / "o.json"
    f.write_text(json.dumps({"v": 1, "workloads": {"nginx": {"best": {"config": {"net.core.busy_poll": 50}}}}}))
    assert load_oracle(f, "nginx") == {"net.core.busy_poll": 50}
    with pytest.raises(UsageError, match="no best configuration for workload 'memcached'"):
        load_oracle(f, "memcached")
    f.write_text("{")
    with pytest.raises(UsageError, match="cannot read"):
        load_oracle(f, "nginx")

"""Prometheus export (issue 11.1): the listener of a simulated daemon scraped and parsed with prometheus_client's
parser, the listener's life inside the service, the node_exporter textfile (atomic rename), config validation,
and the shipped Grafana dashboard against what the exporter really emits."""

from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import os
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from polltuned.clock import FakeClock
from polltuned.daemon.config import DaemonConfig, MetricsConfig, load_config
from polltuned.daemon.metrics import MetricsExporter, ServerLike, metrics_from_status
from polltuned.daemon.service import Service
from polltuned.daemon.statusdoc import build_status
from polltuned.daemon.wiring import Daemon
from polltuned.errors import HostError, PolicyError
from polltuned.host.metrics_http import MetricsServer, serve_metrics
from polltuned.host.systemd import Notifier
from tests.test_daemon_process import World, _wait_phase
from tests.test_daemon_status import _sim_daemon

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "config" / "grafana" / "polltuned.json"


def scrape(server: ServerLike) -> str:
    with urllib.request.urlopen(f"http://{server.address}:{server.port}/metrics", timeout=10) as r:
        assert r.status == 200
        return str(r.read().decode())


def samples(text: str) -> dict[str, list[Sample]]:
    """metric family name -> samples, through prometheus_client's own parser."""
    out: dict[str, list[Sample]] = {}
    for fam in text_string_to_metric_families(text):
        out.setdefault(fam.name, []).extend(fam.samples)
    return out


def one(fams: Mapping[str, list[Sample]], family: str, **labels: str) -> float:
    got = [s.value for s in fams[family] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(got) == 1, (family, labels, fams.get(family))
    return float(got[0])


def port0(reg: Any, addr: str, port: int) -> MetricsServer:
    """The configured address, any free port (config ports are 1..65535; tests must not collide)."""
    return serve_metrics(reg, addr, 0)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Daemon, dict[str, Any]]:
    """A simulated daemon run to the end (one round, CONFIRM, ROLLBACK, STOPPED) and its last status document."""
    _, _, d = _sim_daemon(tmp_path_factory.mktemp("sim"), "prom", 10)
    doc: dict[str, Any] = {}
    for _ in d.controller.steps():
        doc = build_status(d, d.controller)
    doc["updated"] = 1234.5
    return d, doc


@pytest.fixture
def exporter() -> Iterator[MetricsExporter]:
    ex = MetricsExporter(MetricsConfig(http_address="127.0.0.1"), clock=FakeClock(), serve=port0)
    yield ex
    ex.close()


def test_scrape_a_simulated_daemons_listener(finished: tuple[Daemon, dict[str, Any]],
                                            exporter: MetricsExporter) -> None:
    d, doc = finished
    exporter.start()
    assert exporter.server is not None and exporter.server.address == "127.0.0.1"
    assert scrape(exporter.server) == ""          # nothing published yet: nothing invented
    exporter.publish(doc)
    fams = samples(scrape(exporter.server))
    # phase: a state set, exactly one state on
    phases = {s.labels["polltuned_phase"]: s.value for s in fams["polltuned_phase"]}
    assert phases["STOPPED"] == 1 and sum(phases.values()) == 1 and "HOLD" in phases
    assert one(fams, "polltuned_info", policy="prom", nic="sim0") == 1
    assert one(fams, "polltuned_status_updated_timestamp_seconds") == 1234.5
    assert one(fams, "polltuned_tuning_round") == 1
    # windows measured / failed since start: the round's budget plus the A/B pairs (10 + 2 x 3)
    res = doc["result"]
    assert one(fams, "polltuned_windows_measured") == d.windows.measured == 16
    assert one(fams, "polltuned_windows_failed") == d.windows.failed
    assert one(fams, "polltuned_round_windows_used") == res["windows_used"]
    # every knob of the policy, original / current / best / deployed, and its owner
    for row in doc["knobs"]:
        k = row["key"]
        assert one(fams, "polltuned_knob_value", knob=k, kind="original") == row["original"]
        assert one(fams, "polltuned_knob_value", knob=k, kind="current") == row["current"]
        assert one(fams, "polltuned_knob_value", knob=k, kind="best") == row["best"]
        assert one(fams, "polltuned_knob_value", knob=k, kind="deployed") == res["deployed"][k]
        owners = [s for s in fams["polltuned_knob_owner"] if s.labels["knob"] == k]
        assert len(owners) == 1 and owners[0].value == 1
        assert owners[0].labels["owner"] == {"not managed": "not_managed"}.get(row["owner"], row["owner"])
    assert {s.labels["knob"] for s in fams["polltuned_knob_value"]} == set(d.policy.knobs)
    # baseline and best objective, the confirmed gain and its CI
    assert one(fams, "polltuned_objective", kind="baseline") == pytest.approx(res["baseline_objective"])
    assert one(fams, "polltuned_objective", kind="best") == pytest.approx(res["best_objective"])
    conf = res["confirmation"]
    assert one(fams, "polltuned_confirmation_gain_ratio", bound="estimate") == pytest.approx(conf["gain"])
    assert one(fams, "polltuned_confirmation_gain_ratio", bound="ci_low") == pytest.approx(conf["ci"][0])
    assert one(fams, "polltuned_confirmation_gain_ratio", bound="ci_high") == pytest.approx(conf["ci"][1])
    assert one(fams, "polltuned_confirmation_deployed") == float(conf["verdict"].startswith("significant"))
    assert one(fams, "polltuned_guard_aborts") == doc["guard_aborts_total"] == d.controller.guard_aborts
    assert one(fams, "polltuned_guard_aborts") >= len(doc["guard_events"])
    # counters are typed as counters (a dashboard takes increase() of them)
    types = {f.name: f.type for f in text_string_to_metric_families(scrape(exporter.server))}
    assert types["polltuned_guard_aborts"] == types["polltuned_windows_measured"] == "counter"
    assert types["polltuned_knob_value"] == "gauge"


def test_metric_names_follow_the_rules(finished: tuple[Daemon, dict[str, Any]]) -> None:
    _, doc = finished
    for m in metrics_from_status(full_doc(doc)):
        assert m.name.startswith("polltuned"), m.name
        assert re.fullmatch(r"[a-z_][a-z0-9_]*", m.name), m.name
        assert not m.name.endswith(("_ms", "_us", "_milliseconds", "_percent")), f"{m.name}: base units only"
        if m.type == "counter":
            assert all(s.name.endswith("_total") for s in m.samples)


def full_doc(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The finished daemon's document plus the blocks a HOLD / real host fills (per-CPU counters, HOLD's table,
    the CPU scope) and a verification block (not produced by statusdoc yet: exported when present)."""
    out = dict(doc)
    out["counters"] = {"interval_s": 1.0, "unavailable": {}, "cpus": [
        {"cpu": 0, "net_rx_per_s": 1200.0, "irqs_per_s": 300.0, "softirq": 0.12, "system": 0.31,
         "runq_wait_ms_per_s": 25.0},
        {"cpu": 1, "net_rx_per_s": 3.0, "irqs_per_s": None, "softirq": 0.0, "system": 0.02,
         "runq_wait_ms_per_s": None}]}
    out["hold"] = {"windows": 40, "exploring": 3, "explore_share": 0.075, "switches": 1, "fallbacks": 1,
                   "active_region": 1, "context": {"rate_pps": 52000.0, "flows": 16.0},
                   "table": [{"region": 0, "gain": 0.0, "ci_low": None, "active": False, "originals": True},
                             {"region": 1, "gain": 0.42, "ci_low": 0.31, "active": True, "originals": False}]}
    out["cpu_scope"] = {"kind": "cpus", "scope": "cpus 0 (nic queues + app)", "fallbacks": [], "last_cores": 0.43,
                        "cpus": [0]}
    out["verification"] = {"t": 99.0, "ok": False, "rows": [{"key": "a", "state": "holds"},
                                                           {"key": "b", "state": "admin-changed"}]}
    return out


def test_optional_blocks_exported_when_present_absent_otherwise(finished: tuple[Daemon, dict[str, Any]]) -> None:
    _, doc = finished
    bare = {m.name for m in metrics_from_status(doc)}
    assert not {"polltuned_last_verification_ok", "polltuned_cpu_scope"} & bare
    assert "polltuned_hold_entry_gain" in bare     # the daemon reached HOLD: its table is exported
    fams = {m.name: m for m in metrics_from_status(full_doc(doc))}
    by = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in fams.values() for s in m.samples}
    assert by[("polltuned_cpu_net_rx_softirqs_per_second", (("cpu", "0"),))] == 1200.0
    assert by[("polltuned_cpu_system_ratio", (("cpu", "1"),))] == 0.02
    assert ("polltuned_cpu_nic_irqs_per_second", (("cpu", "1"),)) not in by      # unavailable: no sample, not 0
    assert by[("polltuned_hold_context", (("signal", "flows"),))] == 16.0
    assert by[("polltuned_hold_entry_gain", (("active", "true"), ("originals", "false"), ("region", "1")))] == 0.42
    assert by[("polltuned_hold_entry_gain_ci_low", (("active", "true"), ("originals", "false"),
                                                    ("region", "1")))] == 0.31
    assert ("polltuned_hold_entry_gain_ci_low", (("active", "false"), ("originals", "true"), ("region", "0"))) \
        not in by                                                                   # no CI: no sample, not 0
    assert by[("polltuned_hold_explore_share", ())] == 0.075 and by[("polltuned_hold_active_region", ())] == 1
    assert by[("polltuned_cpu_scope_info", (("kind", "cpus"), ("scope", "cpus 0 (nic queues + app)")))] == 1
    assert by[("polltuned_last_verification_ok", ())] == 0
    assert by[("polltuned_last_verification_knobs", (("state", "admin-changed"),))] == 1
    # a document from the very first step (no result yet) still converts
    first = {"phase": "RECOVER", "policy": "p", "knobs": [], "progress": {"round": 0, "trial": None}}
    names = {m.name for m in metrics_from_status(first)}
    assert "polltuned_phase" in names and "polltuned_objective" not in names and "polltuned_trial" not in names


def test_conversion_happens_at_scrape_time_once_per_published_document() -> None:
    ex = MetricsExporter(MetricsConfig(), clock=FakeClock())
    assert list(ex.registry.collect()) == []
    doc = {"phase": "HOLD", "progress": {"round": 2}}
    ex.publish(doc)
    first = list(ex.collector.collect())
    assert list(ex.collector.collect()) == first and all(a is b for a, b in zip(ex.collector.collect(), first))
    ex.publish({"phase": "HOLD", "progress": {"round": 3}})          # a new document: converted again
    fams = samples(generate_latest(ex.registry).decode())
    assert one(fams, "polltuned_tuning_round") == 3


def test_benchmark_smoke() -> None:
    """benchmarks/metrics_scrape.py keeps working (3 scrapes; the numbers come from the script itself)."""
    spec = importlib.util.spec_from_file_location("pt_metrics_bench", REPO / "benchmarks" / "metrics_scrape.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    doc = bench.large_doc({"phase": "HOLD", "knobs": [], "updated": 1.0}, cpus=8, knobs=3)
    r = bench.bench_inproc(doc, 3, warmup=1)
    assert r["scrapes"] == 3 and r["samples"] > 8 * 4 and 0 < r["daemon_cpu_ms_median"] <= r["daemon_cpu_ms_max"]


def test_the_service_opens_the_listener_and_closes_it_on_exit(tmp_path: Path) -> None:
    _, _, d = _sim_daemon(tmp_path, "svc", 8)
    prom = tmp_path / "textfile" / "polltuned.prom"
    prom.parent.mkdir()
    clock = FakeClock()
    ex = MetricsExporter(MetricsConfig(http_address="127.0.0.1", textfile=str(prom)), clock=clock, serve=port0)
    scraped: dict[str, str] = {}

    def status(c: Any) -> dict[str, Any]:
        if c.phase == "CONFIRM" and "mid" not in scraped and ex.server is not None:
            scraped["mid"] = scrape(ex.server)   # the listener answers while the service runs
            scraped["url"] = f"http://{ex.server.address}:{ex.server.port}/metrics"
        return build_status(d, c)

    svc = Service(controller=d.controller, notifier=Notifier(environ={}), run_dir=str(tmp_path / "run"),
                  clock=clock, build_status=status, reload_policy=lambda: d.policy, status_interval_s=0.0,
                  metrics=ex)
    assert svc.run() == 0
    mid = samples(scraped["mid"])
    assert sum(s.value for s in mid["polltuned_phase"]) == 1
    assert one(mid, "polltuned_phase", polltuned_phase="STOPPED") == 0
    # closed on exit: nothing listens there any more
    assert ex.server is None
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(scraped["url"], timeout=5)
    # the textfile followed every publish: it now holds the final phase
    final = samples(prom.read_text())
    assert one(final, "polltuned_phase", polltuned_phase="STOPPED") == 1
    assert [p.name for p in prom.parent.iterdir()] == ["polltuned.prom"]      # no temp file left behind
    assert prom.stat().st_mode & 0o777 == 0o644                                 # node_exporter's user reads it


def test_listener_stops_and_frees_its_port() -> None:
    ex = MetricsExporter(MetricsConfig(http_address="127.0.0.1"), clock=FakeClock(), serve=port0)
    ex.start()
    assert ex.server is not None
    addr, port = ex.server.address, ex.server.port
    ex.publish({"phase": "HOLD"})
    assert "polltuned_phase" in scrape(ex.server)
    ex.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://{addr}:{port}/metrics", timeout=5)
    again = serve_metrics(ex.registry, addr, port)       # the port is free again at once
    try:
        assert again.port == port
    finally:
        again.close()


def test_listener_that_cannot_bind_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    first = serve_metrics(MetricsExporter(MetricsConfig(), clock=FakeClock()).registry, "127.0.0.1", 0)
    try:
        ex = MetricsExporter(MetricsConfig(http_address="127.0.0.1", http_port=first.port), clock=FakeClock())
        with caplog.at_level(logging.ERROR, logger="polltuned.daemon"):
            ex.start()
        assert ex.server is None
        msgs = [r.getMessage() for r in caplog.records]
        assert len(msgs) == 1 and "metrics: HTTP listener disabled: cannot listen on 127.0.0.1 port" in msgs[0]
        assert "Address already in use" in msgs[0]
        ex.publish({"phase": "HOLD"})          # the daemon keeps running without it
    finally:
        first.close()
    with pytest.raises(HostError, match=r"cannot listen on 198\.18\.0\.1"):
        serve_metrics(ex.registry, "198.18.0.1", 0)     # not an address of this host


def test_textfile_is_complete_whenever_it_is_read(tmp_path: Path, finished: tuple[Daemon, dict[str, Any]]) -> None:
    """node_exporter may read at any moment: with the temp file + rename it only ever sees whole documents."""
    _, doc = finished
    prom = tmp_path / "out" / "polltuned.prom"
    prom.parent.mkdir()
    ex = MetricsExporter(MetricsConfig(textfile=str(prom), textfile_min_interval_s=0), clock=FakeClock())
    ex.publish({**full_doc(doc), "updated": 0.0})
    n_lines = len(prom.read_text().splitlines())
    stop = threading.Event()
    seen: list[float] = []
    bad: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            text = prom.read_text()
            try:
                fams = samples(text)
                seen.append(one(fams, "polltuned_status_updated_timestamp_seconds"))
                if len(text.splitlines()) != n_lines:
                    bad.append(f"{len(text.splitlines())} lines")
            except Exception as e:       # a torn file would fail to parse or lack the last families
                bad.append(repr(e))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(1, 150):
            ex.publish({**full_doc(doc), "updated": float(i)})
    finally:
        stop.set()
        t.join()
    assert bad == [] and len(seen) > 0
    assert seen == sorted(seen)                        # never an older document after a newer one
    assert one(samples(prom.read_text()), "polltuned_status_updated_timestamp_seconds") == 149
    assert sorted(os.listdir(prom.parent)) == ["polltuned.prom"]


def test_textfile_writes_are_rate_limited_and_the_last_one_lands_at_close(tmp_path: Path) -> None:
    prom = tmp_path / "polltuned.prom"
    clock = FakeClock()
    ex = MetricsExporter(MetricsConfig(textfile=str(prom)), clock=clock)   # default: at most once a second
    ex.publish({"phase": "BASELINE", "updated": 1.0})
    written = prom.stat().st_mtime_ns, prom.read_text()
    for i, phase in enumerate(("PROPOSE", "APPLY", "SETTLE")):
        clock.advance(0.2)
        ex.publish({"phase": phase, "updated": 2.0 + i})
    assert prom.read_text() == written[1]                # held back: node_exporter reads far less often
    clock.advance(0.5)
    ex.publish({"phase": "MEASURE", "updated": 9.0})     # 1.1 s after the last write
    assert one(samples(prom.read_text()), "polltuned_phase", polltuned_phase="MEASURE") == 1
    clock.advance(0.1)
    ex.publish({"phase": "STOPPED", "updated": 10.0})
    assert one(samples(prom.read_text()), "polltuned_phase", polltuned_phase="MEASURE") == 1
    ex.close()                                           # the held-back last document is not lost
    assert one(samples(prom.read_text()), "polltuned_phase", polltuned_phase="STOPPED") == 1


def test_textfile_errors_are_logged_once_and_recover(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    prom = tmp_path / "missing" / "polltuned.prom"
    ex = MetricsExporter(MetricsConfig(textfile=str(prom), textfile_min_interval_s=0), clock=FakeClock())
    with caplog.at_level(logging.INFO, logger="polltuned.daemon"):
        for _ in range(3):
            ex.publish({"phase": "HOLD"})
        prom.parent.mkdir()
        ex.publish({"phase": "HOLD"})
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("cannot write the textfile" in m for m in msgs) == 1
    assert any("written again" in m for m in msgs) and prom.exists()


@pytest.mark.parametrize(("toml", "field", "why"), [
    ('[metrics]\nhttp_address = "0.0.0.0"\n', "metrics.http_address", "must be a loopback address"),
    ('[metrics]\nhttp_address = "192.0.2.7"\n', "metrics.http_address", "unless metrics.allow_remote = true"),
    ('[metrics]\nhttp_address = "metrics.example"\n', "metrics.http_address", "must be an IP address"),
    ('[metrics]\nhttp_address = "127.0.0.1"\nhttp_port = 70000\n', "metrics.http_port", "less than or equal to 65535"),
    ('[metrics]\nhttp_port = 0\n', "metrics.http_port", "greater than or equal to 1"),
    ('[metrics]\ntextfile = "polltuned.prom"\n', "metrics.textfile", "absolute path ending in .prom"),
    ('[metrics]\ntextfile = "/var/lib/node-exporter/polltuned.txt"\n', "metrics.textfile", "reads only *.prom"),
    ('[metrics]\nlisten = "127.0.0.1:9877"\n', "metrics.listen", "unknown field"),
])
def test_config_validation_errors_are_one_line(tmp_path: Path, toml: str, field: str, why: str) -> None:
    p = tmp_path / "polltuned.toml"
    p.write_text(toml)
    with pytest.raises(PolicyError) as ei:
        load_config(p)
    text = ei.value.render()
    assert len(text.splitlines()) == 1, text
    assert text.startswith(f"polltuned: error[policy-invalid]: {p}: {field}: ") and why in text, text


def test_config_accepts_loopback_and_explicit_remote(tmp_path: Path) -> None:
    p = tmp_path / "polltuned.toml"
    p.write_text('[metrics]\nhttp_address = "::1"\ntextfile = "/var/lib/prometheus/node-exporter/polltuned.prom"\n')
    m = load_config(p).metrics
    assert (m.http_address, m.http_port) == ("::1", 9877)
    assert m.textfile == "/var/lib/prometheus/node-exporter/polltuned.prom"
    p.write_text('[metrics]\nhttp_address = "localhost"\n')
    assert load_config(p).metrics.http_address == "127.0.0.1"
    p.write_text('[metrics]\nallow_remote = true\nhttp_address = "0.0.0.0"\nhttp_port = 9100\n')
    assert load_config(p).metrics.http_address == "0.0.0.0"
    assert DaemonConfig().metrics.http_address is None and DaemonConfig().metrics.textfile is None   # opt-in
    assert load_config(REPO / "config" / "polltuned.toml").metrics == MetricsConfig()   # shipped: off


def _exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "expr" and isinstance(v, str):
                yield v
            else:
                yield from _exprs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _exprs(v)


def test_grafana_dashboard_uses_only_exported_metrics(finished: tuple[Daemon, dict[str, Any]]) -> None:
    dash = json.loads(DASHBOARD.read_text())
    titles = " | ".join(p["title"] for p in dash["panels"])
    for wanted in ("Phase", "Round", "Objective", "Knob", "Guard aborts", "NET_RX", "softirq"):
        assert wanted.lower() in titles.lower(), (wanted, titles)
    _, doc = finished
    exported: set[str] = set()
    for m in metrics_from_status(full_doc(doc)):
        exported.update(s.name for s in m.samples)
    used = {n for e in _exprs(dash) for n in re.findall(r"\bpolltuned_[a-z0-9_]+", e)}
    assert used and used <= exported, sorted(used - exported)
    assert {"polltuned_phase", "polltuned_knob_value", "polltuned_guard_aborts_total",
            "polltuned_cpu_net_rx_softirqs_per_second", "polltuned_cpu_softirq_ratio"} <= used


@pytest.mark.slow
def test_real_daemon_process_serves_metrics_on_loopback(tmp_path: Path) -> None:
    """`polltuned run` with [metrics] in its config: scrape it in HOLD, then SIGTERM closes the listener."""
    with socket.socket() as s:          # a free port for the daemon (closed again before it binds)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    w = World(tmp_path)
    prom = tmp_path / "polltuned.prom"
    w.config.write_text(w.config.read_text() + f'[metrics]\nhttp_address = "127.0.0.1"\nhttp_port = {port}\n'
                        f'textfile = "{prom}"\n')
    proc = w.start()
    try:
        _wait_phase(w, "HOLD")
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 30
        while True:   # the status file and the exporter are published together; give the scrape a moment
            fams = samples(urllib.request.urlopen(url, timeout=10).read().decode())
            if fams.get("polltuned_phase") and one(fams, "polltuned_phase", polltuned_phase="HOLD") == 1:
                break
            assert time.monotonic() < deadline, "metrics never showed HOLD"
            time.sleep(0.2)
        assert one(fams, "polltuned_info", policy="daemon-test") == 1
        assert one(fams, "polltuned_confirmation_deployed") == 1
        assert one(fams, "polltuned_knob_value", knob="net.core.busy_read", kind="current") == \
            one(fams, "polltuned_knob_value", knob="net.core.busy_read", kind="deployed") != 0
        assert one(samples(prom.read_text()), "polltuned_info", policy="daemon-test") == 1
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert proc.returncode == 0, w.log.read_text()
        assert f"metrics: serving http://127.0.0.1:{port}/metrics" in w.log.read_text()
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(url, timeout=5)
        assert one(samples(prom.read_text()), "polltuned_phase", polltuned_phase="STOPPED") == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        w.close()


def test_cpu_scope_of_the_env_reaches_status_and_metrics(tmp_path: Path) -> None:
    """Once the engine's env carries a CpuScope (``env.cpu_scope``), status says where CPU is measured —
    a whole-host fallback says so — and the exporter publishes it."""
    from polltuned.metrics.cpu_scope import HostCpuScope, NoCpuScope

    _, _, d = _sim_daemon(tmp_path, "scope", 4)
    assert "cpu_scope" not in build_status(d, d.controller)          # no scope on the env: nothing invented
    counting: Any = d.controller.env
    host_env = counting.env                                          # the HostEnv inside the counting wrapper
    host_env.cpu_scope = HostCpuScope(_NoSample(), "nic veth0 has no queue IRQs and the policy sets "
                                                  "no app_cpus", fallbacks=["cgroup of kv.service unavailable: x"])
    doc = build_status(d, d.controller)
    assert doc["cpu_scope"]["scope"] == ("whole host (fallback: nic veth0 has no queue IRQs and the policy sets no "
                                         "app_cpus)")
    assert doc["cpu_scope"]["kind"] == "host" and doc["cpu_scope"]["fallbacks"] == ["cgroup of kv.service "
                                                                                    "unavailable: x"]
    json.dumps(doc)
    fams = samples(generate_latest(_registry_with(doc)).decode())
    assert one(fams, "polltuned_cpu_scope_info", kind="host") == 1
    host_env.cpu_scope = NoCpuScope("no counters sampler")
    assert build_status(d, d.controller)["cpu_scope"]["scope"] == "none (no counters sampler)"


class _NoSample:
    def sample(self) -> Any:
        raise AssertionError("status must not sample counters")


def _registry_with(doc: Mapping[str, Any]) -> Any:
    ex = MetricsExporter(MetricsConfig(), clock=FakeClock())
    ex.publish(doc)
    return ex.registry


def test_in_hold_status_is_published_on_each_window_and_otherwise_rarely(tmp_path: Path) -> None:
    """Issue 14 (CPU in HOLD): a status document costs ~25 ms; while holding it is written when a
    window's result (the message) changes and otherwise every hold_status_interval_s, not every
    status_interval_s."""
    clock = FakeClock(start=0.0)

    class Stub:
        phase, message, trial, recovery, stopping, policy = "HOLD", "", None, True, False, None

        def steps(self) -> Iterator[str]:
            self.phase = "RECOVER"
            yield "RECOVER"
            self.phase = "HOLD"
            for t in range(120):          # two minutes of HOLD in 1 s slices, a window result every 13 s
                clock.advance(1.0)
                if t % 13 == 12:
                    self.message = f"window {t}"
                yield "HOLD"

    published: list[float] = []

    def status(c: Any) -> dict[str, Any]:
        published.append(clock.monotonic())
        return {"phase": c.phase}

    svc = Service(controller=Stub(), notifier=Notifier(environ={}),  # type: ignore[arg-type]
                  run_dir=str(tmp_path / "run"), clock=clock, build_status=status, reload_policy=lambda: None,  # type: ignore[arg-type,return-value]
                  status_interval_s=5.0, hold_status_interval_s=30.0)
    assert svc.run() == 0
    hold = [t for t in published if t > 0]
    # 9 window results + 2 periodic refreshes + the final one, instead of 24 at every 5 s
    assert 9 <= len(hold) <= 13, hold
    assert {13.0, 26.0, 117.0} <= set(hold)
    assert not any(b - a > 30.0 for a, b in itertools.pairwise(hold))

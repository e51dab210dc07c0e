"""The study store behind one interface: the contract every backend keeps (JSON lines, SQLite,
PostgreSQL, the fleet store), workload classes, pending trials and their expiry, the fallback when
the database is unreachable, the JSON-lines import, the [study] config, and SIGKILLed writers.

PostgreSQL tests use a private cluster started in a temp dir (tests/conftest.py ``pg_cluster``) and
skip with the reason when it cannot start.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import signal
import socket
import sqlite3
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from polltuned.clock import FakeClock
from polltuned.errors import PolicyError
from polltuned.policy.loader import load_policy
from polltuned.policy.schema import Policy
from polltuned.records import KnobValue
from polltuned.study import StoreUnavailable, Study, fingerprint
from polltuned.study.config import StudyConfig, redact_dsn
from polltuned.study.fleet import FleetStudy
from polltuned.study.jsonl import JsonlStudy
from polltuned.study.select import open_local, open_study
from polltuned.study.sql import ClassRules, judge
from polltuned.study.sqlite import DB_NAME, SqliteStudy

BASE: dict[str, KnobValue] = {"net.core.busy_read": 0, "net.core.busy_poll": 0}
OTHER_BASE: dict[str, KnobValue] = {"net.core.busy_read": 0, "net.core.busy_poll": 50}


def pol() -> Policy:
    return load_policy("sim-default")


def window(st: Study, sid: str, i: int, cfg: Mapping[str, KnobValue], *, phase: str = "trial", y: float | None = -0.1,
           status: str = "ok", ratio: bool = True, value: float | None = 10.0) -> None:
    st.append("window", session=sid, trial=i, phase=phase, config=dict(cfg), index=i, status=status, value=value,
              y=y, ratio=ratio, score={"ok": status != "failed", "latency_us": 12.5, "cpu_cores": 0.25,
                                       "reasons": []})


def session(st: Study, sid: str, base: Mapping[str, KnobValue] = BASE, host: str = "hfp") -> None:
    st.append("session", session=sid, fingerprint=st.fingerprint, policy="p", seed=3, started=1_000_000.0,
              baseline=dict(base), host=host, mode="search")


# ---------------------------------------------------------------- the contract, every backend
def test_records_round_trip_and_resumable(store_factory: Any) -> None:
    st = store_factory(pol())
    session(st, "s1")
    window(st, "s1", 0, BASE, phase="baseline", y=0.01)
    window(st, "s1", 1, {**BASE, "net.core.busy_read": 50}, y=-0.4)
    window(st, "s1", 2, {**BASE, "net.core.busy_read": 90}, status="failed", y=None, value=None, ratio=False)
    st.append("trial", session="s1", trial=1, config={"net.core.busy_read": 50}, status="ok", reason="", windows=1)
    assert (r := st.resumable()) is not None and r.session == "s1"
    result = {"deployed": {**BASE, "net.core.busy_read": 50}, "deployed_is_baseline": False,
              "confirmation": {"deploy": True, "gain": 0.3}}
    st.append("end", session="s1", result=result)
    session(st, "s2")
    window(st, "s2", 0, BASE, phase="baseline", y=0.0)

    again = store_factory(pol())   # a restart reads the same records back
    logs = again.sessions()
    assert [s.session for s in logs] == ["s1", "s2"]
    s1 = logs[0]
    assert s1.ended and s1.result == result and s1.baseline == BASE and s1.seed == 3 and s1.host == "hfp"
    assert [(w.index, w.phase, w.status, w.y, w.value) for w in s1.windows] == [
        (0, "baseline", "ok", 0.01, 10.0), (1, "trial", "ok", -0.4, 10.0), (2, "trial", "failed", None, None)]
    assert s1.windows[1].config == {**BASE, "net.core.busy_read": 50} and s1.windows[1].ratio
    assert s1.windows[1].score is not None and s1.windows[1].score["latency_us"] == 12.5
    assert (r2 := again.resumable()) is not None and r2.session == "s2" and not r2.ended
    assert again.confirmed_deployment("hfp") == (BASE, {**BASE, "net.core.busy_read": 50})
    assert again.confirmed_deployment("another-host") is None
    assert again.prior_observations(BASE) == [(BASE, 0.01), ({**BASE, "net.core.busy_read": 50}, -0.4)]
    assert again.prior_observations(OTHER_BASE) == []


def test_the_interface_is_what_engine_history_and_status_use(store_factory: Any) -> None:
    st = store_factory(pol())
    for name in ("append", "sessions", "resumable", "prior_observations", "confirmed_deployment", "join_class",
                 "shared_observations", "pending_configs", "set_pending", "describe", "close"):
        assert callable(getattr(st, name)), name
    assert st.fingerprint == fingerprint(pol())
    info = st.describe().to_json()
    assert info["backend"] in ("jsonl", "sqlite", "postgresql") and info["fingerprint"] == st.fingerprint
    assert "password" not in json.dumps(info)


# ---------------------------------------------------------------- workload classes (shared stores)
@pytest.fixture(params=("sqlite-shared", "postgresql"))
def shared_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Stores of several hosts of one class: one SQLite file opened as a shared store (no server
    needed), or the PostgreSQL database."""
    kind = request.param
    dsn = request.getfixturevalue("pg_dsn") if kind == "postgresql" else ""
    made: list[Study] = []

    def make(host_id: str, clock: FakeClock, rules: ClassRules | None = None, policy: Policy | None = None) -> Any:
        p = policy or pol()
        ck = fingerprint(p) + "-cls"
        st: Any
        if kind == "postgresql":
            from polltuned.host.pgsql import connect_postgres
            from polltuned.study.postgres import PostgresStudy

            st = PostgresStudy(connect_postgres(dsn), fingerprint(p), location="pg", class_key=ck, host_id=host_id,
                               shared=True, clock=clock, rules=rules or ClassRules())
        else:
            st = SqliteStudy(tmp_path / "class.sqlite3", fingerprint(p), class_key=ck, host_id=host_id, shared=True,
                             clock=clock, rules=rules or ClassRules())
        made.append(st)
        return st

    yield make
    for st in made:
        st.close()


def test_class_members_share_observations_of_the_same_baseline(shared_factory: Any) -> None:
    clock = FakeClock()
    a, b = shared_factory("host-a", clock), shared_factory("host-b", clock)
    session(a, "sa")
    session(b, "sb")
    assert a.join_class("sa", 100.0, 0.1) and b.join_class("sb", 104.0, 0.12)
    window(a, "sa", 0, BASE, phase="baseline", y=0.02)
    window(a, "sa", 1, {**BASE, "net.core.busy_read": 50}, y=-0.5)
    window(a, "sa", 2, {**BASE, "net.core.busy_read": 80}, status="aborted", y=0.9)
    window(a, "sa", 3, {**BASE, "net.core.busy_read": 99}, status="failed", y=None, value=None)
    window(a, "sa", 4, BASE, phase="baseline", y=233.0, ratio=False)     # an old raw-J baseline: never shared
    window(a, "sa", 1003, {**BASE, "net.core.busy_read": 50}, phase="confirm", y=None)
    # another session of host a started from another baseline: not comparable
    session(a, "sa-other", base=OTHER_BASE)
    window(a, "sa-other", 1, {**OTHER_BASE, "net.core.busy_read": 20}, y=-0.3)
    got = b.shared_observations("sb", BASE)
    assert got == [(BASE, 0.02), ({**BASE, "net.core.busy_read": 50}, -0.5), ({**BASE, "net.core.busy_read": 80}, 0.9)]
    assert a.shared_observations("sa", BASE) == []          # a host's own windows are its own, not shared
    # incremental: a new window appears once, nothing is repeated
    window(a, "sa", 5, {**BASE, "net.core.busy_read": 30}, y=-0.2)
    again = b.shared_observations("sb", BASE)
    assert again == [*got, ({**BASE, "net.core.busy_read": 30}, -0.2)]
    window(b, "sb", 1, {**BASE, "net.core.busy_read": 10}, y=-0.05)
    assert a.shared_observations("sa", BASE) == [({**BASE, "net.core.busy_read": 10}, -0.05)]
    # the verdict is written back to the shared session row
    a.append("end", session="sa", result={"deployed": BASE, "deployed_is_baseline": True, "confirmation": None})
    assert [s.ended for s in a.sessions() if s.session == "sa"] == [True]
    assert b.class_hosts() == 2 and a.class_hosts() == 2
    assert a.describe().hosts == 2 and a.describe().membership == "in class"


def test_pending_trials_are_visible_cleared_and_expire(shared_factory: Any) -> None:
    clock = FakeClock()
    rules = ClassRules(pending_timeout_s=60.0)
    a, b = shared_factory("host-a", clock, rules), shared_factory("host-b", clock, rules)
    session(a, "sa")
    session(b, "sb")
    cfg = {**BASE, "net.core.busy_read": 40}
    a.set_pending("sa", cfg)
    assert b.pending_configs("sb") == [cfg]
    assert a.pending_configs("sa") == []                     # not its own
    a.set_pending("sa", None)
    assert b.pending_configs("sb") == []
    a.set_pending("sa", cfg)                                 # announced, then the host is killed
    clock.advance(59.0)
    assert b.pending_configs("sb") == [cfg]
    clock.advance(2.0)
    assert b.pending_configs("sb") == []                     # a dead host's trial expires
    a.set_pending("sa", {**BASE, "net.core.busy_read": 41})  # re-announcing refreshes it
    assert b.pending_configs("sb") == [{**BASE, "net.core.busy_read": 41}]


def test_a_host_whose_baseline_or_noise_does_not_match_tunes_alone(shared_factory: Any,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    hosts = {h: shared_factory(h, clock) for h in ("a", "b", "c", "odd-level", "odd-noise")}
    for h, st in hosts.items():
        session(st, "s-" + h)
    assert hosts["a"].join_class("s-a", 100.0, 0.10)
    assert hosts["b"].join_class("s-b", 110.0, 0.12)
    assert hosts["c"].join_class("s-c", 95.0, 0.09)
    with caplog.at_level(logging.WARNING, logger="polltuned.study"):
        assert not hosts["odd-level"].join_class("s-odd-level", 300.0, 0.10)
        assert not hosts["odd-noise"].join_class("s-odd-noise", 100.0, 0.60)
    assert "odd-level does not match its workload class" in caplog.text and "tunes alone" in caplog.text
    info = hosts["odd-level"].describe()
    assert info.membership.startswith("alone: its baseline J 300 is 3.00x the class median")
    assert hosts["odd-noise"].describe().membership.startswith("alone: its window noise 0.600")
    window(hosts["odd-level"], "s-odd-level", 1, {**BASE, "net.core.busy_read": 50}, y=-0.9)
    assert hosts["a"].shared_observations("s-a", BASE) == []   # its observations stay its own
    assert hosts["a"].class_hosts() == 3


def test_judge_uses_the_class_median() -> None:
    r = ClassRules(max_level_ratio=1.5, max_noise_ratio=2.5)
    assert judge(100.0, 0.1, [], r) is None                                   # the first host defines it
    assert judge(140.0, 0.1, [(100.0, 0.1), (101.0, 0.1), (500.0, 0.1)], r) is None  # median 101, not the mean
    assert judge(200.0, 0.1, [(100.0, 0.1), (101.0, 0.1), (500.0, 0.1)], r) is not None
    # the limit widens with the window noise a two-window baseline carries (1.5x -> 1.5 x e^(2 x 0.3 / sqrt 2))
    assert judge(200.0, 0.3, [(100.0, 0.3), (101.0, 0.3), (500.0, 0.3)], r) is None
    assert judge(250.0, 0.3, [(100.0, 0.3), (101.0, 0.3), (500.0, 0.3)], r) is not None
    three = [(100.0, 0.1), (101.0, 0.1), (99.0, 0.1)]
    assert judge(100.0, 0.03, three, r) is not None                           # too quiet counts too
    assert judge(100.0, 0.05, three, r) is None
    assert judge(900.0, 0.1, three[:2], r) is None            # fewer than 3 others: nobody is judged yet


def test_an_early_outlier_stops_being_shared_once_the_class_can_judge(shared_factory: Any) -> None:
    clock = FakeClock()
    hosts = {h: shared_factory(h, clock) for h in ("odd", "a", "b", "c")}
    for h, st in hosts.items():
        session(st, "s-" + h)
    assert hosts["odd"].join_class("s-odd", 400.0, 0.1)          # first: nobody to compare with
    window(hosts["odd"], "s-odd", 1, {**BASE, "net.core.busy_read": 9}, y=-0.7)
    assert hosts["a"].join_class("s-a", 100.0, 0.1)
    assert hosts["a"].shared_observations("s-a", BASE) == [({**BASE, "net.core.busy_read": 9}, -0.7)]
    assert hosts["b"].join_class("s-b", 104.0, 0.1) and hosts["c"].join_class("s-c", 97.0, 0.1)
    assert hosts["a"].shared_observations("s-a", BASE) == []     # 3 others now: 400 is 3.9x their median


# ---------------------------------------------------------------- the fleet store
def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def test_unreachable_database_falls_back_to_the_local_store(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from polltuned.clock import FakeClock as FC
    from polltuned.engine.driver import drive
    from polltuned.worlds.env import ScenarioEnv
    from polltuned.worlds.scenario import load_scenario
    from tests.engine_run import engine_for

    p = pol()
    p = p.model_copy(update={"tuning": p.tuning.model_copy(update={"budget": 8, "optimiser": "random"})})
    dsn = f"host=127.0.0.1 port={closed_port()} dbname=polltuned user=polltuned password=s3cret"
    cfg = StudyConfig(backend="postgresql", dsn=dsn, connect_timeout_s=2)
    with caplog.at_level(logging.WARNING, logger="polltuned.study"):
        st = open_study(cfg, tmp_path, p, class_fp="cls", host_id="h1")
    assert isinstance(st, FleetStudy) and st.remote is None
    assert "unreachable" in caplog.text and "tuning alone on the local store" in caplog.text
    info = st.describe()
    assert info.backend == "postgresql" and info.fallback is not None and "tuning alone" in info.fallback
    assert "s3cret" not in json.dumps(info.to_json()) and "s3cret" not in caplog.text
    assert info.local == str(tmp_path / "studies" / DB_NAME)
    env = ScenarioEnv(p, load_scenario("busypoll_split"), seed=0)
    t = engine_for(p, env, st, clock=FC())
    drive(t, env)
    assert t.result is not None and not t.state.in_class
    logs = open_local(tmp_path, p).sessions()           # everything is on the local store
    assert len(logs) == 1 and logs[0].ended and len(logs[0].windows) >= 8


class FlakyRemote(SqliteStudy):
    """A shared store that fails (as a database that went away) once ``broken`` is set."""

    broken = False

    def _exec(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        if self.broken:
            raise StoreUnavailable("pg: server closed the connection unexpectedly")
        return super()._exec(sql, params)


def test_database_failing_mid_session_drops_to_the_local_store(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    p = pol()
    clock = FakeClock()
    local = SqliteStudy(tmp_path / "local.sqlite3", fingerprint(p))
    remote = FlakyRemote(tmp_path / "shared.sqlite3", fingerprint(p), class_key="k", host_id="h1", shared=True,
                         clock=clock)
    st = FleetStudy(local, remote, location="postgresql://db/x", class_key="k")  # type: ignore[arg-type]
    session(st, "s")
    assert st.join_class("s", 100.0, 0.1)
    window(st, "s", 0, BASE, phase="baseline", y=0.0)
    remote.broken = True
    with caplog.at_level(logging.WARNING, logger="polltuned.study"):
        window(st, "s", 1, {**BASE, "net.core.busy_read": 50}, y=-0.3)    # the local write still happens
        assert st.pending_configs("s") == [] and st.shared_observations("s", BASE) == []
    assert st.remote is None and "failed" in caplog.text and "tuning alone" in caplog.text
    assert st.describe().fallback is not None and st.describe().membership.startswith("alone")
    window(st, "s", 2, {**BASE, "net.core.busy_read": 60}, y=-0.2)
    st.append("end", session="s", result={})
    assert [len(s.windows) for s in local.sessions()] == [3] and local.sessions()[0].ended


# ---------------------------------------------------------------- JSON lines -> SQLite, config, identity
def test_a_jsonl_study_is_imported_once_and_left_unchanged(tmp_path: Path) -> None:
    p = pol()
    old = open_local(tmp_path, p, backend="jsonl")
    assert isinstance(old, JsonlStudy) and old.path is not None
    session(old, "legacy")
    window(old, "legacy", 0, BASE, phase="baseline", y=0.0)
    window(old, "legacy", 1, {**BASE, "net.core.busy_read": 50}, y=-0.4)
    old.append("end", session="legacy", result={"deployed": BASE})
    with open(old.path, "a", encoding="utf-8") as fh:
        fh.write('{"v": 1, "kind": "wind')                      # a torn tail from a crash
    before = old.path.read_bytes()
    new = open_local(tmp_path, p)
    assert isinstance(new, SqliteStudy)
    assert [(s.session, len(s.windows), s.ended) for s in new.sessions()] == [("legacy", 2, True)]
    session(new, "fresh")
    new.close()
    again = open_local(tmp_path, p)                              # not imported twice
    assert [(s.session, len(s.windows)) for s in again.sessions()] == [("legacy", 2), ("fresh", 0)]
    assert old.path.read_bytes() == before
    assert again.prior_observations(BASE) == [(BASE, 0.0), ({**BASE, "net.core.busy_read": 50}, -0.4)]


@pytest.mark.parametrize(("toml", "field", "rule"), [
    ('backend = "postgresql"', "study.dsn", "required with backend"),
    ('dsn = "postgresql://h/db"', "study.dsn", 'only used with backend = "postgresql"'),
    ('backend = "mysql"', "study.backend", "Input should be"),
    ('backend = "postgresql"\ndsn = "not a dsn"', "study.dsn", "libpq key=value"),
    ('backend = "postgresql"\ndsn = "postgresql:///db"', "study.dsn", "needs a host"),
    ('max_level_ratio = 0.5', "study.max_level_ratio", "greater than 1"),
    ('colour = "blue"', "study.colour", "unknown field"),
])
def test_study_config_errors_are_one_line(tmp_path: Path, toml: str, field: str, rule: str) -> None:
    from polltuned.daemon.config import load_config

    f = tmp_path / "polltuned.toml"
    f.write_text(f'policy = "sim-default"\n[study]\n{toml}\n')
    with pytest.raises(PolicyError) as e:
        load_config(f)
    assert len(e.value.problems) == 1
    line = e.value.problems[0]
    assert line.startswith(f"{f}: {field}: ") and rule in line and "\n" not in line


def test_study_config_accepts_both_dsn_forms(tmp_path: Path) -> None:
    from polltuned.daemon.config import load_config

    f = tmp_path / "polltuned.toml"
    for dsn in ("postgresql://polltuned@db.example/polltuned?sslmode=require", "host=/run/pg dbname=pt user=pt",
                "postgresql:///pt?host=/run/postgresql"):
        f.write_text(f'[study]\nbackend = "postgresql"\ndsn = "{dsn}"\n')
        assert load_config(f).study.dsn == dsn
    assert load_config(tmp_path / "missing.toml" if False else f).study.backend == "postgresql"


def test_redact_dsn_removes_every_password() -> None:
    assert redact_dsn("postgresql://pt:s3cret@db:5432/pt?sslmode=require") == "postgresql://pt@db:5432/pt?sslmode=require"
    assert redact_dsn("postgresql://db/pt?password=s3cret&sslmode=require") == "postgresql://db/pt?sslmode=require"
    assert redact_dsn("host=db password='se cr\\'et' dbname=pt") == "host=db dbname=pt"
    assert redact_dsn("host=db user=pt") == "host=db user=pt"


def test_class_fingerprint_adds_cpu_model_and_probe_target(tmp_path: Path) -> None:
    from polltuned.host.fs import FsHost
    from polltuned.host.identity import class_facts, class_fingerprint, cpu_model, host_fingerprint, host_id

    assert cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13 64-Core Processor\n") == \
        "AMD EPYC 7B13 64-Core Processor"
    assert cpu_model("processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n") == "arm 0x41/0xd0c"
    assert cpu_model("") == "?"
    root = tmp_path / "root"
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text("6.12.0\n")
    (root / "proc/sys/kernel/hostname").write_text("web-1\n")
    (root / "etc").mkdir()
    (root / "etc/machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    (root / "proc/cpuinfo").write_text("model name\t: CPU A\n")
    host = FsHost(str(root))
    before = host_fingerprint(host, None)
    fa = class_fingerprint(host, None, "sockperf udp 198.18.0.2:11111")
    assert class_facts(host, None, "x")["cpu_model"] == "CPU A"
    assert class_fingerprint(host, None, "sockperf udp 198.18.0.3:11111") != fa       # another probe target
    (root / "proc/cpuinfo").write_text("model name\t: CPU B\n")
    assert class_fingerprint(host, None, "sockperf udp 198.18.0.2:11111") != fa       # another CPU model
    assert host_fingerprint(host, None) == before          # resume records stay valid
    assert host_id(host) == "web-1-0123456789ab"


# ---------------------------------------------------------------- status and history
def test_status_and_history_lines_show_store_class_and_hosts(tmp_path: Path, capsys: Any) -> None:
    from polltuned.cli.main import main
    from polltuned.daemon.render import study_lines

    fleet = {"backend": "postgresql", "location": "postgresql://pt@db/pt", "class_key": "aaaa-bbbb", "hosts": 8,
             "membership": "in class", "fallback": None, "local": "/var/lib/polltuned/studies/studies.sqlite3"}
    assert study_lines(fleet) == ["study:     postgresql postgresql://pt@db/pt; class aaaa-bbbb, shared by 8 hosts; "
                                  "this host: in class"]
    down = {**fleet, "hosts": None, "membership": "alone: shared store unavailable",
            "fallback": "postgresql postgresql://pt@db/pt unreachable (refused): tuning alone on the local store x"}
    lines = study_lines(down)
    assert "hosts not counted yet" in lines[0] and lines[1].strip().startswith("postgresql postgresql://pt@db/pt "
                                                                                "unreachable")
    assert study_lines({"backend": "sqlite", "location": "/s.sqlite3", "class_key": "k"}) == [
        "study:     sqlite /s.sqlite3; class k (this host only)"]
    # history: the store of the config's [study] section, with the class and the sessions
    p = pol()
    state = tmp_path / "state"
    st = open_local(state, p)
    session(st, "s1")
    window(st, "s1", 0, BASE, phase="baseline", y=0.0)
    st.close()
    cfg = tmp_path / "polltuned.toml"
    cfg.write_text('policy = "sim-default"\n[study]\nbackend = "sqlite"\n')
    root = tmp_path / "root"
    root.mkdir()
    assert main(["--host-root", str(root), "--state-dir", str(state), "history", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"study:     sqlite {state / 'studies' / DB_NAME}; class {fingerprint(p)}-")
    assert "1 windows (session s1)" in out
    assert main(["--host-root", str(root), "--state-dir", str(state), "history", "--config", str(cfg), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["study"]["backend"] == "sqlite" and doc["windows"][0]["latency_us"] == 12.5


def test_status_shows_the_fleet_store_and_its_fallback(tmp_path: Path) -> None:
    from polltuned.daemon.render import render_status

    doc = {"policy": "p", "phase": "PROPOSE", "study": {
        "backend": "postgresql", "location": "host=db dbname=pt", "class_key": "k1", "hosts": 3,
        "membership": "in class", "fallback": None}}
    text = render_status(doc, running=True, dirty=False, now=0.0)
    assert "study:     postgresql host=db dbname=pt; class k1, shared by 3 hosts; this host: in class" in text


# ---------------------------------------------------------------- crash safety (SQLite writer)
@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """tmpfs when available (SIGKILL keeps the page cache: fsync durability is not what is tested)."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    if base is None:
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="ptk-study-", dir=base))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class StopInTransaction(SqliteStudy):
    """Stops itself (SIGSTOP) after inserting window number ``stop_at`` but before COMMIT: the
    parent then SIGKILLs it exactly mid-transaction."""

    stop_at = -1

    def _insert(self, kind: str, rec: Mapping[str, Any]) -> None:
        super()._insert(kind, rec)
        if kind == "window" and rec.get("index") == self.stop_at:
            os.kill(os.getpid(), signal.SIGSTOP)


def writer(path: Path, fp: str, sid: str, start: int, stop_at: int, ack: int) -> None:
    """Child: append windows start, start+1, ...; after each commit write its index to ``ack``."""
    try:
        st = StopInTransaction(path, fp)
        st.stop_at = stop_at
        if start == 0:
            session(st, sid)
        for i in range(start, start + 100_000):   # never finishes before the SIGKILL
            window(st, sid, i, {**BASE, "net.core.busy_read": i % 97}, y=-i / 1000.0, value=float(i) + 0.5)
            os.write(ack, f"{i}\n".encode())
    except BaseException:
        os._exit(3)
    os._exit(0)


@pytest.mark.slow
def test_sigkill_sqlite_writer_mid_transaction_keeps_every_committed_window(fast_dir: Path) -> None:
    rng = random.Random(20261201)
    path = fast_dir / "studies.sqlite3"
    fp = "f" * 16
    SqliteStudy(path, fp).close()
    acked: list[int] = []
    kills = mid_tx = 0
    nxt = 0
    for it in range(120):
        r, w = os.pipe()
        stop_at = nxt + rng.randint(0, 30) if it % 2 == 0 else -1
        pid = os.fork()
        if pid == 0:
            os.close(r)
            writer(path, fp, "s", nxt, stop_at, w)
        os.close(w)
        if stop_at >= 0:      # exactly between the INSERT and the COMMIT
            _, status = os.waitpid(pid, os.WUNTRACED)
            assert os.WIFSTOPPED(status), "the writer finished before its stop point"
            mid_tx += 1
        else:                 # at a random moment (mostly inside a transaction: the commit's fsync)
            time.sleep(rng.uniform(0.0, 0.02))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        kills += os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        with os.fdopen(r) as fh:
            got = [int(x) for x in fh.read().split()]
        acked += got
        st = SqliteStudy(path, fp)
        logs = st.sessions()
        idx = [wr.index for wr in logs[0].windows] if logs else []
        assert set(acked) <= set(idx), f"iteration {it}: committed windows lost: {sorted(set(acked) - set(idx))[:5]}"
        if stop_at >= 0:
            assert stop_at not in idx, "an uncommitted window became visible"
        for wr in logs[0].windows if logs else []:      # no torn record: every field complete and consistent
            assert wr.index is not None and wr.value == wr.index + 0.5 and wr.y is not None
            assert math.isclose(wr.y, -wr.index / 1000.0) and wr.config["net.core.busy_read"] == wr.index % 97
        assert st._exec("PRAGMA integrity_check") == [("ok",)]
        st.close()
        nxt = (max(idx) + 1) if idx else 0
    print(f"study crash test: {kills} SIGKILLs ({mid_tx} exactly mid-transaction), {len(acked)} committed windows, "
          "0 lost")
    assert kills == 120 and mid_tx == 60 and len(acked) > 0


def test_a_corrupt_sqlite_file_is_a_typed_error(tmp_path: Path) -> None:
    from polltuned.errors import JournalError

    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / DB_NAME).write_bytes(b"this is not a database" * 100)
    with pytest.raises(JournalError, match="not a readable study database"):
        open_local(tmp_path, pol())
    # and a newer schema is refused rather than misread
    good = tmp_path / "g.sqlite3"
    SqliteStudy(good, "f").close()
    with sqlite3.connect(good) as c:
        c.execute("UPDATE pt_meta SET value = '9' WHERE key = 'schema'")
    with pytest.raises(JournalError, match="schema version"):
        SqliteStudy(good, "f")


def test_a_daemon_with_an_unreachable_database_tunes_alone_and_status_says_so(tmp_path: Path) -> None:
    from polltuned.daemon.render import render_status
    from polltuned.daemon.statusdoc import build_status
    from polltuned.daemon.wiring import build_daemon
    from polltuned.probes.sim import make_fake_host_tree

    repo = Path(__file__).resolve().parents[1]
    pol_file = tmp_path / "p.toml"
    pol_file.write_text(f'include = ["{repo}/policies/sim-default.toml"]\nname = "fleet-down"\n'
                        "[tuning]\nbudget = 6\n[confirm]\npairs = 2\n")
    p = load_policy(str(pol_file))
    root = tmp_path / "root"
    make_fake_host_tree(root, p.knobs)
    cfg = StudyConfig(backend="postgresql", dsn=f"postgresql://pt:pw@127.0.0.1:{closed_port()}/pt",
                      connect_timeout_s=2)
    d = build_daemon(policy=p, host_root=str(root), state_dir=str(tmp_path / "state"), clock=FakeClock(),
                     max_rounds=1, study=cfg)
    docs = [build_status(d, d.controller) for _ in d.controller.steps()]
    st = docs[-1]["study"]
    assert st["backend"] == "postgresql" and st["location"] == f"postgresql://pt@127.0.0.1:{cfg.dsn.rsplit(':', 1)[1]}"
    assert st["membership"] == "alone: shared store unavailable" and "tuning alone on the local store" in st["fallback"]
    text = render_status(docs[-1], running=True, dirty=None, now=0.0)
    assert "study:     postgresql postgresql://pt@127.0.0.1" in text and "tuning alone" in text and "pw" not in text
    logs = open_local(tmp_path / "state", p).sessions()      # the round was recorded locally
    assert len(logs) == 1 and logs[0].ended


# ---------------------------------------------------------------- latency histograms (issue 15)
def test_window_histograms_are_kept_and_a_deployment_p99_recomputed(store_factory: Any) -> None:
    from polltuned.histogram import LatencyHistogram

    rng = random.Random(5)
    dep = {**BASE, "net.core.busy_poll": 50}
    per_window = [[int(rng.lognormvariate(10.5 + 0.4 * (i % 2), 0.5)) for _ in range(800)] for i in range(4)]
    st = store_factory(pol())
    session(st, "s1")
    for i, vals in enumerate(per_window):
        st.append("window", session="s1", trial=-2, phase="confirm", config=dep if i % 2 else BASE, index=1000 + i,
                  status="ok", value=10.0, y=None, ratio=False, score=None,
                  histogram=LatencyHistogram.of_ns(vals).encode())
    window(st, "s1", 5, dep, phase="confirm", y=None, ratio=False)   # a window without one (older probe)
    again = store_factory(pol())
    ws = again.sessions()[0].windows
    assert [w.histogram is not None for w in ws] == [True, True, True, True, False]
    assert LatencyHistogram.decode(ws[1].histogram).count == 800
    h = again.histogram_of(dep)
    assert h is not None and h.count == 1600
    mine = sorted(per_window[1] + per_window[3])
    exact = mine[math.ceil(0.99 * len(mine)) - 1] / 1e3
    assert exact <= h.percentile_us(99) <= exact * (1 + 2 ** -10) + 1e-3
    assert again.histogram_of(dep, phases=("trial",)) is None
    assert again.histogram_of(dep, session="nope") is None


def test_an_sqlite_study_without_the_histogram_table_stays_readable(tmp_path: Path) -> None:
    st = open_local(tmp_path, pol(), backend="sqlite")
    session(st, "s1")
    window(st, "s1", 0, BASE, phase="baseline", y=0.01)
    st.close()
    db = next(tmp_path.rglob(DB_NAME))
    con = sqlite3.connect(db)
    con.execute("DROP TABLE pt_histogram")   # as a study written before the table existed
    con.commit()
    con.close()
    again = open_local(tmp_path, pol(), backend="sqlite")
    assert [(w.index, w.histogram) for w in again.sessions()[0].windows] == [(0, None)]
    window(again, "s1", 1, BASE, y=-0.1)
    assert len(again.sessions()[0].windows) == 2

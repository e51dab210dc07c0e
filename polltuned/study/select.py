"""Opening the study store the daemon config names (``[study]``, polltuned.study.config).

    sqlite (default)  STATE_DIR/studies/studies.sqlite3 (imports STATE_DIR/studies/<fp>.jsonl once)
    jsonl             STATE_DIR/studies/<fp>.jsonl (today's format)
    postgresql        the local SQLite store + the class's study in the DSN's database (FleetStudy);
                      unreachable: the local store alone, said in the log and in status

The workload class key is the policy fingerprint plus the host class fingerprint (kernel, NIC
driver and queues, CPU model and count, the probe's target: polltuned.host.identity).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from polltuned.clock import Clock
from polltuned.errors import HostError, UsageError
from polltuned.host.identity import class_fingerprint, host_id
from polltuned.host.pgsql import connect_postgres
from polltuned.policy.schema import Policy
from polltuned.study.base import StoreUnavailable, Study, fingerprint
from polltuned.study.config import StudyConfig, redact_dsn
from polltuned.study.fleet import FleetStudy
from polltuned.study.jsonl import JsonlStudy
from polltuned.study.postgres import PostgresStudy
from polltuned.study.sql import ClassRules
from polltuned.study.sqlite import DB_NAME, SqliteStudy

log = logging.getLogger("polltuned.study")

BACKENDS = ("sqlite", "jsonl", "postgresql")


def studies_dir(state_dir: str | os.PathLike[str]) -> Path:
    """STATE_DIR/studies, 0700 like the journal's directory (issue 16: the study database and its
    directory were 0644/0755 while the journal is 0600); an existing one loses group/other access
    beyond 0750 (group polltuned may read the status, never write)."""
    d = Path(state_dir) / "studies"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = d.stat().st_mode & 0o777
    if mode & 0o027:
        d.chmod(mode & 0o750)
    return d


def memory_study(policy: Policy) -> Study:
    """Records kept in memory only (benchmarks, tests)."""
    return JsonlStudy(None, fingerprint(policy))


def open_local(state_dir: str | os.PathLike[str], policy: Policy, *, backend: str = "sqlite",
               clock: Clock | None = None, host_id: str | None = None, class_key: str | None = None) -> Study:
    """The local store of ``policy`` under ``state_dir``: SQLite (default; imports an existing
    JSON-lines study once) or the JSON-lines file (``backend="jsonl"``)."""

    fp = fingerprint(policy)
    d = studies_dir(state_dir)
    if backend == "jsonl":
        return JsonlStudy(d / f"{fp}.jsonl", fp)
    if backend != "sqlite":
        raise UsageError(f"study.backend: unknown local study backend {backend!r} (choose sqlite or jsonl)")
    return SqliteStudy(d / DB_NAME, fp, class_key=class_key, host_id=host_id, clock=clock,
                       import_jsonl=d / f"{fp}.jsonl")


def probe_target(policy: Policy) -> str:
    """What the policy's probe measures, as one string (part of the workload class key)."""
    p: Any = policy.probe
    kind = str(p.kind)
    if kind == "sockperf":
        return f"sockperf {p.protocol} {p.target}:{p.port} {p.mode} {p.msg_size}B"
    if kind == "tcp_rtt":
        return f"tcp_rtt {p.address or '*'}:{p.port or '*'} {p.side}"
    if kind == "prometheus":
        return f"prometheus {p.url} {p.metric}"
    if kind == "command":
        return "command " + " ".join(p.argv)
    if kind == "sim":
        return f"sim {p.scenario}"
    return kind


def class_key(policy: Policy, class_fp: str) -> str:
    return f"{fingerprint(policy)}-{class_fp}"


def default_pending_timeout(policy: Policy) -> float:
    """A visit is at most two trial windows and a reference window: twice that, at least 60 s."""
    t = policy.tuning
    return max(60.0, 6.0 * (t.window_s + t.settle_s))


def rules_for(cfg: StudyConfig, policy: Policy) -> ClassRules:
    return ClassRules(max_level_ratio=cfg.max_level_ratio, max_noise_ratio=cfg.max_noise_ratio,
                      pending_timeout_s=cfg.pending_timeout_s or default_pending_timeout(policy))


def open_study(cfg: StudyConfig, state_dir: str | os.PathLike[str], policy: Policy, *, class_fp: str,
               host_id: str, clock: Clock | None = None, connect: Any = None) -> Study:
    """The store ``cfg`` names for ``policy`` on this host. ``connect(dsn, connect_timeout_s=...)``
    opens the PostgreSQL connection (default polltuned.host.pgsql.connect_postgres)."""
    ck = class_key(policy, class_fp)
    if cfg.backend != "postgresql":
        return open_local(state_dir, policy, backend=cfg.backend, clock=clock, host_id=host_id, class_key=ck)

    assert cfg.dsn is not None
    local = open_local(state_dir, policy, clock=clock, host_id=host_id, class_key=ck)
    assert isinstance(local, SqliteStudy)
    shown = redact_dsn(cfg.dsn)
    if connect is None:
        connect = connect_postgres
    remote: PostgresStudy | None = None
    fallback: str | None = None
    try:
        conn = connect(cfg.dsn, connect_timeout_s=cfg.connect_timeout_s)
        try:
            remote = PostgresStudy(conn, fingerprint(policy), location=shown, class_key=ck, host_id=host_id,
                                   shared=True, clock=clock, rules=rules_for(cfg, policy))
        except BaseException:
            conn.close()
            raise
    except (HostError, StoreUnavailable) as e:
        fallback = f"postgresql {shown} unreachable ({e.message}): tuning alone on the local store {local.path}"
    return FleetStudy(local, remote, location=shown, class_key=ck, fallback=fallback)


def open_for_host(cfg: StudyConfig | None, state_dir: str | os.PathLike[str], policy: Policy, host: Any, *,
                  clock: Clock | None = None) -> Study:
    """``open_study`` with the class fingerprint and host id read from ``host`` (a polltuned.host Host)."""
    cfg = cfg or StudyConfig()
    cfp = class_fingerprint(host, policy.nic, probe_target(policy))
    return open_study(cfg, state_dir, policy, class_fp=cfp, host_id=cfg.host_id or host_id(host), clock=clock)

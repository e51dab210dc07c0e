"""Shared fixtures.

``real_kernel``: for tests that change real global kernel knobs or create namespaces. Skips with a
clear reason when not root; serialises against every other real-kernel user on the machine with an
flock on /tmp/polltuned-realkernel.lock (helpers, benches and CI share one VM).

``pg_cluster`` / ``pg_dsn``: a private PostgreSQL cluster (benchmarks/pgcluster.py: initdb + pg_ctl in a
temp dir, Unix socket only, started once per test session, never the system cluster) and a fresh
database per test; skips with the reason when the server binaries or psycopg are missing.
``store_factory``: the study-store contract tests' backends (jsonl, sqlite, postgresql, fleet).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REALKERNEL_LOCK = "/tmp/polltuned-realkernel.lock"
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def real_kernel() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("needs root: this test changes real kernel knobs / network namespaces")
    fd = os.open(REALKERNEL_LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


# ---------------------------------------------------------------- PostgreSQL (study store tests)
def _pgcluster_module() -> object:
    from benchmarks._load import load

    return load("pgcluster")


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[object]:
    """A private PostgreSQL cluster in a temp dir (Unix socket only) for the whole test session;
    skips with the reason when psycopg or the server binaries are missing or it cannot start."""
    try:
        import psycopg  # noqa: F401
    except ImportError as e:
        pytest.skip(f"PostgreSQL tests need psycopg: {e}")
    mod: Any = _pgcluster_module()
    try:
        cluster = mod.PrivateCluster.start()
    except mod.ClusterUnavailable as e:
        pytest.skip(f"PostgreSQL cannot start here: {e}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_dsn(pg_cluster: Any) -> Iterator[str]:
    """A fresh, empty database in the private cluster (dropped afterwards)."""
    import uuid

    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_cluster.dsn, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    try:
        yield f"host={pg_cluster.sock} dbname={name} user=polltuned"
    finally:
        with psycopg.connect(pg_cluster.dsn, autocommit=True) as c:
            c.execute(f"DROP DATABASE {name} WITH (FORCE)")


STORE_BACKENDS = ("jsonl", "sqlite", "postgresql", "fleet")


@pytest.fixture(params=STORE_BACKENDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """``make(policy, host_id="host-a", clock=None, rules=None)`` -> a Study of the parametrised
    backend; calling it again opens the same store anew (a restart). ``postgresql`` is the shared
    database alone, ``fleet`` the daemon's store for it (local SQLite + the database)."""
    from polltuned.study import Study, open_local
    from polltuned.study.config import StudyConfig
    from polltuned.study.select import open_study

    kind = request.param
    dsn = request.getfixturevalue("pg_dsn") if kind in ("postgresql", "fleet") else ""

    def make(policy: Any, host_id: str = "host-a", clock: Any = None, rules: Any = None) -> Study:
        if kind in ("jsonl", "sqlite"):
            return open_local(tmp_path / host_id, policy, backend=kind)
        if kind == "postgresql":
            from polltuned.host.pgsql import connect_postgres
            from polltuned.study import fingerprint
            from polltuned.study.postgres import PostgresStudy
            from polltuned.study.sql import ClassRules

            return PostgresStudy(connect_postgres(dsn), fingerprint(policy), location=dsn,
                                 class_key=fingerprint(policy) + "-cls", host_id=host_id, shared=True, clock=clock,
                                 rules=rules or ClassRules())
        return open_study(StudyConfig(backend="postgresql", dsn=dsn), tmp_path / host_id, policy, class_fp="cls",
                          host_id=host_id, clock=clock)

    make.kind = kind  # type: ignore[attr-defined]
    return make

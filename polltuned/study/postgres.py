"""The PostgreSQL study backend: the database many daemons share (one row per window, the same
schema as SQLite: polltuned.study.sql). Every statement goes through one autocommit connection
opened by polltuned.host.pgsql; a database error of any kind becomes StoreUnavailable, which the
fleet store (polltuned.study.fleet) answers by tuning alone on the local store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from polltuned.clock import Clock
from polltuned.host.pgsql import first_line
from polltuned.study.base import StoreUnavailable
from polltuned.study.sql import ClassRules, SqlStudy

#: pg_advisory_xact_lock key serialising schema creation between hosts starting at once
SCHEMA_LOCK = 0x706F6C6C


class PostgresStudy(SqlStudy):
    backend = "postgresql"
    serial = "BIGSERIAL PRIMARY KEY"
    real = "DOUBLE PRECISION"

    def __init__(self, conn: Any, fp: str, *, location: str, class_key: str | None = None,
                 host_id: str | None = None, shared: bool = True, clock: Clock | None = None,
                 rules: ClassRules | None = None) -> None:
        super().__init__(fp, class_key=class_key, host_id=host_id, shared=shared, clock=clock, rules=rules)
        self._conn = conn
        self._where = location
        self._sql: dict[str, str] = {}
        self._init_schema()

    def location(self) -> str:
        return self._where

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        q = self._sql.get(sql)
        if q is None:
            q = self._sql[sql] = sql.replace("?", "%s")
        try:
            cur = self._conn.execute(q, tuple(params))
            return list(cur.fetchall()) if cur.description is not None else []
        except psycopg.Error as e:
            raise StoreUnavailable(f"{self._where}: {first_line(e)}") from None

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        import psycopg

        try:
            with self._conn.transaction():
                yield
        except psycopg.Error as e:
            raise StoreUnavailable(f"{self._where}: {first_line(e)}") from None

    def _tx(self) -> contextlib.AbstractContextManager[None]:
        return self._transaction()

    def _read(self) -> contextlib.AbstractContextManager[None]:
        # reads need no transaction block (each statement sees committed rows): fewer round trips
        return contextlib.nullcontext()

    def _soft(self) -> None:
        self._exec("SET LOCAL synchronous_commit TO OFF")

    def _create_lock(self) -> None:
        self._exec("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()

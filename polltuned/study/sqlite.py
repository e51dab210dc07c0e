"""The SQLite study backend (the default): ``STATE_DIR/studies/studies.sqlite3``, every policy's
study in one file (rows keyed by the policy fingerprint).

WAL journal, ``synchronous=FULL`` (a committed record survives power loss, not only a crash),
one transaction per record (``BEGIN IMMEDIATE`` ... ``COMMIT``): a writer killed at any moment
leaves every record it committed and none of the one it was writing — SQLite's journal gives the
guarantee the fsync'd JSON lines give the journal (tests/test_study_store.py kills writers mid-
transaction to check it). Readers (``polltuned history``) never block the daemon.

An existing JSON-lines study (``studies/<fingerprint>.jsonl``, written by earlier versions) is
imported once, in one transaction, the first time the policy's study is opened: afterwards there
is one source of truth with indexed reads instead of a file re-parsed on every read. The file is
left where it is, untouched, so an older polltuned can still read it; ``pt_meta`` remembers the
import (a crash during it rolls it back, and the next start imports again).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from polltuned.clock import Clock
from polltuned.errors import JournalError
from polltuned.study.jsonl import iter_records
from polltuned.study.sql import ClassRules, SqlStudy

log = logging.getLogger("polltuned.study")

DB_NAME = "studies.sqlite3"


def _private(path: Path) -> None:
    """The database (and its -wal/-shm files, which SQLite creates with the database's mode) 0600,
    like the journal: created so, and tightened when an older polltuned left it 0644."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            if p.exists() and p.stat().st_mode & 0o077:
                p.chmod(0o600)
    except OSError:
        pass  # sqlite3.connect reports what is wrong with the path


class SqliteStudy(SqlStudy):
    backend = "sqlite"

    def __init__(self, path: Path, fp: str, *, class_key: str | None = None, host_id: str | None = None,
                 shared: bool = False, clock: Clock | None = None, rules: ClassRules | None = None,
                 import_jsonl: Path | None = None) -> None:
        super().__init__(fp, class_key=class_key, host_id=host_id, shared=shared, clock=clock, rules=rules)
        self.path = path
        _private(path)
        try:
            self._conn = sqlite3.connect(str(path), isolation_level=None, timeout=30.0, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._init_schema()
        except sqlite3.DatabaseError as e:
            raise JournalError(f"{path}: not a readable study database ({e})") from None
        if import_jsonl is not None:
            self._import(import_jsonl)

    def location(self) -> str:
        return str(self.path)

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, tuple(params)).fetchall()

    @contextlib.contextmanager
    def _begin(self, how: str) -> Iterator[None]:
        if self._conn.in_transaction:   # nested: part of the outer transaction
            yield
            return
        self._conn.execute(f"BEGIN {how}")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _tx(self) -> contextlib.AbstractContextManager[None]:
        return self._begin("IMMEDIATE")

    def _read(self) -> contextlib.AbstractContextManager[None]:
        return self._begin("DEFERRED")

    def _import(self, jsonl: Path) -> None:
        key = f"imported:{self.fingerprint}"
        if self._exec("SELECT 1 FROM pt_meta WHERE key = ?", (key,)) or not jsonl.is_file():
            return
        records = list(iter_records(jsonl.read_text(encoding="utf-8"), str(jsonl)))
        with self._tx():
            if self._exec("SELECT 1 FROM pt_meta WHERE key = ?", (key,)):
                return  # another process imported it meanwhile
            for rec in records:
                fields = {k: v for k, v in rec.items() if k not in ("v", "kind")}
                self._insert(str(rec.get("kind")), fields)
            self._exec("INSERT INTO pt_meta (key, value) VALUES (?, ?)",
                       (key, f"{len(records)} records from {jsonl.name}"))
        log.info("study: imported %d records of %s into %s (the file is kept, unchanged)", len(records), jsonl,
                 self.path)

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()

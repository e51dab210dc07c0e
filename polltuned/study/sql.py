"""The relational study store shared by the SQLite and PostgreSQL backends (one schema, one code).

Why not Optuna's RDB storage (which runs distributed studies on PostgreSQL): its unit is a *trial*
with one value and immutable parameters drawn from declared distributions; ours is a *window*
with a raw J, a reference flag and a log-ratio the engine revises when the next reference
arrives, grouped in sessions, plus workload-class membership and pending trials. Mapping windows
onto Optuna trials would put everything we query into user attributes (JSON blobs SQL cannot
filter), pull SQLAlchemy + Alembic into the daemon, and still need our own tables for classes.
What we took from it: RUNNING trials visible to every worker (our ``pt_pending``), a heartbeat
with a grace period after which a dead worker's trial is ignored (our pending timeout), and an
append-only record per observation.

Tables (schema version 1 in ``pt_meta``; every JSON column is ``json.dumps(..., sort_keys=True)``)::

  pt_session  one row per session: study (policy fingerprint), class_key, host_id, host_fp, policy,
              seed, started (the store's clock when written: the sharing horizon), mode, baseline
              (+ base_key), in_class, ended, result, the record (with the engine's own "started")
  pt_window   one row per measurement window: session, trial, phase, config, idx, status, value
              (raw J), y (the log-ratio as told), ratio, score
  pt_histogram the latency histogram of a window that had one (session, idx, phase: the window's;
              histogram: polltuned.histogram's compressed HdrHistogram text). A table of its own,
              created by ``CREATE ... IF NOT EXISTS`` like the others: an older database gains it
              on open, an older polltuned ignores it (the schema stays version 1)
  pt_event    other records (``trial``), verbatim
  pt_pending  one row per session measuring a trial right now: class_key, host_id, config, since
  pt_member   one row per (class_key, host_id): the host's last baseline level and noise, and
              whether the class accepted it

Each :meth:`append` is one transaction (committed before it returns), so a killed writer leaves
every earlier record and never half of one. Reads of this host's own history filter by
``host_id`` when the database is shared (``shared=True``); a local database belongs to one host.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from polltuned.clock import Clock, SystemClock
from polltuned.errors import JournalError
from polltuned.records import KnobValue
from polltuned.study.base import (
    STUDY_VERSION,
    SessionLog,
    Study,
    StudyInfo,
    WindowRecord,
    base_key,
    dumps,
    finite,
    shareable,
)

log = logging.getLogger("polltuned.study")

SCHEMA_VERSION = "1"

#: DDL with {serial} (auto-increment primary key) and {real} (double precision) per dialect
SCHEMA = """
CREATE TABLE IF NOT EXISTS pt_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pt_session (
  seq {serial}, session TEXT NOT NULL UNIQUE, study TEXT NOT NULL, class_key TEXT, host_id TEXT,
  host_fp TEXT, policy TEXT, seed BIGINT, started {real}, mode TEXT, baseline TEXT NOT NULL,
  base_key TEXT NOT NULL, in_class INTEGER NOT NULL DEFAULT 0, ended INTEGER NOT NULL DEFAULT 0,
  result TEXT, record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS pt_session_study ON pt_session (study, host_id);
CREATE INDEX IF NOT EXISTS pt_session_class ON pt_session (class_key, base_key);
CREATE TABLE IF NOT EXISTS pt_window (
  seq {serial}, session TEXT NOT NULL, trial INTEGER, phase TEXT, config TEXT NOT NULL, idx INTEGER,
  status TEXT, value {real}, y {real}, ratio INTEGER NOT NULL DEFAULT 0, score TEXT);
CREATE INDEX IF NOT EXISTS pt_window_session ON pt_window (session, seq);
CREATE TABLE IF NOT EXISTS pt_histogram (session TEXT NOT NULL, idx INTEGER NOT NULL, phase TEXT NOT NULL,
  histogram TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS pt_histogram_window ON pt_histogram (session, idx);
CREATE TABLE IF NOT EXISTS pt_event (seq {serial}, session TEXT NOT NULL, kind TEXT NOT NULL, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pt_pending (
  session TEXT PRIMARY KEY, class_key TEXT NOT NULL, host_id TEXT, config TEXT NOT NULL, since {real} NOT NULL);
CREATE INDEX IF NOT EXISTS pt_pending_class ON pt_pending (class_key);
CREATE TABLE IF NOT EXISTS pt_member (
  class_key TEXT NOT NULL, host_id TEXT NOT NULL, session TEXT, level {real}, noise {real},
  accepted INTEGER NOT NULL, reason TEXT, at {real}, PRIMARY KEY (class_key, host_id));
"""


@dataclass(frozen=True)
class ClassRules:
    """When a host's baseline does not match its class (it then tunes alone)."""

    max_level_ratio: float = 1.5      # baseline J more than 1.5x (or less than 1/1.5x) the class median
    max_noise_ratio: float = 2.5      # window noise more than 2.5x (or less than 1/2.5x) the class median
    pending_timeout_s: float = 120.0  # a pending trial older than this is a dead host's: ignored
    min_hosts: int = 3                # fewer other hosts than this: nobody is judged yet (accepted)
    shared_horizon_s: float = 7 * 86400.0  # sessions older than this are not shared


@dataclass
class _SharedCache:
    last_seq: int = 0
    rows: list[tuple[str, dict[str, KnobValue], float]] = field(default_factory=list)


def judge(level: float, noise: float, others: Sequence[tuple[float, float]], rules: ClassRules) -> str | None:
    """Why a host with baseline J ``level`` and noise ``noise`` does not match the class's other
    hosts ``others`` [(level, noise)] (compared with their medians); None when it matches, or while
    fewer than ``rules.min_hosts`` others have reported (a median of one or two hosts would let
    whichever host came first decide; shared_observations re-judges every host once there are
    enough, so an early outlier's windows stop being shared then)."""
    if len(others) < rules.min_hosts:
        return None
    lv = [math.log(x) for x, _ in others if x and x > 0 and math.isfinite(x)]
    nz = [n for _, n in others if n and n > 0 and math.isfinite(n)]
    if lv and level > 0 and math.isfinite(level):
        med = statistics.median(lv)
        d = math.log(level) - med
        # a baseline level comes from a few windows: the limit widens by what that noise explains
        # (two standard errors of a two-window mean, with the larger of this host's and the class's noise)
        sd = max(noise if math.isfinite(noise) and noise > 0 else 0.0, statistics.median(nz) if nz else 0.0)
        limit = math.log(rules.max_level_ratio) + 2.0 * sd / math.sqrt(2.0)
        if abs(d) > limit:
            return (f"its baseline J {level:.4g} is {math.exp(d):.2f}x the class median {math.exp(med):.4g} "
                    f"(limit {math.exp(limit):.2f}x: {rules.max_level_ratio:g}x beyond the window noise)")
    if nz and noise > 0 and math.isfinite(noise):
        med_n = statistics.median(nz)
        r = noise / med_n
        if r > rules.max_noise_ratio or r < 1.0 / rules.max_noise_ratio:
            return (f"its window noise {noise:.3f} is {r:.2f}x the class median {med_n:.3f} "
                    f"(limit {rules.max_noise_ratio:g}x)")
    return None


class SqlStudy(Study):
    """A study in a relational database (see the module docstring). Subclasses connect and say how
    to run a statement and a transaction; statements are written with ``?`` placeholders."""

    backend = "sql"
    serial = "INTEGER PRIMARY KEY AUTOINCREMENT"
    real = "REAL"

    def __init__(self, fp: str, *, class_key: str | None = None, host_id: str | None = None,
                 shared: bool = False, clock: Clock | None = None, rules: ClassRules | None = None) -> None:
        self.fingerprint = fp
        self.class_key = class_key
        self.host_id = host_id
        self.shared = shared
        self.clock: Clock = clock or SystemClock()
        self.rules = rules or ClassRules()
        self._shared: dict[str, _SharedCache] = {}
        self._membership = "not joined yet" if shared else "single host"
        self._hosts: int | None = None

    # ---------------------------------------------------------------- dialect (subclasses)
    def _exec(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _tx(self) -> contextlib.AbstractContextManager[None]:
        """A write transaction: committed on exit, rolled back on an exception."""
        raise NotImplementedError

    def _read(self) -> contextlib.AbstractContextManager[None]:
        """A consistent read (one snapshot for several statements)."""
        return self._tx()

    def _create_lock(self) -> None:
        """Serialise concurrent schema creation (PostgreSQL: an advisory lock)."""
        return None

    def location(self) -> str:
        return "?"

    # ---------------------------------------------------------------- schema
    def _init_schema(self) -> None:
        with self._tx():
            self._create_lock()
            for stmt in SCHEMA.format(serial=self.serial, real=self.real).split(";"):
                if stmt.strip():
                    self._exec(stmt)
            rows = self._exec("SELECT value FROM pt_meta WHERE key = ?", ("schema",))
            if not rows:
                self._exec("INSERT INTO pt_meta (key, value) VALUES (?, ?)", ("schema", SCHEMA_VERSION))
            elif rows[0][0] != SCHEMA_VERSION:
                raise JournalError(f"{self.location()}: unknown study schema version {rows[0][0]!r} "
                                   f"(this polltuned reads {SCHEMA_VERSION})")

    # ---------------------------------------------------------------- records
    def append(self, kind: str, **fields: Any) -> None:
        with self._tx():
            self._insert(kind, fields)

    def _insert(self, kind: str, rec: Mapping[str, Any]) -> None:
        sid = str(rec.get("session"))
        if kind == "session":
            base = dict(rec.get("baseline") or {})
            host = rec.get("host")
            self._exec(
                "INSERT INTO pt_session (session, study, class_key, host_id, host_fp, policy, seed, started, mode, "
                "baseline, base_key, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (session) DO NOTHING",
                (sid, self.fingerprint, self.class_key, self.host_id, None if host is None else str(host),
                 None if rec.get("policy") is None else str(rec.get("policy")), int(rec.get("seed") or 0),
                 self.clock.wall(), None if rec.get("mode") is None else str(rec.get("mode")),
                 dumps(base), base_key(base), dumps({"v": STUDY_VERSION, "kind": kind, **rec})))
        elif kind == "window":
            ix, tr = rec.get("index"), rec.get("trial")
            self._exec(
                "INSERT INTO pt_window (session, trial, phase, config, idx, status, value, y, ratio, score) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (sid, None if tr is None else int(tr), str(rec.get("phase")), dumps(dict(rec.get("config") or {})),
                 None if ix is None else int(ix), str(rec.get("status")), finite(rec.get("value")),
                 finite(rec.get("y")), 1 if rec.get("ratio") else 0,
                 None if rec.get("score") is None else dumps(rec.get("score"))))
            hist = rec.get("histogram")
            if isinstance(hist, str) and hist and ix is not None:
                self._exec("INSERT INTO pt_histogram (session, idx, phase, histogram) VALUES (?, ?, ?, ?)",
                           (sid, int(ix), str(rec.get("phase")), hist))
        elif kind == "end":
            res = rec.get("result")
            self._exec("UPDATE pt_session SET ended = 1, result = ? WHERE session = ?",
                       (dumps(res if isinstance(res, Mapping) else None), sid))
        else:
            self._exec("INSERT INTO pt_event (session, kind, record) VALUES (?, ?, ?)",
                       (sid, kind, dumps({"v": STUDY_VERSION, "kind": kind, **rec})))

    def _own(self) -> tuple[str, tuple[Any, ...]]:
        if self.shared and self.host_id is not None:
            return "s.study = ? AND s.host_id = ?", (self.fingerprint, self.host_id)
        return "s.study = ?", (self.fingerprint,)

    def sessions(self) -> list[SessionLog]:
        where, params = self._own()
        with self._read():
            srows = self._exec(f"SELECT s.session, s.baseline, s.seed, s.host_fp, s.ended, s.result FROM pt_session s "
                               f"WHERE {where} ORDER BY s.seq", params)
            wrows = self._exec(
                f"SELECT w.session, w.trial, w.phase, w.config, w.idx, w.status, w.value, w.y, w.ratio, w.score, "
                f"h.histogram FROM pt_window w JOIN pt_session s ON s.session = w.session "
                f"LEFT JOIN pt_histogram h ON h.session = w.session AND h.idx = w.idx AND h.phase = w.phase "
                f"WHERE {where} ORDER BY w.seq", params)
        out: dict[str, SessionLog] = {}
        for sid, base, seed, host_fp, ended, result in srows:
            res = json.loads(result) if result else None
            out[sid] = SessionLog(sid, json.loads(base), int(seed or 0), ended=bool(ended),
                                  host=host_fp, result=res if isinstance(res, dict) else None)
        for sid, trial, phase, cfg, idx, status, value, y, ratio, score, hist in wrows:
            s = out.get(sid)
            if s is None:
                continue
            sc = json.loads(score) if score else None
            no = None if trial is None or int(trial) < 0 else int(trial)   # old files: -1/-2/-3 outside trials
            s.windows.append(WindowRecord(no, str(phase), json.loads(cfg), str(status),
                                          None if y is None else float(y), None if value is None else float(value),
                                          None if idx is None else int(idx), bool(ratio),
                                          sc if isinstance(sc, dict) else None,
                                          hist if isinstance(hist, str) and hist else None))
        return list(out.values())

    # ---------------------------------------------------------------- fleet hooks
    def join_class(self, session: str, baseline_j: float, noise_sd: float) -> bool:
        if not self.shared or self.class_key is None or self.host_id is None:
            return False
        ck, me = self.class_key, self.host_id
        with self._tx():
            others = [(float(lv), float(nz)) for lv, nz in self._exec(
                "SELECT level, noise FROM pt_member WHERE class_key = ? AND host_id <> ? "
                "AND level IS NOT NULL AND noise IS NOT NULL", (ck, me))]
            why = judge(baseline_j, noise_sd, others, self.rules)
            ok = why is None
            self._exec(
                "INSERT INTO pt_member (class_key, host_id, session, level, noise, accepted, reason, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (class_key, host_id) DO UPDATE SET "
                "session = excluded.session, level = excluded.level, noise = excluded.noise, "
                "accepted = excluded.accepted, reason = excluded.reason, at = excluded.at",
                (ck, me, session, finite(baseline_j), finite(noise_sd), 1 if ok else 0, why, self.clock.wall()))
            if ok:
                self._exec("UPDATE pt_session SET in_class = 1 WHERE session = ?", (session,))
            n = self._exec("SELECT COUNT(*) FROM pt_member WHERE class_key = ? AND accepted = 1", (ck,))
        self._hosts = int(n[0][0]) if n else None
        if ok:
            self._membership = "in class"
            log.info("study: host %s joined workload class %s (%d hosts share it)", me, ck, self._hosts or 0,
                     extra={"class": ck})
        else:
            self._membership = f"alone: {why}"
            log.warning("study: host %s does not match its workload class %s: %s; it tunes alone", me, ck, why,
                        extra={"class": ck})
        return ok

    def shared_observations(self, session: str, baseline: Mapping[str, KnobValue]
                            ) -> list[tuple[dict[str, KnobValue], float]]:
        if not self.shared or self.class_key is None:
            return []
        bk = base_key(baseline)
        cache = self._shared.setdefault(bk, _SharedCache())
        horizon = self.clock.wall() - self.rules.shared_horizon_s
        with self._read():
            rows = self._exec(
                "SELECT w.seq, w.session, w.config, w.y, w.phase, w.status, w.ratio FROM pt_window w "
                "JOIN pt_session s ON s.session = w.session "
                "WHERE s.class_key = ? AND s.base_key = ? AND s.host_id <> ? AND w.seq > ? AND w.y IS NOT NULL "
                "AND (s.started IS NULL OR s.started >= ?) ORDER BY w.seq",
                (self.class_key, bk, self.host_id or "", cache.last_seq, horizon))
            in_class = self._exec("SELECT session, host_id FROM pt_session WHERE class_key = ? AND base_key = ? "
                                  "AND in_class = 1 AND session <> ?", (self.class_key, bk, session))
            reports = self._exec("SELECT host_id, level, noise FROM pt_member WHERE class_key = ? "
                                 "AND level IS NOT NULL AND noise IS NOT NULL", (self.class_key,))
        # every host re-judged against the others' medians as they are now
        levels = {str(h): (float(lv), float(nz)) for h, lv, nz in reports}
        fits = {h for h, (lv, nz) in levels.items()
                if judge(lv, nz, [v for o, v in levels.items() if o != h], self.rules) is None}
        members = {str(sid) for sid, h in in_class if str(h) in fits}
        for seq, sid, cfg, y, phase, status, ratio in rows:
            cache.last_seq = max(cache.last_seq, int(seq))
            w = WindowRecord(0, str(phase), {}, str(status), float(y), ratio=bool(ratio))
            if shareable(w):
                cache.rows.append((str(sid), json.loads(cfg), float(y)))
        return [(dict(c), y) for sid, c, y in cache.rows if sid in members]

    def pending_configs(self, session: str) -> list[dict[str, KnobValue]]:
        if not self.shared or self.class_key is None:
            return []
        since = self.clock.wall() - self.rules.pending_timeout_s
        rows = self._exec("SELECT config FROM pt_pending WHERE class_key = ? AND session <> ? AND since >= ? "
                          "ORDER BY since", (self.class_key, session, since))
        return [json.loads(r[0]) for r in rows]

    def _soft(self) -> None:
        """The current transaction holds soft state (pending trials: they expire anyway), so its
        commit need not wait for the disk (PostgreSQL: synchronous_commit off)."""
        return None

    def set_pending(self, session: str, config: Mapping[str, KnobValue] | None) -> None:
        if not self.shared or self.class_key is None:
            return
        with self._tx():
            self._soft()
            if config is None:
                self._exec("DELETE FROM pt_pending WHERE session = ?", (session,))
            else:
                self._exec("INSERT INTO pt_pending (session, class_key, host_id, config, since) VALUES (?, ?, ?, ?, ?) "
                           "ON CONFLICT (session) DO UPDATE SET config = excluded.config, since = excluded.since",
                           (session, self.class_key, self.host_id, dumps(dict(config)), self.clock.wall()))

    # ---------------------------------------------------------------- describe
    def class_hosts(self) -> int | None:
        """Hosts the class accepted (a query; None for a single-host store)."""
        if not self.shared or self.class_key is None:
            return None
        n = self._exec("SELECT COUNT(*) FROM pt_member WHERE class_key = ? AND accepted = 1", (self.class_key,))
        self._hosts = int(n[0][0]) if n else 0
        return self._hosts

    def describe(self) -> StudyInfo:
        return StudyInfo(self.backend, self.location(), self.fingerprint, class_key=self.class_key,
                         hosts=self._hosts if self.shared else None, membership=self._membership)

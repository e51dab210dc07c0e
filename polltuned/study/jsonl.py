"""The JSON-lines study backend: ``STATE_DIR/studies/<fingerprint>.jsonl`` (today's format, kept
readable and writable: ``[study] backend = "jsonl"``; the SQLite default imports such a file once).

One versioned JSON object per line (``"v": 1``, ``"kind"``, the record's fields; see
polltuned.study.base). Each append is one write + fsync; a torn last line (crash mid-write) is
ignored on load, an unparsable line anywhere else is an error. ``path=None`` keeps the lines in
memory (``polltuned.study.memory_study``: benchmarks and tests).

A session without an ``end`` record is *resumable*. Values told to an optimiser from earlier
sessions are only ``"ratio": true`` windows and trial windows (older files stored a baseline
window's raw J in ``y`` — those are never told).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from polltuned.errors import JournalError
from polltuned.study.base import STUDY_VERSION, SessionLog, Study, StudyInfo, WindowRecord, dumps


def iter_records(text: str, source: str = "<study>") -> Iterator[dict[str, Any]]:
    """The records of a study file (pure). A torn (unparsable) *last* line is ignored; elsewhere it
    is an error, as is an unknown record version."""
    lines = text.split("\n")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if all(not rest.strip() for rest in lines[n:]):
                return  # torn tail from a crash mid-append
            raise JournalError(f"{source}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict) or rec.get("v") != STUDY_VERSION:
            got = rec.get("v") if isinstance(rec, dict) else rec
            raise JournalError(f"{source}:{n}: unknown study record version {got!r}")
        yield rec


def window_from(rec: dict[str, Any]) -> WindowRecord:
    y, v, ix, sc, h = rec.get("y"), rec.get("value"), rec.get("index"), rec.get("score"), rec.get("histogram")
    tr = rec.get("trial")
    return WindowRecord(None if tr is None or int(tr) < 0 else int(tr), str(rec.get("phase")),
                        dict(rec.get("config") or {}),
                        str(rec.get("status")), None if y is None else float(y), None if v is None else float(v),
                        None if ix is None else int(ix), bool(rec.get("ratio", False)),
                        dict(sc) if isinstance(sc, dict) else None, h if isinstance(h, str) and h else None)


def sessions_from(records: Iterator[dict[str, Any]]) -> list[SessionLog]:
    sessions: dict[str, SessionLog] = {}
    order: list[str] = []
    for rec in records:
        kind = rec.get("kind")
        sid = str(rec.get("session"))
        if kind == "session":
            host = rec.get("host")
            sessions[sid] = SessionLog(sid, dict(rec.get("baseline") or {}), int(rec.get("seed") or 0),
                                       host=None if host is None else str(host))
            order.append(sid)
        elif sid not in sessions:
            continue
        elif kind == "window":
            sessions[sid].windows.append(window_from(rec))
        elif kind == "end":
            sessions[sid].ended = True
            res = rec.get("result")
            sessions[sid].result = dict(res) if isinstance(res, dict) else None
    return [sessions[s] for s in order]


def parse_study(text: str, source: str = "<study>") -> list[SessionLog]:
    """Parse a study file (pure). A torn (unparsable) *last* line is ignored; elsewhere it is an error."""
    return sessions_from(iter_records(text, source))


class JsonlStudy(Study):
    """Append-only JSON-lines study. ``path=None`` keeps records in memory only."""

    backend = "jsonl"

    def __init__(self, path: Path | None, fp: str) -> None:
        self.path = path
        self.fingerprint = fp
        self._mem: list[str] = []

    def append(self, kind: str, **fields: Any) -> None:
        line = dumps({"v": STUDY_VERSION, "kind": kind, **fields})
        if self.path is None:
            self._mem.append(line)
            return
        with open(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def text(self) -> str:
        if self.path is None:
            return "\n".join(self._mem) + ("\n" if self._mem else "")
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    def sessions(self) -> list[SessionLog]:
        return parse_study(self.text(), str(self.path or "<memory>"))

    def describe(self) -> StudyInfo:
        if self.path is None:
            return StudyInfo("memory", "<memory>", self.fingerprint)
        return StudyInfo("jsonl", str(self.path), self.fingerprint)

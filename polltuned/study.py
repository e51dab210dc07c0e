"""Durable trial history: versioned JSON lines in ``STATE_DIR/studies/<fingerprint>.jsonl``.

One file per policy fingerprint (a hash of the knobs, objective and probe: what makes old numbers
comparable). Records (every line has ``"v": 1`` and ``"kind"``):

  session  {"session", "fingerprint", "policy", "seed", "started", "baseline": {knob: value}}
  window   {"session", "trial", "phase": "baseline"|"trial"|"confirm", "config", "window_index",
            "status": "ok"|"failed"|"aborted"|"infeasible", "value", "y", "score"}
  trial    {"session", "trial", "config", "status", "reason", "windows"}
  end      {"session", "result": TuningResult.to_json()}

Each append is one write + fsync; a torn last line (crash mid-write) is ignored on load. A session
without an ``end`` record is *resumable*: the tuner replays its windows into a fresh optimiser and
continues where it stopped. A new session with ``tuning.warm_start`` tells the optimiser the
windows of earlier sessions (their ``y`` is relative to their own baseline, so it stays
comparable).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polltuned.errors import JournalError
from polltuned.policy.schema import Policy
from polltuned.records import KnobValue

STUDY_VERSION = 1


def fingerprint(policy: Policy) -> str:
    data = {
        "knobs": {k: v.model_dump(mode="json") for k, v in sorted(policy.knobs.items())},
        "objective": policy.objective.model_dump(mode="json"),
        "probe": policy.probe.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class WindowRecord:
    trial: int
    phase: str
    config: dict[str, KnobValue]
    status: str
    y: float | None


@dataclass
class SessionLog:
    session: str
    baseline: dict[str, KnobValue]
    seed: int
    windows: list[WindowRecord] = field(default_factory=list)
    ended: bool = False


def parse_study(text: str, source: str = "<study>") -> list[SessionLog]:
    """Parse a study file (pure). A torn (unparsable) *last* line is ignored; elsewhere it is an error."""
    sessions: dict[str, SessionLog] = {}
    order: list[str] = []
    lines = text.split("\n")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if all(not rest.strip() for rest in lines[n:]):
                break  # torn tail from a crash mid-append
            raise JournalError(f"{source}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict) or rec.get("v") != STUDY_VERSION:
            got = rec.get("v") if isinstance(rec, dict) else rec
            raise JournalError(f"{source}:{n}: unknown study record version {got!r}")
        kind = rec.get("kind")
        sid = str(rec.get("session"))
        if kind == "session":
            sessions[sid] = SessionLog(sid, dict(rec.get("baseline") or {}), int(rec.get("seed") or 0))
            order.append(sid)
        elif sid not in sessions:
            continue
        elif kind == "window":
            y = rec.get("y")
            sessions[sid].windows.append(WindowRecord(int(rec.get("trial", -1)), str(rec.get("phase")),
                                                      dict(rec.get("config") or {}), str(rec.get("status")),
                                                      None if y is None else float(y)))
        elif kind == "end":
            sessions[sid].ended = True
    return [sessions[s] for s in order]


class Study:
    """Append-only study log. ``path=None`` keeps records in memory only (benchmarks, tests)."""

    def __init__(self, path: Path | None, fp: str) -> None:
        self.path = path
        self.fingerprint = fp
        self._mem: list[str] = []

    @staticmethod
    def open(state_dir: str | os.PathLike[str], policy: Policy) -> Study:
        fp = fingerprint(policy)
        d = Path(state_dir) / "studies"
        d.mkdir(parents=True, exist_ok=True)
        return Study(d / f"{fp}.jsonl", fp)

    @staticmethod
    def memory(policy: Policy) -> Study:
        return Study(None, fingerprint(policy))

    def append(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"v": STUDY_VERSION, "kind": kind, **fields}, sort_keys=True, default=_default)
        if self.path is None:
            self._mem.append(line)
            return
        with open(self.path, "a", encoding="utf-8") as fh:
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

    def resumable(self) -> SessionLog | None:
        s = self.sessions()
        return s[-1] if s and not s[-1].ended else None

    def prior_observations(self, limit_sessions: int = 5) -> list[tuple[dict[str, KnobValue], float]]:
        out: list[tuple[dict[str, KnobValue], float]] = []
        for s in [s for s in self.sessions() if s.ended][-limit_sessions:]:
            for w in s.windows:
                if w.y is not None and w.phase in ("baseline", "trial") and w.status in ("ok", "aborted"):
                    out.append((w.config, w.y))
        return out


def _default(o: object) -> object:
    if hasattr(o, "item"):
        return o.item()  # numpy scalars
    if isinstance(o, Mapping):
        return dict(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")

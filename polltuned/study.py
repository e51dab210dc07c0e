"""Durable trial history: versioned JSON lines in ``STATE_DIR/studies/<fingerprint>.jsonl``.

One file per policy fingerprint (a hash of the knobs, objective and probe: what makes old numbers
comparable). Records (every line has ``"v": 1`` and ``"kind"``):

  session  {"session", "fingerprint", "policy", "seed", "started", "baseline": {knob: value},
            "host": host fingerprint (optional), "mode": "search"|"resume"|"observe"}
  window   {"session", "trial", "phase": "baseline"|"trial"|"confirm"|"resume", "config", "index",
            "status": "ok"|"failed"|"aborted"|"infeasible", "value", "y", "ratio": true, "score"}
  trial    {"session", "trial", "config", "status", "reason", "windows"}
  end      {"session", "result": TuningResult.to_json()}

Each append is one write + fsync; a torn last line (crash mid-write) is ignored on load. A session
without an ``end`` record is *resumable*: the engine rebuilds its reference series and
observations from the windows' raw values (``value`` = J, ``index``) and continues where it
stopped. A new session with ``tuning.warm_start`` tells the optimiser the windows of earlier
sessions *that had the same baseline configuration*, and only values that are log-ratios to their
neighbouring reference windows (``"ratio": true``; older files stored a baseline window's raw J in
``y`` — those are never told).
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
    value: float | None = None       # J of the window
    index: int | None = None         # window index in its session
    ratio: bool = False              # y is a log-ratio to the neighbouring reference windows


@dataclass
class SessionLog:
    session: str
    baseline: dict[str, KnobValue]
    seed: int
    windows: list[WindowRecord] = field(default_factory=list)
    ended: bool = False
    host: str | None = None
    result: dict[str, Any] | None = None


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
            host = rec.get("host")
            sessions[sid] = SessionLog(sid, dict(rec.get("baseline") or {}), int(rec.get("seed") or 0),
                                       host=None if host is None else str(host))
            order.append(sid)
        elif sid not in sessions:
            continue
        elif kind == "window":
            y, v, ix = rec.get("y"), rec.get("value"), rec.get("index")
            sessions[sid].windows.append(WindowRecord(
                int(rec.get("trial", -1)), str(rec.get("phase")), dict(rec.get("config") or {}),
                str(rec.get("status")), None if y is None else float(y), None if v is None else float(v),
                None if ix is None else int(ix), bool(rec.get("ratio", False))))
        elif kind == "end":
            sessions[sid].ended = True
            res = rec.get("result")
            sessions[sid].result = dict(res) if isinstance(res, dict) else None
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

    def prior_observations(self, baseline: Mapping[str, KnobValue] | None = None,
                           limit_sessions: int = 5) -> list[tuple[dict[str, KnobValue], float]]:
        """Told values of earlier finished sessions: log-ratios only (``ratio`` windows, or trial
        windows, which were always log-ratios), and only from sessions that started from the same
        baseline configuration (``baseline``; None = any)."""
        out: list[tuple[dict[str, KnobValue], float]] = []
        ended = [s for s in self.sessions() if s.ended]
        if baseline is not None:
            want = {k: str(v) for k, v in baseline.items()}
            ended = [s for s in ended if {k: str(s.baseline.get(k)) for k in want} == want]
        for s in ended[-limit_sessions:]:
            for w in s.windows:
                if w.y is None or w.status not in ("ok", "aborted"):
                    continue
                if w.phase == "trial" or (w.phase == "baseline" and w.ratio):
                    out.append((w.config, w.y))
        return out

    def confirmed_deployment(self, host: str | None) -> tuple[dict[str, KnobValue], dict[str, KnobValue]] | None:
        """(baseline, deployed) of the last finished session on this host fingerprint whose
        confirmation deployed a change; None when there is none (or the last one kept the baseline)."""
        for s in reversed(self.sessions()):
            if not s.ended or s.result is None or s.host is None or s.host != host:
                continue
            res = s.result
            conf = res.get("confirmation")
            dep = res.get("deployed")
            if (res.get("deployed_is_baseline") or not isinstance(dep, dict) or not isinstance(conf, dict)
                    or not conf.get("deploy")):
                return None
            return dict(s.baseline), dict(dep)
        return None


    # ---------------------------------------------------------------- fleet hooks (single host)
    # A store shared by the hosts of one workload class (polltuned.study backends for fleets)
    # answers these from every host's records; this single-host store has no other hosts.
    def join_class(self, session: str, baseline_j: float, noise_sd: float) -> bool:
        """Offer this host's baseline level and window noise to its workload class; True when the
        class accepts it (its observations are then shared), False to tune alone."""
        return False

    def shared_observations(self, session: str, baseline: Mapping[str, KnobValue]
                            ) -> list[tuple[dict[str, KnobValue], float]]:
        """Told values (log-ratios to each host's own reference level) of the *other* hosts of the
        class that started from the same baseline configuration."""
        return []

    def pending_configs(self, session: str) -> list[dict[str, KnobValue]]:
        """Configurations other hosts of the class are measuring right now."""
        return []

    def set_pending(self, session: str, config: Mapping[str, KnobValue] | None) -> None:
        """Announce (or clear, with None) the configuration this host is measuring."""
        return None


def _default(o: object) -> object:
    if hasattr(o, "item"):
        return o.item()  # numpy scalars
    if isinstance(o, Mapping):
        return dict(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")

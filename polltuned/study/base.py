"""The study store interface every backend implements, and the records it returns.

A *study* is the durable trial history of one policy fingerprint (a hash of the knobs, objective
and probe: what makes old numbers comparable). The engine (polltuned.engine.core) writes four
kinds of record through :meth:`Study.append` and reads back what it needs to resume, warm-start
and share; ``polltuned history`` and ``polltuned status`` read sessions and :meth:`Study.describe`.

Records (every backend stores the same fields; the JSON-lines file writes them verbatim)::

  session  {"session", "fingerprint", "policy", "seed", "started", "baseline": {knob: value},
            "host": host fingerprint (optional), "mode": "search"|"resume"|"observe"}
  window   {"session", "trial" (None outside trials), "phase": the window's kind (polltuned.engine.phases
            .WindowKind: "reference"|"trial"|"repeat"|"confirm"|"resume"|"hold"|…; files written
            before kinds existed say "baseline" for a reference window), "config", "index",
            "status": "ok"|"failed"|"aborted"|"infeasible", "value", "y", "ratio": true, "score",
            "histogram" (optional: the window's latency histogram, polltuned.histogram's compressed
            HdrHistogram text; absent in older studies)}
  trial    {"session", "trial", "config", "status", "reason", "windows"}
  end      {"session", "result": TuningResult.to_json()}

The *fleet hooks* (``join_class``, ``shared_observations``, ``pending_configs``, ``set_pending``)
are answered trivially by a single-host store (this base class); the PostgreSQL fleet store
(polltuned.study.fleet) answers them from every host of the workload class.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from polltuned.errors import PolltunedError
from polltuned.histogram import HistogramError, LatencyHistogram
from polltuned.policy.schema import Policy
from polltuned.records import KnobValue

STUDY_VERSION = 1
KINDS = ("session", "window", "trial", "end")


class StoreUnavailable(PolltunedError):
    """The shared study database cannot be reached or failed mid-operation (the host then tunes
    alone on its local store)."""

    code = "store-unavailable"


def fingerprint(policy: Policy) -> str:
    """The study's key: what the policy asks for (knobs, objective, probe), not what this host
    offers today. Pass the policy as loaded, before knobs the host lacks are dropped or narrowed
    (issue 16: a vanished device or a kernel without one knob must not start a new, empty study);
    the NIC's name is folded back into ``{nic}``, so a renamed NIC keeps its study."""
    nic = policy.nic

    def generic(text: str) -> str:
        return "{nic}" + text[len(nic):] if nic and text.startswith(nic + ":") else text

    data = {
        "knobs": {generic(k): {**v.model_dump(mode="json"),
                               **({"requires_nonzero": [generic(d) for d in v.requires_nonzero]}
                                  if v.requires_nonzero else {})}
                  for k, v in sorted(policy.knobs.items())},
        "objective": policy.objective.model_dump(mode="json"),
        "probe": policy.probe.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _applies(config: Mapping[str, KnobValue], session_baseline: Mapping[str, KnobValue],
             want: Mapping[str, str]) -> dict[str, KnobValue] | None:
    """A window of an earlier session on today's knob set ``want`` (key -> baseline as text): the
    knobs no longer tuned here (a vanished device, a dropped knob) must have sat at that session's
    baseline, and every knob tuned today must have been set; None when the window does not apply
    (issue 16: a changed knob set keeps the windows that still apply)."""
    if any(k not in config for k in want):
        return None
    if any(str(v) != str(session_baseline.get(k)) for k, v in config.items() if k not in want):
        return None
    return {k: config[k] for k in want}


def base_key(baseline: Mapping[str, KnobValue]) -> str:
    """A baseline configuration as a comparable string (values compared as text, like the engine)."""
    return json.dumps({k: str(v) for k, v in baseline.items()}, sort_keys=True)


def dumps(o: object) -> str:
    return json.dumps(o, sort_keys=True, default=_default)


def _default(o: object) -> object:
    if hasattr(o, "item"):
        return o.item()  # numpy scalars
    if isinstance(o, Mapping):
        return dict(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def finite(x: Any) -> float | None:
    """A float for a REAL column (None for None, NaN and infinities: JSON has no NaN either)."""
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


@dataclass(frozen=True)
class WindowRecord:
    trial: int | None                # the trial's number (None: not a trial's window)
    phase: str
    config: dict[str, KnobValue]
    status: str
    y: float | None
    value: float | None = None       # J of the window
    index: int | None = None         # window index in its session
    ratio: bool = False              # y is a log-ratio to the neighbouring reference windows
    score: dict[str, Any] | None = None  # polltuned.objective.Score.to_json() (history shows it)
    histogram: str | None = None     # the window's latency histogram (polltuned.histogram), if it had one


@dataclass
class SessionLog:
    session: str
    baseline: dict[str, KnobValue]
    seed: int
    windows: list[WindowRecord] = field(default_factory=list)
    ended: bool = False
    host: str | None = None
    result: dict[str, Any] | None = None


@dataclass(frozen=True)
class StudyInfo:
    """What ``status`` and ``history`` say about the store (never a password)."""

    backend: str                     # jsonl | sqlite | postgresql | memory
    location: str                    # file path, or the DSN without its password
    fingerprint: str
    class_key: str | None = None     # policy fingerprint + host class fingerprint (fleet)
    hosts: int | None = None         # hosts that share the class (accepted members), None = single host
    membership: str = "single host"  # "in class" | "alone: <why>" | "single host" | "not joined yet"
    fallback: str | None = None      # why the shared store is not used (the host tunes alone)
    local: str | None = None         # the local store a fleet host also writes (and falls back to)

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "location": self.location, "fingerprint": self.fingerprint,
                "class_key": self.class_key, "hosts": self.hosts, "membership": self.membership,
                "fallback": self.fallback, "local": self.local}


class Study:
    """The store interface: exactly what the engine, ``history`` and ``status`` use.

    Backends implement :meth:`append` and :meth:`sessions` (and :meth:`describe`); the rest is
    derived here from the sessions, and the fleet hooks default to a single host."""

    fingerprint: str
    backend: str = "?"

    # ---------------------------------------------------------------- records (backends)
    def append(self, kind: str, **fields: Any) -> None:
        """Durably record one record (one fsync'd line, or one committed transaction) before returning."""
        raise NotImplementedError

    def sessions(self) -> list[SessionLog]:
        """This host's sessions of the study, oldest first, with their windows."""
        raise NotImplementedError

    def describe(self) -> StudyInfo:
        return StudyInfo(self.backend, "?", self.fingerprint)

    def close(self) -> None:
        return None

    # ---------------------------------------------------------------- derived (engine)
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
                if shareable(w):
                    assert w.y is not None
                    cfg = w.config if baseline is None else _applies(w.config, s.baseline, want)
                    if cfg is not None:
                        out.append((cfg, w.y))
        return out

    def histogram_of(self, config: Mapping[str, KnobValue], *, phases: tuple[str, ...] = ("confirm", "resume"),
                     session: str | None = None) -> LatencyHistogram | None:
        """The merged latency histogram of every measured window of ``config`` (compared as text,
        like the engine) in ``phases`` of ``session`` (None: all of this host's sessions): a
        deployment's p99 recomputed from all its requests (``.percentile_us(99)``). None when no
        such window kept a histogram."""
        want = {k: str(v) for k, v in config.items()}
        total: LatencyHistogram | None = None
        for s in self.sessions():
            if session is not None and s.session != session:
                continue
            for w in s.windows:
                if w.histogram is None or w.phase not in phases or w.status not in ("ok", "infeasible"):
                    continue
                if {k: str(w.config.get(k)) for k in want} != want:
                    continue
                try:
                    h = LatencyHistogram.decode(w.histogram)
                except HistogramError:
                    continue
                total = h if total is None else total.add(h)
        return total

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


def shareable(w: WindowRecord) -> bool:
    """A window whose ``y`` may be told to an optimiser: a trial window (always a log-ratio), or a
    reference window stored as a log-ratio; measured (ok, or aborted by the guard: told capped)."""
    if w.y is None or w.status not in ("ok", "aborted"):
        return False
    return w.phase in ("trial", "repeat") or (w.phase in ("reference", "baseline") and w.ratio)

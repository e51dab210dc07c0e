"""Builds the status document the daemon publishes (see polltuned.daemon.status)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from polltuned.daemon.controller import Controller
from polltuned.daemon.wiring import Daemon
from polltuned.engine.session import TuningResult
from polltuned.errors import PolltunedError
from polltuned.knobs.vhost import recommend_vhost_poll_us
from polltuned.policy.schema import Policy


def _num(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def knob_rows(d: Daemon, c: Controller) -> list[dict[str, Any]]:
    managed: dict[str, Any] = {}
    try:
        managed = {m.key: m for m in d.actuator.managed()}
    except PolltunedError:
        managed = {}
    try:
        # a managed knob's live value came with its row: read only the others (each read of a
        # device knob inside a netns is a subprocess; status is built every few seconds in HOLD)
        live = d.actuator.read([k for k in c.policy.knobs if k not in managed])
    except PolltunedError:
        live = {}
    res = c.result
    best = res.best_config if res is not None else {}
    deployed = res.deployed if res is not None else {}
    rows = []
    keys = list(c.policy.knobs) + [k for k in managed if k not in c.policy.knobs]
    for key in keys:
        m = managed.get(key)
        released_parts: list[str] = []
        if m is not None:
            owner = {"polltuned": "polltuned", "restored": "polltuned (restored)", "released": "admin (released)",
                     "unsupported": "unsupported", "gone": "gone"}.get(m.state, m.state)
            if m.state == "polltuned" and m.released_parts:
                owner, released_parts = "polltuned (partly released)", list(m.released_parts)
            original, current = m.baseline, m.live
        else:
            owner = "not managed" if key in live else "unsupported"
            original, current = live.get(key), live.get(key)
        note = ""
        if (key in deployed and res is not None and not res.deployed_is_baseline and current == deployed[key]
                and original != current):
            note = "deployed"
        row = {"key": key, "original": original, "current": current, "best": best.get(key), "owner": owner,
               "note": note}
        if released_parts:
            row["released_parts"] = released_parts   # e.g. the IRQs irqbalance moved: left to the admin
        rows.append(row)
    return rows


def build_status(d: Daemon, c: Controller) -> dict[str, Any]:
    pol = c.policy
    doc: dict[str, Any] = {
        "policy": pol.name,
        "nic": pol.nic,
        "phase": c.phase,
        "message": c.message,
        "trial": c.trial,
        "progress": {"trial": c.trial, "trials_budget": pol.tuning.budget // max(pol.tuning.repeats, 1),
                     "windows_budget": pol.tuning.budget, "round": c.round,
                     "windows_used": c.result.windows_used if c.result is not None else None},
        "knobs": knob_rows(d, c),
        "dropped_knobs": dict(getattr(d, "dropped_knobs", {})),
        "guard_events": list(c.guard_events),
        "guard_aborts_total": c.guard_aborts,
        "windows": {"measured": d.windows.measured, "failed": d.windows.failed},
        "recent_events": list(c.events)[-10:],
        "recovery": c.recovery,
        "hold": c.hold,
        "reloads": list(c.reloads),
        "counters": d.counters.summary(),
        "on_exit": pol.on_exit,
    }
    store = getattr(d, "study", None)   # polltuned.study.Study of the current round ([study] in the config)
    if store is not None:
        doc["study"] = store.describe().to_json()
    watcher = getattr(d, "watcher", None)
    ver = watcher.status() if watcher is not None else None
    if ver is not None:
        doc["last_verification"] = ver
    scope = getattr(c.env, "cpu_scope", None)   # polltuned.metrics.cpu_scope.CpuScope, once the env has one
    if scope is not None and callable(getattr(scope, "status", None)):
        doc["cpu_scope"] = scope.status()
    res = c.result
    if res is not None:
        doc["result"] = result_doc(c, res)
        doc["progress"]["windows_used"] = res.windows_used
        if doc["progress"]["trial"] is None:
            doc["progress"]["trial"] = len(res.trials)
        rec = _vhost_recommendation(pol, res)
        if rec:
            doc["recommendations"] = rec
    return _jsonable(doc)  # type: ignore[no-any-return]


def _jsonable(obj: Any) -> Any:
    """``obj`` as JSON data: records with ``to_json``, dataclasses (the recovery's rollback report),
    mappings and sequences, anything else as text."""
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    to_json = getattr(obj, "to_json", None)
    if callable(to_json):
        return to_json()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, Sequence):
        return [_jsonable(v) for v in obj]
    return str(obj)


def result_doc(c: Controller, res: TuningResult) -> dict[str, Any]:
    """The last round's result: objective, configurations, the confirmation's verdict."""
    pol = c.policy
    v = res.verdict
    conf: dict[str, Any] = {}
    if v is not None:
        conf = {
            "verdict": "significant: deployed" if v.deploy else "not deployed: baseline kept",
            "significant": v.significant,
            "gain": _num(v.gain), "ci": [_num(v.ci_low), _num(v.ci_high)],
            "p_value": _num(v.p_value), "pairs": min(len(v.baseline_samples), len(v.candidate_samples)),
            "reason": v.reason,
            "baseline_samples": list(v.baseline_samples), "candidate_samples": list(v.candidate_samples),
        }
    else:
        conf = {"verdict": "no candidate beat the baseline: baseline kept", "reason": res.reason}
    return {
        "objective_name": f"{pol.objective.statistic} {pol.objective.combine}",
        "baseline_objective": _num(res.baseline_value), "best_objective": _num(res.best_value),
        "baseline_config": res.baseline_config, "best_config": res.best_config, "deployed": res.deployed,
        "deployed_is_baseline": res.deployed_is_baseline, "confirmation": conf,
        "windows_used": res.windows_used,
        "trials": {s: sum(1 for t in res.trials if t.status == s) for s in ("ok", "failed", "aborted")},
        # search: a full search; resume: a confirmed configuration re-applied at start and
        # re-checked; observe: measured only, nothing written
        "mode": res.mode, "reason": res.reason, "window_noise_sd": _num(res.noise_sd),
        "would_try": [dict(c) for c in res.would_try],
    }


def _vhost_recommendation(pol: Policy, res: TuningResult) -> dict[str, Any]:
    """vhost/KVM knobs in the policy: the QEMU poll-us matching the deployed busy_poll."""
    bp = res.deployed.get("net.core.busy_poll")
    if not isinstance(bp, int) or not any(k.startswith(("vhost:", "module:kvm")) for k in pol.knobs):
        return {}

    rec = recommend_vhost_poll_us(bp)
    return {"qemu -netdev tap,poll-us": {"value": rec.poll_us, "why": rec.reason}}

"""The one builder of the engine: the daemon, ``polltuned sim`` and ``polltuned bench`` all go
through these functions, so they tune the same engine over the same parts.

    host + state dir --polltuned.actuator.build_actuator--> journal + actuator (the policy's app_cpus)
    policy --prepare_policy--> (knobs this host has and this probe can see)
    actuator + probe --build_env--> HostEnv
    current values + study --build_engine--> Engine (driven by engine.driver.drive or the controller)

``prepare_policy`` is where knob semantics meet the probe (polltuned.knobs.keys.Effect): a knob
that only acts on sockets created afterwards (``net.core.busy_read``) is dropped, with its reason,
when the probe measures long-lived sockets it cannot re-create (tcp_rtt on established
connections, a Prometheus histogram of a running server, a command that does not declare
``fresh_sockets``); so is a knob this host does not have (polltuned.engine.compat).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polltuned.clock import Clock
from polltuned.engine.compat import Compat, KnobSource, detect, log_compat
from polltuned.engine.core import Engine
from polltuned.engine.env import ContextMeterLike, CpuScopeLike, HostEnv, TrialEnv
from polltuned.errors import KnobUnsupported
from polltuned.knobs.keys import Effect
from polltuned.optimiser import Optimiser
from polltuned.policy.schema import Policy
from polltuned.probes.base import Probe
from polltuned.probes.factory import probe_opens_fresh_sockets
from polltuned.study import Study

log = logging.getLogger("polltuned.engine")


def inert_knobs(policy: Policy) -> dict[str, str]:
    """Knobs this policy's probe cannot see, with the reason (one line each)."""
    if probe_opens_fresh_sockets(policy.probe):
        return {}
    out: dict[str, str] = {}
    for key, k in policy.knob_keys.items():
        if k.effect is Effect.NEW_SOCKETS:
            out[key] = (f"acts {k.effect.value}, and the {policy.probe.kind} probe measures sockets that "
                        "already exist (a probe that opens new sockets every window can tune it: sockperf, or "
                        "a command probe with fresh_sockets = true)")
    return out


def without_knobs(policy: Policy, drop: Mapping[str, str]) -> Policy:
    """The policy with ``drop``'s knobs removed (and removed from every ``requires_nonzero``)."""
    if not drop:
        return policy
    knobs = {k: v for k, v in policy.knobs.items() if k not in drop}
    knobs = {k: v.model_copy(update={"requires_nonzero": [d for d in v.requires_nonzero if d in knobs]})
             for k, v in knobs.items()}
    return policy.model_copy(update={"knobs": knobs})


@dataclass(frozen=True)
class FittedPolicy:
    """A policy fitted to this host and its probe (:func:`fit_policy`)."""

    #: what is tuned here: the knobs the probe can see and the host has, ranges narrowed
    policy: Policy
    #: knob -> why it is not tuned (the probe cannot see it, or the host lacks it)
    dropped: dict[str, str]
    #: the host check (polltuned.engine.compat); None when no host was given
    compat: Compat | None


def fit_policy(policy: Policy, source: KnobSource | None = None, *,
               logger: logging.Logger | None = log) -> FittedPolicy:
    """The one policy fitting (daemon, reloads, ``sim``, ``check`` and the bench): knobs the probe
    cannot see dropped (:func:`inert_knobs`), then, with ``source`` (a KnobRegistry or the Actuator
    carrying one), knobs this host lacks dropped and refused values or out-of-domain ranges
    narrowed (polltuned.engine.compat). One log line per dropped knob on ``logger`` (None: silent).
    Raises KnobUnsupported (exit 4) when nothing is left to tune."""
    inert = inert_knobs(policy)
    if logger is not None:
        for key, why in inert.items():
            logger.warning("knob %s not tuned: %s", key, why, extra={"knob": key, "policy": policy.name})
    kept = without_knobs(policy, inert)
    dropped = dict(inert)
    if not kept.knobs:
        raise KnobUnsupported(f"policy {policy.name}: no knob left to tune ("
                              + "; ".join(f"{k}: {why}" for k, why in inert.items()) + ")")
    if source is None:
        return FittedPolicy(kept, dropped, None)
    compat = detect(source, kept)
    if logger is not None:
        log_compat(compat, logger)
    dropped.update(compat.dropped)
    return FittedPolicy(compat.policy, dropped, compat)


def prepare_policy(policy: Policy, source: KnobSource | None = None) -> tuple[Policy, dict[str, str]]:
    """:func:`fit_policy`'s policy and dropped knobs (with their reasons), logged."""
    fitted = fit_policy(policy, source)
    return fitted.policy, fitted.dropped


def build_env(policy: Policy, actuator: Any, probe: Probe, clock: Clock, *,
              cpu_scope: CpuScopeLike | None = None, context: ContextMeterLike | None = None) -> HostEnv:
    """The HostEnv; ``cpu_scope`` (polltuned.metrics.cpu_scope.make_cpu_scope) measures CPU when the
    probe does not report it; ``context`` (polltuned.metrics.context) fills Window.context."""
    return HostEnv(policy, actuator, probe, clock=clock, cpu_scope=cpu_scope, context=context)


def build_engine(policy: Policy, env: TrialEnv, store: Study, clock: Clock, *, optimiser: Optimiser | None = None,
                 host_fingerprint: str | None = None, resume: bool = False, observe: bool = False,
                 dropped: Mapping[str, str] | None = None, follow: bool = False) -> Engine:
    """An engine for ``env``'s host: its current values are the session's baseline. ``follow``:
    HOLD after the first decision (the daemon) instead of finishing (``sim``, the bench)."""
    return Engine(policy, store, current=env.current(), clock=clock, optimiser=optimiser,
                  host_fingerprint=host_fingerprint, resume=resume, observe=observe, dropped_knobs=dropped,
                  follow=follow)

"""The one builder of the engine: the daemon, ``polltuned sim`` and ``polltuned bench`` all go
through these functions, so they tune the same engine over the same parts.

    policy --prepare_policy--> (knobs this host has and this probe can see)
    host + state dir --build_actuator--> journal + actuator (with the policy's app_cpus)
    actuator + probe --build_env--> HostEnv
    current values + study --build_engine--> Engine (driven by engine.driver.drive or the controller)

``prepare_policy`` is where knob semantics meet the probe (polltuned.knobs.keys.Effect): a knob
that only acts on sockets created afterwards (``net.core.busy_read``) is dropped, with its reason,
when the probe measures long-lived sockets it cannot re-create (tcp_rtt on established
connections, a Prometheus histogram of a running server, a command that does not declare
``fresh_sockets``); so is a knob this host does not have (polltuned.knobs.compat).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polltuned.clock import Clock
from polltuned.engine.core import Engine
from polltuned.engine.env import CpuSampler, CpuScopeLike, HostEnv, TrialEnv
from polltuned.knobs.keys import Effect
from polltuned.optimiser import Optimiser
from polltuned.policy.schema import Policy
from polltuned.probes.base import Probe
from polltuned.study import Study

log = logging.getLogger("polltuned.engine")


def inert_knobs(policy: Policy) -> dict[str, str]:
    """Knobs this policy's probe cannot see, with the reason (one line each)."""
    from polltuned.probes.factory import probe_opens_fresh_sockets

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


def prepare_policy(policy: Policy, actuator: Any | None = None) -> tuple[Policy, dict[str, str]]:
    """The policy restricted to knobs the probe can see and this host has (polltuned.knobs.compat:
    missing knobs dropped, refused values and out-of-domain ranges narrowed), with one log line per
    dropped knob; the dropped ones with their reasons. Raises KnobUnsupported (exit 4) when nothing
    is left to tune."""
    from polltuned.errors import KnobUnsupported

    inert = inert_knobs(policy)
    for key, why in inert.items():
        log.warning("knob %s not tuned: %s", key, why, extra={"knob": key, "policy": policy.name})
    kept = without_knobs(policy, inert)
    dropped = dict(inert)
    if not kept.knobs:
        raise KnobUnsupported(f"policy {policy.name}: no knob left to tune ("
                              + "; ".join(f"{k}: {why}" for k, why in inert.items()) + ")")
    if actuator is not None:
        from polltuned.knobs.compat import detect, log_compat

        compat = detect(actuator, kept)
        log_compat(compat, log)
        kept = compat.policy
        dropped.update(compat.dropped)
    return kept, dropped


def build_actuator(host: Any, state_dir: Path, policy: Policy, clock: Clock) -> Any:
    """Journal + actuator for ``host`` (the policy's app_cpus reach the IRQ/vhost strategies)."""
    from polltuned.actuator import Actuator
    from polltuned.journal import Journal
    from polltuned.knobs.registry import KnobRegistry

    state_dir.mkdir(parents=True, exist_ok=True)
    journal = Journal(state_dir, clock=clock)
    return Actuator(host, journal, registry=KnobRegistry(host, app_cpus=policy.app_cpus),
                    app_cpus=policy.app_cpus, clock=clock)


def build_env(policy: Policy, actuator: Any, probe: Probe, clock: Clock, *,
              sampler: CpuSampler | None = None, cpus: Sequence[int] | None = None,
              cpu_scope: CpuScopeLike | None = None) -> HostEnv:
    return HostEnv(policy, actuator, probe, clock=clock, sampler=sampler, cpus=cpus, cpu_scope=cpu_scope)


def build_engine(policy: Policy, env: TrialEnv, store: Study, clock: Clock, *, optimiser: Optimiser | None = None,
                 host_fingerprint: str | None = None, resume: bool = False, observe: bool = False,
                 dropped: Mapping[str, str] | None = None) -> Engine:
    """An engine for ``env``'s host: its current values are the session's baseline."""
    return Engine(policy, store, current=env.current(), clock=clock, optimiser=optimiser,
                  host_fingerprint=host_fingerprint, resume=resume, observe=observe, dropped_knobs=dropped)

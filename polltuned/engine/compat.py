"""Fit a policy to this host: keep the knobs the host has, drop the others with the reason.

One implementation for the daemon (at start and on reload), ``polltuned check POLICY`` and the bench.
Per knob of the policy (knobs.md section 2, the version matrix, is what varies):

* the knob must exist and be writable on this host — ``Knob.availability()``: the sysctl or sysfs
  file exists and is writable (0444 module parameters and managed IRQs are read-only by design),
  per-NAPI netlink needs ``napi-set`` with that attribute in the netdev family's policy (6.13+;
  the family itself is 6.3+), IRQ affinity needs queue IRQs that are not all managed, a module
  parameter needs its module loaded, vhost affinity needs vhost workers;
* the policy's search space is narrowed to what this kernel accepts: categorical values the knob
  refuses (``threaded = 2`` before threaded busy-poll, ``pack-app`` without ``app_cpus``) are
  removed, numeric bounds are clamped to the knob's domain (``netdev_budget_usecs`` minimum =
  2 jiffies); a knob left with fewer than two values, or with an empty range, is dropped;
* ``requires_nonzero`` lists lose the knobs that were dropped.

Nothing is written. When no knob is left, :class:`polltuned.errors.KnobUnsupported` (exit 4)
names every knob with its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from polltuned.errors import KnobUnsupported, PolltunedError
from polltuned.knobs.base import Knob
from polltuned.knobs.registry import KnobRegistry
from polltuned.policy.schema import KnobSpec, Policy

#: categorical values that expand from the policy's app_cpus (irq_affinity, vhost:affinity)
APP_STRATEGIES = ("pack-app", "avoid-app")


class _HasRegistry(Protocol):
    @property
    def registry(self) -> KnobRegistry: ...


#: where the knobs are looked up: a KnobRegistry, or anything carrying one (the Actuator)
KnobSource: TypeAlias = "KnobRegistry | _HasRegistry"


@dataclass(frozen=True)
class Compat:
    """The policy as this host can run it, and what was taken out of it."""

    policy: Policy
    #: knob key -> why it is not tuned on this host
    dropped: Mapping[str, str] = field(default_factory=dict)
    #: knob key -> how its search space was narrowed (values removed, bounds clamped) and why
    narrowed: Mapping[str, str] = field(default_factory=dict)
    #: knobs this host has that offer pack-app/avoid-app while the policy's app_cpus is empty
    needs_app_cpus: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"kept": list(self.policy.knobs), "dropped": dict(self.dropped), "narrowed": dict(self.narrowed),
                "needs_app_cpus": list(self.needs_app_cpus)}


def _fit_categorical(knob: Knob, spec: KnobSpec) -> tuple[KnobSpec | None, str]:
    assert spec.values is not None
    keep: list[str | int] = []
    refused: list[str] = []
    for v in spec.values:
        try:
            knob.validate(v)
            keep.append(v)
        except PolltunedError as e:
            refused.append(f"{v!r} ({e.message.removeprefix(knob.key + ': ').removeprefix(repr(v) + ': ')})")
    if not refused:
        return spec, ""
    why = "values not usable here: " + "; ".join(refused)
    if len(keep) < 2:
        left = f"only {keep[0]!r} is left" if keep else "no value is left"
        return None, f"{why}; {left}, nothing to search"
    upd = {**spec.model_dump(), "values": keep, "seeds": [s for s in spec.seeds if s in keep]}
    if spec.off_value is not None and spec.off_value not in keep:
        upd["off_value"] = None
    return KnobSpec.model_validate(upd), why


def _fit_numeric(knob: Knob, spec: KnobSpec) -> tuple[KnobSpec | None, str]:
    assert spec.min is not None and spec.max is not None
    dom = knob.domain
    if dom.kind != "int":
        return None, f"the policy gives a numeric range but this knob takes {dom.describe()}"
    lo, hi = max(spec.min, dom.lo), min(spec.max, dom.hi)
    if lo > hi:
        return None, (f"the policy range {spec.min:g}..{spec.max:g} lies outside what this kernel accepts "
                      f"({dom.describe()}{', ' + dom.note if dom.note else ''})")
    if (lo, hi) == (spec.min, spec.max):
        return spec, ""
    upd = {**spec.model_dump(), "min": lo, "max": hi,
           "seeds": [s for s in spec.seeds if not isinstance(s, str) and lo <= s <= hi]}
    if lo > 0:
        upd["zero_is_off"] = False
    if isinstance(spec.off_value, (int, float)) and not lo <= spec.off_value <= hi:
        upd["off_value"] = None
    why = (f"range {spec.min:g}..{spec.max:g} clamped to {lo:g}..{hi:g}: this kernel accepts {dom.describe()}"
           + (f" ({dom.note})" if dom.note else ""))
    return KnobSpec.model_validate(upd), why


def fit_knob(knob: Knob, spec: KnobSpec) -> tuple[KnobSpec | None, str]:
    """Pure given the knob's domain/validate: the spec narrowed to what the knob accepts
    (None = nothing usable is left) and a one-line reason when anything changed."""
    if spec.type == "categorical":
        return _fit_categorical(knob, spec)
    return _fit_numeric(knob, spec)


def detect(source: KnobSource, policy: Policy) -> Compat:
    """Decide, per knob of ``policy``, whether this host has it; return the policy without the
    missing ones (see the module doc). ``source``: a KnobRegistry or anything carrying one
    (the Actuator). Raises KnobUnsupported when no knob is left."""
    registry = source if isinstance(source, KnobRegistry) else source.registry
    kept: dict[str, KnobSpec] = {}
    dropped: dict[str, str] = {}
    narrowed: dict[str, str] = {}
    needs_app: list[str] = []
    for key, spec in policy.knobs.items():
        try:
            knob = registry.get(key)
            av = knob.availability()
        except PolltunedError as e:
            dropped[key] = e.message
            continue
        if not av.present or not av.writable:
            dropped[key] = av.reason or ("absent on this host" if not av.present else "not writable")
            continue
        if not policy.app_cpus and any(v in APP_STRATEGIES for v in (spec.values or [])):
            needs_app.append(key)
        try:
            fitted, why = fit_knob(knob, spec)
        except (PolltunedError, ValueError) as e:
            dropped[key] = f"cannot fit the policy's values to this host: {e}"
            continue
        if fitted is None:
            dropped[key] = why
            continue
        kept[key] = fitted
        if why:
            narrowed[key] = why
    if not kept:
        raise KnobUnsupported(
            f"policy {policy.name}: none of its {len(policy.knobs)} knobs can be tuned on this host: "
            + "; ".join(f"{k}: {r}" for k, r in dropped.items()),
            hint=f"`polltuned check {policy.name}` lists what this host has")
    knobs = {k: (s if all(d in kept for d in s.requires_nonzero)
                 else s.model_copy(update={"requires_nonzero": [d for d in s.requires_nonzero if d in kept]}))
             for k, s in kept.items()}
    return Compat(policy.model_copy(update={"knobs": knobs}), dropped, narrowed, tuple(needs_app))


def log_compat(compat: Compat, log: logging.Logger) -> None:
    """One log line per dropped knob (warning) and per narrowed one (info)."""
    for key, why in compat.dropped.items():
        log.warning("knob %s dropped: %s", key, why, extra={"knob": key})
    for key, why in compat.narrowed.items():
        log.info("knob %s narrowed: %s", key, why, extra={"knob": key})

"""The search space built from a policy, and its encoding into the unit cube.

Every optimiser works on the same encoding, so that what "near" means is decided once, here, with
what we know about the knobs:

* a numeric knob is one column in [0, 1], on a log scale when the policy says ``scale = "log"``;
* a knob with ``zero_is_off`` gets an explicit on/off column plus the value column over its
  non-zero range; while off, its value column is pinned to 0 (so the surrogate never learns from a
  value that had no effect);
* a small integer range (at most three values, e.g. ``kernel.timer_migration`` 0/1) and a
  categorical knob are one-hot columns;
* a conditional knob (``requires_nonzero``) is pinned to its ``off_value`` (and its columns to
  0) whenever one of the knobs it depends on is zero: it is not searched where it cannot matter.

``decode(encode(c))`` is the canonical form of a configuration: two assignments with the same
canonical form are the same trial.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from polltuned.errors import PolicyError
from polltuned.policy.schema import KnobSpec, Policy
from polltuned.records import KnobValue

Vector = np.ndarray


@dataclass(frozen=True)
class Dim:
    """One knob of the space. ``kind``: "num" (one column), "switch" (on/off + value column), "cat" (one-hot)."""

    key: str
    kind: str
    is_int: bool
    lo: float = 0.0            # numeric range of the value column (non-zero part for "switch")
    hi: float = 0.0
    log: bool = False
    choices: tuple[KnobValue, ...] = ()
    seeds: tuple[KnobValue, ...] = ()
    requires: tuple[str, ...] = ()
    off_value: KnobValue = 0
    offset: int = 0            # first column in the encoded vector

    @property
    def width(self) -> int:
        if self.kind == "num":
            return 1
        if self.kind == "switch":
            return 2
        return len(self.choices)

    # -- value column <-> number ---------------------------------------------------------
    def to_unit(self, v: float) -> float:
        v = min(max(v, self.lo), self.hi)
        if self.hi <= self.lo:
            return 0.0
        if self.log:
            return (math.log(v) - math.log(self.lo)) / (math.log(self.hi) - math.log(self.lo))
        return (v - self.lo) / (self.hi - self.lo)

    def from_unit(self, u: float) -> KnobValue:
        u = min(max(float(u), 0.0), 1.0)
        if self.log:
            v = math.exp(math.log(self.lo) + u * (math.log(self.hi) - math.log(self.lo)))
        else:
            v = self.lo + u * (self.hi - self.lo)
        if self.is_int:
            return int(min(max(round(v), self.lo), self.hi))
        return float(v)


def _dim_from_spec(key: str, spec: KnobSpec) -> Dim:
    seeds = tuple(spec.seeds)
    req = tuple(spec.requires_nonzero)
    if spec.type == "categorical":
        assert spec.values is not None
        off = spec.off_value if spec.off_value is not None else spec.values[0]
        return Dim(key, "cat", False, choices=tuple(spec.values), seeds=seeds, requires=req, off_value=off)
    assert spec.min is not None and spec.max is not None
    is_int = spec.type == "int"
    off_value: KnobValue = spec.off_value if spec.off_value is not None else (
        int(spec.min) if is_int else float(spec.min))
    if is_int and not spec.zero_is_off and spec.max - spec.min <= 2:
        choices = tuple(range(int(spec.min), int(spec.max) + 1))
        return Dim(key, "cat", True, choices=choices, seeds=seeds, requires=req, off_value=off_value)
    log = spec.scale == "log"
    if spec.zero_is_off:
        lo = max(spec.min, 1.0)
        return Dim(key, "switch", is_int, lo=lo, hi=spec.max, log=log, seeds=seeds, requires=req,
                   off_value=0 if is_int else 0.0)
    return Dim(key, "num", is_int, lo=spec.min, hi=spec.max, log=log, seeds=seeds, requires=req,
               off_value=off_value)


def _is_zero(v: KnobValue) -> bool:
    if isinstance(v, str):
        return v in ("0", "off", "")
    return v == 0


@dataclass(frozen=True)
class Space:
    dims: tuple[Dim, ...]
    width: int = field(default=0)

    @staticmethod
    def from_policy(policy: Policy) -> Space:
        dims: list[Dim] = []
        off = 0
        for key, spec in policy.knobs.items():
            d = _dim_from_spec(key, spec)
            d = replace(d, offset=off)
            off += d.width
            dims.append(d)
        keys = {d.key for d in dims}
        for d in dims:
            for r in d.requires:
                if r not in keys:
                    raise PolicyError([f"knobs.{d.key}.requires_nonzero: {r!r} is not a knob of this policy"])
        return Space(tuple(dims), off)

    @property
    def keys(self) -> list[str]:
        return [d.key for d in self.dims]

    def dim(self, key: str) -> Dim:
        for d in self.dims:
            if d.key == key:
                return d
        raise KeyError(key)

    # -- conditionals ----------------------------------------------------------------------
    def active(self, config: Mapping[str, KnobValue], d: Dim) -> bool:
        return all(not _is_zero(config.get(r, 0)) for r in d.requires)

    # -- encoding --------------------------------------------------------------------------
    def encode(self, config: Mapping[str, KnobValue]) -> Vector:
        u = np.zeros(self.width)
        for d in self.dims:
            v = config.get(d.key, d.off_value)
            if not self.active(config, d):
                continue
            if d.kind == "num":
                u[d.offset] = d.to_unit(_num(v))
            elif d.kind == "switch":
                if not _is_zero(v):
                    u[d.offset] = 1.0
                    u[d.offset + 1] = d.to_unit(_num(v))
            else:
                idx = _choice_index(d, v)
                u[d.offset + idx] = 1.0
        return u

    def decode(self, u: Vector) -> dict[str, KnobValue]:
        out: dict[str, KnobValue] = {}
        for d in self.dims:
            if d.kind == "num":
                out[d.key] = d.from_unit(float(u[d.offset]))
            elif d.kind == "switch":
                out[d.key] = d.from_unit(float(u[d.offset + 1])) if u[d.offset] >= 0.5 else d.off_value
            else:
                seg = u[d.offset:d.offset + d.width]
                out[d.key] = d.choices[int(np.argmax(seg))]
        # conditionals, in dependency order (one pass suffices for acyclic 1-level deps; repeat to be safe)
        for _ in range(len(self.dims)):
            changed = False
            for d in self.dims:
                if not self.active(out, d) and out[d.key] != d.off_value:
                    out[d.key] = d.off_value
                    changed = True
            if not changed:
                break
        return out

    def canonical(self, config: Mapping[str, KnobValue]) -> dict[str, KnobValue]:
        return self.decode(self.encode(config))

    def key_of(self, config: Mapping[str, KnobValue]) -> str:
        c = self.canonical(config)
        return "|".join(f"{k}={c[k]}" for k in self.keys)

    # -- sampling ------------------------------------------------------------------------
    def sample_uniform(self, rng: np.random.Generator, n: int) -> list[dict[str, KnobValue]]:
        """Independent uniform draws in the encoded space (off/on equally likely)."""
        out = []
        for _ in range(n):
            u = np.zeros(self.width)
            for d in self.dims:
                if d.kind == "num":
                    u[d.offset] = rng.random()
                elif d.kind == "switch":
                    u[d.offset] = float(rng.random() < 0.5)
                    u[d.offset + 1] = rng.random()
                else:
                    u[d.offset + int(rng.integers(d.width))] = 1.0
            out.append(self.decode(u))
        return out

    def space_filling(self, n: int, seed: int) -> list[dict[str, KnobValue]]:
        """A space-filling design of ``n`` points over every knob's whole range: a scrambled Sobol
        sequence decides which switches are on and the categories (each switch is off or on about
        equally often, each category about equally often), and every knob's values are *stratified
        among the points where it is on* (a Latin hypercube per knob: with k points switched on,
        one value in each of k equal slices of its — log or linear — range, in random order), so a
        threshold anywhere in a knob's range is straddled even by a small design."""
        if n <= 0:
            return []
        from scipy.stats import qmc

        rng = np.random.default_rng(seed)
        coords = sum(2 if d.kind == "switch" else 1 for d in self.dims)
        m = max(0, math.ceil(math.log2(n)))
        pts = qmc.Sobol(d=coords, scramble=True, seed=seed).random_base2(m)[:n]
        us = [np.zeros(self.width) for _ in range(n)]
        j = 0
        for d in self.dims:
            if d.kind == "cat":
                for u, row in zip(us, pts):
                    u[d.offset + min(int(row[j] * d.width), d.width - 1)] = 1.0
                j += 1
                continue
            if d.kind == "switch":
                on = [i for i, row in enumerate(pts) if row[j] >= 0.5]
                if not on:  # a design without this knob switched on at all: turn one point on
                    on = [int(rng.integers(n))]
                col = d.offset + 1
                for i in on:
                    us[i][d.offset] = 1.0
                j += 2
            else:
                on = list(range(n))
                col = d.offset
                j += 1
            k = len(on)
            strata = (rng.permutation(k) + rng.random(k)) / k
            for i, v in zip(on, strata):
                us[i][col] = v
        return [self.decode(u) for u in us]

    def levels(self, d: Dim, n_numeric: int = 3) -> list[KnobValue]:
        """A small set of values per knob for grid search: off, seeds, and log/linear-spaced points."""
        if d.kind == "cat":
            return list(d.choices)
        vals: list[KnobValue] = []
        if d.kind == "switch":
            vals.append(d.off_value)
        for i in range(n_numeric):
            u = 0.5 if n_numeric == 1 else i / (n_numeric - 1)
            v = d.from_unit(u)
            if v not in vals:
                vals.append(v)
        return vals

    def seed_configs(self, baseline: Mapping[str, KnobValue]) -> list[dict[str, KnobValue]]:
        """Domain seeds, one knob at a time on top of the baseline (a conditional knob brings its
        dependencies at their seeds). They come one at a time because a seed that hurts on this
        host then costs one guarded window and says which knob hurt; all of them together is one
        more trial of its own (``joint_seed``), tried after these."""
        seeded = [d for d in self.dims if d.seeds]
        out: list[dict[str, KnobValue]] = []
        for d in seeded:
            for s in d.seeds:
                c = dict(baseline)
                c[d.key] = _coerce(d, s)
                # a conditional knob's seed needs its dependencies on: take their seeds too
                for r in d.requires:
                    if _is_zero(c.get(r, 0)):
                        rd = self.dim(r)
                        if rd.seeds:
                            c[r] = _coerce(rd, rd.seeds[0])
                out.append(self.canonical(c))
        uniq: list[dict[str, KnobValue]] = []
        seen = {self.key_of(baseline)}
        for c in out:
            k = self.key_of(c)
            if k not in seen:
                seen.add(k)
                uniq.append(c)
        return uniq

    def joint_seed(self, baseline: Mapping[str, KnobValue]) -> dict[str, KnobValue] | None:
        """Every seeded knob at its first seed at once, on top of the baseline: what a static
        profile copied from the seeds would deploy. A gain that needs two knobs on together
        (busy_read with busy_poll for an application that both reads and polls) is invisible to the
        one-knob seeds, and a search that never measures the static profile cannot show it beats
        it. ``None`` when it is the baseline or one of ``seed_configs`` (fewer than two seeded
        knobs, or a conditional knob and its dependency seeded as a pair)."""
        c = dict(baseline)
        for d in self.dims:
            if d.seeds:
                c[d.key] = _coerce(d, d.seeds[0])
        out = self.canonical(c)
        known = {self.key_of(baseline)} | {self.key_of(s) for s in self.seed_configs(baseline)}
        return None if self.key_of(out) in known else out

    def clip_to_space(self, config: Mapping[str, KnobValue]) -> dict[str, KnobValue]:
        return self.canonical(config)


def _num(v: KnobValue) -> float:
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return 0.0
    return float(v)


def _coerce(d: Dim, v: KnobValue) -> KnobValue:
    if d.kind == "cat":
        return v
    return int(v) if d.is_int and not isinstance(v, str) else (float(v) if not isinstance(v, str) else v)


def _choice_index(d: Dim, v: KnobValue) -> int:
    for i, c in enumerate(d.choices):
        if c == v or str(c) == str(v):
            return i
    return 0


def restrict(config: Mapping[str, KnobValue], keys: Sequence[str]) -> dict[str, KnobValue]:
    return {k: config[k] for k in keys if k in config}

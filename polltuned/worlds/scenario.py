"""Simulated worlds: loading scenario files, and the public scenario contract.

The scenario contract (stable; write your own)
==============================================

A scenario is a plain Python file defining two functions::

    def measure(config: dict[str, int | float | str], rng: numpy.random.Generator,
                window: int = 0) -> dict[str, float]:
        '''One noisy measurement window under ``config``.'''

    def expected(config: dict[str, int | float | str]) -> dict[str, float]:
        '''The same without noise. Used only to score tuners, never shown to them.'''

* ``config`` holds every knob of the policy's space, keyed exactly as the policy spells it, in
  kernel vocabulary (``net.core.busy_read``, ``kernel.timer_migration``,
  ``eth0:gro_flush_timeout``, ...). A scenario ignores knobs it does not model. Device-scoped knobs
  carry the policy's device name; ``knob(config, "gro_flush_timeout", 0)`` finds them whatever the
  device is called.
* Both functions return at least ``p99_us`` and ``cpu_cores`` (floats); optionally ``p50_us``,
  ``p999_us``, ``mean_us``, ``throughput_pps``, ``drops_per_s``.
* The keyword ``window`` (the index of the measurement window, 0-based, counting every window the
  engine measures) is passed only when ``measure`` accepts it: use it for drift or a workload change.
  ``expected`` then describes the workload the tuner should end up deploying for (the last one).
* All randomness must come from ``rng`` (runs with a seed reproduce exactly).
* Instead of module-level functions a file may define ``create() -> object`` returning an object
  with ``measure``/``expected`` methods (for scenarios that load data, e.g. the replay scenario).
* An optional module docstring is shown by ``polltuned sim --list``.

Shipped scenarios live in ``polltuned/worlds/scenarios/`` and are found by name (``busypoll_split``).
"""

from __future__ import annotations

import importlib.util
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polltuned.errors import UsageError
from polltuned.records import KnobValue, Window

Measurement = dict[str, float]
REQUIRED = ("p99_us", "cpu_cores")
OPTIONAL = ("p50_us", "p999_us", "mean_us", "throughput_pps", "drops_per_s")


def shipped_dir() -> Path:
    return Path(__file__).resolve().parent / "scenarios"


def shipped_names() -> list[str]:
    return sorted(p.stem for p in shipped_dir().glob("*.py") if not p.stem.startswith("_"))


def knob(config: Mapping[str, KnobValue], name: str, default: float = 0.0) -> float:
    """Numeric value of a knob by full key or by its suffix after ``DEV:`` (device-independent)."""
    if name in config:
        v = config[name]
    else:
        for k, val in config.items():
            if k.endswith(":" + name):
                v = val
                break
        else:
            return default
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class Scenario:
    name: str
    path: Path
    doc: str
    _measure: Callable[..., Any]
    _expected: Callable[..., Any]
    takes_window: bool

    def measure(self, config: Mapping[str, KnobValue], rng: np.random.Generator, window: int = 0) -> Measurement:
        cfg = dict(config)
        raw = self._measure(cfg, rng, window=window) if self.takes_window else self._measure(cfg, rng)
        return _check(self.name, "measure", raw)

    def expected(self, config: Mapping[str, KnobValue]) -> Measurement:
        return _check(self.name, "expected", self._expected(dict(config)))


def _check(name: str, fn: str, raw: object) -> Measurement:
    if not isinstance(raw, Mapping):
        raise UsageError(f"scenario {name}: {fn}() must return a dict (got {type(raw).__name__})")
    out: Measurement = {}
    for k in REQUIRED:
        if k not in raw:
            raise UsageError(f"scenario {name}: {fn}() result lacks {k!r} (contract: {', '.join(REQUIRED)})")
    for k in (*REQUIRED, *OPTIONAL):
        if k in raw and raw[k] is not None:
            out[k] = float(raw[k])
    return out


def resolve_scenario_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".py" or "/" in name_or_path:
        if not p.is_file():
            raise UsageError(f"scenario {name_or_path}: no such file")
        return p
    cand = shipped_dir() / f"{name_or_path}.py"
    if cand.is_file():
        return cand
    raise UsageError(f"scenario {name_or_path!r}: not a file and not a shipped scenario",
                     hint="shipped: " + ", ".join(shipped_names()))


def load_scenario(name_or_path: str) -> Scenario:
    path = resolve_scenario_path(name_or_path)
    spec = importlib.util.spec_from_file_location(f"polltuned_scenario_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise UsageError(f"scenario {path}: cannot be loaded as a Python file")
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # a user's file: report it in one line
        raise UsageError(f"scenario {path}: failed to load: {type(e).__name__}: {e}") from e
    obj: Any = mod
    if hasattr(mod, "create"):
        obj = mod.create()
    m = getattr(obj, "measure", None)
    x = getattr(obj, "expected", None)
    if not callable(m) or not callable(x):
        raise UsageError(f"scenario {path}: must define measure(config, rng) and expected(config)")
    try:
        params = inspect.signature(m).parameters
        takes_window = "window" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())
    except (TypeError, ValueError):
        takes_window = False
    return Scenario(path.stem, path, (mod.__doc__ or "").strip(), m, x, takes_window)


def to_window(m: Measurement, duration_s: float) -> Window:
    """A scenario measurement as a probe Window (statistic names as in records.LATENCY_STATS)."""
    lat = {}
    for stat, key in (("p50", "p50_us"), ("p99", "p99_us"), ("p999", "p999_us"), ("mean", "mean_us")):
        v = m.get(key)
        if v is not None and math.isfinite(v):
            lat[stat] = v
    return Window(ok=True, latency=lat, cpu_cores=m.get("cpu_cores"), throughput_pps=m.get("throughput_pps"),
                  drops_per_s=m.get("drops_per_s"), observations=1, duration_s=duration_s)


# ---------------------------------------------------------------- helpers for scenario authors
def noisy(rng: np.random.Generator, value: float, cv: float, outlier_p: float = 0.05,
          outlier_x: float = 1.35) -> float:
    """Lognormal window noise with occasional outlier windows (heavy tail, as measured in vm-bench §7)."""
    v = value * math.exp(rng.normal(0.0, cv))
    if rng.random() < outlier_p:
        v *= outlier_x
    return v

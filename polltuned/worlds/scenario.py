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
* An optional module docstring is shown by ``polltuned sim --list``; ``NONSTATIONARY = True``
  marks a scenario whose world changes with ``window`` (the benchmark then does not compare
  exploration cost, which it measures against the final world).
* **Context (optional)**: a world whose load moves may expose it, as the daemon's counters would
  (polltuned.metrics.context): ``measure`` then also returns ``"context:NAME"`` keys (floats, e.g.
  ``"context:offered_rate"``, ``"context:runnable_others"``, ``"context:flows"``) and the engine
  gets them in ``Window.context`` (``{"offered_rate": ..., ...}``). They must describe the *load*,
  never the knobs' own effect. Two optional functions let the long-horizon benchmark score against
  the load of each window: ``expected_at(config, window)`` (``expected`` for the load at that
  window) and ``load_at(window) -> str`` (a label of the load; windows with the same label share
  one optimum). Without them every window is scored with ``expected``.

Shipped scenarios live in ``polltuned/worlds/scenarios/`` and are found by name (``busypoll_split``).
``family:SEED:INDEX`` names landscape INDEX of the random family SEED (``polltuned.worlds.family``);
``family-moving:SEED:INDEX`` a landscape of its moving-load family (the load, and the optimum with
it, moves between 2-3 levels; exposed as context).
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
from polltuned.knobs.keys import key_suffix
from polltuned.records import KnobValue, Window
from polltuned.trust import require_trusted
from polltuned.worlds import family
from polltuned.worlds.helpers import knob, noisy

__all__ = ["Measurement", "ReplayScenario", "Scenario", "knob", "load_scenario", "noisy", "resolve_scenario_path",
           "shipped_dir", "shipped_names", "to_window"]

Measurement = dict[str, float]
REQUIRED = ("p99_us", "cpu_cores")
OPTIONAL = ("p50_us", "p999_us", "mean_us", "throughput_pps", "drops_per_s")
#: a measurement key ``CONTEXT_PREFIX + name`` carries context signal ``name`` (Window.context)
CONTEXT_PREFIX = "context:"


def shipped_dir() -> Path:
    return Path(__file__).resolve().parent / "scenarios"


def shipped_names() -> list[str]:
    return sorted(p.stem for p in shipped_dir().glob("*.py") if not p.stem.startswith("_"))


@dataclass(frozen=True)
class Scenario:
    name: str
    path: Path
    doc: str
    _measure: Callable[..., Any]
    _expected: Callable[..., Any]
    takes_window: bool
    nonstationary: bool = False
    _expected_at: Callable[..., Any] | None = None
    _load_at: Callable[[int], Any] | None = None

    @property
    def has_loads(self) -> bool:
        """The scenario says which load each window sees (``load_at``)."""
        return self._load_at is not None

    def expected_at(self, config: Mapping[str, KnobValue], window: int) -> Measurement:
        """``expected`` for the load at ``window`` (``expected`` when the scenario has no ``expected_at``)."""
        if self._expected_at is None:
            return self.expected(config)
        return _check(self.name, "expected_at", self._expected_at(dict(config), window))

    def load_at(self, window: int) -> str:
        """The label of the load at ``window`` ("final" when the scenario does not say)."""
        return "final" if self._load_at is None else str(self._load_at(window))

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
    for k, v in raw.items():
        if isinstance(k, str) and k.startswith(CONTEXT_PREFIX) and len(k) > len(CONTEXT_PREFIX) and v is not None:
            f = float(v)
            if math.isfinite(f):
                out[k] = f
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
    """A scenario file, a shipped scenario by name, or ``family:SEED:INDEX`` (a landscape of the
    random family, ``polltuned.worlds.family``)."""
    if name_or_path.startswith(("family:", "family-moving:")):
        return _family_scenario(name_or_path)
    path = resolve_scenario_path(name_or_path)
    if path.resolve().parent != shipped_dir().resolve():  # a user's file: as root, only a root-owned one

        require_trusted(path, "scenario")
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
    xa = getattr(obj, "expected_at", None)
    la = getattr(obj, "load_at", None)
    return Scenario(path.stem, path, (mod.__doc__ or "").strip(), m, x, takes_window,
                    bool(getattr(mod, "NONSTATIONARY", False)), xa if callable(xa) else None,
                    la if callable(la) else None)


def _family_scenario(name: str) -> Scenario:
    moving = family.parse_moving_name(name)
    if moving is not None:
        mv = family.make_moving_landscape(*moving)
        return Scenario(mv.name, Path(family.__file__), mv.summary(), mv.measure, mv.expected, True, True,
                        mv.expected_at, mv.load_at)
    parsed = family.parse_name(name)
    assert parsed is not None
    ls = family.make_landscape(*parsed)
    return Scenario(ls.name, Path(family.__file__), ls.summary(), ls.measure, ls.expected, True,
                    ls.nonstationary)


def to_window(m: Measurement, duration_s: float) -> Window:
    """A scenario measurement as a probe Window (statistic names as in records.LATENCY_STATS)."""
    lat = {}
    for stat, key in (("p50", "p50_us"), ("p99", "p99_us"), ("p999", "p999_us"), ("mean", "mean_us")):
        v = m.get(key)
        if v is not None and math.isfinite(v):
            lat[stat] = v
    ctx = {k[len(CONTEXT_PREFIX):]: v for k, v in m.items() if k.startswith(CONTEXT_PREFIX)}
    return Window(ok=True, latency=lat, cpu_cores=m.get("cpu_cores"), throughput_pps=m.get("throughput_pps"),
                  drops_per_s=m.get("drops_per_s"), observations=1, duration_s=duration_s, context=ctx)


# ---------------------------------------------------------------- replay of recorded windows
class ReplayScenario:
    """Windows recorded on a real host (``polltuned bench --record FILE``: JSON lines
    ``{"v": 1, "workload": str, "config": {knob: value}, "window": Window.to_json()}``) served back
    by resampling the records of the nearest recorded configuration.

    Distance between configurations: per knob, |log1p(a) - log1p(b)| for numbers (so 0 vs 50 is
    far and 50 vs 60 is near) and 3 for differing categories; knobs are matched by their name after
    ``DEV:`` so recordings from another device name still apply. ``expected`` is the mean p99 and
    mean CPU of the nearest configuration's records (the mean, not the median: with few windows per
    configuration it is the less noisy estimate of what a tuner would see on average).
    """

    def __init__(self, records: list[tuple[dict[str, KnobValue], Measurement]], workload: str | None = None) -> None:
        if not records:
            raise UsageError("replay: no usable records (need ok windows with p99 and cpu_cores)")
        self.records = records
        self.workload = workload
        groups: dict[str, list[Measurement]] = {}
        configs: dict[str, dict[str, KnobValue]] = {}
        for cfg, m in records:
            k = repr(sorted((key_suffix(a), str(b)) for a, b in cfg.items()))
            groups.setdefault(k, []).append(m)
            configs[k] = {key_suffix(a): b for a, b in cfg.items()}
        self._keys = list(groups)
        self._groups = [groups[k] for k in self._keys]
        self._configs = [configs[k] for k in self._keys]

    @staticmethod
    def from_file(path: str | Path, workload: str | None = None) -> ReplayScenario:
        import json

        recs: list[tuple[dict[str, KnobValue], Measurement]] = []
        p = Path(path)
        try:
            lines = p.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise UsageError(f"replay: cannot read {p}: {e.strerror}") from e
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                if n == len(lines):
                    break  # torn tail
                raise UsageError(f"replay: {p}:{n}: not valid JSON") from None
            if d.get("v") != 1:
                raise UsageError(f"replay: {p}:{n}: unknown record version {d.get('v')!r}")
            if workload is not None and d.get("workload") != workload:
                continue
            w = Window.from_json(d.get("window") or {})
            p99 = w.stat("p99")
            if not w.ok or p99 is None or w.cpu_cores is None:
                continue
            m: Measurement = {"p99_us": p99, "cpu_cores": w.cpu_cores}
            for stat, key in (("p50", "p50_us"), ("p999", "p999_us"), ("mean", "mean_us")):
                v = w.stat(stat)
                if v is not None:
                    m[key] = v
            if w.throughput_pps is not None:
                m["throughput_pps"] = w.throughput_pps
            if w.drops_per_s is not None:
                m["drops_per_s"] = w.drops_per_s
            recs.append(({str(k): v for k, v in (d.get("config") or {}).items()}, m))
        return ReplayScenario(recs, workload)

    def _nearest(self, config: Mapping[str, KnobValue]) -> int:
        c = {key_suffix(k): v for k, v in config.items()}
        best, best_d = 0, math.inf
        for i, rc in enumerate(self._configs):
            d = 0.0
            for k, v in rc.items():
                if k not in c:
                    continue
                d += _dist(v, c[k])
            if d < best_d:
                best, best_d = i, d
        return best

    def measure(self, config: dict[str, KnobValue], rng: np.random.Generator, window: int = 0) -> Measurement:
        g = self._groups[self._nearest(config)]
        return dict(g[int(rng.integers(len(g)))])

    def expected(self, config: dict[str, KnobValue]) -> Measurement:
        g = self._groups[self._nearest(config)]
        out: Measurement = {"p99_us": float(np.mean([m["p99_us"] for m in g])),
                            "cpu_cores": float(np.mean([m["cpu_cores"] for m in g]))}
        return out


def _dist(a: KnobValue, b: KnobValue) -> float:
    try:
        fa, fb = float(a), float(b)
    except (TypeError, ValueError):
        return 0.0 if str(a) == str(b) else 3.0
    return abs(math.log1p(max(fa, 0.0)) - math.log1p(max(fb, 0.0)))

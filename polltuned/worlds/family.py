"""A public random family of simulated worlds: landscapes nobody hand-tuned the engine for.

``make_landscape(family_seed, index)`` draws one landscape (deterministic: the same seed and
index give the same world, on every machine). A landscape honours the scenario contract of
``polltuned.worlds.scenario`` (``measure(config, rng, window=0)`` and ``expected(config)``,
returning ``p99_us``, ``p50_us`` and ``cpu_cores``), and ``load_scenario("family:SEED:INDEX")``
resolves to it, so ``polltuned sim --scenario family:1:3`` and the sim probe accept it too.

The effects are the ones measured by hand in the reference threads (/work/shared/seeds) and on the
project VM (vm-bench §3-§6, §9, §11, §14), with random sizes and random locations:

* busy polling: a gain that saturates above a random threshold (a Hill curve in the busy value,
  random sharpness), carried by ``busy_read`` (a blocking-read application), by ``busy_poll`` (an
  epoll application), by both together (the gain needs both on), or by ``busy_read`` with
  ``busy_poll`` adding the rest only while ``busy_read`` is on; its size 0 .. 90 % of the p99;
* a CPU cost of the spinning that grows with the busy value up to a random number of cores (the
  objective p99 x (1 + w x cores) then puts the optimum at a random place inside the range);
* a "held in GRO" slope (vm-bench §1.3: RTT ~ busy value + base) in a random subset;
* colocation in a random subset: the gain collapses and above a random busy value the latency grows
  by 1-3 µs per µs of busy value (vm-bench §6: RTT ~ 2 x busy_read + base);
* IRQ deferral (``napi_defer_hard_irqs`` > 0 and ``gro_flush_timeout`` > 0): +few % .. +1000 %
  latency growing with ``gro_flush_timeout`` without busy polling, a CPU saving, about neutral
  (-8 .. +2 %) with busy polling; ``gro_flush_timeout`` alone hurts in a subset (vm-bench §4);
* a ``kernel.timer_migration`` step (random sign, 0-10 % of the p99, sometimes CPU too);
* a ``net.core.gro_normal_batch`` plateau: flat, or a broad shallow optimum at a random place;
* cliffs in a random subset: the busy value above X multiplies the p99 by 5-12; deferral with
  ``gro_flush_timeout`` above Y likewise;
* noise: lognormal window CV 5-60 % (smaller while busy polling runs, vm-bench §14), outlier
  windows x1.3-3 with probability 2-10 %, small CPU noise; a slow multiplicative latency drift with
  the window index in a random subset; a workload shift at a random window (10-25) in a random
  subset (``nonstationary``; ``expected`` then describes the workload after the shift);
* about a fifth of the worlds are flat: no setting gains 5 % or more.

The model is written with numpy so that it evaluates whole grids of configurations at once
(``Landscape.evaluate``); ``expected`` and ``measure`` use it on one configuration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from polltuned.errors import UsageError
from polltuned.records import KnobValue
from polltuned.worlds.helpers import knob, noisy

Arr = npt.NDArray[np.float64]
ArrLike = float | Arr

PREFIX = "family:"
#: mixes the family's own purpose into the seed sequence, so that family seed 1 does not share a
#: stream with anything else seeded with 1
_STREAM = 0x706F6C6C
BUSY_MODES = ("read", "epoll", "both", "read_plus")
FLAT_P = 0.1
GFT_MAX_NS = 500_000.0


@dataclass(frozen=True)
class Busy:
    """Busy polling: which knob carries the gain, how big, where it saturates, what it costs."""

    mode: str                 # one of BUSY_MODES
    gain: float               # fraction of the p99 removed at saturation (after a colocation collapse)
    threshold_us: float       # busy value giving half the gain (busy_read, or busy_poll in "epoll" mode)
    sharpness: float          # Hill exponent of the gain curve
    poll_threshold_us: float  # half-gain value of the second knob ("both", "read_plus")
    read_share: float         # "read_plus": part of the gain busy_read gets without busy_poll
    side: float               # weight of the knob that does not carry the gain (wasted polling)
    hold_us_per_us: float     # latency added per µs of busy value (packets held until the window ends)
    cpu_cores: float          # CPU cost of full spinning
    cpu_tau_us: float         # busy value at which the CPU cost reaches 63 %
    coloc: bool               # another runnable task shares the CPU
    coloc_start_us: float     # above this busy value the poller delays the peer
    coloc_us_per_us: float    # latency added per µs of busy value above coloc_start_us
    cliff_us: float           # busy value above which the p99 jumps (inf: no cliff)
    cliff_x: float            # the jump's factor


@dataclass(frozen=True)
class Defer:
    """IRQ deferral (napi_defer_hard_irqs + gro_flush_timeout) and gro_flush_timeout alone."""

    hurt_min: float           # p99 factor - 1 of any deferral without busy polling (the timer wake-up)
    hurt_max: float           # ... plus this much more at gro_flush_timeout 500 µs
    hurt_exp: float           # growth exponent in gro_flush_timeout
    count_scale: float        # napi_defer_hard_irqs scale of the effect (1 - exp(-n / scale))
    cpu_save: float           # fraction of the baseline CPU saved at saturation
    save_scale_ns: float      # gro_flush_timeout scale of the saving
    with_busy: float          # p99 factor - 1 when busy polling runs (about neutral)
    alone_hurt: float         # gro_flush_timeout alone (no deferral): p99 factor - 1 at 500 µs
    cliff_ns: float           # gro_flush_timeout above which deferral jumps (inf: no cliff)
    cliff_x: float


@dataclass(frozen=True)
class Phase:
    """One workload: everything ``expected`` needs."""

    base_p99_us: float
    p50_ratio: float
    base_cpu: float
    busy: Busy
    defer: Defer
    tm0_p99: float            # kernel.timer_migration = 0: p99 factor - 1
    tm0_cpu: float            # ... and CPU factor - 1
    gnb_depth: float          # gro_normal_batch: depth of the broad optimum (0: flat)
    gnb_centre_log2: float
    gnb_width_log2: float


@dataclass(frozen=True)
class Noise:
    cv: float                 # lognormal window CV of the p99 without busy polling
    busy_relief: float        # busy polling at saturation scales the CV by (1 - busy_relief)
    outlier_p: float
    outlier_x_max: float      # outlier windows multiply the p99 by U(1.3, outlier_x_max)
    cpu_cv: float


@dataclass(frozen=True)
class Drift:
    amp1: float
    period1: float
    phase1: float
    amp2: float
    period2: float
    phase2: float
    trend_per_100: float      # log-drift per 100 windows

    def factor(self, window: int) -> float:
        w = float(window)
        x = (self.amp1 * math.sin(2 * math.pi * w / self.period1 + self.phase1)
             + self.amp2 * math.sin(2 * math.pi * w / self.period2 + self.phase2)
             - self.amp1 * math.sin(self.phase1) - self.amp2 * math.sin(self.phase2)
             + self.trend_per_100 * w / 100.0)
        return math.exp(x)


@dataclass(frozen=True)
class Landscape:
    """One drawn world. ``phases[-1]`` is the final workload (what ``expected`` describes)."""

    family_seed: int
    index: int
    flat: bool
    phases: tuple[Phase, ...]
    shift_at: int | None
    noise: Noise
    drift: Drift | None

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.family_seed}:{self.index}"

    @property
    def nonstationary(self) -> bool:
        return self.shift_at is not None

    def phase_at(self, window: int) -> Phase:
        if self.shift_at is not None and window < self.shift_at:
            return self.phases[0]
        return self.phases[-1]

    # -- the contract ---------------------------------------------------------------------
    def expected(self, config: Mapping[str, KnobValue]) -> dict[str, float]:
        return self._one(self.phases[-1], config)

    def measure(self, config: Mapping[str, KnobValue], rng: np.random.Generator,
                window: int = 0) -> dict[str, float]:
        ph = self.phase_at(window)
        e = self._one(ph, config)
        act = float(_activity(ph.busy, *_busy_values(config)))
        drift = self.drift.factor(window) if self.drift is not None else 1.0
        n = self.noise
        cv = n.cv * (1.0 - n.busy_relief * act)
        x = float(rng.uniform(1.3, n.outlier_x_max))
        p99 = noisy(rng, e["p99_us"] * drift, cv, n.outlier_p, x)
        p50 = noisy(rng, e["p50_us"] * drift, cv * 0.5, 0.0)
        cpu = noisy(rng, e["cpu_cores"], n.cpu_cv, 0.0)
        return {"p99_us": p99, "p50_us": min(p50, p99), "cpu_cores": cpu}

    # -- grids ----------------------------------------------------------------------------
    def evaluate(self, busy_read: ArrLike, busy_poll: ArrLike, gro_normal_batch: ArrLike,
                 timer_migration: ArrLike, gro_flush_timeout: ArrLike, napi_defer_hard_irqs: ArrLike,
                 phase: int = -1) -> dict[str, Arr]:
        """The noise-free model on (broadcast) arrays of knob values: p99_us, p50_us, cpu_cores."""
        p99, p50, cpu = _model(self.phases[phase], _a(busy_read), _a(busy_poll), _a(gro_normal_batch),
                               _a(timer_migration), _a(gro_flush_timeout), _a(napi_defer_hard_irqs))
        return {"p99_us": p99, "p50_us": p50, "cpu_cores": cpu}

    def describe(self) -> dict[str, Any]:
        """The drawn parameters (for reports; JSON-ready, an absent cliff is None); never shown to a tuner."""
        return {"name": self.name, "flat": self.flat, "nonstationary": self.nonstationary,
                "shift_at": self.shift_at, "noise": _finite(asdict(self.noise)),
                "drift": _finite(asdict(self.drift)) if self.drift is not None else None,
                "phases": [_finite(asdict(p)) for p in self.phases]}

    def summary(self) -> str:
        """One line for ``polltuned sim`` and reports."""
        b = self.phases[-1].busy
        parts = ["flat" if self.flat else f"busy gain {b.gain:.0%} via {b.mode} (half at {b.threshold_us:.0f} µs)"]
        if b.coloc:
            parts.append(f"colocated above {b.coloc_start_us:.0f} µs")
        if math.isfinite(b.cliff_us):
            parts.append(f"busy cliff at {b.cliff_us:.0f} µs")
        if math.isfinite(self.phases[-1].defer.cliff_ns):
            parts.append(f"deferral cliff at {self.phases[-1].defer.cliff_ns / 1000:.0f} µs")
        parts.append(f"noise CV {self.noise.cv:.0%}")
        if self.drift is not None:
            parts.append("drift")
        if self.shift_at is not None:
            parts.append(f"workload shift at window {self.shift_at}")
        return f"random landscape {self.index} of family {self.family_seed}: " + ", ".join(parts)

    def _one(self, ph: Phase, config: Mapping[str, KnobValue]) -> dict[str, float]:
        br, bp = _busy_values(config)
        p99, p50, cpu = _model(ph, _a(br), _a(bp), _a(knob(config, "net.core.gro_normal_batch", 8)),
                               _a(knob(config, "kernel.timer_migration", 1)),
                               _a(knob(config, "gro_flush_timeout", 0)), _a(knob(config, "napi_defer_hard_irqs", 0)))
        return {"p99_us": float(p99), "p50_us": float(p50), "cpu_cores": float(cpu)}


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out[k] = _finite(v)
        elif isinstance(v, float) and not math.isfinite(v):
            out[k] = None
        else:
            out[k] = v
    return out


# ---------------------------------------------------------------- the model (numpy, broadcasting)
def _a(x: ArrLike) -> Arr:
    return np.maximum(np.asarray(x, dtype=np.float64), 0.0)


def _busy_values(config: Mapping[str, KnobValue]) -> tuple[float, float]:
    return knob(config, "net.core.busy_read"), knob(config, "net.core.busy_poll")


def _hill(b: ArrLike, half: float, k: float) -> Arr:
    bk = np.power(np.maximum(b, 0.0), k)
    out: Arr = bk / (bk + half ** k)
    return out


def _activity(busy: Busy, br: ArrLike, bp: ArrLike) -> Arr:
    """How much of the busy-polling gain is switched on (0..1)."""
    ar = _hill(br, busy.threshold_us, busy.sharpness)
    ap_own = _hill(bp, busy.threshold_us, busy.sharpness)
    ap = _hill(bp, busy.poll_threshold_us, busy.sharpness)
    if busy.mode == "read":
        return ar
    if busy.mode == "epoll":
        return ap_own
    if busy.mode == "both":
        out: Arr = ar * ap
        return out
    out = ar * (busy.read_share + (1.0 - busy.read_share) * ap)
    return out


def _spin(busy: Busy, br: Arr, bp: Arr) -> Arr:
    """The busy value that spins on the CPU (what costs CPU and delays a co-located peer)."""
    if busy.mode == "read":
        out: Arr = br + busy.side * bp
    elif busy.mode == "epoll":
        out = bp + busy.side * br
    else:
        out = np.maximum(br, bp)
    return out


def _model(ph: Phase, br: Arr, bp: Arr, gnb: Arr, tm: Arr, gft: Arr, defer: Arr) -> tuple[Arr, Arr, Arr]:
    b, d = ph.busy, ph.defer
    act = _activity(b, br, bp)
    spin = _spin(b, br, bp)
    base = ph.base_p99_us
    p99 = base * (1.0 - b.gain * act) + b.hold_us_per_us * spin
    if b.coloc:
        p99 = p99 + b.coloc_us_per_us * np.maximum(spin - b.coloc_start_us, 0.0)
    if math.isfinite(b.cliff_us):
        p99 = p99 * (1.0 + (b.cliff_x - 1.0) * _sigmoid((spin - b.cliff_us) / (0.04 * b.cliff_us)))
    spin_cpu = b.cpu_cores * (1.0 - np.exp(-spin / b.cpu_tau_us))

    # deferral: only with both knobs on; gro_flush_timeout alone: only in the "held in GRO" worlds
    on = (defer > 0) & (gft > 0)
    g = np.minimum(gft, GFT_MAX_NS) / GFT_MAX_NS
    strength = 1.0 - np.exp(-defer / d.count_scale)
    hurt = (d.hurt_min + d.hurt_max * np.power(g, d.hurt_exp)) * strength
    dmult = 1.0 + (1.0 - act) * hurt + act * d.with_busy * strength
    alone = 1.0 + (1.0 - act) * d.alone_hurt * np.power(g, d.hurt_exp)
    p99 = p99 * np.where(on, dmult, np.where(gft > 0, alone, 1.0))
    if math.isfinite(d.cliff_ns):
        p99 = p99 * np.where(on, 1.0 + (d.cliff_x - 1.0) * _sigmoid((gft - d.cliff_ns) / (0.03 * d.cliff_ns)), 1.0)
    # the saving is IRQ work; busy polling already removes most of it
    save = np.where(on, d.cpu_save * (1.0 - np.exp(-gft / d.save_scale_ns)) * strength * (1.0 - 0.8 * act), 0.0)

    tm0 = tm < 0.5
    p99 = p99 * np.where(tm0, 1.0 + ph.tm0_p99, 1.0)
    if ph.gnb_depth > 0:
        x = np.log2(np.maximum(gnb, 1.0))
        p99 = p99 * (1.0 - ph.gnb_depth * np.exp(-((x - ph.gnb_centre_log2) ** 2) / (2 * ph.gnb_width_log2 ** 2)))
    cpu = ph.base_cpu * (1.0 - save) * np.where(tm0, 1.0 + ph.tm0_cpu, 1.0) + spin_cpu
    p50 = p99 * (ph.p50_ratio + (0.9 - ph.p50_ratio) * 0.5 * act)
    return p99, p50, cpu


def _sigmoid(x: Arr) -> Arr:
    out: Arr = 0.5 * (1.0 + np.tanh(0.5 * np.clip(x, -60.0, 60.0)))
    return out


# ---------------------------------------------------------------- drawing a landscape
def _logu(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _u(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(rng.uniform(lo, hi))


def _draw_busy(rng: np.random.Generator, flat: bool, coloc: bool | None = None) -> Busy:
    mode = BUSY_MODES[int(rng.choice(len(BUSY_MODES), p=[0.4, 0.3, 0.15, 0.15]))]
    gain = 0.0 if flat else _u(rng, 0.1, 0.9)
    held = bool(rng.random() < 0.2)
    co = bool(rng.random() < 0.2) if coloc is None else coloc
    if co:
        gain *= _u(rng, 0.1, 0.7)  # the peer waits for the CPU: much of the gain is gone
    threshold = _logu(rng, 2.0, 100.0)
    # a cliff sits above where the gain starts (below it the world would be just harmful)
    cliff = _logu(rng, max(60.0, 1.5 * threshold), 195.0) if rng.random() < 0.25 else math.inf
    return Busy(
        mode=mode, gain=gain, threshold_us=threshold, sharpness=_u(rng, 1.5, 5.0),
        poll_threshold_us=_logu(rng, 2.0, 100.0), read_share=_u(rng, 0.3, 0.7),
        side=0.0 if rng.random() < 0.6 else _u(rng, 0.05, 0.3),
        hold_us_per_us=_u(rng, 0.1, 1.0) if held else _u(rng, 0.005, 0.05),
        cpu_cores=_logu(rng, 0.1, 2.0), cpu_tau_us=_logu(rng, 2.0, 60.0),
        coloc=co, coloc_start_us=_logu(rng, 4.0, 80.0), coloc_us_per_us=_u(rng, 1.0, 3.0),
        cliff_us=cliff, cliff_x=_u(rng, 5.0, 12.0))


def _draw_defer(rng: np.random.Generator, flat: bool) -> Defer:
    cliff = bool(rng.random() < 0.25)
    return Defer(
        hurt_min=_u(rng, 0.15, 0.3), hurt_max=_logu(rng, 0.5, 10.0), hurt_exp=_u(rng, 0.3, 0.7),
        count_scale=_logu(rng, 0.3, 2.0),
        cpu_save=_u(rng, 0.0, 0.06) if flat else _u(rng, 0.1, 0.9), save_scale_ns=_logu(rng, 5_000.0, 50_000.0),
        with_busy=_u(rng, -0.05, 0.04), alone_hurt=_u(rng, 0.3, 2.0) if rng.random() < 0.25 else 0.0,
        cliff_ns=_logu(rng, 50_000.0, 400_000.0) if cliff else math.inf, cliff_x=_u(rng, 5.0, 12.0))


def _draw_phase(rng: np.random.Generator, flat: bool) -> Phase:
    busy = _draw_busy(rng, flat)
    defer = _draw_defer(rng, flat)
    tm_max = 0.015 if flat else 0.10
    tm0 = _u(rng, 0.0, tm_max) * (1.0 if rng.random() < 0.5 else -1.0)
    tm_cpu = 0.0 if flat or rng.random() < 0.7 else _u(rng, -0.15, 0.05)
    gnb_flat = bool(rng.random() < 0.5)
    depth = 0.0 if gnb_flat else (_u(rng, 0.0, 0.01) if flat else _u(rng, 0.01, 0.06))
    return Phase(base_p99_us=_logu(rng, 15.0, 600.0), p50_ratio=_u(rng, 0.35, 0.75), base_cpu=_u(rng, 0.1, 2.0),
                 busy=busy, defer=defer, tm0_p99=tm0, tm0_cpu=tm_cpu, gnb_depth=depth,
                 gnb_centre_log2=_u(rng, 0.0, 6.0), gnb_width_log2=_u(rng, 0.7, 2.0))


def make_landscape(family_seed: int, index: int) -> Landscape:
    """Landscape ``index`` of family ``family_seed`` (both >= 0); deterministic."""
    if family_seed < 0 or index < 0:
        raise UsageError(f"family landscape: seed and index must be >= 0 (got seed={family_seed}, index={index})")
    rng = np.random.default_rng(np.random.SeedSequence([_STREAM, family_seed, index]))
    flat = bool(rng.random() < FLAT_P)
    final = _draw_phase(rng, flat)
    noise = Noise(cv=_logu(rng, 0.05, 0.6), busy_relief=_u(rng, 0.0, 0.6), outlier_p=_u(rng, 0.02, 0.10),
                  outlier_x_max=_u(rng, 1.3, 3.0), cpu_cv=_u(rng, 0.01, 0.05))
    drift = None
    if rng.random() < 0.3:
        drift = Drift(amp1=_u(rng, 0.05, 0.25), period1=_u(rng, 60.0, 200.0), phase1=_u(rng, 0.0, 2 * math.pi),
                      amp2=_u(rng, 0.0, 0.1), period2=_u(rng, 15.0, 60.0), phase2=_u(rng, 0.0, 2 * math.pi),
                      trend_per_100=_u(rng, -0.3, 0.3))
    phases: tuple[Phase, ...] = (final,)
    shift_at = None
    if rng.random() < 0.2:
        # the workload before the shift: another busy-polling world (colocation flipped half the
        # time, so what the tuner learnt first is often wrong afterwards) at another level
        flip = bool(rng.random() < 0.5)
        before_busy = _draw_busy(rng, False, coloc=(not final.busy.coloc) if flip else None)
        before = replace(final, busy=before_busy, base_p99_us=final.base_p99_us * _logu(rng, 0.5, 3.0),
                         base_cpu=final.base_cpu * _u(rng, 0.7, 1.5))
        phases = (before, final)
        shift_at = int(rng.integers(10, 26))
    return Landscape(family_seed, index, flat, phases, shift_at, noise, drift)


def parse_name(name: str) -> tuple[int, int] | None:
    """``family:SEED:INDEX`` -> (seed, index); None when ``name`` is not a family name."""
    if not name.startswith(PREFIX):
        return None
    parts = name[len(PREFIX):].split(":")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise UsageError(f"scenario {name!r}: a family landscape is named family:SEED:INDEX with two "
                         "non-negative integers", hint="e.g. family:1:3")
    return int(parts[0]), int(parts[1])


# ---------------------------------------------------------------- the moving-load family
MOVING_PREFIX = "family-moving:"
#: the moving-load family's own stream (the stationary family above is unchanged by it)
_STREAM_MOVING = 0x6D6F7665
#: the schedule is drawn this far (windows); it repeats after that
SCHEDULE_WINDOWS = 2000


@dataclass(frozen=True)
class Load:
    """One load level of a moving landscape, as the counters would see it (the context)."""

    label: str
    offered_rate: float       # requests/s (open loop: does not depend on the knobs)
    flows: float              # active connections on the service
    runnable_others: float    # other runnable tasks on the application's CPUs


@dataclass(frozen=True)
class MovingLandscape:
    """A world whose load moves between 2-3 levels in phases of random length, and whose optimum
    moves with it. The loads (drawn per landscape, deterministic):

    * ``quiet``: few flows, the application alone on its CPUs; busy polling pays (a gain of
      20-90 %, as in the stationary family's busy-polling worlds, never colocated);
    * ``shared``: more flows and 1-2 other runnable tasks on the application's CPUs: the same
      world with colocation — busy polling's gain mostly gone and, above a random busy value, the
      poller delays the peer by 1-3 µs per µs (seeds 000/004: the poller must yield);
    * ``burst`` (half of the landscapes): a high request rate alone on the CPUs: another draw of
      the busy-polling curve (threshold, sharpness, CPU cost) and IRQ deferral that hurts less and
      saves more CPU (published IRQ-suspension results flip with the rate).

    Phases last ``U(min_phase, max_phase)`` windows (25-90), each a different load than the one
    before, so 300 windows see at least 3 changes. ``measure`` returns the context as
    ``context:offered_rate`` (lognormal noise ``ctx_cv``), ``context:flows`` and
    ``context:runnable_others`` (exact); ``expected_at``/``load_at`` give the load of a window,
    ``expected`` the load of window ``HORIZON - 1`` (the last of a 300-window horizon)."""

    family_seed: int
    index: int
    loads: tuple[Load, ...]
    phases: tuple[Phase, ...]           # parallel to loads
    starts: tuple[int, ...]             # first window of each segment (starts[0] == 0)
    segment_load: tuple[int, ...]       # load index of each segment
    noise: Noise
    ctx_cv: float

    HORIZON = 300

    @property
    def name(self) -> str:
        return f"{MOVING_PREFIX}{self.family_seed}:{self.index}"

    @property
    def nonstationary(self) -> bool:
        return True

    def load_index(self, window: int) -> int:
        import bisect

        w = max(0, int(window)) % SCHEDULE_WINDOWS
        return self.segment_load[bisect.bisect_right(self.starts, w) - 1]

    def load_at(self, window: int) -> str:
        return self.loads[self.load_index(window)].label

    def changes(self, horizon: int = HORIZON) -> list[int]:
        """Windows (< horizon) at which the load changes."""
        return [s for s in self.starts[1:] if s < horizon]

    def expected_at(self, config: Mapping[str, KnobValue], window: int) -> dict[str, float]:
        return _landscape_one(self.phases[self.load_index(window)], config)

    def expected(self, config: Mapping[str, KnobValue]) -> dict[str, float]:
        return self.expected_at(config, self.HORIZON - 1)

    def measure(self, config: Mapping[str, KnobValue], rng: np.random.Generator,
                window: int = 0) -> dict[str, float]:
        i = self.load_index(window)
        ph, ld = self.phases[i], self.loads[i]
        e = _landscape_one(ph, config)
        act = float(_activity(ph.busy, *_busy_values(config)))
        n = self.noise
        cv = n.cv * (1.0 - n.busy_relief * act)
        x = float(rng.uniform(1.3, n.outlier_x_max))
        p99 = noisy(rng, e["p99_us"], cv, n.outlier_p, x)
        p50 = noisy(rng, e["p50_us"], cv * 0.5, 0.0)
        cpu = noisy(rng, e["cpu_cores"], n.cpu_cv, 0.0)
        rate = ld.offered_rate * math.exp(float(rng.normal(0.0, self.ctx_cv)))
        return {"p99_us": p99, "p50_us": min(p50, p99), "cpu_cores": cpu, "context:offered_rate": rate,
                "context:flows": ld.flows, "context:runnable_others": ld.runnable_others}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "loads": [asdict(ld) for ld in self.loads],
                "changes": self.changes(), "segment_load": list(self.segment_load[:12]),
                "noise": _finite(asdict(self.noise)), "ctx_cv": self.ctx_cv,
                "phases": [_finite(asdict(p)) for p in self.phases]}

    def summary(self) -> str:
        parts = []
        for ld, ph in zip(self.loads, self.phases):
            b = ph.busy
            what = f"busy gain {b.gain:.0%} via {b.mode}" + (f", colocated above {b.coloc_start_us:.0f} µs"
                                                             if b.coloc else "")
            parts.append(f"{ld.label} ({ld.offered_rate:.0f} req/s, {ld.flows:.0f} flows, "
                         f"{ld.runnable_others:.0f} other runnable: {what})")
        return (f"moving-load landscape {self.index} of family {self.family_seed}: " + "; ".join(parts)
                + f"; load changes at windows {', '.join(str(c) for c in self.changes())}")


def _landscape_one(ph: Phase, config: Mapping[str, KnobValue]) -> dict[str, float]:
    br, bp = _busy_values(config)
    p99, p50, cpu = _model(ph, _a(br), _a(bp), _a(knob(config, "net.core.gro_normal_batch", 8)),
                           _a(knob(config, "kernel.timer_migration", 1)),
                           _a(knob(config, "gro_flush_timeout", 0)), _a(knob(config, "napi_defer_hard_irqs", 0)))
    return {"p99_us": float(p99), "p50_us": float(p50), "cpu_cores": float(cpu)}


def make_moving_landscape(family_seed: int, index: int, *, min_phase: int = 25,
                          max_phase: int = 90) -> MovingLandscape:
    """Moving-load landscape ``index`` of family ``family_seed`` (both >= 0); deterministic."""
    if family_seed < 0 or index < 0:
        raise UsageError(f"moving-load landscape: seed and index must be >= 0 (got seed={family_seed}, "
                         f"index={index})")
    rng = np.random.default_rng(np.random.SeedSequence([_STREAM_MOVING, family_seed, index]))
    quiet = _draw_phase(rng, False)
    quiet = replace(quiet, busy=replace(quiet.busy, coloc=False, gain=_u(rng, 0.2, 0.9)))
    # the shared load: the same world with another task runnable on the application's CPU
    shared_busy = replace(quiet.busy, coloc=True, gain=quiet.busy.gain * _u(rng, 0.05, 0.4),
                          coloc_start_us=_logu(rng, 2.0, 30.0), coloc_us_per_us=_u(rng, 1.0, 3.0))
    shared = replace(quiet, busy=shared_busy, base_p99_us=quiet.base_p99_us * _logu(rng, 1.2, 3.0),
                     base_cpu=quiet.base_cpu * _u(rng, 1.0, 1.5))
    rate0 = _logu(rng, 2_000.0, 50_000.0)
    flows0 = float(rng.integers(1, 5))
    loads = [Load("quiet", rate0, flows0, 0.0),
             Load("shared", rate0 * _logu(rng, 1.5, 4.0), flows0 * float(rng.integers(2, 9)),
                  float(rng.integers(1, 3)))]
    phases = [quiet, shared]
    if rng.random() < 0.5:
        b = _draw_busy(rng, False, coloc=False)
        d = replace(quiet.defer, hurt_min=_u(rng, 0.0, 0.1), hurt_max=_logu(rng, 0.05, 0.5),
                    cpu_save=_u(rng, 0.3, 0.9))
        burst = replace(quiet, busy=b, defer=d, base_p99_us=quiet.base_p99_us * _logu(rng, 0.7, 2.0),
                        base_cpu=quiet.base_cpu * _u(rng, 1.5, 3.0))
        loads.append(Load("burst", rate0 * _logu(rng, 5.0, 20.0), flows0 * float(rng.integers(4, 17)), 0.0))
        phases.append(burst)
    noise = Noise(cv=_logu(rng, 0.05, 0.3), busy_relief=_u(rng, 0.0, 0.6), outlier_p=_u(rng, 0.02, 0.06),
                  outlier_x_max=_u(rng, 1.3, 2.0), cpu_cv=_u(rng, 0.01, 0.05))
    starts = [0]
    seg = [int(rng.integers(len(loads)))]
    while starts[-1] < SCHEDULE_WINDOWS:
        starts.append(starts[-1] + int(rng.integers(min_phase, max_phase + 1)))
        nxt = int(rng.integers(len(loads) - 1))
        seg.append(nxt + 1 if nxt >= seg[-1] else nxt)
    return MovingLandscape(family_seed, index, tuple(loads), tuple(phases), tuple(starts), tuple(seg), noise,
                           ctx_cv=_u(rng, 0.02, 0.1))


def parse_moving_name(name: str) -> tuple[int, int] | None:
    """``family-moving:SEED:INDEX`` -> (seed, index); None when ``name`` is not such a name."""
    if not name.startswith(MOVING_PREFIX):
        return None
    parts = name[len(MOVING_PREFIX):].split(":")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise UsageError(f"scenario {name!r}: a moving-load landscape is named family-moving:SEED:INDEX with "
                         "two non-negative integers", hint="e.g. family-moving:1:3")
    return int(parts[0]), int(parts[1])

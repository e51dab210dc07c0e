"""What HOLD keeps between windows: the load regions, the table of confirmed deployments, the
active entry and the counters its rules read (pure data and arithmetic, no I/O).

**Regions.** A window's context (``Window.context``: signal -> value, e.g. offered rate, flows,
runnable tasks) is mapped to ``log(1 + max(x, 0))`` per signal. A context belongs to the nearest
known region centre when its distance there (the largest per-signal difference, in log units) is
at most ``radius`` (``hold.region_radius``; 0.7 = a factor of about 2 in any signal); otherwise
it founds a new region, until ``max_regions`` exist (then the nearest region takes it). A centre
is the running mean of its members. A window with no context belongs to region 0 (one region:
the table then holds one deployment, as before). Signals missing on one side are not compared.

**The table.** One :class:`Entry` per region that has had a confirmation: its configuration (the
originals when nothing confirmed there), its confirmed gain and the CI's lower bound against the
originals, the mean log J of the deployed arm then (the level HOLD compares windows with), when it
was confirmed and why it is there. The originals are the entry of every region without one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from polltuned.records import KnobValue


def log_context(ctx: Mapping[str, float]) -> dict[str, float]:
    return {k: math.log1p(max(float(v), 0.0)) for k, v in ctx.items() if math.isfinite(float(v))}


def distance(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Largest per-signal difference of two log contexts (signals both have); 0 when none shared."""
    shared = [k for k in a if k in b]
    return max((abs(a[k] - b[k]) for k in shared), default=0.0)


@dataclass
class RegionMap:
    radius: float
    max_regions: int
    centres: list[dict[str, float]] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    def nearest(self, ctx: Mapping[str, float]) -> tuple[int, float]:
        lc = log_context(ctx)
        best, dist = 0, math.inf
        for i, c in enumerate(self.centres):
            d = distance(lc, c)
            if d < dist:
                best, dist = i, d
        return best, dist

    def assign(self, ctx: Mapping[str, float]) -> int:
        """The region of ``ctx`` (a new one when it is far from every centre and there is room);
        the region's centre moves towards it."""
        lc = log_context(ctx)
        if not self.centres:
            self.centres.append(lc)
            self.counts.append(1)
            return 0
        i, d = self.nearest(ctx)
        if not lc:
            return 0
        if d > self.radius and len(self.centres) < self.max_regions:
            self.centres.append(lc)
            self.counts.append(1)
            return len(self.centres) - 1
        n = self.counts[i] + 1
        c = self.centres[i]
        self.centres[i] = {k: c.get(k, v) + (v - c.get(k, v)) / n for k, v in {**c, **lc}.items()}
        self.counts[i] = n
        return i

    def to_json(self) -> list[dict[str, object]]:
        return [{"region": i, "centre": {k: math.expm1(v) for k, v in c.items()}, "windows": n}
                for i, (c, n) in enumerate(zip(self.centres, self.counts))]


@dataclass(frozen=True)
class Entry:
    region: int
    config: dict[str, KnobValue]
    gain: float                      # confirmed relative gain in J vs the originals (0: the originals)
    ci_low: float                    # lower bound of the gain's CI (nan: not measured)
    level: float                     # mean log J of this configuration when it was confirmed
    windows: int                     # windows its confirmation took
    confirmed_at: int                # window index of the confirmation's end
    why: str
    is_originals: bool = False
    #: knob -> its share of the gain (model-based; knobs whose reversion does not matter were reverted)
    shares: tuple[tuple[str, float], ...] = ()

    def to_json(self, originals: Mapping[str, KnobValue]) -> dict[str, object]:
        def f(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {"region": self.region, "diff": {k: v for k, v in self.config.items() if originals.get(k) != v},
                "gain": f(self.gain), "ci_low": f(self.ci_low), "windows": self.windows,
                "confirmed_at": self.confirmed_at, "why": self.why, "originals": self.is_originals,
                "shares": dict(self.shares)}


@dataclass
class Pending:
    """A first confirmation a load change cut short before it decided: the candidate and the pairs
    measured at that region's load. It goes on when the load is back (the pairs stay paired: each
    A/B pair was measured at one load), so a change does not throw the evidence away."""

    config: dict[str, KnobValue]
    a: list[float]
    b: list[float]
    shares: tuple[tuple[str, float], ...] = ()


@dataclass
class HoldState:
    regions: RegionMap
    table: dict[int, Entry] = field(default_factory=dict)
    active: Entry | None = None      # the entry whose configuration is applied (None: not in HOLD yet)
    level: float | None = None       # log J the HOLD windows are compared with (the active entry's)
    bad_streak: int = 0              # consecutive HOLD windows beyond the guard limit of that level
    region: int = 0                  # region of the last HOLD window
    region_streak: int = 0           # consecutive HOLD windows in ``region``
    since_switch: int = 0            # HOLD windows since the last switch / deployment
    credit: float = 0.0              # challenger windows earned (explore_share per HOLD window)
    windows: int = 0                 # HOLD windows (all kinds) since the first decision
    exploring: int = 0               # of which challenger windows and region searches
    switches: int = 0
    fallbacks: int = 0
    searching: int | None = None     # the region a short search is running for
    pending: dict[int, Pending] = field(default_factory=dict)   # cut confirmations, by region
    transfer: list[dict[str, KnobValue]] = field(default_factory=list)   # other regions' entries to try first
    usable: int = 0                  # usable HOLD windows while the baseline was never measured
    last_kind: str = "hold"          # the kind of the window measured last (status: role)
    log: list[dict[str, object]] = field(default_factory=list)   # the last decisions (status)

    def note(self, index: int, what: str) -> None:
        self.log.append({"window": index, "what": what})
        del self.log[:-10]

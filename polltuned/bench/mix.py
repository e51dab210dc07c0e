"""``polltuned bench --workload mix``: the daemon, unattended, on a world whose load changes.

World (polltuned/bench/world.py: ``ptb-c``/``ptb-s``, veth 198.18.230.1/2, veth NAPI active): ONE
sockperf server (UDP, pinned to CPU1) runs for the whole bench and is never restarted. The client
side alternates between phases (default ``single, shared, single, shared``, ``--phase-s`` each):

  single  one session, client on CPU0, server on CPU1: busy polling wins (~2x on this VM)
  shared  four sessions whose clients run on the server's CPU1: busy polling loses several x

With ``--phases kv-low,kv-high,...`` the server is ONE memcached (CPU1, started once by the world)
and the client side alternates between request rates instead, with polltuned's open-loop GET client
(requests sent on schedule, each timed from its intended send time):

  kv-low   one connection, 1000 req/s
  kv-high  eight connections, 6000 req/s (the defaults' closed-loop capacity is ~9500 req/s here)

One run has one server: sockperf and memcached loads do not mix in a schedule.

Nobody tells the daemon. The bench writes the current load into a phase file; the daemon's probe
(policy ``bench-mix``: a ``command`` probe running ``python -m polltuned.host.mixclient`` in
``ptb-c`` once per window) runs whatever load the file names and prints only percentiles. The
clients are fresh every window, so ``net.core.busy_read`` reaches them; the server's socket predates
every change (only ``busy_poll``, its epoll, acts there).

The daemon is the real one: ``python -m polltuned run`` as a subprocess with its own state and run
directories under ``<state>/mix/`` (journal, study, status.json), the bench's policy, on_exit =
restore. While it runs, the bench only reads: its status.json every second (phase, live knob
values) and the client's per-window log (which load each window ran, its p99). At the end it gets
SIGTERM (it finishes the window, restores its originals and exits); its journal must then be clean.

Afterwards the bench measures, for every load, in interleaved rounds (loads alternate too, arms
in a rotating order; polltuned.bench.comparison): the kernel defaults, tuned's static 50/50, the
daemon's FIRST deployment held for the whole run (what the previous release does), the deployment
the daemon held in each phase (following the load), and a small sweep; the phase's own best
configuration (the oracle) is the best arm measured for that load. From the timeline it reports per
phase: windows, windows spent exploring (any window outside HOLD, and HOLD challenger windows), the
configuration held, and the switch delay after each change (windows and seconds until the daemon
first measures the configuration it holds for that phase).

Safety: everything is undone in ``finally`` (also on SIGINT/SIGTERM): the daemon is stopped (and
killed after a timeout, its journal then rolled back by the bench), the bench's own comparison
actuator rolled back, the server stopped, the namespaces removed. A crashed run is cleaned up by
:func:`mix_recover` (both journals, ``ptb-*`` namespaces). Needs root and the real-kernel lock.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import shutil
import signal
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from polltuned.actuator import build_actuator
from polltuned.bench.comparison import STATIC_OVERRIDES, StopRule, comparison_done, summarise_arm, window_objective
from polltuned.bench.cpu import foreign_cores, wait_for_quiet
from polltuned.bench.env import BenchEnv
from polltuned.bench.session import host_env, recover
from polltuned.bench.signals import raise_if_interrupted, signals_raise
from polltuned.bench.world import DefaultWorld, Workload
from polltuned.clock import Clock
from polltuned.daemon.status import read_status
from polltuned.engine.builder import prepare_policy
from polltuned.errors import HostError, PolltunedError, UsageError
from polltuned.host.exec import SubprocessRunner, foreign_cpu_seconds, kill_pid
from polltuned.host.fs import FsHost, Host
from polltuned.host.mixclient import PhaseLoad, write_phase
from polltuned.policy.loader import find_policy, load_policy
from polltuned.policy.schema import Objective
from polltuned.probes.factory import make_probe
from polltuned.records import KnobValue, Window
from polltuned.stats import geo_mean

log = logging.getLogger("polltuned.bench")

#: the one long-running server's CPUs (the world's server side)
SERVER_CPUS = (1,)


MixApp = Literal["sockperf", "memcached"]


@dataclass(frozen=True)
class MixLayout:
    name: str
    sessions: int
    client_cpus: tuple[int, ...]
    description: str
    #: the server all phases share (one kind per run): sockperf, or memcached with an open-loop client
    app: MixApp = "sockperf"
    rate: float | None = None     # memcached: requests/s, sent on schedule


LAYOUTS: dict[str, MixLayout] = {
    "single": MixLayout("single", 1, (0,), "one session, client CPU0, server CPU1 (busy polling wins)"),
    # four, not three: the engine's load regions compare log(1 + flows); 1 vs 3 sessions is 0.69 apart,
    # inside the default region radius (0.7), 1 vs 4 is 0.92 (hold.region_radius)
    "shared": MixLayout("shared", 4, (1,), "four sessions, clients on the server's CPU1 (busy polling loses)"),
    # memcached on CPU1 for the whole run; one open-loop GET client on CPU0 at a low and a high rate
    # (capacity under the defaults is ~9500 req/s on this VM with 4 closed-loop connections): the
    # rate and the connections move together, both far apart in the engine's log(1 + x) context
    "kv-low": MixLayout("kv-low", 1, (0,), "memcached, one connection, 1000 req/s open loop (client CPU0)",
                        app="memcached", rate=1000.0),
    "kv-high": MixLayout("kv-high", 8, (0,), "memcached, eight connections, 6000 req/s open loop (client CPU0)",
                         app="memcached", rate=6000.0),
}
DEFAULT_SCHEDULE = ("single", "shared", "single", "shared")
DEFAULT_PHASE_S = 150.0
#: the small sweep measured beside the arms, for the per-load oracle
SWEEP: tuple[dict[str, KnobValue], ...] = ({"net.core.busy_read": 50},)


def parse_schedule(text: str) -> tuple[str, ...]:
    """Pure: ``single,shared,single,shared`` -> the layout names (checked, at least 2 phases)."""
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown:
        raise UsageError(f"--phases: unknown load {unknown[0]!r}", hint="loads: " + ", ".join(LAYOUTS))
    if len(names) < 2:
        raise UsageError(f"--phases: need at least 2 phases (got {len(names)})")
    if any(a == b for a, b in itertools.pairwise(names)):
        raise UsageError("--phases: two consecutive phases with the same load are one phase")
    apps = sorted({LAYOUTS[n].app for n in names})
    if len(apps) > 1:
        raise UsageError(f"--phases: one server for the whole run, but the loads need {' and '.join(apps)}",
                         hint="sockperf loads: " + ", ".join(n for n, x in LAYOUTS.items() if x.app == "sockperf")
                         + "; memcached loads: " + ", ".join(n for n, x in LAYOUTS.items() if x.app == "memcached"))
    return names


def schedule_app(names: Sequence[str]) -> MixApp:
    """The server a (checked) schedule runs: the app of its loads."""
    return LAYOUTS[names[0]].app


def phase_load(index: int, layout: str) -> PhaseLoad:
    lay = LAYOUTS[layout]
    return PhaseLoad(phase=index, layout=layout, sessions=lay.sessions, client_cpus=lay.client_cpus,
                     app=lay.app, rate=lay.rate)


# ---------------------------------------------------------------------------- the timeline (pure)


@dataclass(frozen=True)
class StatusSample:
    """One read of the daemon's status.json: wall time, phase, live knob values, HOLD role."""

    t: float
    phase: str
    config: dict[str, KnobValue]
    #: HOLD: what the window measures ("active", "challenger", "fallback-check", ...) when the
    #: daemon says so; None otherwise
    role: str | None = None


@dataclass(frozen=True)
class ClientWindow:
    """One run of the mix client (its ``--log`` line)."""

    t0: float
    t1: float
    phase: int | None
    layout: str | None
    p99: float | None
    ok: bool

    @property
    def mid(self) -> float:
        return (self.t0 + self.t1) / 2


@dataclass(frozen=True)
class PhaseSpan:
    index: int
    layout: str
    t_start: float
    t_end: float


def parse_client_log(text: str) -> list[ClientWindow]:
    """Pure: the mix client's JSON lines (malformed lines skipped)."""
    out: list[ClientWindow] = []
    for line in text.splitlines():
        try:
            d = json.loads(line)
            out.append(ClientWindow(t0=float(d["t0"]), t1=float(d["t1"]), phase=d.get("phase"),
                                    layout=d.get("layout"),
                                    p99=float(d["p99"]) if d.get("p99") is not None else None, ok=bool(d.get("ok"))))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def status_sample(doc: Mapping[str, Any], t: float) -> StatusSample:
    """Pure: a status.json document as a sample (live knob values from its knob rows)."""
    cfg: dict[str, KnobValue] = {}
    for row in doc.get("knobs", []) or []:
        if isinstance(row, Mapping) and isinstance(row.get("key"), str) and isinstance(
                row.get("current"), int | float | str) and not isinstance(row.get("current"), bool):
            cfg[row["key"]] = row["current"]
    hold = doc.get("hold") if isinstance(doc.get("hold"), Mapping) else {}
    role = None
    for k in ("role", "window_role", "measuring"):
        v = hold.get(k) if isinstance(hold, Mapping) else None
        if isinstance(v, str):
            role = v
            break
    return StatusSample(t=t, phase=str(doc.get("phase", "")), config=cfg, role=role)


def sample_at(samples: Sequence[StatusSample], t: float) -> StatusSample | None:
    """Pure: the last sample taken at or before ``t`` (samples in time order); the first one when
    ``t`` precedes them all."""
    best: StatusSample | None = None
    for s in samples:
        if s.t <= t:
            best = s
        else:
            break
    return best if best is not None else (samples[0] if samples else None)


#: what a HOLD window measures, as the daemon's status names it (hold.role: the engine's window
#: kind of the window it last observed); every other kind is exploration (search, confirmation,
#: challengers, the fallback check against the originals)
EXPLOIT_ROLES = ("hold", "active", "deployed")


def is_exploring(s: StatusSample | None, role: str | None = None) -> bool:
    """Pure: a window measured outside HOLD (search, confirmation, re-tune), or in HOLD with a role
    other than watching the active deployment (challenger, fallback check, region search).
    ``role`` is the role the daemon reported for this window (after it); None: ``s.role``."""
    if s is None:
        return True
    if s.phase != "HOLD":
        return True
    r = role if role is not None else s.role
    return r is not None and r not in EXPLOIT_ROLES


def sample_after(samples: Sequence[StatusSample], t: float, until: float) -> StatusSample | None:
    """Pure: the first sample taken in [t, until] (None when there is none)."""
    for s in samples:
        if t <= s.t <= until:
            return s
        if s.t > until:
            break
    return None


def config_key(cfg: Mapping[str, KnobValue]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in cfg.items()))


@dataclass(frozen=True)
class DaemonWindow:
    window: ClientWindow
    phase: int
    config: dict[str, KnobValue]
    daemon_phase: str
    exploring: bool


@dataclass(frozen=True)
class PhaseReport:
    index: int
    layout: str
    windows: int
    exploring: int
    #: the configuration the daemon held (its last HOLD window of the phase); None: never in HOLD
    held: dict[str, KnobValue] | None
    #: the configuration compared as "following the load" for this phase: ``held``, or when the
    #: daemon never reached HOLD in the phase, the deployment it held before (None: none yet)
    follow: dict[str, KnobValue] | None
    t_start: float
    t_end: float
    #: windows and seconds after the change until the daemon first measured ``held`` in HOLD;
    #: 0 when it already held it; None for the first phase or when it never held one
    switch_windows: int | None
    switch_s: float | None
    live_p99_median: float
    hold_p99_median: float
    note: str = ""

    def to_json(self) -> dict[str, object]:
        def f(x: float | None) -> float | None:
            return round(x, 3) if x is not None and math.isfinite(x) else None

        return {"phase": self.index + 1, "load": self.layout, "windows": self.windows,
                "exploring": self.exploring, "held": self.held, "follow": self.follow,
                "t_start": round(self.t_start, 3), "t_end": round(self.t_end, 3), "switch_windows": self.switch_windows,
                "switch_s": f(self.switch_s), "live_p99_median_us": f(self.live_p99_median),
                "hold_p99_median_us": f(self.hold_p99_median), "note": self.note}


def attribute_windows(windows: Sequence[ClientWindow], samples: Sequence[StatusSample]) -> list[DaemonWindow]:
    """Pure: each client window (of a known phase) with the daemon's configuration and phase at
    its midpoint, and the role the daemon reported for it: the status reports the kind of the
    window it last observed, so the role is read from the first sample after the window ended
    (before the next one started)."""
    out: list[DaemonWindow] = []
    known = [w for w in windows if w.phase is not None]
    for i, w in enumerate(known):
        s = sample_at(samples, w.mid)
        nxt = known[i + 1].t0 if i + 1 < len(known) else w.t1 + 5.0
        after = sample_after(samples, w.t1, nxt)
        role = after.role if after is not None and after.phase == "HOLD" else None
        out.append(DaemonWindow(window=w, phase=w.phase if w.phase is not None else 0,
                                config=dict(s.config) if s is not None else {},
                                daemon_phase=s.phase if s is not None else "", exploring=is_exploring(s, role)))
    return out


def analyse_timeline(spans: Sequence[PhaseSpan], windows: Sequence[DaemonWindow],
                     defaults: Mapping[str, KnobValue]) -> list[PhaseReport]:
    """Pure: per phase, what the daemon did (see :class:`PhaseReport`); ``defaults`` (the
    originals) stand in for a phase before the daemon's first deployment."""
    reports: list[PhaseReport] = []
    prev_held: dict[str, KnobValue] | None = None
    for sp in spans:
        ws = [w for w in windows if w.phase == sp.index]
        hold = [w for w in ws if not w.exploring]
        held = dict(hold[-1].config) if hold else None
        sw_n: int | None = None
        sw_s: float | None = None
        note = ""
        if held is None:
            note = "never in HOLD during this phase: " + (
                "its previous deployment stands in" if prev_held is not None else
                "the originals stand in (what it measures its candidates against)")
        elif sp.index > 0:
            if prev_held is not None and config_key(prev_held) == config_key(held) and (
                    ws and not ws[0].exploring and config_key(ws[0].config) == config_key(held)):
                sw_n, sw_s = 0, 0.0
                note = "kept the previous phase's configuration"
            else:
                for j, w in enumerate(ws):
                    if not w.exploring and config_key(w.config) == config_key(held):
                        sw_n, sw_s = j, max(0.0, w.window.t0 - sp.t_start)
                        break
        p99s = [w.window.p99 for w in ws if w.window.ok and w.window.p99 is not None]
        hp99 = [w.window.p99 for w in hold if w.window.ok and w.window.p99 is not None]
        reports.append(PhaseReport(
            index=sp.index, layout=sp.layout, windows=len(ws), exploring=sum(1 for w in ws if w.exploring),
            held=held, follow=held if held is not None else prev_held if prev_held is not None else dict(defaults),
            t_start=sp.t_start, t_end=sp.t_end,
            switch_windows=sw_n, switch_s=sw_s,
            live_p99_median=statistics.median(p99s) if p99s else math.nan,
            hold_p99_median=statistics.median(hp99) if hp99 else math.nan, note=note))
        if held is not None:
            prev_held = held
    return reports


def first_deployment(windows: Sequence[DaemonWindow]) -> dict[str, KnobValue] | None:
    """Pure: the configuration of the daemon's first HOLD window (its first deployment)."""
    for w in windows:
        if not w.exploring:
            return dict(w.config)
    return None


# ---------------------------------------------------------------------------- the comparison (pure parts)


@dataclass(frozen=True)
class Arms:
    """Distinct configurations to measure, and the labels that name each (one config may be
    both the first deployment and a phase's)."""

    configs: dict[str, dict[str, KnobValue]]
    labels: dict[str, str]   # label -> config id


def build_arms(defaults: Mapping[str, KnobValue], first: Mapping[str, KnobValue] | None,
               held: Sequence[dict[str, KnobValue] | None],
               sweep: Sequence[Mapping[str, KnobValue]] = SWEEP) -> Arms:
    """Pure: default, static, first, follow@N (per phase), sweep:... — each a complete
    configuration over ``defaults``' knobs (knobs a config names that are not tuned here are left
    out), deduplicated."""
    configs: dict[str, dict[str, KnobValue]] = {}
    labels: dict[str, str] = {}
    by_key: dict[tuple[tuple[str, str], ...], str] = {}

    def add(label: str, over: Mapping[str, KnobValue]) -> None:
        cfg = {**defaults, **{k: v for k, v in over.items() if k in defaults}}
        key = config_key(cfg)
        if key not in by_key:
            cid = f"c{len(configs)}"
            by_key[key] = cid
            configs[cid] = cfg
        labels[label] = by_key[key]

    add("default", {})
    add("static", STATIC_OVERRIDES)
    add("first", first if first is not None else {})
    for i, h in enumerate(held):
        if h is not None:
            add(f"follow@{i + 1}", h)
    for s in sweep:
        add("sweep:" + ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in s.items()), s)
    return Arms(configs=configs, labels=labels)


@dataclass(frozen=True)
class ArmStats:
    objective: float
    objective_ci: tuple[float, float]
    p99: float
    cpu: float
    windows: int
    failed: int
    foreign: float

    def to_json(self) -> dict[str, object]:
        def f(x: float) -> float | None:
            return round(x, 4) if math.isfinite(x) else None

        return {"objective": f(self.objective), "objective_ci95": [f(self.objective_ci[0]), f(self.objective_ci[1])],
                "p99_us": f(self.p99), "cpu_cores": f(self.cpu), "windows": self.windows, "failed": self.failed,
                "foreign_cores": f(self.foreign)}


def arm_stats(cid: str, cfg: Mapping[str, KnobValue], ws: Sequence[Window], objective: Objective) -> ArmStats:
    a = summarise_arm(cid, cfg, ws, objective)
    return ArmStats(objective=a.objective, objective_ci=a.objective_ci, p99=a.p99, cpu=a.cpu_cores,
                    windows=a.windows, failed=a.failed, foreign=a.foreign_cores)


@dataclass(frozen=True)
class PhaseComparison:
    index: int
    layout: str
    default: ArmStats
    static: ArmStats
    first: ArmStats
    follow: ArmStats | None
    oracle: ArmStats
    oracle_label: str

    def to_json(self) -> dict[str, object]:
        return {"phase": self.index + 1, "load": self.layout, "default": self.default.to_json(),
                "static": self.static.to_json(), "first": self.first.to_json(),
                "follow": self.follow.to_json() if self.follow is not None else None,
                "oracle": self.oracle.to_json(), "oracle_arm": self.oracle_label}


def best_label(arms: Arms, stats: Mapping[str, ArmStats]) -> str:
    """Pure: the label of the config with the lowest J (default first among equals)."""
    best = min(arms.configs, key=lambda cid: (stats[cid].objective if math.isfinite(stats[cid].objective)
                                              else math.inf))
    for lab, cid in arms.labels.items():
        if cid == best:
            return lab
    return best


def whole_run(per_layout: Mapping[str, Mapping[str, ArmStats]], schedule: Sequence[str],
              follow_ids: Sequence[str | None]) -> tuple[dict[str, float], float]:
    """Pure: whole-run J (geometric mean over the phases, which are equally long) of every single
    configuration, and of polltuned following the load (phase N measured with its own held
    configuration; nan when a phase has none)."""
    ids = set.intersection(*(set(v) for v in per_layout.values())) if per_layout else set()
    singles = {cid: geo_mean([per_layout[lay][cid].objective for lay in schedule]) for cid in sorted(ids)}
    if any(f is None for f in follow_ids):
        return singles, math.nan
    fol = geo_mean([per_layout[lay][f].objective for lay, f in zip(schedule, follow_ids) if f is not None])
    return singles, fol


# ---------------------------------------------------------------------------- result


@dataclass
class MixResult:
    schedule: tuple[str, ...]
    phase_s: float
    policy: str
    knobs: list[str]
    dropped_knobs: dict[str, str]
    defaults: dict[str, KnobValue]
    arms: Arms
    per_layout: dict[str, dict[str, ArmStats]]
    phases: list[PhaseReport]
    comparisons: list[PhaseComparison]
    singles: dict[str, float]
    follow_whole: float
    explore_after_cycle: tuple[int, int]
    rounds: dict[str, int]
    stop_reasons: dict[str, str]
    daemon_exit: int | None
    daemon_restored: bool
    restored: bool
    duration_s: float
    run_s: float
    foreign_cores_run: float
    samples: int
    windows_total: int
    targets: dict[str, bool | None] = field(default_factory=dict)
    daemon_log_tail: list[str] = field(default_factory=list)

    def label_of(self, cid: str) -> str:
        labs = [lab for lab, c in self.arms.labels.items() if c == cid]
        return "/".join(labs) or cid

    def to_json(self) -> dict[str, Any]:
        def f(x: float) -> float | None:
            return round(x, 4) if math.isfinite(x) else None

        best_cid = min(self.singles, key=lambda c: self.singles[c] if math.isfinite(self.singles[c]) else math.inf,
                       default=None)
        return {
            "v": 1, "workload": "mix", "policy": self.policy, "schedule": list(self.schedule),
            "phase_s": self.phase_s, "loads": {n: LAYOUTS[n].description for n in dict.fromkeys(self.schedule)},
            "knobs": self.knobs, "dropped_knobs": self.dropped_knobs, "defaults": self.defaults,
            "arms": {lab: cid for lab, cid in self.arms.labels.items()},
            "configs": self.arms.configs,
            "per_load": {lay: {cid: s.to_json() for cid, s in v.items()} for lay, v in self.per_layout.items()},
            "phases": [p.to_json() for p in self.phases],
            "comparison": [c.to_json() for c in self.comparisons],
            "whole_run": {"single_configs": {self.label_of(c): f(v) for c, v in self.singles.items()},
                          "best_single": self.label_of(best_cid) if best_cid is not None else None,
                          "best_single_objective": f(self.singles[best_cid]) if best_cid is not None else None,
                          "follow_objective": f(self.follow_whole)},
            "explore_after_first_cycle": {"exploring": self.explore_after_cycle[0],
                                          "windows": self.explore_after_cycle[1]},
            "rounds": self.rounds, "stop_reasons": self.stop_reasons,
            "targets": self.targets,
            "daemon": {"exit_code": self.daemon_exit, "restored": self.daemon_restored,
                       "status_samples": self.samples, "windows": self.windows_total,
                       "log_tail": self.daemon_log_tail},
            "foreign_cores_during_run": f(self.foreign_cores_run),
            "run_s": round(self.run_s, 1), "duration_s": round(self.duration_s, 1), "restored": self.restored,
        }


def evaluate_targets(res: MixResult) -> dict[str, bool | None]:
    """Pure: issue 14's mix targets (None: not measurable in this run)."""
    t: dict[str, bool | None] = {}
    p99_ok: list[bool] = []
    j_ok: list[bool] = []
    for c in res.comparisons:
        if c.follow is None:
            p99_ok.append(False)
            j_ok.append(False)
            continue
        p99_ok.append(c.follow.p99 <= c.default.p99)
        j_ok.append(c.follow.objective <= 1.15 * c.oracle.objective)
    t["every_phase_p99_le_default"] = all(p99_ok) if p99_ok else None
    t["every_phase_J_le_1.15x_oracle"] = all(j_ok) if j_ok else None
    best = min((v for v in res.singles.values() if math.isfinite(v)), default=math.nan)
    t["whole_run_J_le_0.8x_best_single"] = (res.follow_whole <= 0.8 * best
                                            if math.isfinite(best) and math.isfinite(res.follow_whole) else None)
    seen: set[str] = set()
    sw: list[bool] = []
    for p in res.phases:
        if p.index > 0 and p.layout in seen:
            sw.append(p.switch_windows is not None and p.switch_windows <= 3)
        seen.add(p.layout)
    t["switch_le_3_windows_to_a_seen_load"] = all(sw) if sw else None
    n_exp, n = res.explore_after_cycle
    t["explore_le_10pct_after_first_cycle"] = (n_exp <= 0.10 * n) if n else None
    return t


def _fmt(x: float | None, nd: int = 1) -> str:
    return f"{x:.{nd}f}" if x is not None and math.isfinite(x) else "-"


def _diff(cfg: Mapping[str, KnobValue] | None, defaults: Mapping[str, KnobValue]) -> str:
    if cfg is None:
        return "-"
    d = {k.rsplit(":", 1)[-1].rsplit(".", 1)[-1] if ":" in k else k.rsplit(".", 1)[-1]: v
         for k, v in cfg.items() if defaults.get(k) != v}
    return ",".join(f"{k}={v}" for k, v in d.items()) or "defaults"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for i, r in enumerate(rows):
        out.append("  ".join(c.ljust(widths[j]) if j in (0, 1) or j == len(r) - 1 else c.rjust(widths[j])
                             for j, c in enumerate(r)))
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def render_mix_table(res: MixResult) -> str:
    lines = [f"workload: mix   {len(res.schedule)} phases x {res.phase_s:.0f} s ({', '.join(res.schedule)}); "
             f"daemon: polltuned run, policy {res.policy}; foreign CPU during the run "
             f"{_fmt(res.foreign_cores_run, 2)} cores"]
    lines.append("daemon, unattended (live windows of its own probe):")
    rows: list[tuple[str, ...]] = [("phase", "load", "windows", "exploring", "switch", "live p99 µs",
                                    "HOLD p99 µs", "held configuration")]
    for p in res.phases:
        sw = ("-" if p.index == 0 else "never" if p.switch_windows is None
              else f"{p.switch_windows} win / {_fmt(p.switch_s, 0)} s")
        rows.append((str(p.index + 1), p.layout, str(p.windows), str(p.exploring), sw, _fmt(p.live_p99_median),
                     _fmt(p.hold_p99_median), _diff(p.held, res.defaults) + (f" ({p.note})" if p.note else "")))
    lines += _table(rows)
    lines.append("")
    lines.append("interleaved comparison afterwards, per phase (J = the policy's objective, geometric mean; "
                 "p99 median over rounds):")
    rows = [("phase", "load", "J default", "J static", "J first", "J follow", "J oracle", "follow/oracle",
             "p99 default", "p99 static", "p99 first", "p99 follow", "p99 oracle", "oracle arm")]
    for c in res.comparisons:
        fo = c.follow
        rows.append((str(c.index + 1), c.layout, _fmt(c.default.objective), _fmt(c.static.objective),
                     _fmt(c.first.objective), _fmt(fo.objective if fo else None), _fmt(c.oracle.objective),
                     _fmt(fo.objective / c.oracle.objective if fo and c.oracle.objective > 0 else None, 2),
                     _fmt(c.default.p99), _fmt(c.static.p99), _fmt(c.first.p99), _fmt(fo.p99 if fo else None),
                     _fmt(c.oracle.p99), c.oracle_label))
    lines += _table(rows)
    fc = [a.foreign for v in res.per_layout.values() for a in v.values() if math.isfinite(a.foreign)]
    lines.append(f"foreign CPU during the comparison: mean {_fmt(statistics.fmean(fc) if fc else None, 2)}, "
                 f"max {_fmt(max(fc) if fc else None, 2)} cores (other processes; latency is disturbed above ~0.1)")
    lines.append("configurations: " + "; ".join(f"{res.label_of(cid)} = {_diff(cfg, res.defaults)}"
                                                for cid, cfg in res.arms.configs.items()))
    best = min(res.singles.items(), key=lambda kv: kv[1] if math.isfinite(kv[1]) else math.inf, default=None)
    if best is not None:
        lines.append(f"whole run (geometric mean over phases): follow {_fmt(res.follow_whole)}; best single "
                     f"configuration {res.label_of(best[0])} {_fmt(best[1])} "
                     f"(ratio {_fmt(res.follow_whole / best[1] if best[1] > 0 else None, 2)}); "
                     + ", ".join(f"{res.label_of(c)} {_fmt(v)}" for c, v in res.singles.items()))
    n_exp, n = res.explore_after_cycle
    lines.append(f"exploring after the first full cycle: {n_exp} of {n} windows "
                 f"({_fmt(100 * n_exp / n if n else None, 0)} %)")
    lines.append("targets: " + "; ".join(f"{k} {'met' if v else 'NOT met' if v is not None else 'n/a'}"
                                         for k, v in res.targets.items()))
    lines.append(f"comparison rounds: {res.rounds} ({'; '.join(f'{k}: {v}' for k, v in res.stop_reasons.items())})")
    lines.append(f"took {res.duration_s:.0f} s (daemon run {res.run_s:.0f} s); daemon exit "
                 f"{res.daemon_exit}, its knobs restored: {'yes' if res.daemon_restored else 'NO'}; "
                 f"knobs restored: {'yes' if res.restored else 'NO'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- orchestration


@dataclass(frozen=True)
class MixSettings:
    schedule: tuple[str, ...] = DEFAULT_SCHEDULE
    phase_s: float = DEFAULT_PHASE_S
    policy: str | None = None
    budget: int | None = None
    window_s: float | None = None
    compare_rounds: int = 6
    max_rounds: int | None = None
    rel_halfwidth: float = 0.15
    state_dir: Path = Path("/var/lib/polltuned/bench")
    #: how long the daemon may take to stop (finish its window, restore) before it is killed
    stop_timeout_s: float = 60.0
    wait_quiet_s: float | None = None
    #: the daemon's log level (its log goes to <state>/mix/daemon.log)
    log_level: str = "info"

    def stop_rule(self) -> StopRule:
        mx = self.max_rounds if self.max_rounds is not None else 2 * self.compare_rounds
        return StopRule(min_rounds=self.compare_rounds, max_rounds=max(mx, self.compare_rounds),
                        rel_halfwidth=self.rel_halfwidth)


@dataclass(frozen=True)
class MixPaths:
    root: Path

    @property
    def phase_file(self) -> Path:
        return self.root / "phase.json"

    @property
    def client_log(self) -> Path:
        return self.root / "windows.jsonl"

    @property
    def compare_log(self) -> Path:
        return self.root / "compare.jsonl"

    @property
    def daemon_state(self) -> Path:
        return self.root / "daemon"

    @property
    def daemon_run(self) -> Path:
        return self.root / "run"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    @property
    def policy(self) -> Path:
        return self.root / "policy.toml"

    @property
    def config(self) -> Path:
        return self.root / "polltuned.toml"

    @property
    def samples(self) -> Path:
        return self.root / "status-samples.jsonl"

    @property
    def daemon_pid(self) -> Path:
        return self.root / "daemon.pid"


def client_argv(paths: MixPaths, server: str, port: int, log_file: Path | None) -> list[str]:
    argv = ["{python}", "-m", "polltuned.host.mixclient", "--phase-file", str(paths.phase_file),
            "--server", server, "--port", str(port), "--duration", "{window_s}"]
    if log_file is not None:
        argv += ["--log", str(log_file)]
    return argv


def _toml_str(s: str) -> str:
    return json.dumps(s)   # a JSON string of printable text is a valid TOML basic string


def daemon_policy_toml(base: Path, argv: Sequence[str], netns: str, *, budget: int | None,
                       window_s: float | None) -> str:
    """Pure: the policy the daemon runs: ``base`` included, its probe pointed at this run's files."""
    lines = [f"include = [{_toml_str(str(base))}]", ""]
    tuning = {}
    if budget is not None:
        tuning["budget"] = str(budget)
    if window_s is not None:
        tuning["window_s"] = repr(float(window_s))
    if tuning:
        lines += ["[tuning]", *[f"{k} = {v}" for k, v in tuning.items()], ""]
    lines += ["[probe]", 'kind = "command"', "argv = [" + ", ".join(_toml_str(a) for a in argv) + "]",
              f"netns = {_toml_str(netns)}", "fresh_sockets = true", "timeout_s = 40", "",
              "[probe.statistic_map]"]
    for stat in ("p50", "p90", "p99", "p999", "mean", "max"):
        lines.append(f'{stat} = "$.latency_us.{stat}"')
    lines.append('throughput = "$.throughput_rps"')
    # the number of concurrent client sessions (Window.extra["sessions"]: the context's flows, as
    # the sockperf probe reports its own): the load's size, never the phase or its name
    lines.append('sessions = "$.sessions"')
    return "\n".join(lines) + "\n"


def mix_recover(state_dir: Path, *, host: Host, clock: Clock,
                progress: Callable[[str], None] = lambda s: None) -> bool:
    """Undo what a crashed mix bench left: the daemon's journal (if it was killed), then the bench's
    own journal and ``ptb-*`` namespaces (polltuned.bench.session.recover). Returns whether knobs were dirty."""
    paths = MixPaths(state_dir / "mix")
    stop_leftover_daemon(paths, host=host, clock=clock, progress=progress)
    dirty = mix_recover_daemon(MixPaths(state_dir / "mix"), host=host, clock=clock, progress=progress)
    d2, _ = recover(state_dir, host=host, clock=clock, progress=progress)
    return dirty or d2


class DaemonProcess:
    """``polltuned run`` as a subprocess (its own session), output to a log file."""

    def __init__(self, runner: Any, argv: Sequence[str], log_file: Path) -> None:
        # sh only redirects: a pipe that nobody reads would block the daemon once full
        self._proc = runner.spawn(["sh", "-c", f'exec "$0" "$@" >>{_sh_quote(str(log_file))} 2>&1', *argv])
        self.log_file = log_file
        self.exit_code: int | None = None

    @property
    def pid(self) -> int:
        return int(self._proc.pid)

    def running(self) -> bool:
        return bool(self._proc.running())

    def stop(self, timeout_s: float, clock: Clock) -> tuple[int | None, bool]:
        """SIGTERM, wait up to ``timeout_s``; then SIGKILL. Returns (exit code, exited by itself)."""
        if self._proc.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGTERM)
            deadline = clock.monotonic() + timeout_s
            while self._proc.running() and clock.monotonic() < deadline:
                clock.sleep(0.2)
        clean = not self._proc.running()
        res = self._proc.stop(1.0)
        self.exit_code = res.returncode
        return res.returncode, clean

    def tail(self, n: int = 12) -> list[str]:
        try:
            return self.log_file.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return []


def _sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def _base_policy_path(ref: str | None) -> Path:
    return find_policy(ref or "bench-mix").resolve()


@dataclass
class _Run:
    """What the unattended part produced."""

    spans: list[PhaseSpan]
    samples: list[StatusSample]
    windows: list[ClientWindow]
    daemon_exit: int | None
    daemon_clean: bool
    daemon_restored: bool
    run_s: float
    foreign: float
    tail: list[str]


def run_mix(settings: MixSettings, *, host: Host, clock: Clock,
            progress: Callable[[str], None] = lambda s: None) -> MixResult:
    """The whole mix bench on the real host. Needs root; hold /tmp/polltuned-realkernel.lock around it."""

    app = schedule_app(parse_schedule(",".join(settings.schedule)))
    rule = settings.stop_rule()
    if settings.wait_quiet_s is not None:
        quiet, waited = wait_for_quiet(host, clock, timeout_s=settings.wait_quiet_s, progress=progress)
        progress(f"machine {'quiet' if quiet else 'still busy'} after {waited:.0f} s of waiting")
    t_start = clock.monotonic()
    runner = SubprocessRunner()
    state_dir = Path(settings.state_dir)
    paths = MixPaths(state_dir / "mix")
    ncpus = max(1, len(host.glob("/sys/devices/system/cpu", "cpu[0-9]*")))
    workload = Workload("mix", f"one {app} server on CPU1 for the whole run; the client load alternates",
                        client_cpus=(0,), server_cpus=SERVER_CPUS, app=app)
    world = DefaultWorld(host, runner, clock, state_dir, workload=workload, ncpus=ncpus)
    c = world.config
    base = _base_policy_path(settings.policy)
    owner = os.getpid()
    server: Any = None
    daemon: DaemonProcess | None = None
    actuator: Any = None
    probe: Any = None
    restored = False
    run: _Run | None = None
    with signals_raise():
        try:
            mix_recover(state_dir, host=host, clock=clock, progress=progress)
            if paths.root.exists():
                shutil.rmtree(paths.root)
            paths.root.mkdir(parents=True)
            progress(f"creating the world (mix: {', '.join(settings.schedule)}, {settings.phase_s:.0f} s per phase)")
            world.setup()   # a memcached run: the world starts memcached on CPU1 and waits for it to listen
            if app == "sockperf":
                server = runner.spawn(["sockperf", "server", "-i", c.server_addr, "-p", str(c.port)],
                                      netns=c.server_ns, cpus=list(world.server_cpus))
                clock.sleep(0.5)
                if not server.running():
                    raise HostError(f"bench mix: the sockperf server did not start: {server.stop(0.1).describe()}")
            write_phase(str(paths.phase_file), phase_load(0, settings.schedule[0]))
            paths.policy.write_text(daemon_policy_toml(
                base, client_argv(paths, c.server_addr, world.app_port, paths.client_log), c.client_ns,
                budget=settings.budget, window_s=settings.window_s))
            paths.config.write_text("status_interval_s = 1.0\nhold_status_interval_s = 1.0\n")
            policy = load_policy(str(paths.policy), nic=c.nic)
            argv = [sys.executable, "-m", "polltuned", "--state-dir", str(paths.daemon_state), "--run-dir",
                    str(paths.daemon_run), "run", "--config", str(paths.config), "--policy", str(paths.policy),
                    "--nic", c.nic, "--log-level", settings.log_level]
            progress("starting the daemon: " + " ".join(argv[1:]))
            daemon = DaemonProcess(runner, argv, paths.daemon_log)
            paths.daemon_pid.write_text(f"{daemon.pid}\n")
            run = _unattended(settings, paths, daemon, clock, progress,
                              foreign=lambda: foreign_cpu_seconds(owner))
            daemon = None   # stopped by _unattended
            if not run.daemon_restored:
                raise HostError("bench mix: the daemon did not restore the host on exit",
                                hint="see " + str(paths.daemon_log))
            # ---- the comparison, with the bench's own actuator (after the daemon restored everything)
            actuator = build_actuator(host, state_dir, clock, app_cpus=policy.app_cpus)
            fitted, dropped = prepare_policy(policy, actuator)
            policy = policy.model_copy(update={"knobs": dict(fitted.knobs)})
            probe_cfg = policy.probe.model_copy(update={"argv": client_argv(paths, c.server_addr, world.app_port,
                                                                             paths.compare_log)})
            policy = policy.model_copy(update={"probe": probe_cfg})
            probe = make_probe(probe_cfg, host, clock=clock, runner=runner)
            probe.start()
            env = BenchEnv(host_env(policy, actuator, probe, host, clock), host=host, clock=clock,
                           workload="mix", foreign=lambda: foreign_cpu_seconds(owner))
            env.phase = "compare"
            defaults = env.current()
            dws = attribute_windows(run.windows, run.samples)
            reports = analyse_timeline(run.spans, dws, defaults)
            first = first_deployment(dws)
            arms = build_arms(defaults, first, [r.follow for r in reports])
            layouts = list(dict.fromkeys(settings.schedule))
            progress(f"comparison: {len(arms.configs)} configurations x {len(layouts)} loads, interleaved, "
                     f"{rule.min_rounds}..{rule.max_rounds} rounds: "
                     + "; ".join(f"{lab}={cid}" for lab, cid in arms.labels.items()))
            wins, rounds, reasons = _compare(env, paths, arms, layouts, policy.objective, rule, progress)
            per_layout = {lay: {cid: arm_stats(cid, arms.configs[cid], wins[lay][cid], policy.objective)
                                for cid in arms.configs} for lay in layouts}
            comparisons: list[PhaseComparison] = []
            follow_ids: list[str | None] = []
            for r in reports:
                st = per_layout[r.layout]
                fid = arms.labels.get(f"follow@{r.index + 1}")
                follow_ids.append(fid)
                olab = best_label(arms, st)
                comparisons.append(PhaseComparison(
                    index=r.index, layout=r.layout, default=st[arms.labels["default"]],
                    static=st[arms.labels["static"]], first=st[arms.labels["first"]],
                    follow=st[fid] if fid is not None else None, oracle=st[arms.labels[olab]], oracle_label=olab))
            singles, fol = whole_run(per_layout, settings.schedule, follow_ids)
            ncycle = len(layouts)
            after = [w for w in dws if w.phase >= ncycle]
            res = MixResult(
                schedule=tuple(settings.schedule), phase_s=settings.phase_s, policy=policy.name,
                knobs=list(policy.knobs), dropped_knobs=dropped, defaults=dict(defaults), arms=arms,
                per_layout=per_layout, phases=reports, comparisons=comparisons, singles=singles,
                follow_whole=fol, explore_after_cycle=(sum(1 for w in after if w.exploring), len(after)),
                rounds=rounds, stop_reasons=reasons, daemon_exit=run.daemon_exit,
                daemon_restored=run.daemon_restored, restored=False, duration_s=0.0, run_s=run.run_s,
                foreign_cores_run=run.foreign, samples=len(run.samples), windows_total=len(dws),
                daemon_log_tail=run.tail)
        finally:
            if os.getpid() != owner:
                os._exit(1)
            try:
                if daemon is not None and daemon.running():
                    progress("stopping the daemon (it restores its knobs on exit)")
                    daemon.stop(settings.stop_timeout_s, clock)
                if actuator is not None:
                    rep = actuator.rollback()
                    restored = bool(getattr(rep, "ok", True))
                else:
                    restored = run is not None and run.daemon_restored
                # a daemon that was killed left its journal open: roll it back here
                mix_recover_daemon(paths, host=host, clock=clock, progress=progress)
            finally:
                if probe is not None:
                    with contextlib.suppress(PolltunedError, OSError):
                        probe.close()
                if server is not None:
                    server.stop(1.0)
                world.teardown()
                progress("host restored: knobs back, server stopped, namespaces removed")
    res.restored = restored
    res.duration_s = clock.monotonic() - t_start
    res.targets = evaluate_targets(res)
    return res


def daemon_cmdline_matches(cmdline: str, run_dir: Path) -> bool:
    """Pure: whether /proc/PID/cmdline (NUL-separated) is a ``polltuned ... run`` with ``run_dir``."""
    args = [a for a in cmdline.split("\0") if a]
    return "polltuned" in args and "run" in args and str(run_dir) in args


def stop_leftover_daemon(paths: MixPaths, *, host: Host, clock: Clock,
                         progress: Callable[[str], None] = lambda s: None) -> bool:
    """A crashed (SIGKILLed) bench leaves its daemon running: stop it (SIGTERM: it restores; SIGKILL
    after 60 s). Only the process recorded in the pid file, and only if its command line is that
    daemon's. Returns whether one was running."""
    try:
        pid = int(paths.daemon_pid.read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        cmd = host.read_text(f"/proc/{pid}/cmdline")
    except PolltunedError:
        return False
    if not daemon_cmdline_matches(cmd, paths.daemon_run):
        return False
    progress(f"a previous mix run's daemon (pid {pid}) is still running: stopping it")

    kill_pid(pid, signal.SIGTERM)
    deadline = clock.monotonic() + 60.0
    while host.exists(f"/proc/{pid}/cmdline") and clock.monotonic() < deadline:
        clock.sleep(0.2)
    if host.exists(f"/proc/{pid}/cmdline"):
        kill_pid(pid, signal.SIGKILL)
    return True


def mix_recover_daemon(paths: MixPaths, *, host: Host, clock: Clock,
                       progress: Callable[[str], None] = lambda s: None) -> bool:
    """Roll back the daemon's journal if it is dirty (the daemon was killed). Returns whether it was."""

    if not paths.daemon_state.is_dir():
        return False
    act = build_actuator(host, paths.daemon_state, clock)
    if not act.is_dirty():
        return False
    progress("the daemon left knobs changed: rolling them back from its journal")
    act.rollback()
    return True


def _unattended(settings: MixSettings, paths: MixPaths, daemon: DaemonProcess, clock: Clock,
                progress: Callable[[str], None], *, foreign: Callable[[], Mapping[int, float]]) -> _Run:
    """Run the phases while the daemon tunes; sample its status every second; stop it at the end."""
    spans: list[PhaseSpan] = []
    samples: list[StatusSample] = []
    t0 = clock.monotonic()
    f0 = foreign()
    exit_code: int | None = None
    clean = False
    last_msg = ""
    with open(paths.samples, "a", encoding="utf-8") as sf:
        try:
            for i, layout in enumerate(settings.schedule):
                write_phase(str(paths.phase_file), phase_load(i, layout))
                start = clock.wall()
                progress(f"[MIX] phase {i + 1}/{len(settings.schedule)}: {layout} ({LAYOUTS[layout].description})")
                end_mono = clock.monotonic() + settings.phase_s
                while clock.monotonic() < end_mono:
                    raise_if_interrupted()
                    clock.sleep(min(1.0, max(0.0, end_mono - clock.monotonic())))
                    if not daemon.running():
                        raise HostError("bench mix: the daemon exited during the run",
                                        hint=" | ".join(daemon.tail(5)))
                    doc = read_status(paths.daemon_run)
                    if doc is not None:
                        s = status_sample(doc, clock.wall())
                        samples.append(s)
                        sf.write(json.dumps({"t": s.t, "phase": s.phase, "config": s.config, "role": s.role,
                                             "message": doc.get("message")}, default=str) + "\n")
                        msg = f"{s.phase}: {doc.get('message', '')}"[:140]
                        if msg != last_msg and (s.phase != "HOLD" or "window" not in msg or
                                                int(clock.monotonic()) % 15 == 0):
                            progress(f"[DAEMON] {msg}")
                            last_msg = msg
                spans.append(PhaseSpan(index=i, layout=layout, t_start=start, t_end=clock.wall()))
        finally:
            progress("stopping the daemon (SIGTERM: it finishes its window and restores its originals)")
            exit_code, clean = daemon.stop(settings.stop_timeout_s, clock)
    run_s = clock.monotonic() - t0
    fc = foreign_cores(f0, foreign(), run_s)
    restored = clean and exit_code == 0
    if restored:
        act = build_actuator(FsHost("/"), paths.daemon_state, clock)
        restored = not act.is_dirty()
    try:
        windows = parse_client_log(paths.client_log.read_text())
    except OSError:
        windows = []
    return _Run(spans=spans, samples=samples, windows=windows, daemon_exit=exit_code, daemon_clean=clean,
                daemon_restored=restored, run_s=run_s, foreign=fc, tail=daemon.tail())


Wins = dict[str, dict[str, list[Window]]]


def _compare(env: Any, paths: MixPaths, arms: Arms, layouts: Sequence[str], objective: Objective, rule: StopRule,
             progress: Callable[[str], None]) -> tuple[Wins, dict[str, int], dict[str, str]]:
    """Interleaved rounds: loads alternate, and within a load every configuration once in a rotating order.
    A load stops once :func:`polltuned.bench.comparison.comparison_done` says so (or at the hard cap)."""
    ids = list(arms.configs)
    wins: Wins = {lay: {cid: [] for cid in ids} for lay in layouts}
    done: dict[str, str] = {}
    rounds: dict[str, int] = {lay: 0 for lay in layouts}
    idx = 50_000
    for r in range(rule.max_rounds):
        for li, lay in enumerate(layouts):
            if lay in done:
                continue
            write_phase(str(paths.phase_file), phase_load(900 + li, lay))
            order = ids[r % len(ids):] + ids[: r % len(ids)]
            for cid in order:
                env.apply(arms.configs[cid])
                w = env.measure(idx)
                idx += 1
                wins[lay][cid].append(w)
                j = window_objective(w, objective)
                progress(f"[COMPARE] round {r + 1} {lay} {cid}: "
                         + (f"p99={w.latency.get('p99', math.nan):.1f}us J={j:.1f}" if j is not None
                            else f"failed: {w.error}"))
            rounds[lay] = r + 1
            ok, why = comparison_done({cid: [window_objective(w, objective) for w in v]
                                       for cid, v in wins[lay].items()}, rule)
            if ok:
                done[lay] = why
        if len(done) == len(layouts):
            break
    for lay in layouts:
        done.setdefault(lay, f"hard cap of {rule.max_rounds} rounds")
    return wins, rounds, done

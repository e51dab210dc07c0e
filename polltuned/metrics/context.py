"""The load context of a window, from what the daemon already samples (records.Window.context).

The contextual model is J(knobs, context) (polltuned.optimiser.skopt_backend): the context must
describe the *load*, never the knobs' own effect — a signal the knobs move would let the model
explain a knob's effect away as "another load". Each signal below says where it comes from, what
is exact and what is approximate, and why a knob change does not move it (:data:`SIGNALS`, the
one list). Only *primary* signals go into ``Window.context``; secondary ones go into
``Window.extra`` as ``context2.NAME`` (reports only, never the model's input).

Primary
-------
``flows`` — active flows on the service.
    Source: the probe's own session count (``Window.extra["sessions"]``, sockperf: exact, it runs
    that many clients), the sock_diag TCP-RTT probe's count of established sockets seen on the
    service port (``extra["sockets"]``: exact at each poll, the union over the window), or an
    injected sock_diag count of established sockets on the policy's port (exact at the sampling
    instant). Absent otherwise. Knob-invariant: the polling knobs change how fast a connection is
    served, not how many clients connect (a client that gives up on timeouts would, which the
    guard stops long before).
``offered_rate`` — requests (or packets) per second the clients offer.
    Source: a rate the probe *sets* (sockperf under-load ``rate_mps`` x sessions: exact), else
    the probe's request rate (prometheus histogram count/s, a command's ``throughput``) or the
    NIC's rx packets/s when the load is open-loop (production clients that send at their own
    pace: approximate — arrivals do not wait for answers until the server saturates). Absent for a
    closed-loop probe (sockperf ping-pong, wrk, kvclient): there the rate is sessions / round-trip
    time, so busy polling doubles it on this VM — exactly what must not be in the context.
``runnable_others`` — other runnable tasks on the application's CPUs, excluding the poller.
    Source: one pass over the processes (polltuned.host.procs.task_samples: the CPU each last ran
    on, user+system seconds) at the start and end of the window; counted: processes that are not
    the application's (``is_app``: its pids / cgroup, in the bench the sockperf server), whose
    last CPU at the end is one of the application's CPUs, and that used at least ``min_share``
    (5 %) of a core over the window. Approximate: "ran for >= 5 %" stands for "was runnable"; a
    process that migrated during the window counts where it ended; a multi-threaded process counts
    once. Kernel threads are left out (see below). Knob-invariant: the count of *busy* peers, not
    their CPU share — a spinning poller takes CPU from a peer (its share falls) but a peer that
    needs the CPU stays above 5 %. The bench counts only its own world's processes (clients, hog:
    the descendants of the bench), because on a shared machine other users' jobs come and go on
    the same CPUs (they are the bench's "foreign CPU" column instead). A probe that starts its
    clients per window (sockperf) needs the passes *inside* the window (``within_s``: a helper
    thread samples every fifth of it until the window ends; a peer counts when it was busy on
    the app's CPUs in at least two of the intervals between consecutive samples), or the clients
    are gone. The poller itself is excluded because busy polling makes it a runnable spinning task (/proc/stat
    ``procs_running`` and schedstat run-queue wait move with the knobs for exactly that reason,
    so neither is used).

Secondary (``Window.extra``, never the model's input)
-----------------------------------------------------
``softirqs_per_s``, ``net_rx_per_s``, ``irqs_per_s`` on the application's CPUs: busy polling
processes packets in the poller's syscall instead of NET_RX softirq and IRQ deferral suppresses
hard IRQs (vm-bench §4), so these counters move with the knobs themselves; they describe the load
only at fixed knobs (tests/test_context_realkernel.py on this VM: NET_RX on the server's CPU
1440-1980/s at busy 0 vs 48-55/s at busy 50 for one session, 8800-12200 vs 1700/s for four,
while flows and runnable_others stayed 1/0 and 4/2). ``nic_rx_packets_per_s`` of a closed-loop
load likewise (it follows the RTT).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from polltuned.errors import PolltunedError
from polltuned.host.procs import task_samples
from polltuned.metrics.window import rates
from polltuned.records import Window

log = logging.getLogger("polltuned.context")

RateMode = Literal["closed", "open", "set"]
#: extra keys of the secondary signals
SECONDARY_PREFIX = "context2."


@dataclass(frozen=True)
class Signal:
    name: str
    primary: bool
    source: str
    exactness: str
    invariance: str


#: every context signal (the one list; the module docstring has the long form)
SIGNALS: dict[str, Signal] = {
    "flows": Signal("flows", True, "probe sessions / sock_diag established sockets on the port",
                    "exact", "knobs change how fast a flow is served, not how many connect"),
    "offered_rate": Signal("offered_rate", True, "rate set by the probe, probe request rate, NIC rx pps",
                           "exact when set, approximate when open-loop, absent when closed-loop",
                           "open-loop arrivals do not wait for answers; closed-loop rates are left out"),
    "runnable_others": Signal("runnable_others", True, "processes on the app's CPUs using >= 5 % of a core",
                              "approximate (busy stands for runnable)",
                              "a count of busy peers, not their share; the poller is excluded"),
    "softirqs_per_s": Signal("softirqs_per_s", False, "/proc/softirqs on the app's CPUs", "exact",
                             "NOT invariant: busy polling moves NET_RX work out of softirq"),
    "net_rx_per_s": Signal("net_rx_per_s", False, "/proc/softirqs NET_RX on the app's CPUs", "exact",
                           "NOT invariant: busy polling and deferral change it"),
    "irqs_per_s": Signal("irqs_per_s", False, "/proc/irq/N counts of the NIC's queues on the app's CPUs",
                         "exact", "NOT invariant: IRQ deferral suppresses hard IRQs"),
}


@dataclass(frozen=True)
class Task:
    """One user-space process as the context sees it."""

    pid: int
    cpu: int          # CPU it last ran on
    state: str        # R, S, D, ...
    cpu_s: float      # user + system seconds so far
    cmdline: str = ""


def tasks_from(raw: Mapping[int, tuple[int, str, float, str]]) -> dict[int, Task]:
    """polltuned.host.procs.task_samples() output as Tasks."""
    return {pid: Task(pid, cpu, state, cpu_s, cmd) for pid, (cpu, state, cpu_s, cmd) in raw.items()}


def busy_peers(before: Mapping[int, Task], after: Mapping[int, Task], *, app_cpus: Sequence[int],
               is_app: Callable[[Task], bool], interval_s: float, min_share: float = 0.05) -> set[int]:
    """The pids of processes other than the application's that ended the interval on one of
    ``app_cpus`` and used at least ``min_share`` of a core over it (present at both ends; pid reuse
    is not guarded: a new process with a reused pid and less CPU time than the old one is skipped)."""
    if interval_s <= 0:
        raise ValueError(f"busy_peers: interval must be > 0 (got {interval_s})")
    cpus = set(app_cpus)
    out: set[int] = set()
    for pid, t1 in after.items():
        t0 = before.get(pid)
        if t0 is None or t1.cpu not in cpus or is_app(t1):
            continue
        d = t1.cpu_s - t0.cpu_s
        if d >= 0 and d / interval_s >= min_share:
            out.add(pid)
    return out


def steady_runnable_others(pairs: Sequence[tuple[Mapping[int, Task], Mapping[int, Task], float]], *,
                           app_cpus: Sequence[int], is_app: Callable[[Task], bool], min_intervals: int = 2,
                           min_share: float = 0.05) -> float:
    """Over consecutive samples inside one window: the peers that were busy on the app's CPUs in at
    least ``min_intervals`` of the intervals (all of them when there are fewer; one interval:
    ``busy_peers``' count). A peer busy in one interval (a command starting up, a job passing
    through) is not the load; the window's clients run through the probe's whole window,
    which the sampling thread cuts into fifths. Not a share of the intervals: a client may sit
    idle for most of a measurement (sockperf sleeps 2 s after its warm-up messages, so the bench's
    clients are busy in the last 4 of its 15 intervals)."""
    if not pairs:
        raise ValueError("runnable_others: no sample pairs")
    if min_intervals < 1:
        raise ValueError(f"runnable_others: min_intervals must be >= 1 (got {min_intervals})")
    hits: Counter[int] = Counter()
    for a, b, span in pairs:
        hits.update(busy_peers(a, b, app_cpus=app_cpus, is_app=is_app, interval_s=span, min_share=min_share))
    need = min(min_intervals, len(pairs))
    return float(sum(1 for n in hits.values() if n >= need))


def flows_of(w: Window, sockets: int | None = None) -> float | None:
    """Active flows: the probe's sessions, the TCP-RTT probe's sockets, else a sock_diag count."""
    for key in ("sessions", "sockets"):
        v = w.extra.get(key)
        if v is not None and math.isfinite(v) and v >= 0:
            return float(v)
    return None if sockets is None else float(sockets)


def offered_rate_of(w: Window, *, mode: RateMode, set_rate: float | None = None,
                    nic_rx_pps: float | None = None) -> float | None:
    """The offered rate (see the module docstring): ``set`` -> the rate the probe sets, ``open`` ->
    the probe's request rate or else the NIC's rx packets/s, ``closed`` -> None (it follows the RTT)."""
    if mode == "set":
        return set_rate
    if mode == "closed":
        return None
    if w.throughput_pps is not None and math.isfinite(w.throughput_pps):
        return float(w.throughput_pps)
    return nic_rx_pps


def secondary_of(rates: Any, app_cpus: Sequence[int] | None) -> dict[str, float]:
    """Secondary signals (softirq / NET_RX / NIC IRQ rates summed over ``app_cpus``, default every
    CPU, and the NICs' rx packets/s) from a ``polltuned.metrics.window.Rates``."""
    out: dict[str, float] = {}
    table = rates.cpu
    cpus = list(app_cpus) if app_cpus is not None else sorted(table)
    for col in ("softirqs_per_s", "net_rx_per_s", "irqs_per_s"):
        vals = [getattr(table[c], col) for c in cpus if c in table]
        vals = [v for v in vals if v is not None]
        if vals:
            out[col] = float(sum(vals))
    if rates.nic:
        rx = [r.rx_packets_per_s for r in rates.nic.values() if r.rx_packets_per_s is not None]
        if rx:
            out["nic_rx_packets_per_s"] = float(sum(rx))
    return out


class ContextMeter:
    """Measures a window's context around the probe's window: ``begin()`` right before it,
    ``end(window)`` right after (HostEnv.measure calls both). Every source is injected (the
    host door stays in polltuned/host); a source that fails leaves its signal out, with one log line
    per source, and never fails the window."""

    def __init__(self, *, monotonic: Callable[[], float], app_cpus: Sequence[int] | None = None,
                 tasks: Callable[[], Mapping[int, Task]] | None = None,
                 is_app: Callable[[Task], bool] = lambda t: False,
                 sampler: Any = None, rate_mode: RateMode = "closed", set_rate: float | None = None,
                 sockets: Callable[[], int] | None = None, within_s: float | None = None,
                 sleep: Callable[[float], None] | None = None) -> None:
        if within_s is not None and (within_s <= 0 or sleep is None):
            raise ValueError("ContextMeter: within_s needs a positive window and a sleep function")
        self.monotonic = monotonic
        self.within_s = within_s
        self.sleep = sleep
        self.app_cpus = list(app_cpus) if app_cpus is not None else None
        self.tasks = tasks
        self.is_app = is_app
        self.sampler = sampler
        self.rate_mode: RateMode = rate_mode
        self.set_rate = set_rate
        self.sockets = sockets
        self._t0 = 0.0
        self._tasks0: Mapping[int, Task] | None = None
        self._s0: Any = None
        self._warned: set[str] = set()
        self._inside: list[tuple[float, Mapping[int, Task] | None]] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def _warn(self, source: str, e: Exception) -> None:
        if source not in self._warned:
            self._warned.add(source)
            log.warning("context: %s unavailable, its signal is left out: %s", source, e)

    def begin(self) -> None:
        self._t0 = self.monotonic()
        self._inside = []
        self._thread = None
        self._stop = threading.Event()
        if self.within_s is not None and self.tasks is not None:
            self._tasks0 = None
            self._thread = threading.Thread(target=self._sample_inside, args=(self.within_s,), daemon=True,
                                            name="polltuned-context")
            self._thread.start()
        else:
            self._tasks0 = self._read_tasks()
        self._s0 = None
        if self.sampler is not None:
            try:
                self._s0 = self.sampler.sample()
            except (PolltunedError, OSError) as e:
                self._warn("counters", e)

    def _sample_inside(self, window_s: float) -> None:
        assert self.sleep is not None
        stop = self._stop
        while not stop.is_set() and len(self._inside) < 100:
            self._inside.append((self.monotonic(), self._read_tasks()))
            self.sleep(window_s / 5.0)

    def _task_pairs(self, dt: float) -> list[tuple[Mapping[int, Task], Mapping[int, Task], float]]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=self.within_s)
            if self._thread.is_alive():
                return []
            got = [(t, s) for t, s in self._inside if s is not None]
            return [(a, b, tb - ta) for (ta, a), (tb, b) in itertools.pairwise(got) if tb > ta]
        if self._tasks0 is None or dt <= 0:
            return []
        t1 = self._read_tasks()
        return [] if t1 is None else [(self._tasks0, t1, dt)]

    def _read_tasks(self) -> Mapping[int, Task] | None:
        if self.tasks is None:
            return None
        try:
            return self.tasks()
        except (PolltunedError, OSError) as e:
            self._warn("process list", e)
            return None

    def end(self, w: Window) -> Window:
        """``w`` with its context (primary) and ``context2.*`` extras (secondary)."""
        if not w.ok:
            return w
        dt = self.monotonic() - self._t0
        ctx: dict[str, float] = {}
        extra = dict(w.extra)
        nic_rx: float | None = None
        if self.sampler is not None and self._s0 is not None:
            try:
                r = rates(self._s0, self.sampler.sample())
                sec = secondary_of(r, self.app_cpus)
                nic_rx = sec.get("nic_rx_packets_per_s")
                extra.update({SECONDARY_PREFIX + k: v for k, v in sec.items()})
            except (PolltunedError, OSError, ValueError, ZeroDivisionError) as e:
                self._warn("counters", e)
        sockets: int | None = None
        if self.sockets is not None:
            try:
                sockets = self.sockets()
            except (PolltunedError, OSError) as e:
                self._warn("sock_diag", e)
        fl = flows_of(w, sockets)
        if fl is not None:
            ctx["flows"] = fl
        rate = offered_rate_of(w, mode=self.rate_mode, set_rate=self.set_rate, nic_rx_pps=nic_rx)
        if rate is not None and math.isfinite(rate):
            ctx["offered_rate"] = rate
        pairs = self._task_pairs(dt) if self.app_cpus is not None and self.tasks is not None else []
        if pairs and self.app_cpus is not None:
            cpus = self.app_cpus
            ctx["runnable_others"] = steady_runnable_others(pairs, app_cpus=cpus, is_app=self.is_app)
        return replace(w, context={**w.context, **ctx}, extra=extra)


def rate_mode_for(probe: Any) -> tuple[RateMode, float | None]:
    """Pure: how a probe (policy.probe) tells the offered rate: sockperf under-load sets it
    (``rate_mps`` x sessions), sockperf ping-pong and a command (wrk, kvclient: load generators)
    are closed-loop, the passive probes (tcp_rtt, prometheus) watch open-loop production traffic."""
    kind = getattr(probe, "kind", "")
    if kind == "sockperf":
        if getattr(probe, "mode", "") == "under-load":
            return "set", float((probe.rate_mps or 1000) * probe.sessions)
        return "closed", None
    if kind in ("tcp_rtt", "prometheus"):
        return "open", None
    return "closed", None


def host_context_meter(*, clock: Any, app_cpus: Sequence[int] | None, is_app: Callable[[Task], bool],
                       sampler: Any = None, rate_mode: RateMode = "closed", set_rate: float | None = None,
                       sockets: Callable[[], int] | None = None,
                       descendants_of: int | None = None, within_s: float | None = None) -> ContextMeter:
    """A ContextMeter on the live host: the process list through polltuned.host.procs (only the
    descendants of ``descendants_of`` when given: the bench counts its own world's processes)."""
    return ContextMeter(monotonic=clock.monotonic, app_cpus=app_cpus,
                        tasks=lambda: tasks_from(task_samples(descendants_of)),
                        is_app=is_app, sampler=sampler, rate_mode=rate_mode, set_rate=set_rate, sockets=sockets,
                        within_s=within_s, sleep=clock.sleep)


def app_by_command(*words: str) -> Callable[[Task], bool]:
    """``is_app`` for an application known by its command line: every word must occur in it."""
    return lambda t: bool(t.cmdline) and all(w in t.cmdline for w in words)

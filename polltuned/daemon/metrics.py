"""Prometheus export of the daemon's own state (opt-in, ``[metrics]`` in the daemon config).

The metrics are built at scrape time, by a custom Collector on the exporter's own
CollectorRegistry, from the last status document the service published (the same document as
``polltuned status --json``; see polltuned.daemon.statusdoc). A scrape therefore reads no kernel
file and never races the control loop: publishing swaps one reference, a scrape converts whatever
document is current. Two ways out, both opt-in:

* an HTTP listener (prometheus_client's server, socket opened in polltuned.host.metrics_http) on a
  loopback address; the unit's ``IPAddressAllow=localhost ...`` keeps it local anyway;
* the node_exporter textfile collector: ``<dir>/polltuned.prom`` rewritten (temp file + atomic
  rename) when the status is published, at most once per ``textfile_min_interval_s`` (node_exporter
  reads it once per scrape, tens of seconds apart); the last document is written at exit.

Names follow the Prometheus conventions: ``polltuned_`` prefix, base units in the name
(``_seconds``, ``_ratio`` for fractions, ``_per_second`` for the rates the daemon already computes),
``_total`` for counters, state sets for enumerations. Fields a status document lacks (an older
daemon, a block another part does not fill yet) are simply not exported.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample

from polltuned.clock import Clock
from polltuned.daemon.config import MetricsConfig
from polltuned.errors import PolltunedError
from polltuned.host.metrics_http import serve_metrics

log = logging.getLogger("polltuned.daemon")

#: every phase the controller and the engine publish (a state set lists all of them, 1 for the current)
PHASES = ("IDLE", "RECOVER", "RESUME", "BASELINE", "PROPOSE", "APPLY", "SETTLE", "MEASURE", "SCORE", "CONFIRM",
          "HOLD", "ROLLBACK", "DONE", "STOPPED")
#: status-document owner text -> label value
OWNERS = {"polltuned": "polltuned", "polltuned (restored)": "restored", "admin (released)": "released",
          "polltuned (partly released)": "partly_released", "unsupported": "unsupported", "gone": "gone",
          "not managed": "not_managed"}
KNOB_KINDS = ("original", "current", "best", "deployed")


def _num(v: Any) -> float | None:
    """A finite number from a JSON value (bool -> 0/1), else None."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    return None


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _gauge(name: str, doc: str, value: Any) -> Iterator[Metric]:
    x = _num(value)
    if x is not None:
        yield GaugeMetricFamily(name, doc, value=x)


def _counter(name: str, doc: str, value: Any) -> Iterator[Metric]:
    x = _num(value)
    if x is not None:
        yield CounterMetricFamily(name, doc, value=x)


def _state(doc: Mapping[str, Any]) -> Iterator[Metric]:
    yield InfoMetricFamily("polltuned", "the running policy and what it optimises", value={
        "policy": str(doc.get("policy") or ""), "nic": str(doc.get("nic") or ""),
        "objective": str(_map(doc.get("result")).get("objective_name") or ""),
        "on_exit": str(doc.get("on_exit") or "")})
    phase = str(doc.get("phase") or "IDLE")
    states = {p: p == phase for p in PHASES}
    states.setdefault(phase, True)
    yield StateSetMetricFamily("polltuned_phase", "the controller's phase (1 = current)", value=states)
    yield from _gauge("polltuned_status_updated_timestamp_seconds",
                      "when the daemon last published its status (unix time)", doc.get("updated"))
    prog = _map(doc.get("progress"))
    yield from _gauge("polltuned_tuning_round", "tuning round (1 = first; re-tunes after drift add one)",
                      prog.get("round"))
    yield from _gauge("polltuned_trial", "current or last trial number of the round", prog.get("trial"))
    yield from _gauge("polltuned_trials_budget", "trials the policy's budget allows per round",
                      prog.get("trials_budget"))
    yield from _gauge("polltuned_windows_budget", "measurement windows the policy's budget allows per round",
                      prog.get("windows_budget"))
    yield from _gauge("polltuned_round_windows_used", "measurement windows used by the last finished round",
                      prog.get("windows_used"))
    win = _map(doc.get("windows"))
    yield from _counter("polltuned_windows_measured", "measurement windows since the daemon started "
                        "(tuning and HOLD)", win.get("measured"))
    yield from _counter("polltuned_windows_failed", "measurement windows that failed (probe error, gap, "
                        "CPU unavailable) since the daemon started", win.get("failed"))
    yield from _gauge("polltuned_recovery_dirty_at_start",
                      "1 when the journal showed knobs left by an earlier run at start", _map(
                          doc.get("recovery")).get("dirty_at_start"))


def _knobs(doc: Mapping[str, Any]) -> Iterator[Metric]:
    rows = [r for r in doc.get("knobs") or [] if isinstance(r, Mapping) and r.get("key")]
    deployed = _map(_map(doc.get("result")).get("deployed"))
    values = GaugeMetricFamily("polltuned_knob_value", "numeric knob value: original (before polltuned), current "
                               "(live), best (best found), deployed (what the last round kept)",
                               labels=["knob", "kind"])
    text = GaugeMetricFamily("polltuned_knob_value_info", "non-numeric knob value (e.g. an IRQ affinity "
                             "strategy) as a label; always 1", labels=["knob", "kind", "value"])
    owner = GaugeMetricFamily("polltuned_knob_owner", "who owns the knob (always 1; the owner label says): polltuned, "
                              "restored, released (changed by the admin: never written again), partly_released "
                              "(some parts, e.g. one IRQ, left to the admin), unsupported, gone, "
                              "not_managed", labels=["knob", "owner"])
    for r in rows:
        key = str(r["key"])
        vals = {"original": r.get("original"), "current": r.get("current"), "best": r.get("best")}
        if key in deployed:
            vals["deployed"] = deployed[key]
        for kind in KNOB_KINDS:
            v = vals.get(kind)
            x = _num(v)
            if x is not None:
                values.add_metric([key, kind], x)
            elif isinstance(v, str):
                text.add_metric([key, kind, v], 1.0)
        cur = str(r.get("owner") or "")
        if cur:
            owner.add_metric([key, OWNERS.get(cur, cur.replace(" ", "_"))], 1.0)
    yield values
    yield text
    yield owner


def _result(doc: Mapping[str, Any]) -> Iterator[Metric]:
    res = _map(doc.get("result"))
    if not res:
        return
    obj = GaugeMetricFamily("polltuned_objective", "objective J of the baseline and of the best configuration "
                            "(lower is better; polltuned_info{objective} names it)", labels=["kind"])
    for kind, key in (("baseline", "baseline_objective"), ("best", "best_objective")):
        x = _num(res.get(key))
        if x is not None:
            obj.add_metric([kind], x)
    yield obj
    yield from _gauge("polltuned_deployed_is_baseline", "1 when the last round kept the baseline",
                      res.get("deployed_is_baseline"))
    trials = GaugeMetricFamily("polltuned_round_trials", "trials of the last finished round by outcome",
                               labels=["status"])
    for status, n in _map(res.get("trials")).items():
        x = _num(n)
        if x is not None:
            trials.add_metric([str(status)], x)
    yield trials
    conf = _map(res.get("confirmation"))
    if conf:
        verdict = str(conf.get("verdict") or "")
        yield from _gauge("polltuned_confirmation_deployed",
                          "1 when the interleaved A/B confirmation deployed the candidate", verdict.startswith(
                              "significant: deployed"))
        yield from _gauge("polltuned_confirmation_significant", "1 when the candidate's gain was significant",
                          conf.get("significant"))
        gain = GaugeMetricFamily("polltuned_confirmation_gain_ratio", "relative gain of the candidate over the "
                                 "baseline (0.2 = 20 % better) and its confidence interval", labels=["bound"])
        raw_ci = conf.get("ci")
        ci: list[Any] = [*raw_ci, None, None][:2] if isinstance(raw_ci, list) else [None, None]
        for bound, v in (("estimate", conf.get("gain")), ("ci_low", ci[0]), ("ci_high", ci[1])):
            x = _num(v)
            if x is not None:
                gain.add_metric([bound], x)
        yield gain
        yield from _gauge("polltuned_confirmation_p_value", "p-value of the one-sided Welch test",
                          conf.get("p_value"))
        yield from _gauge("polltuned_confirmation_pairs", "interleaved A/B pairs measured", conf.get("pairs"))


def _guard_hold(doc: Mapping[str, Any]) -> Iterator[Metric]:
    yield from _counter("polltuned_guard_aborts", "guard events since the daemon started: trials rolled back "
                        "(regression beyond guard.max_regression, broken constraint, failed apply)",
                        doc.get("guard_aborts_total"))
    events = [e for e in doc.get("guard_events") or [] if isinstance(e, Mapping)]
    if events:
        yield from _gauge("polltuned_guard_last_event_timestamp_seconds", "time of the latest guard event",
                          events[-1].get("t"))
    hold = _map(doc.get("hold"))
    if not hold:
        return
    yield from _hold_table(hold)


def _hold_table(hold: Mapping[str, Any]) -> Iterator[Metric]:
    """HOLD as the engine keeps it: windows and exploration, the load context, the table."""
    yield from _gauge("polltuned_hold_windows", "windows since the first decision (HOLD, challengers, "
                      "fallback checks, region searches)", hold.get("windows"))
    yield from _gauge("polltuned_hold_exploring_windows", "of which challengers and region searches",
                      hold.get("exploring"))
    yield from _gauge("polltuned_hold_explore_share", "exploring windows / windows (hold.explore_share bounds "
                      "the challengers)", hold.get("explore_share"))
    yield from _counter("polltuned_hold_switches", "switches between table entries", hold.get("switches"))
    yield from _counter("polltuned_hold_fallbacks", "fallback checks against the originals", hold.get("fallbacks"))
    yield from _gauge("polltuned_hold_active_region", "load region of the active entry", hold.get("active_region"))
    ctx = GaugeMetricFamily("polltuned_hold_context", "the load the last window saw (Window.context)",
                            labels=["signal"])
    for name, v in _map(hold.get("context")).items():
        x = _num(v)
        if x is not None:
            ctx.add_metric([str(name)], x)
    yield ctx
    gain = GaugeMetricFamily("polltuned_hold_entry_gain", "confirmed gain of each table entry vs the originals "
                             "(0 = the originals)", labels=["region", "active", "originals"])
    low = GaugeMetricFamily("polltuned_hold_entry_gain_ci_low", "lower bound of that gain's CI",
                            labels=["region", "active", "originals"])
    for e in hold.get("table") or []:
        if not isinstance(e, Mapping):
            continue
        labels = [str(e.get("region")), str(bool(e.get("active"))).lower(), str(bool(e.get("originals"))).lower()]
        for fam, key in ((gain, "gain"), (low, "ci_low")):
            x = _num(e.get(key))
            if x is not None:
                fam.add_metric(labels, x)
    yield gain
    yield low


def _verification(doc: Mapping[str, Any]) -> Iterator[Metric]:
    """``verification`` / ``last_verification``: {"t", "ok", "counts": {state: n}} or {"rows": [{state}]}."""
    ver = _map(doc.get("last_verification") or doc.get("verification"))
    if not ver:
        return
    yield from _gauge("polltuned_last_verification_timestamp_seconds", "time of the last verification of the "
                      "deployed knobs", ver.get("t", ver.get("time")))
    yield from _gauge("polltuned_last_verification_ok", "1 when every managed knob held polltuned's value",
                      ver.get("ok"))
    counts: dict[str, float] = {}
    for state, n in _map(ver.get("counts")).items():
        x = _num(n)
        if x is not None:
            counts[str(state)] = x
    for row in ver.get("rows") or []:
        if isinstance(row, Mapping) and row.get("state"):
            counts[str(row["state"])] = counts.get(str(row["state"]), 0.0) + 1
    if counts:
        g = GaugeMetricFamily("polltuned_last_verification_knobs", "managed knobs by verification result "
                              "(holds, admin-changed, kernel-reset, gone, ...)", labels=["state"])
        for state, x in sorted(counts.items()):
            g.add_metric([state], x)
        yield g


#: status counters field -> (metric name, help). Run-queue wait is left to node_exporter's schedstat
#: collector (node_schedstat_waiting_seconds_total): per-CPU series are most of a big host's scrape.
CPU_COLUMNS: dict[str, tuple[str, str]] = {
    "net_rx_per_s": ("polltuned_cpu_net_rx_softirqs_per_second", "NET_RX softirqs per second on each CPU"),
    "irqs_per_s": ("polltuned_cpu_nic_irqs_per_second", "the watched NIC's queue IRQs per second on each CPU"),
    "softirq": ("polltuned_cpu_softirq_ratio", "fraction of each CPU spent in softirq"),
    "system": ("polltuned_cpu_system_ratio", "fraction of each CPU spent in the kernel (busy polling included)"),
}


def _counters(doc: Mapping[str, Any]) -> Iterator[Metric]:
    cnt = _map(doc.get("counters"))
    cpus = [c for c in cnt.get("cpus") or [] if isinstance(c, Mapping) and c.get("cpu") is not None]
    if cpus:
        yield from _gauge("polltuned_counters_interval_seconds", "interval the per-CPU rates were computed over",
                          cnt.get("interval_s"))
        labels = [{"cpu": str(c["cpu"])} for c in cpus]
        for field, (name, help_) in CPU_COLUMNS.items():
            g = GaugeMetricFamily(name, help_, labels=["cpu"])
            # samples appended directly: add_metric's per-call label zip is most of a 256-CPU conversion
            g.samples.extend(Sample(name, lab, float(v)) for lab, c in zip(labels, cpus)
                             if isinstance(v := c.get(field), (int, float)) and not isinstance(v, bool)
                             and math.isfinite(v))
            yield g
    scope = _map(doc.get("cpu_scope"))
    if scope:
        yield InfoMetricFamily("polltuned_cpu_scope", "where the objective's CPU term is measured (cgroup of the "
                               "service, NIC-queue + app CPUs, or the whole host as a fallback)", value={
                                   "kind": str(scope.get("kind") or ""), "scope": str(scope.get("scope") or "")})
        yield from _gauge("polltuned_cpu_scope_cores", "CPU cores spent in the scope during the last window",
                          scope.get("last_cores"))


SECTIONS: tuple[Callable[[Mapping[str, Any]], Iterator[Metric]], ...] = (
    _state, _knobs, _result, _guard_hold, _verification, _counters)


def metrics_from_status(doc: Mapping[str, Any]) -> list[Metric]:
    """Pure: one status document -> metric families."""
    out: list[Metric] = []
    for section in SECTIONS:
        out.extend(m for m in section(doc) if m.samples)
    return out


class StatusCollector:
    """prometheus_client Collector over the last published status document.

    The document is converted at the first scrape after it was published and the result kept for
    the scrapes that follow until the next publish (several Prometheus servers, a dashboard's
    refresh); a document nobody scrapes is never converted."""

    def __init__(self) -> None:
        self._doc: Mapping[str, Any] | None = None
        self._converted: tuple[Mapping[str, Any], list[Metric]] | None = None

    def publish(self, doc: Mapping[str, Any]) -> None:
        self._doc = doc     # one reference swap: a scrape in another thread sees the old or the new doc

    def describe(self) -> list[Metric]:
        return []           # names vary with the document: nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        doc = self._doc
        if doc is None:
            return []
        memo = self._converted
        if memo is not None and memo[0] is doc:
            return memo[1]
        out = metrics_from_status(doc)
        self._converted = (doc, out)    # Metric objects are only read by the exposition
        return out


class ServerLike(Protocol):
    address: str
    port: int

    def close(self) -> None: ...


Serve = Callable[[CollectorRegistry, str, int], ServerLike]


def write_textfile(path: str, data: bytes) -> None:
    """Write ``path`` atomically for node_exporter's textfile collector: a temp file in the same directory
    (not ending in .prom, so the collector never reads it half-written), mode 0644, then rename(2)."""
    d, base = os.path.split(path)
    tmp = os.path.join(d, f".{base}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.fchmod(fd, 0o644)   # the daemon's UMask=0027 would hide it from node_exporter's user
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        raise


class MetricsExporter:
    """The HTTP listener and/or the textfile writer, fed by Service on every status publish."""

    def __init__(self, cfg: MetricsConfig, *, clock: Clock, serve: Serve | None = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.collector = StatusCollector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._serve = serve
        self.server: ServerLike | None = None
        self._textfile_error: str | None = None
        self._textfile_at: float | None = None      # monotonic time of the last textfile write
        self._textfile_pending = False

    @property
    def enabled(self) -> bool:
        return self.cfg.http_address is not None or self.cfg.textfile is not None

    def start(self) -> None:
        """Open the HTTP listener (when configured). A listener that cannot bind is logged, not fatal."""
        if self.cfg.http_address is None or self.server is not None:
            return

        serve = self._serve
        if serve is None:
            serve = serve_metrics
        try:
            self.server = serve(self.registry, self.cfg.http_address, self.cfg.http_port)
        except PolltunedError as e:
            log.error("metrics: HTTP listener disabled: %s", e.message)
            return
        log.info("metrics: serving http://%s/metrics", _hostport(self.server.address, self.server.port))

    def publish(self, doc: Mapping[str, Any]) -> None:
        """Swap in the new document; rewrite the textfile unless it was written less than
        ``textfile_min_interval_s`` ago (the last document is written at close())."""
        self.collector.publish(doc)
        if self.cfg.textfile is None:
            return
        now = self.clock.monotonic()
        if self._textfile_at is not None and now - self._textfile_at < self.cfg.textfile_min_interval_s:
            self._textfile_pending = True
            return
        self._textfile_at = now
        self._write_textfile()

    def _write_textfile(self) -> None:
        assert self.cfg.textfile is not None
        from prometheus_client.exposition import generate_latest

        self._textfile_pending = False
        try:
            write_textfile(self.cfg.textfile, generate_latest(self.registry))
        except OSError as e:
            msg = f"{self.cfg.textfile}: {e.strerror or e}"
            if msg != self._textfile_error:
                log.warning("metrics: cannot write the textfile %s", msg)
            self._textfile_error = msg
            return
        if self._textfile_error is not None:
            log.info("metrics: textfile %s written again", self.cfg.textfile)
            self._textfile_error = None

    def close(self) -> None:
        """Stop the listener; write the last document to the textfile if a publish was held back."""
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._textfile_pending and self.cfg.textfile is not None:
            self._write_textfile()


def _hostport(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def build_exporter(cfg: MetricsConfig, clock: Clock) -> MetricsExporter | None:
    """None when neither way out is configured (the default)."""
    ex = MetricsExporter(cfg, clock=clock)
    return ex if ex.enabled else None

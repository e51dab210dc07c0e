"""command probe: run the user's own benchmark each window and take the numbers it prints.

How users plug in their own workload (wrk, redis-benchmark, memtier_benchmark, ...). Each window
runs ``argv`` once (bounded by ``timeout_s``; inside ``netns`` and pinned to ``cpus`` when given)
and extracts statistics:

* ``regex``: named groups whose names are statistics (``(?P<p99>[\\d.]+)``); or, with
  ``statistic_map``, statistic -> group name. A regex with one unnamed group names one number.
* ``json_path``: the output is JSON; ``$.a.b[0].c`` names one number.
* ``statistic_map`` without regex/json_path: statistic -> JSON path (when the output is JSON).

Placeholders in ``argv``: ``{window_s}`` is the window length in seconds (``--duration {window_s}``),
``{window_s_int}`` the same rounded to whole seconds, at least 1 (for tools that take only whole
seconds: wrk ``-d {window_s_int}s``), ``{python}`` the interpreter running polltuned (for the
clients shipped with it, e.g. ``{python} -m polltuned.host.kvclient``), ``{rate}`` and
``{arrivals}`` the probe's open-loop ``rate`` (requests/s) and ``arrivals`` (see :func:`open_loop`).

``histogram_path`` names the encoded latency histogram in JSON output (polltuned.histogram, as the
shipped kvclient and httpclient print it): the window carries it, and its p50/p90/p99/p999/mean/max
come from it (windows then merge exactly; the objective reads its percentile from it).

Statistics named p50/p90/p99/p999/mean/max are latencies, reported in µs. A value may carry its
unit, as wrk prints them (``84.00us``, ``1.68ms``, ``2.01s``; also ``ns``, ``µs``, ``m``, ``h``):
it is converted; a bare number is multiplied by ``unit_scale_us``. ``throughput`` /
``throughput_pps`` fill Window.throughput_pps; other names go to Window.extra; those may carry a
metric suffix (``92.40k``, ``1.2M``, ``3G``).
One unnamed number (single group or plain json_path) is the workload's latency figure: it is reported
under every latency statistic, so any objective statistic scores that same number.
A non-zero exit, a timeout, unparsable output or no match is a failed window with the reason.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from polltuned.clock import Clock
from polltuned.errors import ProbeError
from polltuned.histogram import HistogramError, LatencyHistogram
from polltuned.host.exec import Runner
from polltuned.policy.schema import CommandProbe as CommandConfig
from polltuned.records import LATENCY_STATS, Window

log = logging.getLogger("polltuned.probes")

_PATH_TOKEN = re.compile(r"\.([A-Za-z_][\w-]*)|\[(\d+)\]|\[\"([^\"]+)\"\]|\['([^']+)'\]")

#: time units -> µs (wrk's format_time prints us, ms, s, m, h)
TIME_UNITS_US: dict[str, float] = {"ns": 1e-3, "us": 1.0, "µs": 1.0, "μs": 1.0, "ms": 1e3, "s": 1e6,
                                   "m": 60e6, "min": 60e6, "h": 3600e6}
#: metric suffixes of counts and rates (wrk's format_metric prints k, M, G)
METRIC_SUFFIXES: dict[str, float] = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}
_QUANTITY = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-zµμ]*)\s*$")


def json_path_get(doc: object, path: str) -> object:
    """Resolve a small JSONPath subset: ``$.a.b[0]["c d"]`` (the leading ``$`` is optional)."""
    p = path.strip()
    if p.startswith("$"):
        p = p[1:]
    if p and not p.startswith((".", "[")):
        p = "." + p
    pos = 0
    cur = doc
    while pos < len(p):
        m = _PATH_TOKEN.match(p, pos)
        if m is None:
            raise ProbeError(f"json path {path!r}: cannot parse at {p[pos:]!r}")
        pos = m.end()
        key = m.group(1) or m.group(3) or m.group(4)
        if key is not None:
            if not isinstance(cur, Mapping) or key not in cur:
                raise ProbeError(f"json path {path!r}: no key {key!r}")
            cur = cur[key]
        else:
            idx = int(m.group(2))
            if not isinstance(cur, list) or idx >= len(cur):
                raise ProbeError(f"json path {path!r}: no index [{idx}]")
            cur = cur[idx]
    return cur


def parse_quantity(v: object, what: str) -> tuple[float, str]:
    """Pure: a number, or a string holding a number and an optional unit (``"1.68ms"``, ``"92.40k"``).
    Returns (number, unit) with unit ``""`` when there is none."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ProbeError(f"{what}: not a number ({v!r})")
    if isinstance(v, str):
        m = _QUANTITY.match(v)
        if m is None:
            if v.strip().lower() in ("nan", "inf", "-inf", "+inf", "infinity"):
                raise ProbeError(f"{what}: not finite ({v!r})")
            raise ProbeError(f"{what}: not a number ({v!r})")
        f, unit = float(m.group(1)), m.group(2)
    else:
        f, unit = float(v), ""
    if not math.isfinite(f):
        raise ProbeError(f"{what}: not finite ({v!r})")
    return f, unit


def to_statistic(stat: str, v: object, unit_scale_us: float, what: str) -> float:
    """Pure: one printed value as the number polltuned stores for ``stat``: a latency in µs (its
    own unit converted, a bare number times ``unit_scale_us``); any other statistic with its metric
    suffix applied."""
    f, unit = parse_quantity(v, what)
    if stat in LATENCY_STATS or stat == _SINGLE:
        if not unit:
            return f * unit_scale_us
        if unit not in TIME_UNITS_US:
            raise ProbeError(f"{what}: unknown time unit {unit!r} (got {v!r}; one of "
                             f"{', '.join(TIME_UNITS_US)})")
        return f * TIME_UNITS_US[unit]
    if not unit:
        return f
    if unit not in METRIC_SUFFIXES:
        raise ProbeError(f"{what}: unknown suffix {unit!r} for {stat} (got {v!r}; one of "
                         f"{', '.join(METRIC_SUFFIXES)})")
    return f * METRIC_SUFFIXES[unit]


_SINGLE = "__single__"


def extract_statistics(cfg: CommandConfig, output: str) -> dict[str, float]:
    """Pure: the statistics ``cfg`` names in ``output`` (latencies in µs). Raises ProbeError when
    nothing matches."""
    raw: dict[str, tuple[object, str]] = {}
    if cfg.regex:
        m = re.search(cfg.regex, output, re.MULTILINE)
        if m is None:
            raise ProbeError(f"regex {cfg.regex!r} did not match the command output")
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        if cfg.statistic_map:
            for stat, group in cfg.statistic_map.items():
                if group not in groups:
                    raise ProbeError(f"regex group {group!r} (for {stat}) did not match")
                raw[stat] = (groups[group], f"regex group {group!r}")
        elif groups:
            raw = {k: (v, f"regex group {k!r}") for k, v in groups.items()}
        elif m.groups():
            raw[_SINGLE] = (m.group(1), "regex group 1")
        else:
            raise ProbeError(f"regex {cfg.regex!r} has no group to take a number from")
    else:
        try:
            doc: Any = json.loads(output)
        except json.JSONDecodeError as e:
            raise ProbeError(f"command output is not JSON ({e.msg} at line {e.lineno})") from e
        if cfg.statistic_map:
            for stat, path in cfg.statistic_map.items():
                raw[stat] = (json_path_get(doc, path), f"json path {path!r}")
        elif cfg.json_path:
            raw[_SINGLE] = (json_path_get(doc, cfg.json_path), f"json path {cfg.json_path!r}")
    return {k: to_statistic(k, v, cfg.unit_scale_us, what) for k, (v, what) in raw.items()}


def extract_histogram(cfg: CommandConfig, output: str) -> str | None:
    """Pure: the encoded histogram ``cfg.histogram_path`` names in ``output`` (validated: it must
    decode as a polltuned histogram), or None when the probe names none. Raises ProbeError."""
    if cfg.histogram_path is None:
        return None
    try:
        doc: Any = json.loads(output)
    except json.JSONDecodeError as e:
        raise ProbeError(f"command output is not JSON ({e.msg} at line {e.lineno})") from e
    text = json_path_get(doc, cfg.histogram_path)
    if not isinstance(text, str):
        raise ProbeError(f"json path {cfg.histogram_path!r}: not an encoded histogram (a string)")
    try:
        h = LatencyHistogram.decode(text)
    except HistogramError as e:
        raise ProbeError(f"json path {cfg.histogram_path!r}: {e}") from e
    if h.count == 0:
        raise ProbeError(f"json path {cfg.histogram_path!r}: the histogram is empty")
    return text


def statistics_to_window(stats: Mapping[str, float], duration_s: float, histogram: str | None = None) -> Window:
    """Pure: statistics from :func:`extract_statistics` as a Window; with ``histogram`` (encoded),
    the window carries it and its latency percentiles, mean and max are the histogram's."""
    latency: dict[str, float] = {}
    extra: dict[str, float] = {}
    throughput: float | None = None
    for k, v in stats.items():
        if k == _SINGLE:
            for s in LATENCY_STATS:
                latency[s] = v
        elif k in LATENCY_STATS:
            latency[k] = v
        elif k in ("throughput", "throughput_pps"):
            throughput = v
        else:
            extra[k] = v
    observations = 1
    if histogram is not None:
        h = LatencyHistogram.decode(histogram)
        hs = h.stats_us()
        latency.update({k: hs[k] for k in LATENCY_STATS})
        observations = h.count
    if not latency:
        raise ProbeError("the command output named no latency statistic (p50/p90/p99/p999/mean/max)")
    return Window(ok=True, latency=latency, throughput_pps=throughput, duration_s=duration_s,
                  observations=observations, extra=extra, histogram=histogram)


def _fmt_seconds(s: float) -> str:
    return str(round(s)) if abs(s - round(s)) < 1e-9 else f"{s:g}"


def expand_argv(argv: Sequence[str], *, window_s: float, python: str, rate: float | None = None,
                arrivals: str = "poisson") -> list[str]:
    """Pure: ``argv`` with ``{window_s}``, ``{window_s_int}``, ``{python}``, ``{rate}`` and
    ``{arrivals}`` replaced (other braces left alone; ``{rate}`` only when a rate is given)."""
    whole = str(max(1, round(window_s)))
    out = [a.replace("{window_s_int}", whole).replace("{window_s}", _fmt_seconds(window_s)).replace("{python}", python)
           .replace("{arrivals}", arrivals) for a in argv]
    if rate is not None:
        out = [a.replace("{rate}", _fmt_seconds(rate)) for a in out]
    return out


def open_loop(cfg: CommandConfig, rate: float, arrivals: str = "poisson") -> CommandConfig:
    """``cfg`` sending open-loop at ``rate`` requests/s: its ``rate``/``arrivals`` set, and
    ``--rate {rate} --arrivals {arrivals}`` appended to argv when it has no ``{rate}`` yet (the
    shipped kvclient/httpclient take these flags; then a JSON statistic_map also reads their
    ``behind_schedule`` and ``send_lag_us.p99`` into Window.extra). Validated like a policy's probe."""
    argv = list(cfg.argv)
    added = not any("{rate}" in a for a in argv)
    if added:
        argv += ["--rate", "{rate}", "--arrivals", "{arrivals}"]
    smap = dict(cfg.statistic_map)
    if added and smap and not cfg.regex:
        # the shipped clients' open-loop health, in Window.extra: requests sent > 1 ms late (the
        # client could not keep the schedule: its latencies then include its own backlog)
        smap.setdefault("behind_schedule", "$.behind_schedule")
        smap.setdefault("send_lag_p99_us", "$.send_lag_us.p99")
    return CommandConfig.model_validate({**cfg.model_dump(), "argv": argv, "rate": rate, "arrivals": arrivals,
                                         "statistic_map": smap})


class CommandProbe:
    name = "command"

    def __init__(self, cfg: CommandConfig, runner: Runner, *, clock: Clock, python: str | None = None) -> None:
        self.cfg = cfg
        self._runner = runner
        self._clock = clock
        self._python = python or sys.executable

    def start(self) -> None:
        pass

    def restart(self) -> None:
        """Each window runs a fresh process: nothing to restart."""

    def close(self) -> None:
        pass

    def argv(self, duration_s: float) -> list[str]:
        return expand_argv(self.cfg.argv, window_s=duration_s, python=self._python, rate=self.cfg.rate,
                           arrivals=self.cfg.arrivals)

    def measure(self, duration_s: float, window_index: int) -> Window:
        t0 = self._clock.monotonic()
        argv = self.argv(duration_s)
        res = self._runner.run(argv, timeout_s=self.cfg.timeout_s, netns=self.cfg.netns,
                               cpus=self.cfg.cpus or None)
        elapsed = res.duration_s
        try:
            if res.timed_out:
                raise ProbeError(f"{argv[0]} timed out after {self.cfg.timeout_s:g} s")
            if res.returncode != 0:
                raise ProbeError(f"{res.describe()}")
            stats = extract_statistics(self.cfg, res.stdout)
            return statistics_to_window(stats, elapsed, extract_histogram(self.cfg, res.stdout))
        except ProbeError as e:
            log.warning("probe command window %d failed: %s", window_index, e.message)
            return Window.failed(e.message, duration_s=max(elapsed, self._clock.monotonic() - t0))

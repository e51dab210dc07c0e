"""command probe: run the user's own benchmark each window and take the numbers it prints.

How users plug in their own workload (redis-benchmark, memtier_benchmark, wrk, ...). Each window runs
``argv`` once (bounded by ``timeout_s``) and extracts statistics:

* ``regex``: named groups whose names are statistics (``(?P<p99>[\\d.]+)``); or, with
  ``statistic_map``, statistic -> group name. A regex with one unnamed group names one number.
* ``json_path``: the output is JSON; ``$.a.b[0].c`` names one number.
* ``statistic_map`` without regex/json_path: statistic -> JSON path (when the output is JSON).

Statistics named p50/p90/p99/p999/mean/max are latencies (multiplied by ``unit_scale_us`` to get µs);
``throughput`` / ``throughput_pps`` fill Window.throughput_pps; other names go to Window.extra.
One unnamed number (single group or plain json_path) is the workload's latency figure: it is reported
under every latency statistic, so any objective statistic scores that same number.
A non-zero exit, a timeout, unparsable output or no match is a failed window with the reason.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping
from typing import Any

from polltuned.clock import Clock
from polltuned.errors import ProbeError
from polltuned.host.exec import Runner
from polltuned.policy.schema import CommandProbe as CommandConfig
from polltuned.records import LATENCY_STATS, Window

log = logging.getLogger("polltuned.probes")

_PATH_TOKEN = re.compile(r"\.([A-Za-z_][\w-]*)|\[(\d+)\]|\[\"([^\"]+)\"\]|\['([^']+)'\]")


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


def _num(v: object, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ProbeError(f"{what}: not a number ({v!r})")
    try:
        f = float(v)
    except ValueError as e:
        raise ProbeError(f"{what}: not a number ({v!r})") from e
    if not math.isfinite(f):
        raise ProbeError(f"{what}: not finite ({v!r})")
    return f


_SINGLE = "__single__"


def extract_statistics(cfg: CommandConfig, output: str) -> dict[str, float]:
    """Pure: the statistics ``cfg`` names in ``output``. Raises ProbeError when nothing matches."""
    out: dict[str, float] = {}
    if cfg.regex:
        m = re.search(cfg.regex, output, re.MULTILINE)
        if m is None:
            raise ProbeError(f"regex {cfg.regex!r} did not match the command output")
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        if cfg.statistic_map:
            for stat, group in cfg.statistic_map.items():
                if group not in groups:
                    raise ProbeError(f"regex group {group!r} (for {stat}) did not match")
                out[stat] = _num(groups[group], f"regex group {group!r}")
        elif groups:
            out = {k: _num(v, f"regex group {k!r}") for k, v in groups.items()}
        elif m.groups():
            out[_SINGLE] = _num(m.group(1), "regex group 1")
        else:
            raise ProbeError(f"regex {cfg.regex!r} has no group to take a number from")
        return out
    try:
        doc: Any = json.loads(output)
    except json.JSONDecodeError as e:
        raise ProbeError(f"command output is not JSON ({e.msg} at line {e.lineno})") from e
    if cfg.statistic_map:
        for stat, path in cfg.statistic_map.items():
            out[stat] = _num(json_path_get(doc, path), f"json path {path!r}")
    elif cfg.json_path:
        out[_SINGLE] = _num(json_path_get(doc, cfg.json_path), f"json path {cfg.json_path!r}")
    return out


def statistics_to_window(stats: Mapping[str, float], unit_scale_us: float, duration_s: float) -> Window:
    latency: dict[str, float] = {}
    extra: dict[str, float] = {}
    throughput: float | None = None
    for k, v in stats.items():
        if k == _SINGLE:
            for s in LATENCY_STATS:
                latency[s] = v * unit_scale_us
        elif k in LATENCY_STATS:
            latency[k] = v * unit_scale_us
        elif k in ("throughput", "throughput_pps"):
            throughput = v
        else:
            extra[k] = v
    if not latency:
        raise ProbeError("the command output named no latency statistic (p50/p90/p99/p999/mean/max)")
    return Window(ok=True, latency=latency, throughput_pps=throughput, duration_s=duration_s,
                  observations=1, extra=extra)


class CommandProbe:
    name = "command"

    def __init__(self, cfg: CommandConfig, runner: Runner, *, clock: Clock) -> None:
        self.cfg = cfg
        self._runner = runner
        self._clock = clock

    def start(self) -> None:
        pass

    def restart(self) -> None:
        """Each window runs a fresh process: nothing to restart."""

    def close(self) -> None:
        pass

    def measure(self, duration_s: float, window_index: int) -> Window:
        t0 = self._clock.monotonic()
        res = self._runner.run(self.cfg.argv, timeout_s=self.cfg.timeout_s)
        elapsed = res.duration_s
        try:
            if res.timed_out:
                raise ProbeError(f"{self.cfg.argv[0]} timed out after {self.cfg.timeout_s:g} s")
            if res.returncode != 0:
                raise ProbeError(f"{res.describe()}")
            stats = extract_statistics(self.cfg, res.stdout)
            return statistics_to_window(stats, self.cfg.unit_scale_us, elapsed)
        except ProbeError as e:
            log.warning("probe command window %d failed: %s", window_index, e.message)
            return Window.failed(e.message, duration_s=max(elapsed, self._clock.monotonic() - t0))

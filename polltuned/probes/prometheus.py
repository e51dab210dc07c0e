"""prometheus probe: latency quantiles of an application's own histogram, over one window.

The endpoint is scraped at the start and at the end of the window; the cumulative bucket counts of
the histogram ``metric`` (series matching ``labels``, summed per ``le`` like
``sum by (le) (rate(metric_bucket[w]))``) are differenced, and quantiles are interpolated linearly
inside the bucket that holds the rank, as PromQL's ``histogram_quantile`` does. A counter that went
down (application restart) makes the window fail: the difference would be meaningless.

Only the configured URL is fetched (urllib); tests serve it from http.server on 127.0.0.1.
"""

from __future__ import annotations

import logging
import math
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from polltuned.clock import Clock
from polltuned.errors import ProbeError
from polltuned.policy.schema import PrometheusProbe as PrometheusConfig
from polltuned.records import Window

log = logging.getLogger("polltuned.probes")

Fetch = Callable[[str, float], str]


def http_fetch(url: str, timeout_s: float) -> str:
    """GET ``url`` and return the body as text. Errors become ProbeError."""
    if not url.startswith(("http://", "https://")):
        raise ProbeError(f"prometheus url must be http:// or https:// (got {url!r})")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body: bytes = resp.read()
            return body.decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise ProbeError(f"cannot scrape {url}: {e}") from e


@dataclass(frozen=True)
class HistogramSnapshot:
    """Cumulative bucket counts (upper bound -> count, +Inf included), sum and count."""

    buckets: tuple[tuple[float, float], ...]
    total: float
    sum: float


def parse_histogram(text: str, metric: str, labels: Mapping[str, str]) -> HistogramSnapshot:
    """Pure: the histogram ``metric`` in Prometheus text exposition format, summed over matching series."""
    from prometheus_client.parser import text_string_to_metric_families

    by_le: dict[float, float] = {}
    total = 0.0
    s = 0.0
    found = False
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise ProbeError(f"cannot parse the metrics page: {e}") from e
    for fam in families:
        if fam.name != metric:
            continue
        for sample in fam.samples:
            if any(sample.labels.get(k) != v for k, v in labels.items()):
                continue
            if sample.name == metric + "_bucket":
                le = float(sample.labels["le"])
                by_le[le] = by_le.get(le, 0.0) + float(sample.value)
                found = True
            elif sample.name == metric + "_count":
                total += float(sample.value)
            elif sample.name == metric + "_sum":
                s += float(sample.value)
    if not found:
        sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
        raise ProbeError(f"no histogram {metric}{{{sel}}} with buckets on the metrics page")
    if math.inf not in by_le:
        raise ProbeError(f"histogram {metric} has no +Inf bucket")
    if total == 0.0:
        total = by_le[math.inf]
    return HistogramSnapshot(tuple(sorted(by_le.items())), total, s)


def diff_histograms(a: HistogramSnapshot, b: HistogramSnapshot) -> HistogramSnapshot:
    """b - a; raises ProbeError on a counter reset (any count going down) or changed buckets."""
    if [le for le, _ in a.buckets] != [le for le, _ in b.buckets]:
        raise ProbeError("histogram bucket boundaries changed during the window")
    out = []
    for (le, ca), (_, cb) in zip(a.buckets, b.buckets):
        if cb < ca:
            raise ProbeError(f"counter reset: bucket le={le:g} went from {ca:g} to {cb:g}")
        out.append((le, cb - ca))
    if b.total < a.total:
        raise ProbeError(f"counter reset: _count went from {a.total:g} to {b.total:g}")
    return HistogramSnapshot(tuple(out), b.total - a.total, b.sum - a.sum)


def histogram_quantile(q: float, buckets: tuple[tuple[float, float], ...]) -> float:
    """PromQL's histogram_quantile over cumulative ``buckets`` (sorted, +Inf last)."""
    if not buckets or buckets[-1][0] != math.inf:
        raise ValueError("buckets must end with +Inf")
    total = buckets[-1][1]
    if total <= 0:
        return math.nan
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for i, (le, c) in enumerate(buckets):
        if c >= rank:
            if le == math.inf:
                # the rank falls in the open bucket: the best answer is the last finite bound
                return buckets[i - 1][0] if i > 0 else math.nan
            lo = prev_le if i > 0 or le > 0 else 0.0
            if i == 0 and le <= 0:
                return le
            span = c - prev_c
            return lo + (le - lo) * ((rank - prev_c) / span if span > 0 else 1.0)
        prev_le, prev_c = le, c
    return buckets[-2][0] if len(buckets) > 1 else math.nan


class PrometheusProbe:
    name = "prometheus"

    def __init__(self, cfg: PrometheusConfig, *, clock: Clock, fetch: Fetch = http_fetch) -> None:
        self.cfg = cfg
        self._clock = clock
        self._fetch = fetch

    def start(self) -> None:
        pass

    def restart(self) -> None:
        """The application owns its sockets; nothing to restart here."""

    def close(self) -> None:
        pass

    def _scrape(self) -> HistogramSnapshot:
        return parse_histogram(self._fetch(self.cfg.url, self.cfg.timeout_s), self.cfg.metric, self.cfg.labels)

    def measure(self, duration_s: float, window_index: int) -> Window:
        t0 = self._clock.monotonic()
        try:
            a = self._scrape()
            self._clock.sleep(duration_s)
            b = self._scrape()
            d = diff_histograms(a, b)
            elapsed = self._clock.monotonic() - t0
            if d.total <= 0:
                raise ProbeError(f"no observations of {self.cfg.metric} during the window")
            scale = self.cfg.unit_scale_us
            lat = {name: histogram_quantile(q, d.buckets) * scale
                   for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999))}
            lat = {k: v for k, v in lat.items() if math.isfinite(v)}
            if not lat:
                raise ProbeError(f"{self.cfg.metric}: every observation fell in the +Inf bucket")
            lat["mean"] = d.sum / d.total * scale
            return Window(ok=True, latency=lat, observations=round(d.total), duration_s=elapsed,
                          throughput_pps=d.total / elapsed if elapsed > 0 else None)
        except ProbeError as e:
            log.warning("probe prometheus window %d failed: %s", window_index, e.message)
            return Window.failed(e.message, duration_s=self._clock.monotonic() - t0)

"""polltuned.histogram: HdrHistogram in its standard compressed encoding, merged by adding."""

from __future__ import annotations

import math
import random

import pytest

from polltuned.histogram import (
    HIGHEST_NS,
    RESOLUTION,
    HistogramError,
    LatencyHistogram,
    merge,
    statistic_us,
)


def nearest_rank_us(values_ns: list[int], q: float) -> float:
    xs = sorted(values_ns)
    return xs[max(1, math.ceil(q / 100 * len(xs) - 1e-9)) - 1] / 1e3


def _windows(seed: int) -> list[list[int]]:
    """Windows unlike each other (a slow tail in a few of them), as an arm's rounds are."""
    rng = random.Random(seed)
    out = []
    for w in range(12):
        mu = 10.5 + 0.3 * (w % 3)
        vals = [int(rng.lognormvariate(mu, 0.5)) for _ in range(rng.randint(500, 3000))]
        if w % 5 == 0:
            vals += [int(rng.uniform(2e6, 5e6)) for _ in range(40)]  # a stall: 2-5 ms
        out.append(vals)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_merged_p99_equals_the_p99_of_all_requests_within_resolution(seed: int) -> None:
    windows = _windows(seed)
    encoded = [LatencyHistogram.of_ns(w).encode() for w in windows]
    merged = merge(encoded)
    everything = [v for w in windows for v in w]
    assert merged.count == len(everything)
    for q in (50.0, 90.0, 99.0, 99.9):
        exact = nearest_rank_us(everything, q)
        got = merged.percentile_us(q)
        assert exact <= got <= exact * (1 + RESOLUTION) + 1e-3, (q, exact, got)
    # the mean of per-window p99s (what comparing windows' own p99s amounts to) is not that number
    per_window = [nearest_rank_us(w, 99.0) for w in windows]
    p99 = merged.percentile_us(99.0)
    assert abs(sum(per_window) / len(per_window) - p99) > 50 * RESOLUTION * p99


def test_merge_is_exact_and_order_free() -> None:
    windows = _windows(9)
    a = merge(LatencyHistogram.of_ns(w).encode() for w in windows)
    b = merge(LatencyHistogram.of_ns(w).encode() for w in reversed(windows))
    one = LatencyHistogram.of_ns([v for w in windows for v in w])
    assert a.encode() == b.encode() == one.encode()
    assert a.stats_us() == one.stats_us()


def test_stats_and_encoding_round_trip() -> None:
    h = LatencyHistogram.of_ns([10_000, 20_000, 30_000, 1_000_000])
    s = h.stats_us()
    assert s["min"] == pytest.approx(10.0, rel=RESOLUTION) and s["max"] == pytest.approx(1000.0, rel=RESOLUTION)
    assert s["p50"] == pytest.approx(20.0, rel=RESOLUTION) and s["p99"] == pytest.approx(1000.0, rel=RESOLUTION)
    assert s["mean"] == pytest.approx(265.0, rel=RESOLUTION)
    text = h.encode()
    assert text.startswith("HISTF") and len(text) < 200
    assert LatencyHistogram.decode(text).stats_us() == s
    assert statistic_us(text, "p99") == s["p99"] and statistic_us(text, "mean") == s["mean"]
    assert statistic_us(text, "throughput") is None
    assert statistic_us(LatencyHistogram().encode(), "p99") is None


def test_out_of_range_values_are_clamped_and_counted() -> None:
    h = LatencyHistogram()
    h.record_ns(0)
    h.record_ns(HIGHEST_NS * 10)
    assert h.count == 2 and h.clamped == 1
    assert h.percentile_us(100) == pytest.approx(HIGHEST_NS / 1e3, rel=RESOLUTION)


def test_garbage_and_foreign_parameters_are_refused() -> None:
    for bad in ("", "not base64 at all", "HISTFAAAAAAAAAAAAAA"):
        with pytest.raises(HistogramError):
            LatencyHistogram.decode(bad)
    from hdrh.histogram import HdrHistogram

    foreign = HdrHistogram(1, 1_000_000, 2)
    foreign.record_value(5)
    with pytest.raises(HistogramError, match="parameters"):
        LatencyHistogram.decode(foreign.encode().decode())
    with pytest.raises(HistogramError, match="empty"):
        LatencyHistogram().percentile_us(50)


def test_window_histogram_json_round_trip() -> None:
    from polltuned.records import Window

    text = LatencyHistogram.of_ns([5_000, 7_000]).encode()
    w = Window(ok=True, latency={"p99": 7.0}, histogram=text)
    js = w.to_json()
    assert js["histogram"] == text and Window.from_json(js) == w
    old = Window(ok=True, latency={"p99": 7.0}).to_json()
    assert "histogram" not in old and Window.from_json(old).histogram is None  # older records read as before

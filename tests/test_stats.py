"""polltuned.stats: the one percentile convention, the log-scale mean and Welch's test on log J."""

from __future__ import annotations

import math

import pytest

from polltuned.stats import mean_log, percentile, welch_log


def test_percentile_is_nearest_rank() -> None:
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(xs, 0.0) == 1.0 and percentile(xs, 1.0) == 5.0
    assert percentile(xs, 0.5) == 3.0            # rank ceil(2.5) = 3
    assert percentile(xs, 0.4) == 2.0            # rank ceil(2.0) = 2: an observed value, not 2.5
    assert percentile(list(range(1, 101)), 0.99) == 99
    assert percentile([1.0, math.inf], 0.9) == math.inf
    assert math.isnan(percentile([], 0.5))
    with pytest.raises(ValueError):
        percentile(xs, 1.5)


def test_mean_log_is_log_of_geometric_mean() -> None:
    assert mean_log([2.0, 8.0]) == pytest.approx(math.log(4.0))


def test_welch_log_detects_a_lower_candidate() -> None:
    a = [100.0, 102.0, 98.0, 101.0, 99.0]
    b = [80.0, 82.0, 79.0, 81.0, 80.0]
    d, p, d_high, d_low = welch_log(a, b, 0.05)
    assert d < 0 and p < 0.001 and d_low < d < d_high < 0
    d2, p2, _, _ = welch_log(b, a, 0.05)
    assert d2 == pytest.approx(-d) and p2 > 0.999


def test_student_t_is_scipys_without_scipy() -> None:
    """The daemon's t-test runs without scipy (issue 14: ~70 MB); the pure t matches scipy.stats.t."""
    from scipy.stats import t as student_t

    from polltuned.stats import t_cdf, t_ppf

    for dof in (0.7, 1.0, 2.37, 3.0, 4.9, 12.3, 30.0, 1000.0):
        for x in (-40.0, -3.2, -1.0, -1e-3, 0.0, 0.5, 1.7, 4.0, 200.0):
            assert t_cdf(x, dof) == pytest.approx(float(student_t.cdf(x, dof)), rel=1e-9, abs=1e-300)
        for p in (1e-6, 0.025, 0.05, 0.3, 0.5, 0.9, 0.95, 0.975, 1 - 1e-6):
            assert t_ppf(p, dof) == pytest.approx(float(student_t.ppf(p, dof)), rel=1e-9, abs=1e-12)
    assert t_ppf(0.0, 3.0) == -math.inf and t_ppf(1.0, 3.0) == math.inf and math.isnan(t_cdf(1.0, 0.0))

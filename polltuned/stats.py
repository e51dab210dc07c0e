"""The one statistics module: log-scale means and CIs, t-tests, paired ratios, percentiles (pure).

Used by the bench's comparison (polltuned.bench.comparison), the confirmation test
(polltuned.safety), the engine (polltuned.engine.core) and benchmarks/.

Conventions, once:

* **Positive quantities vary multiplicatively** (a disturbed window doubles p99, it does not add
  20 µs), so their centre is the geometric mean and their CI is the Student-t interval of
  mean(log x) mapped back with exp: both bounds are > 0 (:func:`geo_mean`, :func:`log_ci`).
  Non-positive and non-finite values are left out of those two.
* **Paired ratios** (arm vs base measured in the same round) are exp(mean of per-round log ratios)
  with the t interval of those differences (:func:`paired_log_ratios`, :func:`ratio_ci`).
* **Percentiles are nearest-rank**: the q-quantile of n sorted values is the value at rank
  ceil(q * n) (1-based), i.e. always an observed value, never interpolated; q = 0 gives the
  minimum, q = 1 the maximum. Infinities are kept (a run that never reached its target is inf).
  This is the convention of the shipped key-value client (polltuned.host.kvclient) and of
  HdrHistogram's value-at-percentile. The median of a sample is :func:`statistics.median`
  (the mean of the two middle values for even n) wherever the code says "median".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank q-quantile (0 <= q <= 1) of ``xs``; nan when empty. See the module docstring."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1] (got {q})")
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def mean_log(xs: Sequence[float]) -> float:
    """Mean of log x over positive values (the log of the geometric mean); raises on an empty input."""
    return sum(math.log(x) for x in xs) / len(xs)


def t_quantile(level: float, dof: int) -> float:
    """The two-sided Student-t quantile for a ``level`` interval with ``dof`` degrees of freedom."""
    from scipy import stats  # scipy is slow to import; only the intervals need it

    return float(stats.t.ppf(0.5 + level / 2, dof))


def mean_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Student-t confidence interval of the mean (nan for fewer than 2 samples). Can go below zero:
    use :func:`log_ci` for positive quantities."""
    if len(xs) < 2:
        return (math.nan, math.nan)
    m = statistics.fmean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs))
    h = t_quantile(level, len(xs) - 1) * se
    return (m - h, m + h)


def geo_mean(xs: Sequence[float]) -> float:
    """Geometric mean of the positive finite values (nan when there is none)."""
    pos = [x for x in xs if math.isfinite(x) and x > 0]
    return math.exp(statistics.fmean(math.log(x) for x in pos)) if pos else math.nan


def log_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Pure: CI of the geometric mean of positive values: exp of the t interval of mean(log x).
    Both bounds are > 0 whenever defined; nan for fewer than 2 positive finite values."""
    logs = [math.log(x) for x in xs if math.isfinite(x) and x > 0]
    lo, hi = mean_ci(logs, level)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return (math.nan, math.nan)
    return (math.exp(lo), math.exp(hi))


def nonneg_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """CI for a quantity that cannot be negative but may be 0 (CPU cores): on the log scale when
    every value is positive, else the t interval clipped at 0."""
    if xs and all(math.isfinite(x) and x > 0 for x in xs):
        return log_ci(xs, level)
    lo, hi = mean_ci(xs, level)
    return (max(0.0, lo), hi) if math.isfinite(lo) else (lo, hi)


def rel_halfwidth(ci: tuple[float, float], center: float) -> float:
    """Half the CI's width relative to ``center`` (inf when undefined)."""
    lo, hi = ci
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(center)) or center <= 0:
        return math.inf
    return (hi - lo) / 2 / center


def paired_log_ratios(arm: Sequence[float | None], base: Sequence[float | None]) -> list[float]:
    """Pure: per round, log(J_arm / J_base) where both windows of the round scored (> 0)."""
    out: list[float] = []
    for a, b in zip(arm, base):
        if a is not None and b is not None and a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b):
            out.append(math.log(a / b))
    return out


def ratio_ci(log_ratios: Sequence[float], level: float = 0.95) -> tuple[float, tuple[float, float]]:
    """Pure: the paired ratio exp(mean log ratio) and its CI exp(t interval); nan when empty."""
    if not log_ratios:
        return math.nan, (math.nan, math.nan)
    r = math.exp(statistics.fmean(log_ratios))
    if len(log_ratios) >= 2 and statistics.stdev(log_ratios) == 0:
        return r, (r, r)
    lo, hi = mean_ci(log_ratios, level)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return r, (math.nan, math.nan)
    return r, (math.exp(lo), math.exp(hi))


def welch_log(a: Sequence[float], b: Sequence[float], alpha: float) -> tuple[float, float, float, float]:
    """One-sided Welch t-test of H1: mean(log b) < mean(log a) (each needs >= 2 positive values).

    Returns (d, p, d_high, d_low) with d = mean log b - mean log a and the (1 - alpha) one-sided
    upper bound d_high (and the symmetric lower bound d_low).
    """
    from scipy.stats import t as student_t

    la = [math.log(x) for x in a]
    lb = [math.log(x) for x in b]
    na, nb = len(la), len(lb)
    ma, mb = sum(la) / na, sum(lb) / nb
    va = sum((x - ma) ** 2 for x in la) / (na - 1)
    vb = sum((x - mb) ** 2 for x in lb) / (nb - 1)
    se2 = va / na + vb / nb
    d = mb - ma
    if se2 <= 0:
        # identical windows: no evidence of spread; decide on the sign alone but call it unproven
        return d, (0.0 if d < 0 else 1.0), d, d
    se = math.sqrt(se2)
    df = se2 ** 2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1)) if va + vb > 0 else na + nb - 2
    tstat = d / se
    p = float(student_t.cdf(tstat, df))
    q = float(student_t.ppf(1 - alpha, df))
    return d, p, d + q * se, d - q * se

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
    return t_ppf(0.5 + level / 2, dof)


# ---------------------------------------------------------------------------- Student's t, pure
# The daemon decides with these (polltuned.safety); scipy.stats would cost it ~70 MB resident
# (issue 14). Both agree with scipy.stats.t to ~1e-13 (tests/test_stats.py).

def _beta_cf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (DLMF 8.17.22),
    evaluated with the modified Lentz method; converges fast for x < (a + 1) / (a + b + 2)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        for num in (m * (b - m) * x / ((a + 2 * m - 1.0) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1.0))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return h


def _beta_reg(a: float, b: float, x: float, y: float) -> float:
    """I_x(a, b), the regularised incomplete beta function, with ``y`` = 1 - x given exactly."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    front = math.exp(a * math.log(x) + b * math.log(y) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, y) / b


def _t_tail(t: float, dof: float) -> float:
    """P(T > |t|) for Student's t with ``dof`` (> 0, fractional allowed) degrees of freedom."""
    t2 = t * t
    return 0.5 * _beta_reg(dof / 2.0, 0.5, dof / (dof + t2), t2 / (dof + t2))


def t_cdf(t: float, dof: float) -> float:
    """Pure: the Student-t distribution function P(T <= t) (scipy.stats.t.cdf)."""
    if math.isnan(t) or not dof > 0:
        return math.nan
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = _t_tail(t, dof)
    return tail if t < 0 else 1.0 - tail


def t_ppf(p: float, dof: float) -> float:
    """Pure: the Student-t quantile, the t with P(T <= t) = p (scipy.stats.t.ppf), found by
    bisection on the tail probability (to the last few bits)."""
    if not (0.0 <= p <= 1.0) or not dof > 0:
        return math.nan
    if p == 0.5:
        return 0.0
    if p in (0.0, 1.0):
        return -math.inf if p == 0.0 else math.inf
    q = min(p, 1.0 - p)          # the tail to hit; the sign comes from p
    lo, hi = 0.0, 1.0
    while _t_tail(hi, dof) > q:
        lo, hi = hi, hi * 2.0
        if hi > 1e300:
            break
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if _t_tail(mid, dof) > q:
            lo = mid
        else:
            hi = mid
    t = 0.5 * (lo + hi)
    return t if p > 0.5 else -t


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
    p = t_cdf(tstat, df)
    q = t_ppf(1 - alpha, df)
    return d, p, d + q * se, d - q * se

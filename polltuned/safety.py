"""Guard-rail decisions and the confirmation statistics (pure functions, no I/O).

Guard: a trial's first window is compared with the baseline; if it is worse by more than the
policy's ``guard.max_regression`` (J_trial > J_base * (1 + max_regression)) or breaks a constraint,
the trial is aborted early and the tuner rolls back to the best known assignment.

Confirmation: the best candidate (B) and the baseline (A) are re-measured interleaved
(A B A B ...; see optimisation.md §3.2-3.3: interleaving keeps Welch's false-positive rate at
1-7 % under drift, sequential designs reach 27-54 %). The test is Welch's t-test on log J per
window, one-sided (B better). The candidate is deployed only when

  * p < alpha (the gain is significant), and
  * the point estimate of the relative gain 1 - exp(mean log B - mean log A) >= min_effect.

Otherwise the baseline stays and the verdict says why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from polltuned.objective import Score
from polltuned.stats import welch_log


@dataclass(frozen=True)
class GuardDecision:
    abort: bool
    reason: str = ""


def guard_check(s: Score, baseline_value: float, max_regression: float) -> GuardDecision:
    """Decide on a trial's first window. A failed window aborts too (nothing to compare)."""
    if not s.ok:
        return GuardDecision(True, "; ".join(s.reasons) or "window failed")
    if not s.feasible:
        return GuardDecision(True, "constraint broken: " + "; ".join(s.reasons))
    limit = baseline_value * (1.0 + max_regression)
    if s.value > limit:
        return GuardDecision(
            True,
            f"objective {s.value:.4g} is {s.value / baseline_value - 1:+.0%} vs baseline {baseline_value:.4g} "
            f"(limit +{max_regression:.0%})",
        )
    return GuardDecision(False)


@dataclass(frozen=True)
class Verdict:
    baseline_samples: tuple[float, ...]
    candidate_samples: tuple[float, ...]
    gain: float                 # relative improvement of the candidate (0.2 = 20 % lower J)
    ci_low: float               # one-sided (1 - alpha) lower confidence bound on the gain
    ci_high: float              # matching upper bound (two-sided 1 - 2*alpha interval)
    p_value: float
    significant: bool
    deploy: bool
    reason: str

    def to_json(self) -> dict[str, object]:
        def f(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "baseline_samples": list(self.baseline_samples),
            "candidate_samples": list(self.candidate_samples),
            "gain": f(self.gain),
            "ci_low": f(self.ci_low),
            "ci_high": f(self.ci_high),
            "p_value": f(self.p_value),
            "significant": self.significant,
            "deploy": self.deploy,
            "reason": self.reason,
        }


def confirm_verdict(baseline: Sequence[float], candidate: Sequence[float], *, alpha: float,
                    min_effect: float) -> Verdict:
    a = [x for x in baseline if math.isfinite(x) and x > 0]
    b = [x for x in candidate if math.isfinite(x) and x > 0]
    if len(a) < 2 or len(b) < 2:
        return Verdict(tuple(a), tuple(b), math.nan, math.nan, math.nan, math.nan, False, False,
                       f"not enough usable windows ({len(a)} baseline, {len(b)} candidate; need 2 each)")
    d, p, d_high, d_low = welch_log(a, b, alpha)
    gain = 1.0 - math.exp(d)
    ci_low = 1.0 - math.exp(d_high)
    ci_high = 1.0 - math.exp(d_low)
    significant = p < alpha
    if not significant:
        reason = f"gain {gain:+.1%} not significant (p={p:.3f} >= alpha={alpha:g})"
        deploy = False
    elif gain < min_effect:
        reason = f"gain {gain:+.1%} is significant (p={p:.3f}) but below min_effect {min_effect:.0%}"
        deploy = False
    else:
        reason = f"gain {gain:+.1%} (lower bound {ci_low:+.1%}) significant at p={p:.3f}"
        deploy = True
    return Verdict(tuple(a), tuple(b), gain, ci_low, ci_high, p, significant, deploy, reason)

"""Guard decisions and the confirmation statistics."""

from __future__ import annotations

import numpy as np

from polltuned.objective import Score
from polltuned.safety import confirm_verdict, guard_check


def test_guard_aborts_beyond_the_limit_only() -> None:
    assert not guard_check(Score(ok=True, value=140.0), 100.0, 0.5).abort
    d = guard_check(Score(ok=True, value=160.0), 100.0, 0.5)
    assert d.abort and "+60%" in d.reason


def test_guard_aborts_on_constraint_and_failure() -> None:
    assert guard_check(Score(ok=True, value=50.0, feasible=False, reasons=("cpu",)), 100.0, 0.5).abort
    assert guard_check(Score(ok=False, reasons=("gap",)), 100.0, 0.5).abort


def _samples(rng: np.random.Generator, mean: float, n: int, cv: float = 0.08) -> list[float]:
    return [mean * float(np.exp(rng.normal(0, cv))) for _ in range(n)]


def test_clear_gain_is_deployed() -> None:
    rng = np.random.default_rng(1)
    v = confirm_verdict(_samples(rng, 100, 6), _samples(rng, 70, 6), alpha=0.05, min_effect=0.05)
    assert v.significant and v.deploy
    assert 0.2 < v.gain < 0.4 and v.ci_low > 0 and v.p_value < 0.01
    assert len(v.baseline_samples) == 6 and len(v.candidate_samples) == 6


def test_no_gain_is_not_deployed_and_false_positive_rate_is_bounded() -> None:
    rng = np.random.default_rng(2)
    deployed = 0
    for _ in range(400):
        v = confirm_verdict(_samples(rng, 100, 6), _samples(rng, 100, 6), alpha=0.05, min_effect=0.05)
        deployed += v.deploy
    assert deployed / 400 <= 0.05


def test_significant_but_below_min_effect_is_not_deployed() -> None:
    a = [100.0, 100.5, 99.5, 100.2, 99.8, 100.1]
    b = [97.0, 97.4, 96.6, 97.1, 96.9, 97.0]
    v = confirm_verdict(a, b, alpha=0.05, min_effect=0.05)
    assert v.significant and not v.deploy
    assert "below min_effect" in v.reason


def test_not_enough_windows() -> None:
    v = confirm_verdict([100.0], [50.0, 51.0], alpha=0.05, min_effect=0.05)
    assert not v.deploy and "not enough" in v.reason

"""Objective: one window -> a score; constraints are infeasibility, failures are unusable."""

from __future__ import annotations

import math

import pytest

from polltuned.objective import score, value_of
from polltuned.policy.schema import Constraints, Objective
from polltuned.records import Window


def w(p99: float = 100.0, cpu: float | None = 1.0, **kw: float) -> Window:
    return Window(ok=True, latency={"p99": p99, "p50": p99 / 2}, cpu_cores=cpu, **kw)  # type: ignore[arg-type]


def test_latency_x_cpu_combines_as_documented() -> None:
    s = score(w(100.0, 2.0), Objective(combine="latency_x_cpu", cpu_weight=0.25))
    assert s.ok and s.feasible
    assert s.value == pytest.approx(100.0 * (1 + 0.25 * 2.0))


def test_statistic_is_selectable() -> None:
    s = score(w(100.0, 1.0), Objective(statistic="p50", combine="latency"))
    assert s.value == pytest.approx(50.0)


def test_failed_window_is_never_a_number() -> None:
    s = score(Window.failed("probe gap"), Objective())
    assert not s.ok and math.isnan(s.value)
    assert "probe gap" in s.reasons[0]


def test_missing_cpu_is_unusable_when_the_objective_needs_it() -> None:
    assert not score(w(cpu=None), Objective(combine="latency_x_cpu")).ok
    assert score(w(cpu=None), Objective(combine="latency")).ok


def test_cpu_budget_is_infeasibility_not_a_penalty() -> None:
    obj = Objective(combine="latency_cpu_budget", constraints=Constraints(cpu_budget_cores=1.5))
    ok = score(w(100.0, 1.0), obj)
    over = score(w(100.0, 2.0), obj)
    assert ok.feasible and over.ok and not over.feasible
    assert over.value == pytest.approx(100.0)  # same value: no silent penalty
    assert "cpu_budget_cores" in over.reasons[0]


def test_throughput_floor_and_drops_increase() -> None:
    obj = Objective(combine="latency", constraints=Constraints(throughput_floor_pps=1000,
                                                               max_drops_increase_per_s=5))
    assert not score(w(throughput_pps=500.0), obj).feasible
    assert score(w(throughput_pps=2000.0), obj).feasible
    assert not score(w(throughput_pps=2000.0, drops_per_s=20.0), obj, baseline_drops_per_s=1.0).feasible
    assert score(w(throughput_pps=2000.0, drops_per_s=3.0), obj, baseline_drops_per_s=1.0).feasible


def test_cpu_per_throughput_with_latency_ceiling() -> None:
    obj = Objective(combine="cpu_per_throughput", latency_ceiling_us=150)
    s = score(w(100.0, 2.0, throughput_pps=1e6), obj)
    assert s.value == pytest.approx(2.0)  # µs of CPU per packet
    assert not score(w(200.0, 2.0, throughput_pps=1e6), obj).feasible
    assert not score(w(100.0, 2.0), obj).ok  # no throughput


def test_value_of_scenario_dict_and_infeasible_is_inf() -> None:
    obj = Objective(combine="latency_cpu_budget", constraints=Constraints(cpu_budget_cores=1.0))
    assert value_of({"p99_us": 10.0, "cpu_cores": 0.5}, obj) == pytest.approx(10.0)
    assert value_of({"p99_us": 10.0, "cpu_cores": 1.5}, obj) == math.inf

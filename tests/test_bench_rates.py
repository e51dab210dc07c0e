"""`polltuned bench --rates` without the real kernel: the rate grammar, the capacity, the open-loop
probe per rate, the table and JSON of several load points."""

from __future__ import annotations

import math

import pytest

from polltuned.bench.comparison import ArmSummary
from polltuned.bench.rates import (
    RatePoint,
    RateSpec,
    RatesResult,
    capacity_of,
    parse_rates,
    render_rates_table,
)
from polltuned.bench.table import BenchResult
from polltuned.cli.main import main
from polltuned.errors import HostError, UsageError
from polltuned.policy.loader import load_policy
from polltuned.policy.schema import CommandProbe
from polltuned.probes.command import open_loop
from polltuned.records import Window


def test_parse_rates_percent_absolute_and_errors() -> None:
    got = parse_rates("20%, 60%,90%")
    assert [(r.value, r.relative) for r in got] == [(20.0, True), (60.0, True), (90.0, True)]
    assert got[1].resolve(10_000.0) == pytest.approx(6000.0)
    mixed = parse_rates("5000,50%")
    assert mixed[0].resolve(None) == 5000.0 and mixed[0].text == "5000/s" and mixed[1].text == "50%"
    with pytest.raises(HostError):
        mixed[1].resolve(None)                    # a percentage needs the measured capacity
    for bad in ("", "20%,", "abc", "0%", "120%", "-5", "2e6", "nan", "20%,20%"):
        with pytest.raises(UsageError):
            parse_rates(bad)


def test_capacity_is_the_median_closed_loop_throughput() -> None:
    ws = [Window(ok=True, latency={"p99": 50.0}, throughput_pps=t) for t in (9000.0, 11000.0, 10000.0)]
    assert capacity_of([*ws, Window.failed("client died")]) == 10000.0
    with pytest.raises(HostError, match="client died"):
        capacity_of([Window.failed("client died")])


def test_the_memcached_probe_runs_open_loop_at_the_rate() -> None:
    pol = load_policy("bench-memcached", nic="ptb-s/ptbs")
    assert isinstance(pol.probe, CommandProbe) and pol.probe.rate is None
    cfg = open_loop(pol.probe, 6000.0, "poisson")
    assert cfg.rate == 6000.0 and "--rate" in cfg.argv and "{rate}" in cfg.argv


def _arm(name: str, p99: float, j: float, cfg: dict[str, int]) -> ArmSummary:
    return ArmSummary(name, cfg, 8, 0, 10.0, p99, 500.0, 0.5, j, (j * 0.9, j * 1.1), (p99 * 0.9, p99 * 1.1),
                      (j,) * 8, throughput=4000.0)


def _point(spec: RateSpec, rate: float, deployed_br: int, j_dep: float) -> RatePoint:
    arms = {"default": _arm("default", 200.0, 230.0, {"net.core.busy_read": 0}),
            "static": _arm("static", 30.0, 40.0, {"net.core.busy_read": 50}),
            "deployed": _arm("deployed", 25.0, j_dep, {"net.core.busy_read": deployed_br})}
    res = BenchResult("memcached", arms, {"reason": "deployed"}, [], 100.0, True, ["net.core.busy_read"], {}, {},
                      False, comparison={"rounds": 8, "stop_reason": "ok", "aliases": {}})
    return RatePoint(spec, rate, res, closed_p99={"default": 90.0, "static": 20.0, "deployed": 18.0},
                     closed_rps={"default": 9000.0, "static": 15000.0, "deployed": 16000.0})


def test_rates_table_and_json_one_block_per_rate() -> None:
    lo, hi = parse_rates("20%,90%")
    res = RatesResult("memcached", "bench-memcached", 10_000.0,
                      [_point(lo, 2000.0, 25, 30.0), _point(hi, 9000.0, 100, 45.0)], duration_s=600.0,
                      restored=True)
    t = render_rates_table(res)
    assert t.count("=== rate ") == 2 and "=== rate 20% = 2000 req/s" in t and "=== rate 90% = 9000 req/s" in t
    assert "open-loop p99 µs" in t and "closed-loop p99 µs" in t
    assert "best configuration by rate (lowest J): 20%: deployed, 90%: static" in t
    assert "tuned at 20%: net.core.busy_read=25" in t and "tuned at 90%: net.core.busy_read=100" in t
    assert "the deployed configuration changes with rate" in t
    d = res.to_json()
    assert d["capacity_rps"] == 10000.0 and [r["rate"] for r in d["rates"]] == ["20%", "90%"]
    assert d["best_by_rate"] == {"20%": "deployed", "90%": "static"} and d["best_changes_with_rate"]
    assert d["rates"][0]["closed_loop_p99_us"]["default"] == 90.0
    assert math.isclose(d["rates"][1]["rate_rps"], 9000.0)


def test_cli_refuses_rates_for_sockperf_workloads(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    import os

    if os.geteuid() != 0:
        pytest.skip("bench refuses non-root first")
    rc = main(["--state-dir", str(tmp_path), "bench", "--workload", "single", "--rates", "20%", "--no-lock"])
    err = capsys.readouterr().err
    assert rc == 2 and "--rates" in err and "open-loop client" in err
    rc = main(["--state-dir", str(tmp_path), "bench", "--workload", "memcached", "--rates", "120%", "--no-lock"])
    assert rc == 2 and "out of range" in capsys.readouterr().err

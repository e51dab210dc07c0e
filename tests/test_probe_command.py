"""command probe: regex / JSON path extraction and failure windows."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pytest

from polltuned.clock import FakeClock
from polltuned.errors import ProbeError
from polltuned.host.exec import ExecResult, SubprocessRunner
from polltuned.policy.schema import CommandProbe as Cfg
from polltuned.probes.command import CommandProbe, extract_statistics, json_path_get

REDIS_OUT = """====== PING_INLINE ======
  100000 requests completed in 1.02 seconds
Summary:
  throughput summary: 98135.43 requests per second
  latency summary (msec):
          avg       min       p50       p95       p99       max
        0.283     0.080     0.279     0.399     0.511     1.287
"""


def test_regex_named_groups_with_map_and_scale() -> None:
    cfg = Cfg(argv=["redis-benchmark"],
              regex=r"throughput summary: (?P<tp>[\d.]+)[\s\S]*?\n\s+(?P<avg>[\d.]+)\s+[\d.]+\s+(?P<med>[\d.]+)"
                    r"\s+[\d.]+\s+(?P<p99>[\d.]+)",
              statistic_map={"p50": "med", "p99": "p99", "mean": "avg", "throughput": "tp"},
              unit_scale_us=1000.0)
    from polltuned.probes.command import statistics_to_window

    stats = extract_statistics(cfg, REDIS_OUT)
    w = statistics_to_window(stats, 1.0)
    assert w.latency["p99"] == pytest.approx(511.0)
    assert w.latency["p50"] == pytest.approx(279.0)
    assert w.throughput_pps == pytest.approx(98135.43)


def test_json_path() -> None:
    doc = {"a": {"b": [{"c d": 5}, {"x": "7.5"}]}}
    assert json_path_get(doc, "$.a.b[0][\"c d\"]") == 5
    assert json_path_get(doc, "a.b[1].x") == "7.5"
    with pytest.raises(ProbeError, match="no key"):
        json_path_get(doc, "$.a.z")
    with pytest.raises(ProbeError, match="no index"):
        json_path_get(doc, "$.a.b[5]")
    cfg = Cfg(argv=["x"], statistic_map={"p99": "$.lat.p99", "p50": "$.lat.p50"})
    assert extract_statistics(cfg, '{"lat": {"p99": 12.5, "p50": 3}}') == {"p99": 12.5, "p50": 3.0}


def test_single_number_is_every_latency_statistic() -> None:
    from polltuned.probes.command import statistics_to_window

    cfg = Cfg(argv=["x"], json_path="$.result")
    w = statistics_to_window(extract_statistics(cfg, '{"result": 42}'), 1.0)
    assert w.latency["p99"] == w.latency["p50"] == 42.0


class ScriptedRunner:
    def __init__(self, res: ExecResult) -> None:
        self.res = res
        self.calls: list[tuple[Sequence[str], float]] = []

    def run(self, argv: Sequence[str], *, timeout_s: float, netns: str | None = None,
            cpus: Sequence[int] | None = None, check: bool = False) -> ExecResult:
        self.calls.append((argv, timeout_s))
        return self.res

    def spawn(self, argv: Sequence[str], *, netns: str | None = None,
              cpus: Sequence[int] | None = None) -> object:
        raise AssertionError("not used")


@pytest.mark.parametrize(
    ("res", "needle"),
    [
        (ExecResult(("bench",), 3, "", "bad things"), "exit 3: bad things"),
        (ExecResult(("bench",), None, "", "", timed_out=True), "timed out"),
        (ExecResult(("bench",), 0, "no numbers here", ""), "did not match"),
        (ExecResult(("bench",), 0, "p99=nan", ""), "not finite"),
    ],
)
def test_failures_are_failed_windows(res: ExecResult, needle: str, caplog: pytest.LogCaptureFixture) -> None:
    cfg = Cfg(argv=["bench"], regex=r"p99=(?P<p99>\S+)", timeout_s=9)
    runner = ScriptedRunner(res)
    with caplog.at_level("WARNING", logger="polltuned.probes"):
        w = CommandProbe(cfg, runner, clock=FakeClock()).measure(1.0, 3)  # type: ignore[arg-type]
    assert not w.ok and w.error is not None and needle in w.error
    assert runner.calls[0][1] == 9
    assert any("probe command window 3 failed" in r.getMessage() for r in caplog.records)


def test_real_subprocess_json() -> None:
    cfg = Cfg(argv=[sys.executable, "-c", "import json; print(json.dumps({'p99': 120, 'p50': 40}))"],
              statistic_map={"p99": "$.p99", "p50": "$.p50"})
    w = CommandProbe(cfg, SubprocessRunner(), clock=FakeClock()).measure(1.0, 0)
    assert w.ok and w.latency == {"p99": 120.0, "p50": 40.0}
    assert w.duration_s > 0

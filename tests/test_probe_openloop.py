"""Open-loop rates and histograms through the command probe, the policy schema and the objective."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from polltuned.clock import FakeClock
from polltuned.histogram import RESOLUTION, LatencyHistogram
from polltuned.host.exec import ExecResult
from polltuned.objective import arm_latency, latency_of, score
from polltuned.policy.loader import load_policy
from polltuned.policy.schema import CommandProbe as Cfg
from polltuned.policy.schema import Objective
from polltuned.probes.command import CommandProbe, expand_argv, extract_histogram, open_loop, statistics_to_window
from polltuned.records import Window

KV = ["{python}", "-m", "polltuned.host.kvclient", "--server", "198.18.230.2", "--duration", "{window_s}"]
MAP = {"p99": "$.latency_us.p99", "p50": "$.latency_us.p50", "throughput": "$.throughput_rps"}


def _doc(values_ns: Sequence[int], p99: float = 1.0) -> str:
    h = LatencyHistogram.of_ns(values_ns)
    return json.dumps({"latency_us": {"p99": p99, "p50": p99}, "throughput_rps": 2000.0,
                       "histogram": {"format": "hdrhistogram-v2-compressed", "encoded": h.encode()}})


def test_rate_fields_are_validated() -> None:
    ok = Cfg(argv=[*KV, "--rate", "{rate}", "--arrivals", "{arrivals}"], statistic_map=MAP, rate=2000,
             arrivals="uniform")
    assert ok.rate == 2000 and ok.arrivals == "uniform"
    for bad in ({"rate": 0}, {"rate": -1}, {"rate": float("nan")}, {"rate": float("inf")}, {"rate": 2e6},
                {"arrivals": "bursty", "rate": 10}):
        with pytest.raises(ValidationError):
            Cfg(argv=[*KV, "--rate", "{rate}"], statistic_map=MAP, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="no \\{rate\\} placeholder"):
        Cfg(argv=KV, statistic_map=MAP, rate=100)
    with pytest.raises(ValidationError, match="sets no 'rate'"):
        Cfg(argv=[*KV, "--rate", "{rate}"], statistic_map=MAP)
    with pytest.raises(ValidationError, match="extra"):
        Cfg(argv=KV, statistic_map=MAP, rps=100)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="regex"):
        Cfg(argv=KV, regex="(?P<p99>\\d+)", histogram_path="$.histogram.encoded")


def test_rate_placeholders_and_the_open_loop_helper() -> None:
    assert expand_argv(["--rate", "{rate}", "--arrivals", "{arrivals}"], window_s=2, python="py", rate=2000.0,
                       arrivals="uniform") == ["--rate", "2000", "--arrivals", "uniform"]
    assert expand_argv(["{rate}"], window_s=2, python="py", rate=12.5) == ["12.5"]
    base = load_policy("bench-memcached", nic="ptb-s/ptbs").probe
    assert isinstance(base, Cfg) and base.rate is None
    cfg = open_loop(base, 30000.0, "poisson")
    assert cfg.rate == 30000.0 and cfg.argv[-4:] == ["--rate", "{rate}", "--arrivals", "{arrivals}"]
    argv = CommandProbe(cfg, None, clock=FakeClock(), python="py").argv(2.0)  # type: ignore[arg-type]
    assert argv[-4:] == ["--rate", "30000", "--arrivals", "poisson"] and argv[0] == "py"
    assert open_loop(cfg, 100.0).argv == cfg.argv          # already open loop: only the rate changes
    with pytest.raises(ValidationError):
        open_loop(base, 0.0)


class Runner:
    def __init__(self, out: str) -> None:
        self.out = out
        self.argv: list[str] = []

    def run(self, argv: Sequence[str], *, timeout_s: float, netns: str | None = None,
            cpus: Sequence[int] | None = None, check: bool = False) -> ExecResult:
        self.argv = list(argv)
        return ExecResult(tuple(argv), 0, self.out, "", duration_s=2.0)


def test_the_probe_keeps_the_histogram_and_takes_its_percentiles_from_it() -> None:
    rng = random.Random(1)
    vals = [int(rng.lognormvariate(10.8, 0.6)) for _ in range(5000)]
    cfg = Cfg(argv=[*KV, "--rate", "{rate}"], statistic_map=MAP, rate=500, histogram_path="$.histogram.encoded")
    r = Runner(_doc(vals, p99=1.0))                       # the printed p99 is off: the histogram wins
    w = CommandProbe(cfg, r, clock=FakeClock()).measure(2.0, 0)  # type: ignore[arg-type]
    assert w.ok and w.histogram is not None and w.observations == 5000
    assert "500" in r.argv
    h = LatencyHistogram.decode(w.histogram)
    assert w.latency["p99"] == h.percentile_us(99) and w.latency["p99"] > 100
    assert w.throughput_pps == 2000.0


@pytest.mark.parametrize(("out", "needle"), [
    (json.dumps({"latency_us": {"p99": 5, "p50": 5}, "throughput_rps": 1}), "no key 'histogram'"),
    (json.dumps({"latency_us": {"p99": 5, "p50": 5}, "throughput_rps": 1, "histogram": {"encoded": "zzz"}}),
     "cannot decode"),
    (json.dumps({"latency_us": {"p99": 5, "p50": 5}, "throughput_rps": 1,
                 "histogram": {"encoded": LatencyHistogram().encode()}}), "empty"),
    (json.dumps({"latency_us": {"p99": 5, "p50": 5}, "throughput_rps": 1, "histogram": {"encoded": 3}}),
     "not an encoded histogram"),
])
def test_a_missing_or_bad_histogram_is_a_failed_window(out: str, needle: str) -> None:
    cfg = Cfg(argv=KV, statistic_map=MAP, histogram_path="$.histogram.encoded")
    w = CommandProbe(cfg, Runner(out), clock=FakeClock()).measure(2.0, 0)  # type: ignore[arg-type]
    assert not w.ok and w.error is not None and needle in w.error
    assert extract_histogram(Cfg(argv=KV, statistic_map=MAP), out) is None  # not asked for: not read


def test_the_objective_reads_its_percentile_from_the_histogram() -> None:
    vals = list(range(1_000, 101_000, 100))                # 1000 values, 1..101 µs
    text = LatencyHistogram.of_ns(vals).encode()
    obj = Objective(statistic="p99", combine="latency")
    stale = Window(ok=True, latency={"p99": 5.0}, histogram=text)
    assert latency_of(stale, "p99") == pytest.approx(99.9, rel=RESOLUTION)
    assert score(stale, obj).value == pytest.approx(99.9, rel=RESOLUTION)
    assert latency_of(Window(ok=True, latency={"p99": 5.0}), "p99") == 5.0
    assert latency_of(Window(ok=True, latency={"p99": 5.0}, histogram="garbage"), "p99") == 5.0


def test_arm_latency_is_the_percentile_of_all_requests() -> None:
    rng = random.Random(2)
    groups = [[int(rng.lognormvariate(10 + (i % 3), 0.4)) for _ in range(rng.randint(200, 2000))] for i in range(6)]
    ws = [statistics_to_window({"p99": 1.0}, 2.0, LatencyHistogram.of_ns(g).encode()) for g in groups]
    everything = sorted(v for g in groups for v in g)
    exact = everything[-(-99 * len(everything) // 100) - 1] / 1e3
    got = arm_latency([*ws, Window.failed("x")], "p99")      # failed windows do not count
    assert got is not None and exact <= got <= exact * (1 + RESOLUTION) + 1e-3
    assert arm_latency([*ws, Window(ok=True, latency={"p99": 3.0})], "p99") is None  # one without: no merge
    assert arm_latency([], "p99") is None


def test_the_host_env_keeps_the_probes_histogram_when_it_adds_cpu() -> None:
    from polltuned.engine.env import HostEnv
    from tests.test_sim import FakeScope, act_stub

    text = LatencyHistogram.of_ns([20_000, 30_000]).encode()

    class HistProbe:
        name = "hist"

        def start(self) -> None: ...
        def restart(self) -> None: ...
        def close(self) -> None: ...

        def measure(self, duration_s: float, window_index: int) -> Window:
            return Window(ok=True, latency={"p99": 30.0}, histogram=text, context={"rate": 2.0})

    env = HostEnv(load_policy("sim-default"), act_stub(), HistProbe(), clock=FakeClock(), cpu_scope=FakeScope(0.5))
    w = env.measure(0)
    assert w.cpu_cores == 0.5 and w.histogram == text and w.context == {"rate": 2.0}


def test_the_engine_stores_every_windows_histogram_and_the_deployment_p99_is_recomputed() -> None:
    from dataclasses import replace

    from polltuned.study import memory_study
    from polltuned.worlds.env import ScenarioEnv
    from polltuned.worlds.scenario import load_scenario
    from tests.engine_run import engine_for, events

    class HistEnv(ScenarioEnv):
        """The simulated world, each window with a 100-request histogram whose p99 is its p99."""

        def measure(self, window_index: int) -> Window:
            w = super().measure(window_index)
            if not w.ok:
                return w
            p99_ns = int(w.latency["p99"] * 1e3)
            return replace(w, histogram=LatencyHistogram.of_ns([p99_ns // 2] * 98 + [p99_ns] * 2).encode())

    p = load_policy("sim-default")
    p = p.model_copy(update={"tuning": p.tuning.model_copy(update={"budget": 14})})
    env = HistEnv(p, load_scenario("busypoll_split"), seed=0)
    store = memory_study(p)
    eng = engine_for(p, env, store)
    list(events(eng, env))
    r = eng.result
    assert r is not None
    ws = store.sessions()[-1].windows
    measured = [w for w in ws if w.status in ("ok", "infeasible", "aborted")]
    assert measured and all(w.histogram is not None for w in measured)
    confirm = [w for w in measured if w.phase == "confirm" and
               all(str(w.config.get(k)) == str(v) for k, v in r.deployed.items())]
    h = store.histogram_of(r.deployed)
    assert confirm and h is not None and h.count == 100 * len(confirm)


def test_the_bench_comparison_reports_an_arms_merged_p99() -> None:
    from polltuned.bench.comparison import summarise_arm

    rng = random.Random(4)
    # one window with a slow tail among quick ones: the median of per-window p99s hides it
    groups = [[int(rng.lognormvariate(10, 0.3)) for _ in range(1000)] for _ in range(4)]
    groups[2] += [5_000_000] * 60
    ws = [statistics_to_window({"p99": 1.0}, 2.0, LatencyHistogram.of_ns(g).encode()) for g in groups]
    obj = Objective(statistic="p99", combine="latency")
    arm = summarise_arm("deployed", {}, ws, obj)
    merged = arm_latency(ws, "p99")
    assert merged is not None and arm.p99 == merged and arm.p99 > 1000      # the tail is 1.5 % of the arm
    median = sorted(w.latency["p99"] for w in ws)[1:3]
    assert max(median) < 100
    plain = summarise_arm("default", {}, [Window(ok=True, latency={"p99": v}) for v in (10.0, 30.0, 20.0)], obj)
    assert plain.p99 == 20.0                                                 # no histograms: the median


def test_a_recorded_open_loop_kvclient_run_through_the_shipped_policy() -> None:
    """tests/fixtures/bench/kvclient_open.json: a real ``kvclient --rate 10000`` run (memcached 1.6.18,
    loopback, a loaded VM) read by bench-memcached's probe made open-loop."""
    from pathlib import Path

    from polltuned.probes.command import extract_statistics

    text = (Path(__file__).parent / "fixtures" / "bench" / "kvclient_open.json").read_text()
    doc = json.loads(text)
    base = load_policy("bench-memcached", nic="ptb-s/ptbs").probe
    assert isinstance(base, Cfg)
    cfg = open_loop(base, 10000.0)
    w = statistics_to_window(extract_statistics(cfg, text), 1.0, extract_histogram(cfg, text))
    assert w.histogram is not None and w.observations == doc["requests"] == doc["offered"] == 10000
    for k in ("p50", "p99", "p999"):       # the client's exact percentiles, within the histogram's resolution
        assert doc["latency_us"][k] <= w.latency[k] <= doc["latency_us"][k] * (1 + RESOLUTION) + 1e-3
    assert w.throughput_pps == doc["achieved_rps"]
    assert w.extra["behind_schedule"] == doc["behind_schedule"] > 0                # a loaded VM: it fell behind
    assert w.extra["send_lag_p99_us"] == doc["send_lag_us"]["p99"]

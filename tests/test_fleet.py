"""Fleet search through the engine's hooks: hosts of one class share observations and see each
other's pending trials (so they measure different configurations at once); a host killed mid-trial
loses none of the class's observations and its pending trial expires."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from polltuned.clock import FakeClock, SystemClock
from polltuned.engine.core import Engine
from polltuned.optimiser import Context, Optimiser, Recommendation, make_optimiser
from polltuned.optimiser.space import Space
from polltuned.policy.loader import load_policy
from polltuned.policy.schema import Policy
from polltuned.records import KnobValue
from polltuned.study import fingerprint
from polltuned.study.config import StudyConfig
from polltuned.study.select import open_study
from polltuned.study.sqlite import SqliteStudy
from polltuned.worlds.env import ScenarioEnv, default_config
from polltuned.worlds.scenario import load_scenario
from tests.engine_run import engine_for
from tests.engine_run import events as steps


def policy(budget: int = 12) -> Policy:
    p = load_policy("sim-default")
    return p.model_copy(update={"tuning": p.tuning.model_copy(update={"budget": budget, "seed": 5})})


class Recorder:
    """Delegates to a real optimiser; records every ask (pending passed, config returned) and retell."""

    def __init__(self, inner: Optimiser) -> None:
        self.inner = inner
        self.name = inner.name
        self.asks: list[tuple[list[dict[str, KnobValue]], dict[str, KnobValue]]] = []
        self.retold: list[tuple[dict[str, KnobValue], float]] = []

    def ask(self, remaining: int | None = None, pending: Sequence[Mapping[str, KnobValue]] = (), *,
            context: Context | None = None) -> dict[str, KnobValue]:
        c = self.inner.ask(remaining=remaining, pending=pending, context=context)
        self.asks.append(([dict(p) for p in pending], dict(c)))
        return c

    def tell(self, config: Mapping[str, KnobValue], y: float, *, context: Context | None = None) -> None:
        self.inner.tell(config, y, context=context)

    def retell(self, observations: Sequence[tuple[Mapping[str, KnobValue], float]], *,
               contexts: Sequence[Context | None] | None = None) -> None:
        self.retold = [(dict(c), y) for c, y in observations]
        self.inner.retell(observations, contexts=contexts)

    def tell_failed(self, config: Mapping[str, KnobValue]) -> None:
        self.inner.tell_failed(config)

    def set_noise(self, sd: float) -> None:
        self.inner.set_noise(sd)

    def best(self, *, context: Mapping[str, float] | None = None) -> Recommendation | None:
        return self.inner.best(context=context)

    def candidate(self, *, context: Mapping[str, float] | None = None) -> Recommendation | None:
        return self.inner.candidate(context=context)

    def simplify(self, config: Mapping[str, KnobValue], *,
                 context: Mapping[str, float] | None = None) -> dict[str, KnobValue]:
        return self.inner.simplify(config, context=context)

    @property
    def cpu_seconds(self) -> float:
        return self.inner.cpu_seconds


def tuner(p: Policy, store: Any, seed: int) -> tuple[Engine, ScenarioEnv, Recorder]:
    base = default_config(p)
    rec = Recorder(make_optimiser("skopt", Space.from_policy(p), base, seed=p.tuning.seed,
                                  initial_points=p.tuning.initial_points))
    env = ScenarioEnv(p, load_scenario("busypoll_split"), seed=seed, baseline=base)
    return engine_for(p, env, store, optimiser=rec), env, rec


def lockstep(a: tuple[Engine, ScenarioEnv, Recorder], b: tuple[Engine, ScenarioEnv, Recorder]) -> list[str]:
    """Run two engines one event at a time each (two hosts measuring at the same pace)."""
    msgs: list[str] = []
    gens = [steps(a[0], a[1]), steps(b[0], b[1])]
    live = [True, True]
    while any(live):
        for i, g in enumerate(gens):
            if live[i]:
                try:
                    msgs.append(next(g).message)
                except StopIteration:
                    live[i] = False
    return msgs


def test_two_hosts_of_a_class_split_the_search(tmp_path: Path) -> None:
    p = policy(budget=12)
    fp = fingerprint(p)
    db = tmp_path / "class.sqlite3"
    stores = [SqliteStudy(db, fp, class_key=fp + "-cls", host_id=h, shared=True, clock=FakeClock())
              for h in ("host-a", "host-b")]
    ha, hb = tuner(p, stores[0], seed=1), tuner(p, stores[1], seed=2)
    (ta, _, ra), (tb, _, rb) = ha, hb
    msgs = lockstep(ha, hb)
    assert sum("joined its workload class" in m for m in msgs) == 2
    assert ta.state.in_class and tb.state.in_class
    # the same seed gives both the same space-filling design: the second host to ask skips what
    # the first is measuring (pending), so they measure different configurations at once
    with_pending = [(pend, c) for pend, c in rb.asks + ra.asks if pend]
    assert with_pending, "no ask ever saw the other host's pending trial"
    assert all(c not in pend for pend, c in with_pending)
    assert ra.asks[0][1] != rb.asks[0][1]
    # each host's model holds the other's trial windows (log-ratios to the other's own baseline)
    a_trials = {Space.from_policy(p).key_of(w.config) for s in stores[0].sessions() for w in s.windows
                if w.phase == "trial" and w.y is not None}
    b_told = {Space.from_policy(p).key_of(c) for c, _ in rb.retold}
    assert a_trials and a_trials <= b_told
    # both confirmed on themselves and wrote their verdicts back
    for t, st in ((ta, stores[0]), (tb, stores[1])):
        assert t.result is not None and st.sessions()[-1].ended and st.sessions()[-1].result is not None


def test_without_a_class_the_same_seed_measures_the_same_configurations(tmp_path: Path) -> None:
    """The control for the test above: single-host stores share nothing, so identical seeds
    propose identical first configurations."""
    p = policy(budget=8)
    ha, hb = (tuner(p, SqliteStudy(tmp_path / f"{h}.sqlite3", fingerprint(p)), seed=s)
              for h, s in (("a", 1), ("b", 2)))
    (_, _, ra), (_, _, rb) = ha, hb
    lockstep(ha, hb)
    assert ra.asks[0][1] == rb.asks[0][1] and all(not pend for pend, _ in ra.asks + rb.asks)


def _host_process(dsn: str, state: Path, ack: int) -> None:
    """Child: one fleet host tuning busypoll_split; writes each measured window's index to ``ack``
    (after the engine journalled it) and stops itself in the middle of its second trial."""
    try:
        p = policy(budget=30)
        cfg = StudyConfig(backend="postgresql", dsn=dsn, pending_timeout_s=60.0)
        st = open_study(cfg, state, p, class_fp="cls", host_id="victim", clock=SystemClock())
        env = ScenarioEnv(p, load_scenario("busypoll_split"), seed=3)
        t = engine_for(p, env, st)
        trials = 0
        for ev in steps(t, env):
            if ev.phase == "MEASURE" and ev.window is not None:
                os.write(ack, f"{ev.window}\n".encode())
            if ev.phase == "APPLY":
                trials += 1
            if ev.phase == "MEASURE" and ev.trial is not None and trials >= 2:
                os.write(ack, f"session {t.state.session}\n".encode())
                os.kill(os.getpid(), signal.SIGSTOP)
    except BaseException:
        os._exit(3)
    os._exit(0)


def test_a_killed_host_loses_none_of_the_fleets_observations(pg_dsn: str, tmp_path: Path) -> None:
    from polltuned.host.pgsql import connect_postgres
    from polltuned.study.postgres import PostgresStudy
    from polltuned.study.sql import ClassRules

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _host_process(pg_dsn, tmp_path / "victim", w)
    os.close(w)
    _, status = os.waitpid(pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f"the host finished before its second trial (status {status})"
    os.kill(pid, signal.SIGKILL)              # killed mid-trial, its trial announced as pending
    os.waitpid(pid, 0)
    with os.fdopen(r) as fh:
        lines = fh.read().split("\n")
    acked = {int(x) for x in lines if x.strip().isdigit()}
    sid = next(x.split()[1] for x in lines if x.startswith("session "))
    p = policy(budget=30)
    ck = fingerprint(p) + "-cls"
    now = time.time()
    reader = PostgresStudy(connect_postgres(pg_dsn), fingerprint(p), location="pg", class_key=ck, host_id="reader",
                           shared=True, clock=FakeClock(now), rules=ClassRules(pending_timeout_s=60.0))
    rows = reader._exec("SELECT idx FROM pt_window WHERE session = ?", (sid,))
    assert acked and acked <= {int(x[0]) for x in rows}, "a window the killed host measured is missing"
    shared = reader.shared_observations("reader-session", default_config(p))
    assert len(shared) >= len([i for i in acked]) - 1     # its windows are the class's (all but none-told ones)
    pend = reader.pending_configs("reader-session")
    assert len(pend) == 1                                  # the dead host's trial, until it expires
    later = PostgresStudy(connect_postgres(pg_dsn), fingerprint(p), location="pg", class_key=ck, host_id="reader",
                          shared=True, clock=FakeClock(now + 61.0), rules=ClassRules(pending_timeout_s=60.0))
    assert later.pending_configs("reader-session") == []
    reader.close()
    later.close()


@pytest.mark.parametrize("n", [3])
def test_fleet_benchmark_quick_run(tmp_path: Path, n: int) -> None:
    """benchmarks/fleet.py keeps working (a tiny run on a shared SQLite file; the numbers come from
    the script itself, not from this test)."""
    import importlib.util
    import json
    import sys

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "fleet.py"
    spec = importlib.util.spec_from_file_location("pt_fleet_bench", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["pt_fleet_bench"] = mod
    spec.loader.exec_module(mod)
    out = tmp_path / "fleet.json"
    rc = mod.main(["--quick", "--hosts", str(n), "--store", "sqlite", "--json", str(out), "--workdir", str(tmp_path)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["hosts"] == n and set(doc["modes"]) == {"fleet", "alone"}
    for mode in ("fleet", "alone"):
        m = doc["modes"][mode]
        assert len(m["per_host"]) == n and all(h["windows"] > 0 for h in m["per_host"])
        assert m["worse_than_baseline"] >= 0 and "tell_ms" in m["latency"]
    assert doc["modes"]["fleet"]["in_class"] == n

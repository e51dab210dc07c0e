"""benchmarks/tuner_quality.py in --quick mode: it runs any scenario directory and reports the metrics."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from polltuned.worlds.scenario import shipped_dir

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "tuner_quality.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tuner_quality", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tuner_quality"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_quick_run_on_a_scenario_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("busypoll_split", "nothing_helps"):
        shutil.copy(shipped_dir() / f"{name}.py", tmp_path / f"{name}.py")
    bench = load_bench()
    rc = bench.main(["--scenarios", str(tmp_path), "--quick", "--seeds", "2", "--budget", "14",
                     "--methods", "polltuned,random,static", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    by = {s["scenario"]: s for s in out["scenarios"]}
    assert set(by) == {"busypoll_split", "nothing_helps"}
    split = by["busypoll_split"]
    assert split["effect"] and split["J_star"] < split["J_baseline"]
    pt = split["methods"]["polltuned"]
    for key in ("regret_10", "regret_20", "regret_deployed", "within5", "cum_regret", "breaches",
                "worse_than_baseline", "kept_baseline", "cpu_per_trial"):
        assert key in pt
    assert pt["worse_than_baseline"] == 0
    assert by["nothing_helps"]["methods"]["static"]["worse_than_baseline"] == 2  # static busy polling hurts
    assert any(line.startswith(("PASS", "FAIL")) for line in out["targets"])


def test_table_output() -> None:
    bench = load_bench()
    s = {"scenario": "x", "gain_available": 0.5, "effect": True,
         "methods": {"polltuned": {"runs": 2, "regret_10": 0.1, "regret_20": 0.05, "regret_deployed": 0.0,
                                   "within5": 2, "median_window_within5": 6.0, "cum_regret": 3.0,
                                   "breaches": 0.0, "worse_than_baseline": 0, "kept_baseline": 0.0,
                                   "cpu_per_trial": 0.09}}}
    t = bench.table([s])
    assert "| x (50%) | polltuned | 0.10 | 0.05 | 0.00 | 2/2 (6) |" in t

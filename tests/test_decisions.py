"""benchmarks/decisions.py: every decision of a horizon run, judged against the load it was made at."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from benchmarks._load import load

ROOT = Path(__file__).resolve().parents[1]


D: Any = load("decisions")


@pytest.mark.parametrize("why, label", [
    ("the model predicts +2.0% for the search's pick net.core.gro_normal_batch=14 at this load (< min_effect): "
     "the originals stay", "the model predicted too little for the pick"),
    ("baseline kept: gain +9.3% not significant (p=0.034 >= alpha=0.0166667)",
     "the confirmation's gain was not significant"),
    ("baseline kept: candidate broke the guard during confirmation: +170% vs the baseline windows next to it",
     "the candidate broke the guard"),
    ("the load the search measured left before the confirmation: the originals for now",
     "the load left before the confirmation"),
    ("no configuration is predicted to beat the baseline; kept", "nothing was predicted to win"),
    ("baseline kept: not enough usable windows (1 baseline, 1 candidate)", "too few usable windows"),
    ("something the engine never said", "other"),
])
def test_reason_classes_follow_the_engine_words(why: str, label: str) -> None:
    assert D.reason_class(why) == label


def _world() -> tuple[list[str], Any, dict[str, tuple[float, float]]]:
    """Two loads: 'a' (windows 0-9, originals J 100, optimum J 50 at busy 50) and 'b' (windows
    10-19, nothing to gain: originals J 100 = J*)."""
    labels = ["a"] * 10 + ["b"] * 10

    def j_at(t: int, cfg: Mapping[str, Any]) -> float:
        if labels[t] == "b":
            return 100.0
        return {0: 100.0, 50: 50.0, 20: 80.0}.get(int(cfg.get("busy", 0)), 100.0)

    return labels, j_at, {"a": (100.0, 50.0), "b": (100.0, 100.0)}


def test_outcomes_coverage_and_kinds_are_judged_at_the_load_of_the_decision() -> None:
    labels, j_at, optima = _world()
    configs = [{"busy": 0}] * 3 + [{"busy": 50}] + [{"busy": 20}] * 5 + [{"busy": 50}] + [{"busy": 0}] * 10
    decisions = [
        {"window": 6, "round": 1, "region": 0, "deployed": True, "config": {"busy": 20},
         "why": "deployed: gain +20%"},                                  # short; busy 50 was measured at window 3
        {"window": 9, "round": 1, "region": 0, "deployed": False, "config": {"busy": 0},
         "why": "baseline kept: gain +4% not significant (p=0.3 >= alpha=0.0167)"},   # missed, not measured since
        {"window": 10, "round": 1, "region": 0, "deployed": True, "config": {"busy": 50},
         "why": "deployed after a resumed confirmation: gain +50%"},    # within
        {"window": 15, "round": 1, "region": 1, "deployed": False, "config": {"busy": 0},
         "why": "the model predicts +1% for the search's pick"},         # load b: right
        {"window": 20, "round": 2, "region": 0, "deployed": False, "config": {"busy": 0},
         "why": "no configuration is predicted to beat the baseline; kept"},
    ]
    rows = D.judge(decisions, label_at=labels, j_at=j_at, optima=optima, configs=configs)
    assert [r["kind"] for r in rows] == ["first search", "region search", "resumed confirmation", "region search",
                                         "first search"]
    assert [r["outcome"] for r in rows] == ["deployed, short", "kept, missed", "deployed, within 5 %",
                                            "kept, right", "kept, right"]
    assert [r["measured_within5"] for r in rows] == [True, False, True, True, True]
    assert rows[0]["regret"] == pytest.approx(0.6) and rows[1]["regret"] == pytest.approx(1.0)
    assert rows[1]["reason"] == "the confirmation's gain was not significant" and rows[0]["reason"] == ""
    s = D.summary(rows)
    assert s["decisions"] == 5
    assert s["by_kind"]["first search"] == {"decisions": 2, "deployed, short, measured": 1,
                                            "kept, right, measured": 1}
    assert s["missed_reasons"] == {"region search: the confirmation's gain was not significant": 1}
    assert s["short_regret_median"] == pytest.approx(0.6)
    assert "kept although the load had > 5 % to gain" in D.table(s)


def test_a_short_horizon_run_reports_the_engine_decisions_with_their_reasons(capsys: Any) -> None:
    """Real engine, one family landscape: every decision event parses, carries a reason and a
    configuration, and the CLI's JSON holds one row per decision."""
    assert D.main(["--family", "1", "--family-seed", "8117", "--seeds", "1", "--horizon", "80", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["rows"]
    assert rows and out["summary"]["decisions"] == len(rows)
    assert all(r["why"] and r["config"] is not None and 0 < r["window"] <= 80 for r in rows), rows
    assert rows[0]["kind"] == "first search"
    assert all(r["outcome"] in D.OUTCOMES for r in rows)
    assert sum(c["decisions"] for c in out["summary"]["by_kind"].values()) == len(rows)


def test_bad_arguments_exit_with_usage() -> None:
    with pytest.raises(SystemExit) as e:
        D.main(["--family", "0", "--family-seed", "1"])
    assert e.value.code == 2

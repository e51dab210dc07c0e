#!/usr/bin/env python3
"""Where the daemon's misses come from: every decision of a horizon run, judged against the load.

``tuner_quality.py --horizon`` says *how often* the configuration in force is within 5 % of the
current load's optimum. This script says *which decision* put a worse one there. It runs the same
daemon cycle (``tuner_quality.run_horizon``, follow mode) on a family of moving landscapes and takes
every decision the engine announces — a round's first search, a load region's short search, a
resumed confirmation — with the engine's own reason. Each decision is judged at the load of the
last window measured before it (``Scenario.expected_at``; J* by ``tuner_quality.optimum``):

* **deployed, within 5 %** — the entry is within 5 % of the load's optimum;
* **deployed, short** — it gains, but is more than 5 % from the optimum;
* **kept, right** — the originals stayed, and the load has less than 5 % to gain;
* **kept, missed** — the originals stayed although the load has more than 5 % to gain, with the
  reason class the engine gave (the model predicted too little for the pick, the confirmation's gain
  was not significant, the candidate broke the guard, the load left, nothing was predicted to win,
  too few usable windows).

For every decision it also says whether the windows since the previous decision *measured* any
configuration within 5 % of that load's optimum: "not measured" means the search never saw a
winner (a search problem); "measured" means it saw one and the decision let it go (a selection or
confirmation problem). The table prints both, per kind of search.

Usage:
  benchmarks/decisions.py --family 30 --family-seed S [--seeds 2] [--horizon 300] [--policy FILE]
                          [--jobs N] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks._load import load  # noqa: E402
from polltuned.policy.loader import load_policy  # noqa: E402
from polltuned.policy.schema import Policy  # noqa: E402
from polltuned.worlds.env import default_config  # noqa: E402
from polltuned.worlds.scenario import load_scenario  # noqa: E402

TQ: Any = load("tuner_quality")
WITHIN = 0.05
#: the engine's reasons for keeping the originals, by the words it uses (first match wins)
REASONS = (("model predicts", "the model predicted too little for the pick"),
           ("not significant", "the confirmation's gain was not significant"),
           ("broke the guard", "the candidate broke the guard"),
           ("left before", "the load left before the confirmation"),
           ("load change", "the load left during the confirmation"),
           ("no configuration is predicted", "nothing was predicted to win"),
           ("not enough usable", "too few usable windows"))
KINDS = ("first search", "region search", "resumed confirmation")
OUTCOMES = ("deployed, within 5 %", "deployed, short", "kept, right", "kept, missed")


def reason_class(why: str) -> str:
    """The class of an engine reason for keeping the originals ("other" when none matches)."""
    low = why.lower()
    for words, label in REASONS:
        if words in low:
            return label
    return "other"


def search_kind(d: Mapping[str, Any], first_of_round: bool) -> str:
    if "resumed confirmation" in d["why"]:
        return "resumed confirmation"
    return "first search" if first_of_round else "region search"


def judge(decisions: Sequence[Mapping[str, Any]], *, label_at: Sequence[str],
          j_at: Any, optima: Mapping[str, tuple[float, float]],
          configs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each decision with its kind, outcome, reason class and coverage. ``label_at[t]``: the load of
    window t; ``j_at(t, cfg)``: J of ``cfg`` at window t's load; ``optima[label]``: (J of the
    originals, J*); ``configs[t]``: the configuration window t measured."""
    out: list[dict[str, Any]] = []
    prev_window, prev_round = 0, None
    n = len(label_at)
    for d in decisions:
        t = min(max(int(d["window"]) - 1, 0), n - 1)      # the last window measured before it
        label = label_at[t]
        j_def, j_star = optima[label]
        available = j_def / j_star - 1.0
        first = d["round"] != prev_round
        kind = search_kind(d, first)
        if d["deployed"] and d.get("config") is not None:
            regret = j_at(t, d["config"]) / j_star - 1.0
            outcome = OUTCOMES[0] if regret <= WITHIN else OUTCOMES[1]
        else:
            regret = available
            outcome = OUTCOMES[2] if available <= WITHIN else OUTCOMES[3]
        since = range(prev_window, t + 1)
        measured = any(label_at[u] == label and j_at(u, configs[u]) <= j_star * (1.0 + WITHIN)
                       for u in since if u < len(configs))
        out.append({**d, "kind": kind, "load": label, "available": available, "regret": regret,
                    "outcome": outcome, "measured_within5": measured,
                    "reason": reason_class(d["why"]) if outcome == OUTCOMES[3] else ""})
        prev_window, prev_round = t + 1, d["round"]
    return out


def run_one(args: tuple[str, Policy, int, int]) -> list[dict[str, Any]]:
    sc_path, pol, seed, horizon = args
    r = TQ.run_horizon(sc_path, pol, "polltuned", seed, horizon)
    sc = load_scenario(sc_path)
    base = default_config(pol)
    optima = TQ.load_optima(sc_path, pol, horizon)
    labels = [sc.load_at(t) for t in range(horizon)]

    def j_at(t: int, cfg: Mapping[str, Any]) -> float:
        return float(TQ.J(TQ._AtWindow(sc, t), pol, {**base, **cfg}))

    rows = judge(r["decisions"], label_at=labels, j_at=j_at, optima=optima, configs=r["configs"])
    return [{**row, "scenario": sc_path, "seed": seed} for row in rows]


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    by_kind: dict[str, dict[str, int]] = {}
    for k in KINDS:
        sel = [r for r in rows if r["kind"] == k]
        c = collections.Counter(r["outcome"] + (", measured" if r["measured_within5"] else ", not measured")
                                for r in sel)
        by_kind[k] = {"decisions": len(sel), **dict(sorted(c.items()))}
    missed = collections.Counter(f'{r["kind"]}: {r["reason"]}' for r in rows if r["outcome"] == OUTCOMES[3])
    short = [r["regret"] for r in rows if r["outcome"] == OUTCOMES[1]]
    return {"decisions": len(rows), "by_kind": by_kind, "missed_reasons": dict(missed.most_common()),
            "short_regret_median": sorted(short)[len(short) // 2] if short else None}


def table(s: Mapping[str, Any]) -> str:
    lines = [f"{s['decisions']} decisions", ""]
    head = ["kind", "n"] + [f"{o} (m/-)" for o in OUTCOMES]
    lines.append(" | ".join(head))
    for k, c in s["by_kind"].items():
        cells = [k, str(c["decisions"])]
        for o in OUTCOMES:
            cells.append(f'{c.get(o + ", measured", 0)}/{c.get(o + ", not measured", 0)}')
        lines.append(" | ".join(cells))
    lines += ["", "m: a configuration within 5 % of the load's optimum was measured since the previous decision; "
              "-: none was", "", "kept although the load had > 5 % to gain, by the engine's reason:"]
    lines += [f"  {n:4d}  {k}" for k, n in s["missed_reasons"].items()]
    if s["short_regret_median"] is not None:
        lines.append(f"median regret of the deployments more than 5 % short: {s['short_regret_median']:.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", type=int, required=True, help="landscapes (moving family)")
    ap.add_argument("--family-seed", type=int, required=True)
    ap.add_argument("--seeds", type=int, default=2, help="runs per landscape")
    ap.add_argument("--horizon", type=int, default=300)
    ap.add_argument("--policy", default=str(HERE.parent / "policies" / "sim-default.toml"))
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.family < 1 or a.seeds < 1 or a.horizon < 10:
        ap.error("--family and --seeds must be >= 1 and --horizon >= 10")
    pol = load_policy(a.policy)
    tasks = [(f"family-moving:{a.family_seed}:{i}", pol, s, a.horizon) for i in range(a.family) for s in range(a.seeds)]
    t0 = time.monotonic()
    rows = [row for rs in TQ._pool_map(run_one, tasks, a.jobs) for row in rs]
    s = summary(rows)
    if a.json:
        print(json.dumps({"summary": s, "rows": rows}, indent=1, default=str))
    else:
        print(table(s))
        print(f"\n({len(tasks)} runs, {time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

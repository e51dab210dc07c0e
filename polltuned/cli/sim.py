"""``polltuned sim``: run the real engine (Engine + HostEnv + Actuator + Journal + guard +
confirmation) against a simulated scenario on a fake /proc + /sys tree.

The fake tree is a temporary directory (or ``--host-root`` when given) whose knob files start at
the kernel defaults; the scenario reads the live knob values back each window. The journal and the
study go to a temporary state directory unless ``--state-dir`` is given. Never touches the real
kernel: ``--host-root /`` is refused.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from polltuned.actuator import build_actuator
from polltuned.cli._types import SEED, int_range
from polltuned.cli.main import DEFAULT_STATE_DIR
from polltuned.clock import FakeClock
from polltuned.engine.builder import build_engine, build_env, prepare_policy
from polltuned.engine.driver import drive
from polltuned.engine.phases import Event, Phase
from polltuned.errors import ExitCode, UsageError
from polltuned.host.fs import FsHost
from polltuned.objective import value_of
from polltuned.optimiser import OPTIMISERS
from polltuned.policy.loader import load_policy
from polltuned.policy.schema import SimProbe as SimProbeConfig
from polltuned.probes.sim import SimProbe, make_fake_host_tree
from polltuned.study import open_local
from polltuned.worlds.scenario import load_scenario, shipped_names

if TYPE_CHECKING:
    from polltuned.clock import Clock
    from polltuned.engine.session import TuningResult
    from polltuned.policy.schema import Policy
    from polltuned.worlds.scenario import Scenario



def _optimisers() -> list[str]:
    return list(OPTIMISERS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", help="scenario .py file, shipped name, or family:SEED:INDEX (a random landscape) "
                   "(default: the policy's probe.scenario)")
    p.add_argument("--policy", default="sim-default", help="policy name or file (default sim-default)")
    p.add_argument("--trials", type=int_range(1, 10_000), default=None, metavar="N",
                   help="budget in measurement windows, 1..10000 (default: the policy's tuning.budget)")
    p.add_argument("--seed", type=SEED, default=0, metavar="N", help="noise and optimiser seed, 0..2^32-1 (default 0)")
    p.add_argument("--optimiser", choices=_optimisers(), default=None,
                   help="search method (default: the policy's tuning.optimiser)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--list", action="store_true", help="list the shipped scenarios and exit")
    p.add_argument("--quiet", action="store_true", help="no per-step progress lines")


def run(args: argparse.Namespace) -> int:
    if args.list:
        for name in shipped_names():
            sc = load_scenario(name)
            first = sc.doc.splitlines()[0] if sc.doc else ""
            print(f"{name}: {first}")
        print("family:SEED:INDEX: landscape INDEX of the random scenario family SEED (polltuned.worlds.family)")
        return int(ExitCode.OK)
    pol = load_policy(args.policy)
    scen = args.scenario
    if scen is None:
        if getattr(pol.probe, "kind", None) != "sim":
            raise UsageError(f"policy {pol.name}: probe kind is {pol.probe.kind!r}, not 'sim'; give --scenario")
        scen = pol.probe.scenario  # type: ignore[union-attr]
    scenario = load_scenario(scen)
    upd: dict[str, object] = {"seed": args.seed}
    if args.trials is not None:
        if args.trials < 1:
            raise UsageError(f"--trials: must be >= 1 (got {args.trials})")
        upd["budget"] = args.trials
    if args.optimiser:
        upd["optimiser"] = args.optimiser
    pol = pol.model_copy(update={"tuning": pol.tuning.model_copy(update=upd)})

    tmp = tempfile.TemporaryDirectory(prefix="polltuned-sim-")
    try:
        host_root = Path(args.host_root) if args.host_root not in (None, "/") else Path(tmp.name) / "root"
        if host_root.resolve() == Path("/"):
            raise UsageError("--host-root /: sim never runs against the real kernel tree")

        state = Path(tmp.name) / "state" if args.state_dir in (None, DEFAULT_STATE_DIR) else Path(args.state_dir)
        result, events = simulate(pol, scenario, host_root, state, seed=args.seed, clock=FakeClock(),
                                  progress=None if (args.json or args.quiet) else sys.stderr)
    finally:
        tmp.cleanup()
    assert result is not None
    exp = {name: value_of(scenario.expected(cfg), pol.objective)
           for name, cfg in (("baseline", result.baseline_config), ("best", result.best_config),
                             ("deployed", result.deployed))}
    if args.json:
        out = result.to_json()
        out["scenario"] = scenario.name
        out["expected_J"] = exp
        out["events"] = events
        print(json.dumps(out, indent=1, default=str))
    else:
        changed = {k: v for k, v in result.deployed.items() if result.baseline_config.get(k) != v}
        print(f"scenario {scenario.name}, policy {pol.name}, {result.windows_used} windows, seed {args.seed}")
        print(f"trials: {len(result.trials)} "
              f"({sum(t.status == 'ok' for t in result.trials)} ok, "
              f"{sum(t.status == 'aborted' for t in result.trials)} aborted by the guard, "
              f"{sum(t.status == 'failed' for t in result.trials)} failed)")
        print(result.reason)
        print("deployed: " + (", ".join(f"{k}={v}" for k, v in changed.items()) or "the baseline (nothing changed)"))
        print(f"expected J (noise-free): baseline {exp['baseline']:.4g}, deployed {exp['deployed']:.4g}")
    return int(ExitCode.OK)


def simulate(pol: Policy, scenario: Scenario, host_root: Path, state_dir: Path, *, seed: int, clock: Clock,
             progress: TextIO | None = None) -> tuple[TuningResult | None, list[dict[str, object]]]:
    """Build Actuator + Journal + SimProbe + HostEnv on a fake tree (the engine's one builder) and
    drive the engine."""

    clk = clock
    make_fake_host_tree(host_root, pol.knobs)
    host = FsHost(host_root)
    state_dir.mkdir(parents=True, exist_ok=True)
    actuator = build_actuator(host, state_dir, clk, app_cpus=pol.app_cpus)
    journal = actuator.journal
    probe = SimProbe(host, pol, scenario, seed, clock=clk)
    # the world is measured by the sim probe (fresh sockets every window), whatever the policy's
    # own probe: the knobs it can see are judged with that probe
    sim_ref = scenario.name if scenario.name.startswith("family:") else str(scenario.path)
    pol = pol.model_copy(update={"probe": SimProbeConfig(kind="sim", scenario=sim_ref)})
    # knobs the fake tree lacks (per-NAPI netlink) are left out, as on a host
    pol, dropped = prepare_policy(pol, actuator)
    for key, why in dropped.items():
        if progress is not None:
            print(f"knob {key} dropped: {why}", file=progress)
    env = build_env(pol, actuator, probe, clk)
    engine = build_engine(pol, env, open_local(state_dir, pol), clk, dropped=dropped)
    events: list[dict[str, object]] = []

    def on_event(ev: Event) -> None:
        events.append(ev.to_json())
        if progress is not None and ev.phase in (Phase.BASELINE, Phase.SCORE, Phase.ROLLBACK, Phase.CONFIRM,
                                                 Phase.RESUME, Phase.OBSERVE, Phase.DONE):
            print(f"[{ev.phase}] {ev.message}", file=progress)

    try:
        result = drive(engine, env, on_event=on_event)
    finally:
        close = getattr(journal, "close", None)
        if callable(close):
            close()
    return result, events

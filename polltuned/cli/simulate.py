"""``polltuned run --simulate SCENARIO``: the real daemon, a shipped (or any) policy, a simulated world.

The policy keeps its knobs, objective, tuning, guard, confirmation and hold settings; only its probe
is replaced by the sim probe of SCENARIO (a shipped scenario name or a .py file, see
``polltuned sim --list``), which reads the knob values the daemon applied back from the tree. Knobs
are fitted to the tree exactly as on a real host (``polltuned.engine.compat``), so a fake tree of an
older kernel shows what the daemon would drop there.

Never the real kernel: ``--host-root`` must name a fake /proc + /sys tree; without it a temporary
tree with the policy's knob files at kernel defaults is made. The journal, study, status file and
lock go to a temporary directory unless ``--state-dir`` / ``--run-dir`` are given (so a simulated
run can never share a journal with the real daemon). Time is simulated: windows and settle times
take ``1/--sim-speed`` of their wall time (0 = no waiting at all).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from polltuned.cli.main import DEFAULT_RUN_DIR, DEFAULT_STATE_DIR
from polltuned.errors import UsageError
from polltuned.policy.schema import Policy, SimProbe
from polltuned.probes.sim import make_fake_host_tree
from polltuned.worlds.scenario import load_scenario

log = logging.getLogger("polltuned.daemon")


@dataclass
class Simulation:
    scenario: str
    host_root: str
    state_dir: str
    run_dir: str
    tmp: tempfile.TemporaryDirectory[str] | None

    def swap_probe(self, policy: Policy) -> Policy:
        """The policy with its probe replaced by the scenario's sim probe."""
        return policy.model_copy(update={"probe": SimProbe(kind="sim", scenario=self.scenario)})

    def close(self) -> None:
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None


def prepare(args: argparse.Namespace, policy: Policy) -> Simulation:
    """Check the scenario, choose (or make) the fake tree and the temporary state/run dirs."""

    load_scenario(args.simulate)  # UsageError (exit 2) for an unknown scenario, before anything else
    if args.sim_speed < 0:
        raise UsageError(f"--sim-speed: must be >= 0 (got {args.sim_speed:g})")
    tmp: tempfile.TemporaryDirectory[str] | None = None

    def scratch() -> Path:
        nonlocal tmp
        if tmp is None:
            tmp = tempfile.TemporaryDirectory(prefix="polltuned-simulate-")
        return Path(tmp.name)

    if args.host_root in (None, "/"):
        root = scratch() / "root"
        make_fake_host_tree(root, policy.knobs)
    else:
        root = Path(args.host_root)
        if root.resolve() == Path("/"):
            raise UsageError("--host-root /: --simulate never runs against the real kernel tree")
    state = scratch() / "state" if args.state_dir in (None, DEFAULT_STATE_DIR) else Path(args.state_dir)
    run = scratch() / "run" if args.run_dir in (None, DEFAULT_RUN_DIR) else Path(args.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    log.info("simulated world: scenario %s on the fake tree %s (state %s, run dir %s)", args.simulate, root,
             state, run)
    return Simulation(args.simulate, str(root), str(state), str(run), tmp)

"""SIGKILL `rollback` at random moments, then roll back again: count what the second rollback got wrong.

    .venv/bin/python benchmarks/rollback_kills.py --seed 5 --iterations 400

The same loop as tests/test_crash_rollback.py::test_sigkill_during_rollback_then_rollback_again, ten
times longer, on a fake tree in /dev/shm: apply 1-3 random assignments, fork a rollback, SIGKILL it
after 0-4 ms, run a second rollback in this process. A correct second rollback restores every
original and releases nothing (nobody but polltuned touched the tree). Prints, per outcome, how
many iterations ended that way, and one line per wrong release (knob and the value it found).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_crash_rollback import rollback_killed_then_again
from tests.test_knobs_faketree import make_tree, tree_values


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=400)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="ptk-rbkill-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None))
    counts = {"killed": 0, "released": 0, "failed": 0, "not-restored": 0}
    try:
        root = make_tree(base / "root")
        originals = tree_values(root)
        for i in range(args.iterations):
            state = base / f"rb{i}"
            killed, rep = rollback_killed_then_again(root, state, rng)
            counts["killed"] += killed
            released = [x for x in rep.items if x.outcome == "released"]
            for x in released:
                print(f"iteration {i}: {x.key} released, found {x.value!r}")
            counts["released"] += bool(released)
            counts["failed"] += not rep.ok
            if released:   # put the tree back for the next iteration
                for rel, text in originals.items():
                    (root / rel).write_text(text)
            elif tree_values(root) != originals:
                counts["not-restored"] += 1
                for rel, text in originals.items():
                    (root / rel).write_text(text)
            shutil.rmtree(state)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"seed {args.seed}: {args.iterations} iterations, {counts['killed']} rollbacks SIGKILLed; second rollback: "
          f"{counts['released']} wrong releases, {counts['failed']} failed, {counts['not-restored']} not restored")
    return 0 if counts["released"] == counts["failed"] == counts["not-restored"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

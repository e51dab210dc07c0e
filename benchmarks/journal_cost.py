"""What the journal (with its baseline copy) costs per knob change, on a fake tree on real disk.

Every record is fsync'd; the baseline copy (journal.baselines.json) is replaced atomically
(fsync'd temporary file, rename, directory fsync) only when a transaction journals a new baseline.
Prints one JSON document with the median wall time (ms) of:

* ``apply_first_touch``: an apply of 3 knobs never touched in the epoch (epoch, txn, 3 baselines,
  the copy, 3 x intent/write/read-back/applied, txn-end);
* ``apply_repeat``: an apply of the same 3 knobs again (no baseline: the copy is only compared);
* ``rollback``: restoring the 3 knobs and closing the epoch (the copy is closed);
* ``fsyncs``: fsync(2) calls of each of the first three (load-independent);
* ``state``: one ``Journal.state()`` (read + parse + replay + cross-check with the copy) of a
  journal of ~100 transactions.

    .venv/bin/python benchmarks/journal_cost.py [--runs 30] [--dir DIR]

``--dir`` must be on the file system under test (default: a temporary directory in /var/tmp).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from polltuned.actuator import Actuator, build_actuator
from polltuned.clock import FakeClock
from polltuned.host.fs import FsHost
from tests.test_knobs_faketree import make_tree

KNOBS = ("net.core.busy_poll", "net.core.busy_read", "eth0:gro_flush_timeout")


def actuator(root: Path, state: Path) -> Actuator:
    c = FakeClock()
    h = FsHost(root)
    return build_actuator(h, state, c, app_cpus=[1])


FSYNCS = [0]
_real_fsync = os.fsync


def _counting_fsync(fd: Any) -> None:
    FSYNCS[0] += 1
    _real_fsync(fd)


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000.0


def fsyncs(fn: Callable[[], object]) -> int:
    """fsync(2) calls made by ``fn`` (load-independent, unlike the wall times)."""
    before = FSYNCS[0]
    fn()
    return FSYNCS[0] - before


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30, help="repetitions per measurement (default 30)")
    ap.add_argument("--dir", default="/var/tmp", help="parent directory of the temporary tree")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="polltuned-journal-cost-", dir=args.dir))
    os.fsync = _counting_fsync  # the journal calls os.fsync; counting changes nothing else
    try:
        root = make_tree(base / "root")
        c = actuator(root, base / "count")
        counts = {"apply_first_touch": fsyncs(lambda: c.apply({k: 1 for k in KNOBS})),
                  "apply_repeat": fsyncs(lambda: c.apply({k: 2 for k in KNOBS})),
                  "rollback": fsyncs(c.rollback)}
        first, repeat, rollback = [], [], []
        for i in range(args.runs):
            a = actuator(root, base / f"st{i}")
            first.append(timed(lambda a=a, i=i: a.apply({k: 10 + i for k in KNOBS})))  # type: ignore[misc]
            repeat.append(timed(lambda a=a, i=i: a.apply({k: 20 + i for k in KNOBS})))  # type: ignore[misc]
            rollback.append(timed(a.rollback))
        a = actuator(root, base / "long")
        for i in range(100):
            a.apply({k: 30 + i for k in KNOBS})
        state = [timed(a.journal.state) for _ in range(args.runs)]
        a.rollback()
        out = {"runs": args.runs, "dir": args.dir,
               "apply_first_touch_ms": round(statistics.median(first), 2),
               "apply_repeat_ms": round(statistics.median(repeat), 2),
               "rollback_ms": round(statistics.median(rollback), 2),
               "state_100_txn_ms": round(statistics.median(state), 2),
               "journal_bytes_100_txn": a.journal.size(), "fsyncs": counts}
        print(json.dumps(out, indent=1))
    finally:
        os.fsync = _real_fsync
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

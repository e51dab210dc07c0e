"""Replay: windows recorded on a real host, served back by resampling (nearest recorded config).

Reads the JSON lines written by ``polltuned bench --record FILE`` from the file named by the
environment variable POLLTUNED_REPLAY (and, optionally, only the workload named by
POLLTUNED_REPLAY_WORKLOAD). Without it, it uses ``replay_sample.jsonl`` next to this file: a small
SYNTHETIC sample generated from the busypoll_split scenario (see its "workload" field), shipped so
tests and the benchmark have something to replay until a real recording replaces it.
"""

import os
from pathlib import Path

from polltuned.worlds.scenario import ReplayScenario


def create() -> ReplayScenario:
    path = os.environ.get("POLLTUNED_REPLAY") or str(Path(__file__).with_name("replay_sample.jsonl"))
    return ReplayScenario.from_file(path, os.environ.get("POLLTUNED_REPLAY_WORKLOAD") or None)

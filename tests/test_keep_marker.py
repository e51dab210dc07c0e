"""The keep marker (STATE_DIR/kept.json) belongs to one journal epoch (issue 10).

Pure rules of :class:`KeepMarker`, and `rollback --if-dirty` (what ExecStopPost runs) on a fake
tree: it keeps a configuration only when the marker names the journal's open epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polltuned.cli.main import main
from polltuned.daemon.status import KEEP_MARKER, KeepMarker, clear_kept, is_kept, mark_kept, read_kept
from tests.test_knobs_faketree import make_tree

BUSY_POLL = "proc/sys/net/core/busy_poll"


def test_marker_round_trip_names_its_epoch(tmp_path: Path) -> None:
    mark_kept(tmp_path, epoch=3, policy="p", t=12.5)
    m = read_kept(tmp_path)
    assert m == KeepMarker(3, "p", 12.5)
    assert json.loads((tmp_path / KEEP_MARKER).read_text())["epoch"] == 3
    assert is_kept(tmp_path, 3, True)
    assert not is_kept(tmp_path, 4, True), "a marker covered another epoch"
    assert not is_kept(tmp_path, 3, False), "a marker covered a clean journal"
    assert clear_kept(tmp_path) and read_kept(tmp_path) is None and not clear_kept(tmp_path)


def test_legacy_and_damaged_markers(tmp_path: Path) -> None:
    (tmp_path / KEEP_MARKER).write_text('{"policy": "old", "t": 1}')  # written before markers had an epoch
    m = read_kept(tmp_path)
    assert m is not None and m.epoch is None and m.applies_to(7, True) and not m.applies_to(7, False)
    (tmp_path / KEEP_MARKER).write_text('{"epoch": ')  # torn: counts as no marker (so ExecStopPost restores)
    assert read_kept(tmp_path) is None
    (tmp_path / KEEP_MARKER).write_text('{"epoch": true}')
    m = read_kept(tmp_path)
    assert m is not None and m.epoch is None


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    out, _ = capsys.readouterr()
    return rc, out


def _epoch(state: Path) -> int:
    recs = [json.loads(line) for line in (state / "journal.jsonl").read_text().splitlines()]
    return int([r for r in recs if r["type"] == "epoch"][-1]["epoch"])


def test_rollback_if_dirty_keeps_only_the_marked_epoch(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    root = make_tree(tmp_path / "root")
    st = tmp_path / "st"
    g = ["--host-root", str(root), "--state-dir", str(st)]
    assert _cli(capsys, *g, "apply", "net.core.busy_poll=50")[0] == 0
    mark_kept(st, epoch=_epoch(st), policy="p", t=0.0)
    rc, out = _cli(capsys, *g, "rollback", "--if-dirty")
    assert rc == 0 and "keeping the deployed configuration" in out
    assert (root / BUSY_POLL).read_text() == "50\n"

    # a marker from another epoch does not protect this one
    mark_kept(st, epoch=_epoch(st) + 1, policy="p", t=0.0)
    rc, out = _cli(capsys, *g, "rollback", "--if-dirty")
    assert rc == 0 and "net.core.busy_poll: restored 0" in out
    assert (root / BUSY_POLL).read_text() == "0\n"
    assert read_kept(st) is None, "the stale marker was left behind"

    # the journal is clean now: a new epoch opens, and an old marker naming the closed epoch is stale
    old = _epoch(st)
    mark_kept(st, epoch=old, policy="p", t=0.0)
    assert _cli(capsys, *g, "apply", "net.core.busy_poll=60")[0] == 0
    assert _epoch(st) == old + 1
    rc, out = _cli(capsys, *g, "rollback", "--if-dirty")
    assert rc == 0 and "restored 0" in out and (root / BUSY_POLL).read_text() == "0\n"


"""Issue 16, defects 1, 2 and 4: recovery uses every record it has (the baseline copy is
authoritative whenever the journal is short, torn, unreadable or not a file), and the host is never
reported "clean" unless every knob with a known original holds it ("unknown" otherwise)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polltuned.cli.main import main
from polltuned.errors import ExitCode
from polltuned.journal import COPY_NAME, JOURNAL_NAME, parse_copy
from tests.test_crash_rollback import actuator as act
from tests.test_knobs_faketree import make_tree, tree_values

SIX = ["net.core.busy_read=25", "net.core.busy_poll=50", "net.core.gro_normal_batch=16",
       "kernel.timer_migration=0", "net.core.netdev_budget=600", "eth0:gro_flush_timeout=20000"]
BR = "proc/sys/net/core/busy_read"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "root")


def cli(capsys: pytest.CaptureFixture[str], root: Path, state: Path, *argv: str) -> tuple[int, str, str]:
    rc = main(["--host-root", str(root), "--state-dir", str(state), "--run-dir", str(state.parent / "run"), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_half_truncated_journal_restores_all_six_from_the_copy(root: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Defect 1: a journal cut to half its size lost the records of polltuned's last writes; the
    knobs are restored (not "released" as admin changes) and status never says clean."""
    st = tmp_path / "st"
    originals = tree_values(root)
    assert cli(capsys, root, st, "apply", *SIX)[0] == 0
    tuned = tree_values(root)
    jp = st / JOURNAL_NAME
    data = jp.read_bytes()
    jp.write_bytes(data[: len(data) // 2])
    rc, out, _ = cli(capsys, root, st, "status")
    assert rc != 0 and "clean" not in out
    rc, out, _ = cli(capsys, root, st, "verify")
    assert rc != 0 and "released" not in out and "admin-changed" not in out
    assert tree_values(root) == tuned  # status/verify wrote nothing
    rc, out, err = cli(capsys, root, st, "rollback")
    assert rc == int(ExitCode.JOURNAL), (out, err)
    assert tree_values(root) == originals, out
    assert "released" not in out
    rc, out, _ = cli(capsys, root, st, "status")
    assert rc == 0 and "clean" in out


def test_journal_cut_at_a_record_boundary_after_a_later_apply(root: Path, tmp_path: Path) -> None:
    """The journal lost a whole later transaction (cut exactly at a record boundary): the live values
    are polltuned's later writes, not admin changes -> restored, none released."""
    st = tmp_path / "st"
    originals = tree_values(root)
    a = act(root, st)
    a.apply({"net.core.busy_poll": 50, "net.core.busy_read": 25})
    cut = (st / JOURNAL_NAME).stat().st_size
    a.apply({"net.core.busy_poll": 70, "net.core.busy_read": 30})
    jp = st / JOURNAL_NAME
    jp.write_bytes(jp.read_bytes()[:cut])
    with pytest.raises(Exception) as ei:
        act(root, st).rollback()
    rep = getattr(ei.value, "report", None)
    assert rep is not None and {i.outcome for i in rep.items} == {"restored"}, ei.value
    assert tree_values(root) == originals


@pytest.mark.parametrize("flag", [[], ["--if-dirty"]])
def test_journal_replaced_by_a_directory_is_restored_from_the_copy(root: Path, tmp_path: Path, flag: list[str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Defect 2: the journal cannot be opened (a directory): the intact copy is used."""
    st = tmp_path / "st"
    originals = tree_values(root)
    assert cli(capsys, root, st, "apply", *SIX)[0] == 0
    (st / JOURNAL_NAME).unlink()
    (st / JOURNAL_NAME).mkdir()
    rc, out, _ = cli(capsys, root, st, "status")
    assert rc != 0 and "clean" not in out
    rc, out, err = cli(capsys, root, st, "rollback", *flag)
    assert rc == int(ExitCode.JOURNAL) and "[from the baseline copy]" in out, (out, err)
    assert tree_values(root) == originals


@pytest.mark.parametrize("damage", ["both-emptied", "journal-emptied-copy-deleted", "copy-deleted"])
def test_never_clean_when_the_records_are_gone(root: Path, tmp_path: Path, damage: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Defect 4: journal and copy both emptied (or the copy deleted): status and verify say the
    state is unknown and exit non-zero; never "clean" / "no managed knobs"."""
    st = tmp_path / "st"
    assert cli(capsys, root, st, "apply", *SIX)[0] == 0
    if damage == "both-emptied":
        (st / JOURNAL_NAME).write_bytes(b"")
        (st / COPY_NAME).write_bytes(b"")
    elif damage == "journal-emptied-copy-deleted":
        (st / JOURNAL_NAME).write_bytes(b"")
        (st / COPY_NAME).unlink()
    else:
        (st / COPY_NAME).unlink()
        jp = st / JOURNAL_NAME
        lines = jp.read_bytes().splitlines(keepends=True)
        jp.write_bytes(b"".join(lines[: len(lines) - 3]))  # and the journal lost its tail
    rc, out, _ = cli(capsys, root, st, "status")
    # a journal that still records polltuned values is DIRTY; otherwise the state is UNKNOWN
    assert rc != 0 and "is clean" not in out and "clean:" not in out
    assert "UNKNOWN" in out or (damage == "copy-deleted" and "DIRTY" in out), out
    rc, out, _ = cli(capsys, root, st, "verify")
    assert rc != 0 and "is clean" not in out and "clean:" not in out and "unknown" in out, out
    rc, out, err = cli(capsys, root, st, "rollback")
    assert rc != 0 and "unknown" in (out + err)
    rc, out, _ = cli(capsys, root, st, "status")  # still unknown: nothing proves the host clean
    assert rc != 0 and "is clean" not in out
    assert cli(capsys, root, st, "apply", "net.core.busy_poll=1")[0] == int(ExitCode.JOURNAL)
    # the admin checks the knobs by hand, then says so
    rc, out, _ = cli(capsys, root, st, "rollback", "--accept-unknown")
    assert rc == 0 and "known again" in out
    rc, out, _ = cli(capsys, root, st, "status")
    assert rc == 0 and "host is clean" in out


def test_missing_copy_rollback_restores_what_the_journal_knows(root: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The copy deleted and the journal's tail lost: the journal cannot be proven complete, so a
    knob whose live value differs from its last recorded write is restored (said, one line per
    knob), not released."""
    st = tmp_path / "st"
    originals = tree_values(root)
    a = act(root, st)
    a.apply({"net.core.busy_poll": 50, "net.core.busy_read": 25})
    cut = (st / JOURNAL_NAME).stat().st_size
    a.apply({"net.core.busy_poll": 70, "net.core.busy_read": 30})
    jp = st / JOURNAL_NAME
    jp.write_bytes(jp.read_bytes()[:cut])
    (st / COPY_NAME).unlink()
    rc, out, _ = cli(capsys, root, st, "rollback")
    assert tree_values(root) == originals
    assert rc == int(ExitCode.JOURNAL) and "released" not in out
    assert sum("record of polltuned's last write is lost" in ln for ln in out.splitlines()) == 2, out


def test_clean_after_a_release_says_so(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Defect 4, second half: after a rollback that left an admin-changed knob alone, status does not
    claim every knob has its original value."""
    st = tmp_path / "st"
    assert cli(capsys, root, st, "apply", "net.core.busy_poll=50", "net.core.busy_read=25")[0] == 0
    (root / BR).write_text("33\n")  # the admin
    rc, out, _ = cli(capsys, root, st, "rollback")
    assert rc == 0 and "net.core.busy_read: released" in out
    rc, out, _ = cli(capsys, root, st, "status")
    assert rc == 0 and "every knob has its original value" not in out
    assert "net.core.busy_read" in out and "admin" in out
    rc, out, _ = cli(capsys, root, st, "status", "--json")
    assert json.loads(out)["journal"]["released_to_admin"] == ["net.core.busy_read"]


def test_copy_carries_the_journal_length(root: Path, tmp_path: Path) -> None:
    """The mark that makes a short journal detectable: the copy records how many records the
    journal had at its last complete transaction."""
    st = tmp_path / "st"
    a = act(root, st)
    a.apply({"net.core.busy_poll": 50})
    n = len((st / JOURNAL_NAME).read_bytes().splitlines())
    assert parse_copy((st / COPY_NAME).read_bytes()).seq == n
    a.rollback()
    n = len((st / JOURNAL_NAME).read_bytes().splitlines())
    assert parse_copy((st / COPY_NAME).read_bytes()).seq == n
    shutil.rmtree(st)

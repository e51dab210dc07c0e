"""Journal damage: the baseline copy (journal.baselines.json), the cross-check at load, rollback
from the copy, and the CLI's three answers (clean / dirty / damaged) — a damaged journal is never
reported as clean, and the originals survive the loss of the journal's head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polltuned.actuator import JournalRecovered
from polltuned.cli.main import main
from polltuned.clock import FakeClock
from polltuned.errors import ExitCode, JournalCopiesDisagree, JournalError
from polltuned.journal import (
    COPY_NAME,
    JOURNAL_NAME,
    BaselineCopy,
    CopyEntry,
    Journal,
    cross_check,
    encode_copy,
    encode_record,
    parse_copy,
    parse_journal,
    recovery_state,
    replay,
    salvage_records,
)
from tests.test_crash_rollback import actuator as act
from tests.test_knobs_faketree import make_tree, tree_values

BP = "proc/sys/net/core/busy_poll"
BR = "proc/sys/net/core/busy_read"
GFT = "sys/class/net/eth0/gro_flush_timeout"


def rec(seq: int, type_: str, **kw: object) -> dict[str, object]:
    return {"v": 1, "seq": seq, "t": 1.0, "type": type_, **kw}


def lines(*recs: dict[str, object]) -> bytes:
    return b"".join(encode_record(r) for r in recs)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "root")


def cli(capsys: pytest.CaptureFixture[str], root: Path, state: Path, *argv: str) -> tuple[int, str, str]:
    rc = main(["--host-root", str(root), "--state-dir", str(state), "--run-dir", str(state.parent / "run"), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("polltuned: error[")]


# -- pure parts -----------------------------------------------------------------------------------

def test_copy_roundtrip_and_damage() -> None:
    c = BaselineCopy(3, True, (CopyEntry("net.core.busy_poll", 0, 0, "sysctl"),
                               CopyEntry("eth0:gro_flush_timeout", {"sysfs": 0, "napi": {"257": 0}}, 0, "netdev")))
    data = encode_copy(c)
    assert parse_copy(data) == c
    with pytest.raises(JournalError, match="checksum mismatch"):
        parse_copy(data.replace(b'"state":0', b'"state":7'))
    with pytest.raises(JournalError, match="not valid JSON"):
        parse_copy(data[:20])
    with pytest.raises(JournalError, match="newer polltuned"):
        parse_copy(encode_record({"v": 2, "epoch": 1, "open": True, "baselines": []}))


def test_write_without_baseline_is_corruption_not_emptiness() -> None:
    data = lines(rec(1, "epoch", epoch=1), rec(2, "txn", txn=1, reason="x", keys=["k"]),
                 rec(3, "intent", key="k", value=5, txn=1), rec(4, "applied", key="k", value=5, txn=1))
    with pytest.raises(JournalError, match="record 3: intent of 'k' without its baseline record"):
        replay(parse_journal(data).records)
    # and outside any epoch
    with pytest.raises(JournalError, match="without its baseline"):
        replay(parse_journal(lines(rec(1, "applied", key="k", value=5, txn=1))).records)


def test_cross_check_rules() -> None:
    base = [rec(1, "epoch", epoch=2), rec(2, "txn", txn=1, reason="", keys=["a", "b"]),
            rec(3, "baseline", key="a", state=0, value=0), rec(4, "baseline", key="b", state=8, value=8),
            rec(5, "intent", key="a", value=50, txn=1), rec(6, "applied", key="a", value=50, txn=1)]
    copy = BaselineCopy(2, True, (CopyEntry("a", 0, 0), CopyEntry("b", 8, 8)))
    st = replay(tuple(base))
    cross_check(st, copy)
    assert st.copy_note == "" and st.copy_epoch == 2
    # the journal lost the baseline of b (cut inside it): corrupt
    with pytest.raises(JournalError, match="baseline records of b missing"):
        cross_check(replay(tuple(base[:3])), copy)
    # the journal was emptied: corrupt
    with pytest.raises(JournalError, match="no baseline records for epoch 2"):
        cross_check(replay(()), copy)
    # same key, different original: reported, never resolved
    with pytest.raises(JournalCopiesDisagree, match="a: the journal and the baseline copy disagree"):
        cross_check(replay(tuple(base)), BaselineCopy(2, True, (CopyEntry("a", 9, 9), CopyEntry("b", 8, 8))))
    # crash after the journal's clean record, before the copy was closed: benign
    st2 = replay((*base, rec(7, "clean", epoch=2)))
    cross_check(st2, copy)
    assert st2.copy_note == ""
    # a copy that misses a knob the journal wrote (stale copy): a note, the journal is used
    st3 = replay(tuple(base))
    cross_check(st3, BaselineCopy(2, True, (CopyEntry("b", 8, 8),)))
    assert "lacks a" in st3.copy_note
    # crash between the journal's baseline and the copy (no write yet): consistent
    st4 = replay(tuple(base[:4]))
    cross_check(st4, BaselineCopy(1, False))
    assert st4.copy_note == ""


def test_salvage_and_recovery_state() -> None:
    full = lines(rec(1, "epoch", epoch=4), rec(2, "txn", txn=1, reason="", keys=["a", "b", "c"]),
                 rec(3, "baseline", key="a", state=0, value=0), rec(4, "baseline", key="b", state=1, value=1),
                 rec(5, "baseline", key="c", state=2, value=2),
                 rec(6, "intent", key="a", value=50, txn=1), rec(7, "applied", key="a", value=50, txn=1),
                 rec(8, "intent", key="b", value=60, txn=1), rec(9, "applied", key="b", value=60, txn=1),
                 rec(10, "released", key="c", live=7, expected=2))
    copy = BaselineCopy(4, True, (CopyEntry("a", 0, 0), CopyEntry("b", 1, 1), CopyEntry("c", 2, 2)))
    head_lost = b"".join(ln + b"\n" for ln in full.splitlines()[5:])  # epoch, txn and baselines lost
    salv = salvage_records(b"garbage\n" + head_lost + b'{"v":1,"se')
    assert [r["seq"] for r in salv] == [6, 7, 8, 9, 10]
    assert salv and all(r["type"] != "epoch" for r in salv)
    st = recovery_state(copy, salv)
    assert st.open and list(st.knobs) == ["a", "b", "c"]
    assert st.knobs["c"].released and st.knobs["c"].released_live == 7
    # records were lost, so no surviving "applied" is known to be the last write: all unknown
    assert not any(h.settled for h in st.knobs.values())
    assert [h.baseline_value for h in st.knobs.values()] == [0, 1, 2]
    # nothing survived: every knob unknown, so rollback restores each one
    st0 = recovery_state(copy, [])
    assert all(not h.settled for h in st0.knobs.values())
    # a knob the copy lacks: restored only when intact records show it written
    more = salvage_records(lines(rec(11, "baseline", key="d", state=3, value=3),
                                 rec(12, "baseline", key="e", state=4, value=4),
                                 rec(13, "intent", key="e", value=40, txn=2)))
    st2 = recovery_state(copy, salv + more)
    assert list(st2.knobs) == ["a", "b", "c", "e"] and st2.knobs["e"].baseline_value == 4
    # a surviving record closes the epoch: nothing to restore
    assert not recovery_state(copy, [rec(99, "clean", epoch=4)]).open
    with pytest.raises(JournalCopiesDisagree):
        recovery_state(BaselineCopy(4, True, (CopyEntry("a", 5, 5),)), salvage_records(full))


# -- the actuator ---------------------------------------------------------------------------------

def test_copy_is_durable_before_the_first_write(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = tmp_path / "st"
    seen: list[list[str]] = []
    orig = Journal.append

    def spy(self: Journal, type_: str, **payload: object) -> dict[str, object]:
        if type_ == "intent":
            copy = parse_copy((st / COPY_NAME).read_bytes())
            assert copy.open and payload["key"] in copy.key_list()
            seen.append(copy.key_list())
        return orig(self, type_, **payload)

    monkeypatch.setattr(Journal, "append", spy)
    a = act(root, st)
    a.apply({"net.core.busy_poll": 50, "eth0:gro_flush_timeout": 20000})
    a.apply({"net.core.busy_read": 25})
    assert seen[-1] == ["net.core.busy_poll", "eth0:gro_flush_timeout", "net.core.busy_read"]
    copy = parse_copy((st / COPY_NAME).read_bytes())
    assert [e.kind for e in copy.entries] == ["sysctl", "netdev-sysfs", "sysctl"]
    a.rollback()
    closed = parse_copy((st / COPY_NAME).read_bytes())
    assert not closed.open and closed.entries == () and closed.epoch == 1


@pytest.mark.parametrize("damage", ["empty", "deleted", "cut-in-baseline", "head-lost", "bad-crc-baseline"])
def test_damaged_journal_restored_from_the_copy(root: Path, tmp_path: Path, damage: str) -> None:
    st = tmp_path / "st"
    originals = tree_values(root)
    a = act(root, st)
    a.apply({"net.core.busy_poll": 50, "eth0:gro_flush_timeout": 20000}, reason="t1")
    a.apply({"net.core.busy_read": 25, "net.core.busy_poll": 70}, reason="t2")
    jp = st / JOURNAL_NAME
    data = jp.read_bytes()
    recs = data.split(b"\n")
    if damage == "empty":
        jp.write_bytes(b"")
    elif damage == "deleted":
        jp.unlink()
    elif damage == "cut-in-baseline":
        jp.write_bytes(data[: data.index(b'"type":"baseline"') + 5])
    elif damage == "head-lost":
        jp.write_bytes(b"\n".join(recs[4:]))
    else:
        jp.write_bytes(data.replace(b'"value":0', b'"value":9', 1))
    damaged = jp.read_bytes() if jp.exists() else None
    with pytest.raises(JournalError):
        act(root, st).is_dirty()
    with pytest.raises(JournalError):
        act(root, st).apply({"net.core.busy_poll": 1})  # nothing written over a damaged journal
    assert (root / BP).read_text() == "70\n"
    with pytest.raises(JournalRecovered) as ei:
        act(root, st).rollback()
    assert ei.value.report.clean and {i.outcome for i in ei.value.report.items} == {"restored"}
    assert ei.value.exit_code == ExitCode.JOURNAL
    assert tree_values(root) == originals
    if damaged is not None:  # kept for inspection, byte for byte
        assert ei.value.aside is not None and ei.value.aside.read_bytes() == damaged
        assert not jp.exists()
    # afterwards: clean, and a new epoch numbered above the old one
    assert not act(root, st).is_dirty()
    act(root, st).apply({"net.core.busy_poll": 5})
    assert Journal(st, clock=FakeClock()).state().epoch == 2
    act(root, st).rollback()
    assert tree_values(root) == originals


def test_head_loss_honours_releases_that_survive_and_restores_the_rest(root: Path, tmp_path: Path) -> None:
    """After damage a surviving "applied" may not be the last write, so only explicit releases
    survive as admin decisions; a knob the admin changed unnoticed is restored (documented)."""
    st = tmp_path / "st"
    a = act(root, st)
    a.apply({"net.core.busy_poll": 50, "net.core.busy_read": 50, "net.core.gro_normal_batch": 16})
    (root / BR).write_text("33\n")  # the admin; verify notices and journals the release
    assert {r.key: r.state for r in a.verify()}["net.core.busy_read"] == "admin-changed"
    a.apply({"net.core.busy_poll": 60})
    (root / "proc/sys/net/core/gro_normal_batch").write_text("4\n")  # the admin again, unnoticed
    data = (st / JOURNAL_NAME).read_bytes()
    rel = data.index(b'"type":"released"')
    (st / JOURNAL_NAME).write_bytes(data[data.rindex(b"\n", 0, rel) + 1:])  # head lost up to the release
    with pytest.raises(JournalRecovered) as ei:
        act(root, st).rollback()
    out = {i.key: i.outcome for i in ei.value.report.items}
    assert out == {"net.core.busy_poll": "restored", "net.core.busy_read": "released",
                   "net.core.gro_normal_batch": "restored"}
    assert (root / BP).read_text() == "0\n" and (root / BR).read_text() == "33\n"
    assert (root / "proc/sys/net/core/gro_normal_batch").read_text() == "8\n"


def test_copies_that_disagree_are_reported_and_nothing_is_written(root: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    st = tmp_path / "st"
    act(root, st).apply({"net.core.busy_poll": 50})
    jp = st / JOURNAL_NAME
    out = []
    for ln in jp.read_bytes().splitlines():
        r = json.loads(ln)
        if r["type"] == "baseline":
            r["value"] = r["state"] = 7  # an intact (CRC-valid) record with another original
        out.append(encode_record(r))
    jp.write_bytes(b"".join(out))
    before = tree_values(root)
    with pytest.raises(JournalCopiesDisagree, match=r"disagree on the original value .*journal 7.*copy 0"):
        act(root, st).rollback()
    assert tree_values(root) == before
    rc, _, err = cli(capsys, root, st, "rollback")
    assert rc == 7 and len(error_lines(err)) == 1 and "disagree" in err and "move the other aside" in err
    rc, out_s, err = cli(capsys, root, st, "status")
    assert rc == 7 and "UNKNOWN" in out_s and "clean" not in out_s
    assert tree_values(root) == before
    # the admin decides: the copy goes aside -> the journal alone is trusted
    (st / COPY_NAME).rename(st / "copy.distrusted")
    assert act(root, st).rollback().ok and (root / BP).read_text() == "7\n"


def test_no_copy_no_guessing(root: Path, tmp_path: Path) -> None:
    """A damaged journal without a baseline copy (older polltuned): refused, nothing written."""
    st = tmp_path / "st"
    act(root, st).apply({"net.core.busy_poll": 50})
    (st / COPY_NAME).unlink()
    jp = st / JOURNAL_NAME
    jp.write_bytes(jp.read_bytes().replace(b'"value":0', b'"value":9', 1))
    with pytest.raises(JournalError, match="checksum mismatch") as ei:
        act(root, st).rollback()
    assert not isinstance(ei.value, JournalRecovered) and "no baseline copy" in (ei.value.hint or "")
    assert (root / BP).read_text() == "50\n" and jp.exists()


def test_stale_or_damaged_copy_with_an_intact_journal(root: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    st = tmp_path / "st"
    act(root, st).apply({"net.core.busy_poll": 50})
    (st / COPY_NAME).write_bytes(b"{not json")
    rc, out, _ = cli(capsys, root, st, "status")
    assert rc == int(ExitCode.DIRTY) and "DIRTY" in out and "baseline copy damaged" in out
    # issue 16: without its copy the journal cannot be proven complete: no apply over it, a rollback
    # restores what it records and the admin accepts the state (then the copy is whole again)
    with pytest.raises(JournalError, match="nothing is written over a journal"):
        act(root, st).apply({"net.core.busy_read": 5})
    assert act(root, st).rollback().problem is not None
    act(root, st).accept_unknown()
    act(root, st).apply({"net.core.busy_poll": 50})
    act(root, st).apply({"net.core.busy_read": 5})  # the next change rewrites the copy
    assert parse_copy((st / COPY_NAME).read_bytes()).key_list() == ["net.core.busy_poll", "net.core.busy_read"]
    # a crash between the journal's clean record and closing the copy: the journal says clean
    open_copy = (st / COPY_NAME).read_bytes()
    act(root, st).rollback()
    (st / COPY_NAME).write_bytes(open_copy)
    rc, out, _ = cli(capsys, root, st, "status")
    assert rc == 0 and "clean" in out
    assert act(root, st).rollback().clean  # and the copy is closed again
    assert not parse_copy((st / COPY_NAME).read_bytes()).open


def test_failed_restore_keeps_the_damaged_journal_for_the_next_try(root: Path, tmp_path: Path) -> None:
    st = tmp_path / "st"
    act(root, st).apply({"net.core.busy_poll": 50, "net.core.busy_read": 50})
    (st / JOURNAL_NAME).write_bytes(b"")
    (root / BR).unlink()
    (root / BR).mkdir()  # busy_read cannot be read or written (EISDIR), even by root
    with pytest.raises(JournalRecovered) as ei:
        act(root, st).rollback()
    outcomes = {i.key: i.outcome for i in ei.value.report.items}
    assert outcomes == {"net.core.busy_read": "failed", "net.core.busy_poll": "restored"}
    assert not ei.value.report.clean and ei.value.aside is None
    assert (st / JOURNAL_NAME).exists() and parse_copy((st / COPY_NAME).read_bytes()).open
    assert "run `polltuned rollback` again" in (ei.value.hint or "")
    (root / BR).rmdir()
    (root / BR).write_text("50\n")
    with pytest.raises(JournalRecovered) as ei2:
        act(root, st).rollback()
    assert {i.key: i.outcome for i in ei2.value.report.items} == {"net.core.busy_read": "restored",
                                                                 "net.core.busy_poll": "already"}
    assert ei2.value.report.clean and (root / BR).read_text() == "0\n" and (root / BP).read_text() == "0\n"


# -- the CLI --------------------------------------------------------------------------------------

def test_cli_status_verify_rollback_on_an_empty_journal(root: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: busy_poll carries a polltuned value, the journal is empty."""
    st = tmp_path / "st"
    rc, _, _ = cli(capsys, root, st, "apply", "net.core.busy_poll=50")
    assert rc == 0
    (st / JOURNAL_NAME).write_bytes(b"")
    rc, out, err = cli(capsys, root, st, "status")
    assert rc == 7 and "clean" not in out and "DAMAGED" in out
    assert "net.core.busy_poll (live 50, original 0)" in out
    assert error_lines(err) == [ln for ln in err.splitlines() if not ln.startswith("  hint:")]
    assert len(error_lines(err)) == 1 and "error[journal-corrupt]" in err
    rc, out, err = cli(capsys, root, st, "status", "--json")
    doc = json.loads(out)
    assert rc == 7 and doc["host_dirty"] is None and doc["journal"]["state"] == "corrupt"
    assert doc["journal"]["baseline_copy"] == [{"key": "net.core.busy_poll", "original": 0, "live": 50,
                                                "state": "polltuned"}]
    rc, out, err = cli(capsys, root, st, "verify")
    assert rc == 7 and len(error_lines(err)) == 1
    rc, out, err = cli(capsys, root, st, "rollback", "--if-dirty")  # what ExecStopPost runs
    assert rc == 7 and "net.core.busy_poll: restored 0 [from the baseline copy]" in out
    assert len(error_lines(err)) == 1 and "damaged journal kept as" in err
    assert (root / BP).read_text() == "0\n"
    rc, out, _ = cli(capsys, root, st, "status")
    assert rc == 0 and "host is clean" in out
    rc, out, _ = cli(capsys, root, st, "rollback", "--json")
    assert rc == 0 and json.loads(out)["was_dirty"] is False


def test_cli_rollback_json_reports_the_recovery(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    st = tmp_path / "st"
    cli(capsys, root, st, "apply", "net.core.busy_poll=50", "eth0:gro_flush_timeout=20000")
    data = (st / JOURNAL_NAME).read_bytes()
    (st / JOURNAL_NAME).write_bytes(data[: data.index(b'"type":"baseline"') + 5])  # cut inside a baseline
    rc, out, err = cli(capsys, root, st, "rollback", "--json")
    doc = json.loads(out)
    assert rc == 7 and doc["restored_from_copy"] and doc["clean"]
    assert "baseline records of" in doc["journal_error"] and doc["damaged_journal"].endswith(".damaged-1")
    assert sorted(i["key"] for i in doc["items"]) == ["eth0:gro_flush_timeout", "net.core.busy_poll"]
    assert len(error_lines(err)) == 1


@pytest.mark.slow
def test_real_daemon_killed_then_journal_head_lost(tmp_path: Path) -> None:
    """kill -9 of a daemon holding a deployed configuration, then the journal loses its head:
    status says DAMAGED (exit 7), the daemon refuses to start on it (one line, nothing written),
    and what ExecStopPost runs restores every original from the baseline copy."""
    from tests.test_daemon_process import World, _wait_phase

    w = World(tmp_path)
    try:
        proc = w.start()
        try:
            w.wait_for("READY=1")
            _wait_phase(w, "HOLD")
        finally:
            proc.kill()
            proc.wait()
        tuned = w.snapshot()
        assert tuned != w.originals
        jp = w.state / JOURNAL_NAME
        data = jp.read_bytes()
        jp.write_bytes(data[len(data) // 2:])  # head lost mid-record
        st = w.cli("status")
        assert st.returncode == 7 and "DAMAGED" in st.stdout and "clean" not in st.stdout
        assert len(error_lines(st.stderr)) == 1
        run = w.cli("run", "--config", str(w.config))
        assert run.returncode == 7 and len(error_lines(run.stderr)) == 1 and "Traceback" not in run.stderr
        assert w.snapshot() == tuned  # the daemon wrote nothing over a damaged journal
        rb = w.cli("rollback", "--if-dirty")
        assert rb.returncode == 7 and "[from the baseline copy]" in rb.stdout and len(error_lines(rb.stderr)) == 1
        assert w.snapshot() == w.originals
        again = w.cli("status")
        assert again.returncode == 0 and "host is clean" in again.stdout
    finally:
        w.close()

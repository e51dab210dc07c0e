"""The baseline copy (journal.baselines.json) meets per-part ownership and baseline extensions (the
merge of the ``cli`` and ``watch`` work): an extension reaches the copy before polltuned writes the
new components, a copy stale by an extension is a note while a journal that lost an extension is
damage, a recovery from the copy honours IRQ-by-IRQ releases and restores re-created NAPIs, and
the recovery's rollback loop journals its intents through ``record`` (never into the damaged file).
All on fake /proc+/sys trees."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from polltuned.actuator import JournalRecovered
from polltuned.clock import FakeClock
from polltuned.errors import JournalCopiesDisagree, JournalError
from polltuned.journal import (
    COPY_NAME,
    JOURNAL_NAME,
    BaselineCopy,
    CopyEntry,
    Journal,
    baseline_relation,
    cross_check,
    encode_record,
    parse_copy,
    parse_journal,
    recovery_state,
    replay,
    salvage_records,
)
from tests.test_crash_rollback import actuator as act
from tests.test_journal_damage import rec
from tests.test_knobs_faketree import make_tree
from tests.test_watch import link_flap, napi_values

NAPI = "eth0:napi:defer-hard-irqs"
IRQ = "eth0:irq_affinity"
BUSY = "net.core.busy_poll"




def irq(root: Path, n: int) -> str:
    return (root / f"proc/irq/{n}/smp_affinity_list").read_text()


def journal_lines(state: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in (state / JOURNAL_NAME).read_text().splitlines()]


# -- pure parts -----------------------------------------------------------------------------------

def test_baseline_relation_tells_an_extension_from_another_original() -> None:
    orig = {"sysfs": 0, "napi": {"257": 0, "258": 0}}
    ext = {"sysfs": 0, "napi": {"257": 0, "258": 0, "259": 0}}
    assert baseline_relation(orig, 0, orig, 0) == "same"
    assert baseline_relation(orig, 0, orig, 5) == "differ"            # same components, other value
    assert baseline_relation(ext, 0, orig, 0) == "copy-stale"         # the journal extended it later
    assert baseline_relation(orig, 0, ext, 0) == "copy-newer"         # the journal lost the extension
    # an extension may change the read() form (IRQ affinity lists the new IRQ)
    assert baseline_relation({"38": "0-1"}, "38:0-1", {"38": "0-1", "40": "0"}, "38:0-1;40:0") == "copy-newer"
    # a known component with another value is never an extension
    assert baseline_relation({"napi": {"257": 0, "259": 0}}, 0, {"napi": {"257": 7}}, 0) == "differ"
    assert baseline_relation({"38": "0-1"}, "x", {"38": "0", "40": "0"}, "y") == "differ"
    assert baseline_relation(0, 0, 7, 7) == "differ"


def test_replay_and_cross_check_with_extensions() -> None:
    s0 = {"napi": {"257": 0}}
    s1 = {"napi": {"257": 0, "259": 0}}
    base = (rec(1, "epoch", epoch=1), rec(2, "txn", txn=1, reason="", keys=["n"]),
            rec(3, "baseline", key="n", state=s0, value=0), rec(4, "intent", key="n", value=10, txn=1),
            rec(5, "applied", key="n", value=10, txn=1), rec(6, "txn", txn=2, reason="", keys=["n"]),
            rec(7, "baseline", key="n", state=s1, value=0, extend=True))
    st = replay(base)
    assert st.knobs["n"].baseline_state == s1 and st.knobs["n"].order == 0
    # the copy holds the extension: consistent
    st = replay(base)
    cross_check(st, BaselineCopy(1, True, (CopyEntry("n", s1, 0),)))
    assert st.copy_note == ""
    # a crash between the extension record and the copy: a stale copy, a note, the journal is used
    st = replay(base)
    cross_check(st, BaselineCopy(1, True, (CopyEntry("n", s0, 0),)))
    assert "lacks the baseline extension of n" in st.copy_note
    # the journal lost the extension record the copy has: damage (rollback restores from the copy)
    with pytest.raises(JournalError, match="baseline extension of n is missing") as ei:
        cross_check(replay(base[:6]), BaselineCopy(1, True, (CopyEntry("n", s1, 0),)))
    assert not isinstance(ei.value, JournalCopiesDisagree)
    # another original is still a disagreement
    with pytest.raises(JournalCopiesDisagree):
        cross_check(replay(base), BaselineCopy(1, True, (CopyEntry("n", {"napi": {"257": 3}}, 0),)))
    # an extension without the first-touch baseline before it: records were lost
    with pytest.raises(JournalError, match="baseline extension of 'n' without its baseline record"):
        replay((rec(1, "epoch", epoch=1), rec(2, "baseline", key="n", state=s1, value=0, extend=True)))


def test_recovery_state_with_extensions_and_part_releases() -> None:
    s0 = {"38": "0-1", "39": "0-1"}
    s1 = {"38": "0-1", "39": "0-1", "40": "0-1"}
    full = b"".join(encode_record(r) for r in (
        rec(1, "epoch", epoch=3), rec(2, "txn", txn=1, reason="", keys=["i", "b"]),
        rec(3, "baseline", key="i", state=s0, value="38:0-1;39:0-1"), rec(4, "baseline", key="b", state=0, value=0),
        rec(5, "intent", key="i", value="spread", txn=1), rec(6, "applied", key="i", value="38:0;39:1", txn=1),
        rec(7, "released", key="i", parts=["39"], live={"39": "0"}, expected={"39": "1"}),
        rec(8, "txn", txn=2, reason="", keys=["i"]),
        rec(9, "baseline", key="i", state=s1, value="38:0-1;39:0-1;40:0-1", extend=True),
        rec(10, "intent", key="i", value="spread", txn=2),
        rec(11, "intent", key="i", value="38:0-1;39:0-1;40:0-1", rollback=True),
        # a knob the copy lacks, then extended, then written: restored with its extension
        rec(12, "baseline", key="x", state={"napi": {"1": 0}}, value=0),
        rec(13, "baseline", key="x", state={"napi": {"1": 0, "2": 0}}, value=0, extend=True),
        rec(14, "intent", key="x", value=5, txn=2)))
    copy = BaselineCopy(3, True, (CopyEntry("i", s1, "38:0-1;39:0-1;40:0-1", "irq-affinity"),
                                  CopyEntry("b", 0, 0, "sysctl")))
    # the original record, its extension and the (extended) copy agree: no disagreement
    st = recovery_state(copy, salvage_records(full))
    assert list(st.knobs) == ["i", "b", "x"]
    i = st.knobs["i"]
    assert i.baseline_state == s1 and i.released_parts == frozenset({"39"}) and not i.released
    assert not any(h.settled for h in st.knobs.values())
    assert st.knobs["x"].baseline_state == {"napi": {"1": 0, "2": 0}}
    # a stale copy (crash between the extension record and the copy): the copy is used
    old = BaselineCopy(3, True, (CopyEntry("i", s0, "38:0-1;39:0-1"), CopyEntry("b", 0, 0)))
    assert recovery_state(old, salvage_records(full)).knobs["i"].baseline_state == s0
    # head lost (first records gone): the surviving part release still holds
    head_lost = b"".join(ln + b"\n" for ln in full.splitlines()[6:])
    st2 = recovery_state(copy, salvage_records(head_lost))
    assert st2.knobs["i"].released_parts == frozenset({"39"})
    # a surviving extension that contradicts a known component of the copy: disagreement
    bad = encode_record(rec(9, "baseline", key="i", state={"38": "1", "40": "0-1"}, value="38:1;40:0-1",
                            extend=True))
    with pytest.raises(JournalCopiesDisagree):
        recovery_state(copy, salvage_records(bad))


# -- the actuator ---------------------------------------------------------------------------------

def test_extension_reaches_the_copy_before_the_new_napis_are_written(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_tree(tmp_path / "root")
    st = tmp_path / "st"
    a = act(root, st)
    a.apply({NAPI: 10, BUSY: 50})
    link_flap(root, events=False)                      # NAPIs 257/258 gone, 259/260 at the kernel's 0
    seen: list[object] = []
    orig = Journal.append

    def spy(self: Journal, type_: str, **payload: object) -> dict[str, object]:
        if type_ == "intent" and payload.get("key") == NAPI:
            entry = {e.key: e for e in parse_copy((st / COPY_NAME).read_bytes()).entries}[NAPI]
            seen.append(entry.state)
        return orig(self, type_, **payload)

    monkeypatch.setattr(Journal, "append", spy)
    a.apply({NAPI: 10})
    monkeypatch.setattr(Journal, "append", orig)
    assert seen == [{"napi": {"257": 0, "258": 0, "259": 0, "260": 0}}]
    assert [r["key"] for r in journal_lines(st) if r["type"] == "baseline" and r.get("extend")] == [NAPI]
    assert napi_values(root, "defer-hard-irqs") == {"259": "10", "260": "10"}
    j = Journal(st, clock=FakeClock())
    assert j.state().copy_note == ""
    with j.locked():                                   # a checkpoint keeps journal and copy consistent
        j.compact()
    assert j.state().copy_note == "" and j.state().knobs[NAPI].baseline_state == seen[0]
    rep = a.rollback()
    assert rep.clean and napi_values(root, "defer-hard-irqs") == {"259": "0", "260": "0"}


class _Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs."""


def test_crash_between_the_extension_record_and_the_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after the extension record, before the copy was rewritten (so before any write of the
    new NAPIs): the journal is intact, the copy stale by that extension — a note, not damage and not
    a disagreement; status is dirty, rollback works from the journal and rewrites the copy."""
    root = make_tree(tmp_path / "root")
    st = tmp_path / "st"
    act(root, st).apply({NAPI: 10, BUSY: 50})
    link_flap(root, events=False)

    def killed(self: Journal, st_: object = None) -> bool:
        raise _Killed

    real = Journal.sync_copy
    monkeypatch.setattr(Journal, "sync_copy", killed)
    with pytest.raises(_Killed):
        act(root, st).apply({NAPI: 10})
    monkeypatch.setattr(Journal, "sync_copy", real)
    assert napi_values(root, "defer-hard-irqs") == {"259": "0", "260": "0"}   # nothing written
    state = Journal(st, clock=FakeClock()).state()
    assert "lacks the baseline extension of " + NAPI in state.copy_note
    h = act(root, st).health()
    assert h.state == "dirty" and "baseline extension" in h.note
    rep = act(root, st).rollback()
    assert rep.clean and rep.ok
    assert (root / "proc/sys/net/core/busy_poll").read_text() == "0\n"
    assert napi_values(root, "defer-hard-irqs") == {"259": "0", "260": "0"}
    assert not parse_copy((st / COPY_NAME).read_bytes()).open


def test_journal_that_lost_the_extension_is_damage_and_the_copy_restores_the_new_napis(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "root")
    st = tmp_path / "st"
    a = act(root, st)
    a.apply({NAPI: 10, BUSY: 50})
    link_flap(root, events=False)
    a.apply({NAPI: 10})
    assert napi_values(root, "defer-hard-irqs") == {"259": "10", "260": "10"}
    data = (st / JOURNAL_NAME).read_bytes()
    cut = data.rindex(b"\n", 0, data.index(b'"extend":true')) + 1
    (st / JOURNAL_NAME).write_bytes(data[:cut])        # cut at the record boundary before the extension
    with pytest.raises(JournalError, match=r"baseline extension of .* is missing"):
        act(root, st).is_dirty()
    with pytest.raises(JournalError):
        act(root, st).apply({BUSY: 5})                 # nothing written over a damaged journal
    with pytest.raises(JournalRecovered) as ei:
        act(root, st).rollback()
    assert ei.value.report.clean
    assert {i.key: i.outcome for i in ei.value.report.items} == {NAPI: "restored", BUSY: "restored"}
    # the re-created NAPIs polltuned wrote are back at the kernel's value, from the copy's extension
    assert napi_values(root, "defer-hard-irqs") == {"259": "0", "260": "0"}
    assert (root / "proc/sys/net/core/busy_poll").read_text() == "0\n"
    assert ei.value.aside is not None and ei.value.aside.read_bytes() == data[:cut]


def test_head_lost_after_a_part_release_recovers_irq_by_irq(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """irqbalance moved IRQ 39 (released alone), a link flap extended the NAPI baseline, then the
    journal lost its head: rollback from the copy restores IRQ 38 and every NAPI (re-created ones
    included), leaves IRQ 39 to irqbalance, and journals its intents only through ``record`` (the
    damaged file is kept byte for byte)."""
    root = make_tree(tmp_path / "root")
    st = tmp_path / "st"
    a = act(root, st)
    a.apply({IRQ: "spread", NAPI: 10, BUSY: 50})
    assert (irq(root, 38), irq(root, 39)) == ("0\n", "1\n")
    (root / "proc/irq/39/smp_affinity_list").write_text("0\n")         # irqbalance
    rows = {r.key: r for r in a.verify()}
    assert rows[IRQ].state == "partly-released" and rows[IRQ].released_now == ("39",)
    link_flap(root, events=False)
    a.apply({IRQ: "spread", NAPI: 10, BUSY: 50})
    assert napi_values(root, "defer-hard-irqs") == {"259": "10", "260": "10"} and irq(root, 39) == "0\n"
    data = (st / JOURNAL_NAME).read_bytes()
    rel = data.index(b'"type":"released"')
    damaged = data[data.rindex(b"\n", 0, rel) + 1:]                     # head lost up to the release
    (st / JOURNAL_NAME).write_bytes(damaged)
    health = act(root, st).health()
    assert health.state == "corrupt" and health.restorable
    assert [m.released_parts for m in health.from_copy if m.key == IRQ] == [("39",)]
    with caplog.at_level(logging.INFO, logger="polltuned.actuator"), pytest.raises(JournalRecovered) as ei:
        act(root, st).rollback()
    items = {i.key: i for i in ei.value.report.items}
    assert {k: i.outcome for k, i in items.items()} == {IRQ: "restored", NAPI: "restored", BUSY: "restored"}
    assert "39 left to the admin" in items[IRQ].detail and ei.value.report.clean
    assert (irq(root, 37), irq(root, 38), irq(root, 39)) == ("0-1\n", "0-1\n", "0\n")
    assert napi_values(root, "defer-hard-irqs") == {"259": "0", "260": "0"}
    assert (root / "proc/sys/net/core/busy_poll").read_text() == "0\n"
    msgs = [r.getMessage() for r in caplog.records]
    assert {f"recovery: intent {k}" for k in (IRQ, NAPI, BUSY)} <= set(msgs)
    assert ei.value.aside is not None and ei.value.aside.read_bytes() == damaged
    assert not act(root, st).is_dirty()


def test_rollback_releases_a_part_and_restores_the_rest_in_one_pass(tmp_path: Path) -> None:
    """The precheck's part release (journaled through ``record``) narrows the restore of the same
    pass, without re-reading the journal; each restore is journaled as a rollback intent first."""
    root = make_tree(tmp_path / "root")
    st = tmp_path / "st"
    a = act(root, st)
    a.apply({IRQ: "spread", BUSY: 50})
    (root / "proc/irq/38/smp_affinity_list").write_text("1\n")         # irqbalance moves 38, unnoticed
    rep = a.rollback()
    item = {i.key: i for i in rep.items}[IRQ]
    assert item.outcome == "restored" and "38 left to the admin" in item.detail and rep.clean
    assert (irq(root, 38), irq(root, 39)) == ("1\n", "0-1\n")
    recs = journal_lines(st)
    types = [(r["type"], r.get("key"), r.get("rollback"), r.get("parts")) for r in recs[-6:]]
    assert types == [("released", IRQ, None, ["38"]), ("intent", BUSY, True, None), ("restored", BUSY, None, None),
                     ("intent", IRQ, True, None), ("restored", IRQ, None, None), ("clean", None, None, None)]
    assert parse_journal((st / JOURNAL_NAME).read_bytes()).records[-1]["type"] == "clean"


def test_dry_run_plans_part_releases_and_extensions_like_apply_journals_them(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "root")
    st = tmp_path / "st"
    a = act(root, st)
    a.apply({IRQ: "spread", NAPI: 10})
    (root / "proc/irq/39/smp_affinity_list").write_text("0\n")         # irqbalance, not yet noticed
    link_flap(root, events=False)
    jbytes = (st / JOURNAL_NAME).read_bytes()
    plan = a.plan({IRQ: "avoid-app", NAPI: 20}, reason="r")
    assert (st / JOURNAL_NAME).read_bytes() == jbytes                   # read-only
    assert plan.released_now == () and plan.skipped_released == ()
    n = len(journal_lines(st))
    a.apply({IRQ: "avoid-app", NAPI: 20}, reason="r")
    strip = {"v", "seq", "t", "crc"}
    done = [{k: v for k, v in r.items() if k not in strip} for r in journal_lines(st)[n:]]

    def comparable(r: dict[str, object]) -> dict[str, object]:
        # ``applied`` of the IRQ knob: apply journals the read-back (every IRQ, 39 included), the plan
        # the value apply writes and verifies (the owned IRQs)
        return {k: v for k, v in r.items() if not (r["type"] == "applied" and r["key"] == IRQ and k == "value")}

    assert [comparable(r) for r in plan.records] == [comparable(r) for r in done]
    assert [r["type"] for r in done] == ["released", "txn", "baseline", "intent", "applied", "intent", "applied",
                                         "txn-end"]
    assert done[0]["parts"] == ["39"] and done[2]["extend"] is True and done[2]["key"] == NAPI
    irq_applied = next(r for r in plan.records if r["type"] == "applied" and r["key"] == IRQ)
    assert "39:" not in str(irq_applied["value"]) and "38:" in str(irq_applied["value"])
    assert irq(root, 39) == "0\n"

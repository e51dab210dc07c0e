"""Journal format: CRC'd, sequenced JSON lines; torn tail tolerated; corruption refused; replay;
compaction preserves the replayed state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from polltuned.clock import FakeClock
from polltuned.errors import JournalError
from polltuned.journal import JOURNAL_NAME, Journal, encode_record, parse_journal, replay

# three literal records as written by v1 (crc over the canonical JSON without "crc")
R1 = encode_record({"v": 1, "seq": 1, "t": 1.0, "type": "epoch", "epoch": 1})
R2 = encode_record({"v": 1, "seq": 2, "t": 1.0, "type": "baseline", "key": "net.core.busy_poll",
                    "state": 0, "value": 0})
R3 = encode_record({"v": 1, "seq": 3, "t": 1.0, "type": "intent", "key": "net.core.busy_poll", "value": 50,
                    "txn": 1})
DATA = R1 + R2 + R3


def test_literal_record_format() -> None:
    assert R1 == b'{"crc":"b74c097e","epoch":1,"seq":1,"t":1.0,"type":"epoch","v":1}\n'
    p = parse_journal(DATA)
    assert [r["type"] for r in p.records] == ["epoch", "baseline", "intent"] and p.torn_bytes == 0


def test_torn_tail_is_tolerated() -> None:
    p = parse_journal(DATA[:-7])
    assert [r["type"] for r in p.records] == ["epoch", "baseline"]
    assert p.good_bytes == len(R1 + R2) and p.torn_bytes == len(R3) - 7
    p0 = parse_journal(b'\x00\x00\x00\x00')  # power loss: zero-filled tail without newline
    assert p0.records == () and p0.torn_bytes == 4


@pytest.mark.parametrize("damage,msg", [
    (lambda d: d.replace(b'"value":0', b'"value":1'), "checksum mismatch"),
    (lambda d: d.replace(R2, b"garbage\n"), "not valid JSON"),
    (lambda d: R1 + R3, "sequence 3 where 2 was expected"),
    (lambda d: d.replace(R2, encode_record({**json.loads(R2), "v": 2})), "newer polltuned"),
    (lambda d: d.replace(R2, encode_record({**json.loads(R2), "type": "frobnicate"})), "unknown record type"),
])
def test_corruption_is_an_error(damage: object, msg: str) -> None:
    with pytest.raises(JournalError, match=msg):
        parse_journal(damage(DATA))  # type: ignore[operator]


@settings(max_examples=200, deadline=None)
@given(hs.integers(min_value=0, max_value=len(DATA)))
def test_any_truncation_parses_to_a_prefix(cut: int) -> None:
    p = parse_journal(DATA[:cut])
    full = parse_journal(DATA).records
    assert p.records == full[: len(p.records)]
    assert p.good_bytes + p.torn_bytes == cut


def test_replay_tracks_epochs_and_status() -> None:
    recs = parse_journal(DATA).records
    st = replay(recs)
    h = st.knobs["net.core.busy_poll"]
    assert st.open and h.baseline_value == 0 and not h.settled
    more = [*recs, {"type": "applied", "key": "net.core.busy_poll", "value": 50},
            {"type": "released", "key": "net.core.busy_poll", "live": 7}]
    h2 = replay(tuple(more)).knobs["net.core.busy_poll"]
    assert h2.settled and h2.last_value == 50 and h2.released and h2.released_live == 7
    assert not replay((*more, {"type": "clean", "epoch": 1})).open


def test_append_fsyncs_and_repairs_torn_tail(tmp_path: Path) -> None:
    j = Journal(tmp_path / "st", clock=FakeClock())
    j.append("epoch", epoch=1)
    j.close()
    (tmp_path / "st" / JOURNAL_NAME).write_bytes((tmp_path / "st" / JOURNAL_NAME).read_bytes() + b'{"v":1,"se')
    j2 = Journal(tmp_path / "st", clock=FakeClock())
    rec = j2.append("txn", txn=1, reason="x", keys=[])
    j2.close()
    assert rec["seq"] == 2
    assert [r["type"] for r in j2.records()] == ["epoch", "txn"]
    with pytest.raises(ValueError):
        j2.append("nonsense")


def test_lock_is_exclusive(tmp_path: Path) -> None:
    from polltuned.errors import LockedError

    a = Journal(tmp_path / "st", clock=FakeClock())
    b = Journal(tmp_path / "st", clock=FakeClock())
    with a.locked(), pytest.raises(LockedError), b.locked():
        pass


def test_compaction_preserves_state(tmp_path: Path) -> None:
    j = Journal(tmp_path / "st", clock=FakeClock())
    j.append("epoch", epoch=3)
    for i in range(50):
        j.append("txn", txn=i + 1, reason="trial", keys=["a", "b"])
        if i == 0:
            j.append("baseline", key="a", state=0, value=0)
            j.append("baseline", key="b", state={"sysfs": 1}, value=1)
            j.append("baseline", key="c", state=5, value=5)
        j.append("intent", key="a", value=i, txn=i + 1)
        j.append("applied", key="a", value=i, txn=i + 1)
        j.append("txn-end", txn=i + 1, ok=True)
    j.append("released", key="b", live=9, expected=1)
    j.append("intent", key="c", value=6, txn=50)
    before = j.state()
    size = j.size()
    assert j.compact()
    after = j.state()
    assert j.size() < size / 5
    assert after.epoch == before.epoch and after.open
    assert list(after.knobs) == list(before.knobs)
    for k, h in before.knobs.items():
        h2 = after.knobs[k]
        assert (h2.baseline_state, h2.last_value, h2.settled, h2.released) == \
            (h.baseline_state, h.last_value, h.settled, h.released), k


def test_an_unchanged_journal_is_not_parsed_again_and_a_changed_one_is(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Status reads the managed knobs every few seconds (issue 14: CPU in HOLD): the same bytes give
    the same parse without parsing; any change (an append by another writer) is parsed."""
    import polltuned.journal as jmod

    calls: list[int] = []
    real = jmod.parse_journal

    def counting(data: bytes, source: str = jmod.JOURNAL_NAME) -> jmod.ParsedJournal:
        calls.append(len(data))
        return real(data, source)

    monkeypatch.setattr(jmod, "parse_journal", counting)
    clock = FakeClock()
    w = Journal(tmp_path / "st", clock=clock)
    w.append("epoch", epoch=1)
    r = Journal(tmp_path / "st", clock=clock)
    first = r.state()
    n = len(calls)
    assert r.state() == first and r.load() is r.load() and len(calls) == n
    w.append("txn", txn=1, reason="x", keys=[])     # another writer: the bytes changed
    assert r.state().last_txn == 1 and len(calls) == n + 1
    w.close()

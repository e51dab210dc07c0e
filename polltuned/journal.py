"""The append-only, fsync'd journal that makes every polltuned write reversible.

Format: JSON lines in ``STATE_DIR/journal.jsonl``. Every record carries
``{"v": 1, "seq": N, "t": wall-clock, "type": ..., ..., "crc": "xxxxxxxx"}`` where ``crc`` is the
CRC-32 of the record's canonical JSON (sorted keys, no spaces) without the ``crc`` field, and
``seq`` counts up by one from 1. Records are written with one ``write(2)`` each (O_APPEND) and
fsync'd before the caller continues; the directory is fsync'd when the file is created.

Record types (v1):

``epoch``     a tuning epoch opens (host still clean; baselines follow)
``txn``       an apply transaction begins (``txn``, ``reason``)
``baseline``  a knob's state at first touch in the epoch (``key``, ``state`` snapshot, ``value``);
              with ``extend: true`` for a knob already known: the same baseline plus components
              the kernel created since (re-created NAPIs, new IRQs), written before polltuned
              writes them (older readers ignore it: a second baseline of a known key)
``intent``    about to write ``value`` to ``key`` (``txn``; ``rollback: true`` when rollback is about to
              restore the baseline: a rollback killed mid-restore leaves the knob unsettled)
``applied``   ``key`` was written and read back as ``value`` (``txn``)
``undone``    a failed transaction put ``key`` back to ``value``
``observed``  ``key`` changed as a side effect of polltuned's own write (sysfs clobbers per-NAPI)
``released``  admin wins: ``key`` was changed by someone else (``live``, ``expected``); never written again.
              With ``parts`` (a list, e.g. IRQ numbers of an IRQ affinity knob): only those parts
              were changed and are released; polltuned keeps managing the others (older readers
              release the whole knob: admin wins either way)
``restored``  rollback put ``key`` back to its baseline
``gone``      the object ``key`` lives on vanished (deleted veth/netns)
``txn-end``   the transaction finished (``ok``)
``clean``     every baseline of the epoch is restored/released/gone: the host is clean

Damage rules: a torn *last* line (no trailing newline: crash or power loss mid-write, or a file
truncated at any byte) is ignored and cut off before the next append. Anything else that does not
parse, fails its CRC, breaks the ``seq`` chain, comes from a newer format, or records a write
(intent/applied/...) or a baseline extension of a knob whose baseline record is missing raises
JournalError before any knob is written.

The baseline copy (``STATE_DIR/journal.baselines.json``): a second, independent copy of the open
epoch's baselines, ``{"v": 1, "epoch": N, "open": bool, "baselines": [{key, state, value, kind}],
"crc": ...}``, replaced atomically (fsync'd temporary file, rename, directory fsync) after the
journal's baseline records (extensions included) and before the first write of a knob. Order of
durability: journal record, then copy, then the write; the copy is closed after the journal's
``clean`` record and rewritten before a compaction. So in every crash state the copy lists a subset of the journal's
baselines, and at load (:func:`cross_check`):

* copy keys the journal has no baseline for -> the journal lost records (emptied, head lost, cut
  inside a baseline): JournalError; ``polltuned rollback`` restores from the copy
  (:func:`recovery_state`);
* the copy holds a baseline extension the journal lacks (the extension record was lost) -> the
  same: JournalError, ``polltuned rollback`` restores from the copy;
* the same key with a different baseline in each -> JournalCopiesDisagree: reported, nothing
  written, never resolved by polltuned (move aside the copy you distrust). A baseline and its
  extension are not different originals: one is the other plus components the kernel created
  since (:func:`baseline_relation`);
* a stale copy (a crash between the journal record, a baseline extension included, and the copy,
  or a damaged copy file while the journal is intact) -> a note (``JournalState.copy_note``); the
  next locked change rewrites it.
The copy also carries ``seq``, the journal's length (records) when the copy was last written:
at every transaction's end, before a compaction (lowered to the compacted length) and after a
rollback. A journal with fewer intact records than that lost its tail (cut at a record boundary
or inside one): the last writes it records are not polltuned's last writes, so a live value that
differs from them is no evidence of an admin change: JournalError, and ``polltuned rollback``
restores from the copy. A journal that cannot be opened (a directory, a symlink loop, an I/O
error) is damage the copy repairs the same way.

A missing or damaged copy next to an existing journal leaves the journal *unverified*
(``JournalState.unverified``): it may have lost its tail unnoticed. Then a rollback restores every
knob whose original the journal knows, even one whose live value differs from polltuned's last
recorded write (said, one line per knob), and ``status`` reports the state as unknown unless a
knob the journal knows still carries a polltuned value. Only a state directory with neither file
is a fresh, clean host.
"""

from __future__ import annotations

import errno as errno_mod
import fcntl
import json
import os
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from polltuned.clock import Clock
from polltuned.errors import (
    JournalCopiesDisagree,
    JournalError,
    JournalUnreadable,
    LockedError,
    PermissionNeeded,
    StateNotWritable,
)
from polltuned.knobs.base import JsonValue
from polltuned.records import KnobValue

JOURNAL_VERSION = 1
JOURNAL_NAME = "journal.jsonl"
#: the second, independent copy of the open epoch's baselines (see module doc)
COPY_NAME = "journal.baselines.json"
COPY_VERSION = 1
#: a damaged journal set aside after a recovery from the copy: journal.jsonl.damaged-N
DAMAGED_PREFIX = JOURNAL_NAME + ".damaged-"
#: compact (checkpoint) the journal when it grows beyond this many bytes
COMPACT_BYTES = 256 * 1024
LOCK_NAME = "journal.lock"

RECORD_TYPES = frozenset({"epoch", "txn", "baseline", "intent", "applied", "undone", "observed",
                          "released", "restored", "gone", "txn-end", "clean"})
#: record types that name a knob and so need its baseline earlier in the open epoch
KEY_RECORDS = frozenset({"intent", "applied", "undone", "observed", "released", "restored", "gone"})


#: errnos of a state directory that cannot take a write: disk full, quota, read-only file system
NOT_WRITABLE = frozenset({errno_mod.ENOSPC, errno_mod.EDQUOT, errno_mod.EROFS})


def os_failure(path: Path | str, action: str, e: OSError) -> JournalError | PermissionNeeded:
    """One-line error for an OSError on a state file: permission (exit 5), disk full / read-only
    (state-not-writable, exit 7) or unreadable (exit 7)."""
    why = e.strerror or os.strerror(e.errno or 0)
    if e.errno in (errno_mod.EACCES, errno_mod.EPERM):
        return PermissionNeeded(f"{path}: cannot {action}: {why}",
                                hint="the journal belongs to root: run polltuned as root (sudo)")
    if e.errno in NOT_WRITABLE:
        return StateNotWritable(f"{path}: cannot {action}: {why}",
                                hint="free space on (or remount read-write) the state directory's file system, "
                                     "then run the command again")
    return JournalUnreadable(f"{path}: cannot {action}: {why}")


def _canonical(rec: Mapping[str, Any]) -> str:
    return json.dumps(rec, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def encode_record(rec: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in rec.items() if k != "crc"}
    crc = format(zlib.crc32(_canonical(body).encode()) & 0xFFFFFFFF, "08x")
    return (_canonical({**body, "crc": crc}) + "\n").encode()


@dataclass(frozen=True)
class ParsedJournal:
    records: tuple[dict[str, Any], ...]
    good_bytes: int          # length of the intact prefix (torn tail excluded)
    torn_bytes: int          # bytes of the torn last line (0 if none)


def parse_journal(data: bytes, source: str = JOURNAL_NAME) -> ParsedJournal:
    """Pure: validate and decode journal bytes. Raises JournalError on damage other than a torn tail."""
    records: list[dict[str, Any]] = []
    pos = 0
    lineno = 0
    n = len(data)
    while pos < n:
        nl = data.find(b"\n", pos)
        if nl < 0:  # torn last line
            return ParsedJournal(tuple(records), pos, n - pos)
        lineno += 1
        raw = data[pos:nl]
        try:
            rec = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise JournalError(f"{source}:{lineno}: record is not valid JSON (journal corrupted)",
                               hint="nothing was written; inspect or move the journal aside") from None
        if not isinstance(rec, dict):
            raise JournalError(f"{source}:{lineno}: record is not a JSON object (journal corrupted)")
        crc = rec.get("crc")
        body = {k: v for k, v in rec.items() if k != "crc"}
        want = format(zlib.crc32(_canonical(body).encode()) & 0xFFFFFFFF, "08x")
        if crc != want:
            raise JournalError(f"{source}:{lineno}: checksum mismatch (crc {crc!r}, computed {want}) "
                               "(journal corrupted)", hint="nothing was written; inspect or move the journal aside")
        v = rec.get("v")
        if not isinstance(v, int) or v < 1:
            raise JournalError(f"{source}:{lineno}: missing or bad format version {v!r}")
        if v > JOURNAL_VERSION:
            raise JournalError(f"{source}:{lineno}: written by a newer polltuned (format v{v}, this reads v1)")
        if rec.get("seq") != len(records) + 1:
            raise JournalError(f"{source}:{lineno}: sequence {rec.get('seq')!r} where {len(records) + 1} was "
                               "expected (records missing or reordered: journal corrupted)")
        if rec.get("type") not in RECORD_TYPES:
            raise JournalError(f"{source}:{lineno}: unknown record type {rec.get('type')!r}")
        records.append(rec)
        pos = nl + 1
    return ParsedJournal(tuple(records), pos, 0)


def salvage_records(data: bytes) -> list[dict[str, Any]]:
    """Pure: every complete line of a damaged journal that is still an intact record (valid JSON
    object, CRC, known version and type), in file order; the ``seq`` chain is not required."""
    out: list[dict[str, Any]] = []
    for raw in data.split(b"\n")[:-1]:  # the part after the last newline is a torn tail
        try:
            rec = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            continue
        if not isinstance(rec, dict):
            continue
        body = {k: v for k, v in rec.items() if k != "crc"}
        try:
            want = format(zlib.crc32(_canonical(body).encode()) & 0xFFFFFFFF, "08x")
        except ValueError:  # NaN/inf smuggled in: not something we wrote
            continue
        v = rec.get("v")
        if rec.get("crc") != want or not isinstance(v, int) or not 1 <= v <= JOURNAL_VERSION \
                or rec.get("type") not in RECORD_TYPES:
            continue
        out.append(rec)
    return out


@dataclass
class KnobHistory:
    """Replayed state of one knob in the open epoch."""

    key: str
    order: int                       # position in first-touch order
    baseline_state: JsonValue
    baseline_value: KnobValue | None
    last_value: KnobValue | None     # last value polltuned knows it left there (settled)
    settled: bool = True             # False between an intent and its applied/undone (or: unknown)
    released: bool = False
    restored: bool = False
    gone: bool = False
    released_live: KnobValue | None = None
    written: bool = False            # an intent was journaled for it in this epoch
    kind: str = ""                   # the knob class (sysctl, netdev, ...) from its baseline record
    #: parts released to the admin (IRQ numbers of an IRQ affinity knob); the rest is still managed
    released_parts: frozenset[str] = frozenset()
    #: the journal's record of polltuned's last write may be lost (recovery, unverified journal):
    #: a live value that differs is restored, never taken for an admin change
    evidence_lost: bool = False


@dataclass
class JournalState:
    epoch: int = 0
    open: bool = False
    knobs: dict[str, KnobHistory] = field(default_factory=dict)
    last_txn: int = 0
    unfinished_txn: int | None = None
    closed_epochs: set[int] = field(default_factory=set)
    #: the baseline copy's epoch (0: no copy); new epochs are numbered above both
    copy_epoch: int = 0
    #: a stale or damaged baseline copy while the journal itself is intact ("" = consistent)
    copy_note: str = ""
    #: why the journal cannot be proven complete (its copy is missing or damaged); "" = verified
    unverified: str = ""
    #: knobs released to the admin in the last closed epoch (left as the admin set them)
    closed_released: tuple[str, ...] = ()


def _fold_released(h: KnobHistory, r: Mapping[str, Any]) -> None:
    """A ``released`` record: the whole knob, or with ``parts`` only those parts (IRQs) go to the admin."""
    parts = r.get("parts")
    if isinstance(parts, list) and parts:
        h.released_parts = h.released_parts | frozenset(str(p) for p in parts)
    else:
        h.released = True
        h.released_live = r.get("live")


def _fold(h: KnobHistory, r: Mapping[str, Any]) -> None:
    """One knob record applied to its history (shared by replay and recovery)."""
    t = r["type"]
    if t == "intent":
        h.settled = False
        h.restored = False
        h.written = True
    elif t in ("applied", "undone", "observed"):
        h.settled = True
        h.last_value = r.get("value")
        if t == "applied":
            h.restored = False
            h.written = True
    elif t == "released":
        _fold_released(h, r)
    elif t == "restored":
        h.restored = True
        h.settled = True
        h.last_value = h.baseline_value
    elif t == "gone":
        h.gone = True


def replay(records: tuple[dict[str, Any], ...], source: str = JOURNAL_NAME) -> JournalState:
    """Pure: fold journal records into the state of the latest epoch. A knob record (intent,
    applied, ...) whose baseline is not earlier in the open epoch is damage: JournalError."""
    st = JournalState()
    for i, r in enumerate(records):
        t = r["type"]
        key = r.get("key")
        h = st.knobs.get(key) if isinstance(key, str) else None
        if t == "epoch":
            st.epoch = int(r.get("epoch", st.epoch + 1))
            st.open = True
            st.knobs = {}
        elif t == "clean":
            st.open = False
            st.closed_released = tuple(k for k, kh in st.knobs.items() if kh.released)
            st.knobs = {}
            st.closed_epochs.add(int(r.get("epoch", st.epoch)))
        elif t == "txn":
            st.last_txn = max(st.last_txn, int(r.get("txn", 0)))
            st.unfinished_txn = int(r.get("txn", 0))
        elif t == "txn-end":
            st.unfinished_txn = None
        elif t == "baseline" and isinstance(key, str):
            if key not in st.knobs and r.get("extend") is True:
                raise JournalError(f"{source}: record {r.get('seq', i + 1)}: baseline extension of {key!r} without "
                                   "its baseline record (records missing: journal corrupted)",
                                   hint="`polltuned rollback` restores from the baseline copy when there is one")
            if key not in st.knobs:
                v = r.get("value")
                st.knobs[key] = KnobHistory(key, len(st.knobs), r.get("state"), v, v, kind=str(r.get("kind") or ""))
            elif r.get("extend") is True:
                # the same baseline plus components the kernel created since (module doc)
                known = st.knobs[key]
                known.baseline_state = r.get("state")
                known.baseline_value = r.get("value")
        elif t in KEY_RECORDS and (h is None or not st.open):
            raise JournalError(f"{source}: record {r.get('seq', i + 1)}: {t} of {key!r} without its baseline "
                               "record (records missing: journal corrupted)",
                               hint="`polltuned rollback` restores from the baseline copy when there is one")
        elif h is not None:
            _fold(h, r)
    return st


# -- the baseline copy --------------------------------------------------------------------------

@dataclass(frozen=True)
class CopyEntry:
    key: str
    state: JsonValue
    value: KnobValue | None
    kind: str = ""


@dataclass(frozen=True)
class BaselineCopy:
    """The second copy of the open epoch's baselines (see module doc)."""

    epoch: int
    open: bool
    entries: tuple[CopyEntry, ...] = ()
    #: the journal had at least this many records when the copy was written (module doc)
    seq: int = 0

    def key_list(self) -> list[str]:
        return [e.key for e in self.entries]


def encode_copy(c: BaselineCopy) -> bytes:
    return encode_record({"v": COPY_VERSION, "epoch": c.epoch, "open": c.open, "seq": c.seq,
                          "baselines": [{"key": e.key, "state": e.state, "value": e.value, "kind": e.kind}
                                        for e in c.entries]})


def parse_copy(data: bytes, source: str = COPY_NAME) -> BaselineCopy:
    """Pure: decode and check the baseline copy. Raises JournalError when it is damaged."""
    def bad(why: str) -> JournalError:
        return JournalError(f"{source}: {why} (baseline copy damaged)")

    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise bad("not valid JSON") from None
    if not isinstance(doc, dict):
        raise bad("not a JSON object")
    body = {k: v for k, v in doc.items() if k != "crc"}
    want = format(zlib.crc32(_canonical(body).encode()) & 0xFFFFFFFF, "08x")
    if doc.get("crc") != want:
        raise bad(f"checksum mismatch (crc {doc.get('crc')!r}, computed {want})")
    v = doc.get("v")
    if not isinstance(v, int) or v < 1:
        raise bad(f"missing or bad format version {v!r}")
    if v > COPY_VERSION:
        raise JournalError(f"{source}: written by a newer polltuned (format v{v}, this reads v{COPY_VERSION})")
    epoch, is_open, rows = doc.get("epoch"), doc.get("open"), doc.get("baselines")
    if not isinstance(epoch, int) or not isinstance(is_open, bool) or not isinstance(rows, list):
        raise bad("epoch/open/baselines missing")
    seq = doc.get("seq", 0)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise bad(f"bad seq {seq!r}")
    entries = []
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("key"), str):
            raise bad(f"bad baseline entry {row!r}")
        entries.append(CopyEntry(row["key"], row.get("state"), row.get("value"), str(row.get("kind") or "")))
    return BaselineCopy(epoch, is_open, tuple(entries), seq)


def copy_of(st: JournalState, seq: int = 0) -> BaselineCopy:
    """What the copy must hold for this journal state (extended baselines included: the copy holds
    each knob's current baseline, so an extension reaches the copy before polltuned writes it);
    ``seq``: the journal's length it vouches for."""
    epoch = max(st.epoch, st.copy_epoch)
    if not st.open:
        return BaselineCopy(epoch, False, (), seq)
    hs = sorted(st.knobs.values(), key=lambda h: h.order)
    return BaselineCopy(st.epoch, True, tuple(CopyEntry(h.key, h.baseline_state, h.baseline_value, h.kind)
                                              for h in hs), seq)


def _same_json(a: object, b: object) -> bool:
    try:
        return _canonical({"x": a}) == _canonical({"x": b})
    except (TypeError, ValueError):
        return a == b


def _extends(big: object, small: object) -> bool:
    """Pure: ``big`` is ``small`` plus components it lacks (keys of JSON objects, at any depth), every
    known component unchanged: what a baseline extension (``baseline`` with ``extend``) does."""
    if isinstance(big, dict) and isinstance(small, dict):
        return all(k in big and _extends(big[k], v) for k, v in small.items())
    return _same_json(big, small)


BaselineRelation = Literal["same", "copy-stale", "copy-newer", "differ"]


def baseline_relation(journal_state: object, journal_value: object, copy_state: object,
                      copy_value: object) -> BaselineRelation:
    """Pure: how a baseline in the journal relates to the same knob's baseline in the copy.

    ``same``; ``copy-stale``: the journal extended the baseline after the copy was written (the crash
    window between the extension record and the copy); ``copy-newer``: the copy holds an extension
    the journal has lost; ``differ``: two different originals. An extension may change the ``read()``
    form of the value (IRQ affinity lists the new IRQs), so values are compared only for equal states."""
    if _same_json(journal_state, copy_state):
        return "same" if _same_json(journal_value, copy_value) else "differ"
    if _extends(journal_state, copy_state):
        return "copy-stale"
    if _extends(copy_state, journal_state):
        return "copy-newer"
    return "differ"


def cross_check(st: JournalState, copy: BaselineCopy | None, *, source: str = JOURNAL_NAME,
                copy_source: str = COPY_NAME) -> None:
    """Pure: compare an intact journal's state with the baseline copy (module doc). Sets
    ``st.copy_epoch``/``st.copy_note``; raises JournalError when the journal lost records (a
    baseline, or a baseline extension the copy has) and JournalCopiesDisagree when the two give
    different originals."""
    if copy is None:
        return
    st.copy_epoch = copy.epoch
    written_not_in_copy = [h.key for h in st.knobs.values() if h.written and
                           (not copy.open or copy.epoch != st.epoch or h.key not in copy.key_list())]
    stale = (f"baseline copy {copy_source} lacks {', '.join(written_not_in_copy)} (stale copy; the journal "
             "is intact and is used; rewritten at the next change)") if st.open and written_not_in_copy else ""
    if not copy.open or not copy.entries:
        st.copy_note = stale
        return
    if copy.epoch in st.closed_epochs or st.epoch > copy.epoch:
        # the journal closed the copy's epoch (and maybe opened another): the copy was not updated yet
        st.copy_note = stale
        return
    if st.epoch < copy.epoch or not st.open:
        lost = ", ".join(copy.key_list())
        raise JournalError(f"{source}: has no baseline records for epoch {copy.epoch} (baseline copy "
                           f"{copy_source} lists {lost}): journal emptied or truncated (journal corrupted)",
                           hint="`polltuned rollback` restores those knobs from the baseline copy")
    missing = [e.key for e in copy.entries if e.key not in st.knobs]
    if missing:
        raise JournalError(f"{source}: baseline records of {', '.join(missing)} missing (the baseline copy "
                           f"{copy_source} has them): journal truncated (journal corrupted)",
                           hint="`polltuned rollback` restores those knobs from the baseline copy")
    rel = {e.key: baseline_relation(st.knobs[e.key].baseline_state, st.knobs[e.key].baseline_value, e.state,
                                    e.value) for e in copy.entries}
    newer = [k for k, r in rel.items() if r == "copy-newer"]
    if newer:
        raise JournalError(f"{source}: the baseline extension of {', '.join(newer)} is missing (the baseline copy "
                           f"{copy_source} has it): journal truncated (journal corrupted)",
                           hint="`polltuned rollback` restores those knobs from the baseline copy")
    differ = [(e, st.knobs[e.key]) for e in copy.entries if rel[e.key] == "differ"]
    if differ:
        e, h = differ[0]
        more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
        raise JournalCopiesDisagree(
            f"{e.key}: the journal and the baseline copy disagree on the original value "
            f"(journal {h.baseline_value!r} {_canonical({'s': h.baseline_state})[5:-1]}, "
            f"copy {e.value!r} {_canonical({'s': e.state})[5:-1]}){more}; nothing was written",
            hint=f"decide which is right and move the other aside ({source} or {copy_source})")
    extended = [k for k, r in rel.items() if r == "copy-stale"]
    if extended:
        ext = (f"baseline copy {copy_source} lacks the baseline extension of {', '.join(extended)} (stale copy; "
               "the journal is intact and is used; rewritten at the next change)")
        stale = f"{stale}; {ext}" if stale else ext
    st.copy_note = stale


def _writes_after_last_marker(salvaged: list[dict[str, Any]], after_seq: int = 0) -> bool:
    """Intact write records after the last epoch/clean marker, not older than the copy's ``seq``
    (a record the closed copy vouched for is older than the copy's closure)."""
    tail = salvaged
    for i, r in enumerate(salvaged):
        if r["type"] in ("epoch", "clean"):
            tail = salvaged[i + 1:]
    return any(r["type"] in ("intent", "applied") and not (isinstance(r.get("seq"), int) and r["seq"] <= after_seq)
               for r in tail)


def recovery_state(copy: BaselineCopy, salvaged: list[dict[str, Any]]) -> JournalState:
    """Pure: the open epoch of a damaged journal, rebuilt for a rollback. Baselines come from the
    copy (plus intact baseline records of knobs it lacks that intact records show written, with
    their intact extensions). Every knob is *unknown* (unsettled), so rollback restores it: records
    were lost, so a surviving "applied" is not known to be the last write and cannot tell an admin's
    value from polltuned's. Only explicit decisions that survive are kept: ``released`` (admin wins,
    never written again; with ``parts`` only those parts) and ``gone``. A surviving ``clean`` for
    the copy's epoch means nothing is left to restore. Raises JournalCopiesDisagree when a surviving
    baseline record gives another original than the copy (a baseline and its extensions agree with
    the copy: one holds the other plus components the kernel created later)."""
    start, closed_to = 0, -1
    for i, r in enumerate(salvaged):
        if r["type"] in ("epoch", "clean"):
            start = i + 1
            closed_to = int(r.get("epoch", 0)) if r["type"] == "clean" else -1
    st = JournalState(epoch=copy.epoch, open=copy.open, copy_epoch=copy.epoch)
    if not copy.open or closed_to >= copy.epoch:
        st.open = False
        st.closed_epochs.add(copy.epoch)
        return st
    by_key = {e.key: e for e in copy.entries}
    #: knobs the copy lacks, by their intact baseline records (in st.knobs once shown written)
    extra: dict[str, KnobHistory] = {}
    for e in copy.entries:
        st.knobs[e.key] = KnobHistory(e.key, len(st.knobs), e.state, e.value, None, settled=False, kind=e.kind,
                                      evidence_lost=True)
    for r in salvaged[start:]:
        t, key = r["type"], r.get("key")
        if t == "txn":
            st.last_txn = max(st.last_txn, int(r.get("txn", 0)))
        if not isinstance(key, str):
            continue
        if t == "baseline":
            ce = by_key.get(key)
            if ce is not None:
                if baseline_relation(r.get("state"), r.get("value"), ce.state, ce.value) == "differ":
                    raise JournalCopiesDisagree(
                        f"{key}: an intact journal record and the baseline copy disagree on the original value "
                        f"(journal {r.get('value')!r}, copy {ce.value!r}); nothing was written",
                        hint="decide which is right and move the other aside")
                # the copy is used: polltuned writes an extension's components only once the copy has it
            elif key in extra:
                if r.get("extend") is True:
                    extra[key].baseline_state = r.get("state")
                    extra[key].baseline_value = r.get("value")
            elif key not in st.knobs:
                extra[key] = KnobHistory(key, 0, r.get("state"), r.get("value"), None, settled=False,
                                         kind=str(r.get("kind") or ""), evidence_lost=True)
        elif key in extra and t in ("intent", "applied"):
            # a knob the copy lacks (a stale copy) that intact records show written: restore it too;
            # without a write it is the crash window between its baseline record and the copy
            h = extra[key]
            if key not in st.knobs:
                h.order = len(st.knobs)
                st.knobs[key] = h
        elif key in st.knobs and t == "released":
            _fold_released(st.knobs[key], r)
        elif key in st.knobs and t == "gone":
            st.knobs[key].gone = True
    return st


class Journal:
    """Durable record of baselines, intents and applied values (see module doc)."""

    def __init__(self, state_dir: Path | str, *, clock: Clock) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / JOURNAL_NAME
        self.copy_path = self.dir / COPY_NAME
        self.clock = clock
        self._seq: int | None = None
        #: the bytes of the last parse and the parse (load(): unchanged bytes are not parsed again)
        self._parsed: tuple[bytes, ParsedJournal] | None = None
        self._fd: int | None = None
        self._lock_fd: int | None = None

    # -- reading ---------------------------------------------------------------------------
    def _read(self, path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise os_failure(path, "read", e) from e

    def exists(self) -> bool:
        """Is there anything at the journal's path (a file, or damage in its place)?"""
        return os.path.lexists(self.path)

    def count(self) -> int:
        """The number of records in the journal (the ones appended by this process included)."""
        return self._seq if self._seq is not None else len(self.records())

    def load(self) -> ParsedJournal:
        """The parsed journal. Reading is cheap, parsing is not (status asks for the managed knobs
        every few seconds): bytes equal to the last parse's give that parse again. The records are
        shared between such calls: treat them as read-only."""
        data = self._read(self.path)
        if data is None:
            self._parsed = None
            return ParsedJournal((), 0, 0)
        if self._parsed is not None and self._parsed[0] == data:
            return self._parsed[1]
        parsed = parse_journal(data, str(self.path))
        self._parsed = (data, parsed)
        return parsed

    def records(self) -> tuple[dict[str, Any], ...]:
        return self.load().records

    def load_copy(self) -> BaselineCopy | None:
        """The baseline copy, None when there is none. Raises JournalError when it is damaged."""
        data = self._read(self.copy_path)
        return None if data is None else parse_copy(data, str(self.copy_path))

    def state(self) -> JournalState:
        """The replayed journal, checked against the baseline copy. Raises JournalError (exit 7)
        when the journal is damaged, lost records the copy has, or disagrees with the copy."""
        # the copy first: the writer updates the journal before the copy, so a copy read earlier
        # never lists a baseline the journal (read later) lacks unless records were really lost
        try:
            copy, copy_problem = self.load_copy(), ""
        except JournalError as e:
            copy, copy_problem = None, e.message
        parsed = self.load()
        st = replay(parsed.records, str(self.path))
        if copy_problem:
            st.copy_note = f"{copy_problem}; the journal is intact and is used; rewritten at the next change"
            st.unverified = f"{copy_problem}: the journal cannot be proven complete"
            return st
        if copy is None:
            if self.exists():
                st.unverified = (f"the baseline copy {self.copy_path} is missing: the journal cannot be proven "
                                 "complete")
            return st
        cross_check(st, copy, source=str(self.path), copy_source=str(self.copy_path))
        if copy.seq > len(parsed.records):
            what = "cut inside a record" if parsed.torn_bytes else "cut at a record boundary or emptied"
            raise JournalError(f"{self.path}: {len(parsed.records)} intact records where the baseline copy "
                               f"{self.copy_path} vouches for at least {copy.seq}: journal truncated ({what}; "
                               "the last writes it records are not polltuned's last writes)",
                               hint="`polltuned rollback` restores every knob from the baseline copy")
        return st

    def next_epoch(self, st: JournalState) -> int:
        """Epoch numbers grow across compactions (the copy remembers the last one)."""
        return max(st.epoch, st.copy_epoch) + 1

    def recovery(self, damage: JournalError) -> JournalState:
        """The open epoch of a damaged journal rebuilt from the baseline copy plus the journal's
        intact records (:func:`recovery_state`). A closed copy means no knob was written since the
        journal's last clean record (the copy is opened before any write): nothing to restore.
        Re-raises ``damage`` (hint adjusted) when the copy cannot help: copies that disagree, no
        copy, a damaged copy, or a closed copy contradicted by intact write records."""
        if isinstance(damage, JournalCopiesDisagree):
            raise damage
        try:
            copy = self.load_copy()
        except JournalError as e:
            raise JournalError(f"{damage.message}; the baseline copy is damaged too: {e.message}",
                               hint="nothing was written; restore the knobs by hand") from None
        if copy is None:
            raise JournalError(damage.message,
                               hint="nothing was written; there is no baseline copy to restore from; "
                                    "inspect or move the journal aside") from None
        try:
            salvaged = salvage_records(self._read(self.path) or b"")
        except JournalError:  # not a file, unreadable: the copy alone (a permission error propagates)
            salvaged = []
        if not copy.open and _writes_after_last_marker(salvaged, copy.seq):
            raise JournalError(f"{damage.message}; the baseline copy {self.copy_path} is closed but intact "
                               "journal records show writes", hint="nothing was written; restore the knobs by hand")
        return recovery_state(copy, salvaged)

    # -- locking ---------------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive writer lock (STATE_DIR/journal.lock); LockedError if another process holds it."""
        if self._lock_fd is not None:  # re-entrant within one Journal
            yield
            return
        self._ensure_dir()
        try:
            fd = os.open(self.dir / LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o600)
        except OSError as e:
            try:  # a read-only file system: flock works on a read-only descriptor too (rollback still restores)
                if e.errno not in NOT_WRITABLE:
                    raise
                fd = os.open(self.dir / LOCK_NAME, os.O_RDONLY)
            except OSError:
                raise os_failure(self.dir / LOCK_NAME, "open the lock", e) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise LockedError(f"{self.dir / LOCK_NAME}: another polltuned process is changing knobs",
                              hint="stop the daemon or wait for the other command") from None
        self._lock_fd = fd
        try:
            yield
        finally:
            self._lock_fd = None
            self.close()
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    # -- writing ---------------------------------------------------------------------------
    def _ensure_dir(self) -> None:
        if not self.dir.exists():
            try:
                self.dir.mkdir(parents=True, mode=0o700, exist_ok=True)
            except OSError as e:
                raise os_failure(self.dir, "create the state directory", e) from e

    def _open_for_append(self) -> int:
        if self._fd is not None:
            return self._fd
        self._ensure_dir()
        parsed = self.load()
        created = not self.path.exists()
        if created and not self.copy_path.exists():
            # a new journal always has a copy: then "no copy" can only mean an older polltuned (or
            # a deleted file), and a damaged journal next to a closed copy provably left nothing
            self.write_copy(BaselineCopy(0, False))
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as e:
            raise os_failure(self.path, "open for append", e) from e
        if parsed.torn_bytes:
            os.ftruncate(fd, parsed.good_bytes)  # repair the torn tail before appending
            os.fsync(fd)
        if created:
            self._fsync_dir()
        self._seq = len(parsed.records)
        self._fd = fd
        return fd

    def append(self, type_: str, **payload: Any) -> dict[str, Any]:
        """Append one record and fsync it. Returns the record as written."""
        if type_ not in RECORD_TYPES:
            raise ValueError(f"unknown journal record type {type_!r}")
        fd = self._open_for_append()
        assert self._seq is not None
        rec: dict[str, Any] = {"v": JOURNAL_VERSION, "seq": self._seq + 1, "t": round(self.clock.wall(), 6),
                               "type": type_, **payload}
        data = encode_record(rec)
        try:
            at = os.fstat(fd).st_size
            n = os.write(fd, data)
            if n != len(data):  # a full disk takes part of the record: cut it off again
                os.ftruncate(fd, at)
                raise OSError(errno_mod.ENOSPC, "short write (no space left on device)")
            os.fsync(fd)
        except OSError as e:
            self.close()
            if e.errno in NOT_WRITABLE:
                raise StateNotWritable(f"{self.path}: append failed: {e.strerror}",
                                       hint="no knob was written after this failure; free space on the state "
                                            "directory's file system") from e
            raise JournalError(f"{self.path}: append failed: {e.strerror}",
                               hint="no knob was written after this failure") from e
        self._seq += 1
        return rec

    def _fsync_dir(self) -> None:
        dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def write_copy(self, copy: BaselineCopy) -> None:
        """Replace the baseline copy atomically and durably (temporary file, fsync, rename, dir fsync)."""
        self._ensure_dir()
        tmp = self.dir / f".{COPY_NAME}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                data = encode_copy(copy)
                if os.write(fd, data) != len(data):
                    raise OSError(errno_mod.EIO, "short write")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.copy_path)
            self._fsync_dir()
        except OSError as e:
            raise os_failure(self.copy_path, "write", e) from e

    def sync_copy(self, st: JournalState | None = None, *, mark: bool = False) -> bool:
        """Make the copy match the journal (call with the lock held, before the first write of a
        knob). ``mark``: also vouch for the journal's current length (at a transaction's end).
        Returns True when it was rewritten."""
        st = self.state() if st is None else st
        try:
            have = self.load_copy()
        except JournalError:
            have = None
        seq = self.count() if mark else (have.seq if have is not None else 0)
        want = copy_of(st, seq)
        if have == want or (have is None and want == BaselineCopy(0, False) and not self.exists()):
            return False  # nothing ever journaled: no file to create
        self.write_copy(want)
        return True

    def set_aside(self) -> Path | None:
        """Rename a damaged journal to journal.jsonl.damaged-N (kept for inspection); None if absent."""
        self.close()
        if not self.path.exists():
            return None
        n = 1
        while (self.dir / f"{DAMAGED_PREFIX}{n}").exists():
            n += 1
        dest = self.dir / f"{DAMAGED_PREFIX}{n}"
        try:
            os.replace(self.path, dest)
            self._fsync_dir()
        except OSError as e:
            raise os_failure(self.path, "move aside", e) from e
        return dest

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def compact(self) -> bool:
        """Checkpoint: rewrite the journal as the minimal records that replay to the same state
        (epoch, baselines in first-touch order, each knob's latest status), via a fsync'd temporary
        file renamed over the journal (atomic: a crash leaves either the old or the new file).
        A clean journal is simply emptied. The baseline copy is brought up to date first (it depends
        only on the replayed state, which compaction keeps). Call with the lock held. Returns True
        when rewritten."""
        st = self.state()
        now = round(self.clock.wall(), 6)
        recs: list[dict[str, Any]] = []

        def add(type_: str, **payload: Any) -> None:
            recs.append({"v": JOURNAL_VERSION, "seq": len(recs) + 1, "t": now, "type": type_, **payload})

        if st.open:
            add("epoch", epoch=st.epoch)
            add("txn", txn=st.last_txn, reason="checkpoint", keys=[])
            hs = sorted(st.knobs.values(), key=lambda h: h.order)
            for h in hs:
                add("baseline", key=h.key, state=h.baseline_state, value=h.baseline_value, kind=h.kind)
            for h in hs:
                if not h.settled:
                    add("intent", key=h.key, value=None, txn=st.last_txn)
                elif h.restored:
                    add("restored", key=h.key, value=h.baseline_value)
                elif h.last_value != h.baseline_value:
                    add("observed", key=h.key, value=h.last_value, txn=st.last_txn)
                if h.released_parts:
                    add("released", key=h.key, live=None, expected=None, parts=sorted(h.released_parts))
                if h.released:
                    add("released", key=h.key, live=h.released_live, expected=h.last_value)
                if h.gone:
                    add("gone", key=h.key, detail="checkpoint")
            add("txn-end", txn=st.last_txn, ok=True)
        self.close()
        # the copy first, vouching for the compacted length: a crash before the rename leaves the
        # longer old journal, which still has at least that many records
        self.write_copy(copy_of(st, len(recs)))
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"".join(encode_record(r) for r in recs))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self._fsync_dir()
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._seq = None

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
parse, fails its CRC, breaks the ``seq`` chain or comes from a newer format raises JournalError
before any knob is written.
"""

from __future__ import annotations

import fcntl
import json
import os
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polltuned.clock import Clock
from polltuned.errors import JournalError, LockedError
from polltuned.knobs.base import JsonValue
from polltuned.records import KnobValue

JOURNAL_VERSION = 1
JOURNAL_NAME = "journal.jsonl"
#: compact (checkpoint) the journal when it grows beyond this many bytes
COMPACT_BYTES = 256 * 1024
LOCK_NAME = "journal.lock"

RECORD_TYPES = frozenset({"epoch", "txn", "baseline", "intent", "applied", "undone", "observed",
                          "released", "restored", "gone", "txn-end", "clean"})


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


@dataclass
class KnobHistory:
    """Replayed state of one knob in the open epoch."""

    key: str
    order: int                       # position in first-touch order
    baseline_state: JsonValue
    baseline_value: KnobValue | None
    last_value: KnobValue | None     # last value polltuned knows it left there (settled)
    settled: bool = True             # False between an intent and its applied/undone
    released: bool = False
    restored: bool = False
    gone: bool = False
    released_live: KnobValue | None = None
    #: parts released to the admin (IRQ numbers of an IRQ affinity knob); the rest is still managed
    released_parts: frozenset[str] = frozenset()


@dataclass
class JournalState:
    epoch: int = 0
    open: bool = False
    knobs: dict[str, KnobHistory] = field(default_factory=dict)
    last_txn: int = 0
    unfinished_txn: int | None = None


def replay(records: tuple[dict[str, Any], ...]) -> JournalState:
    """Pure: fold journal records into the state of the latest epoch."""
    st = JournalState()
    for r in records:
        t = r["type"]
        key = r.get("key")
        h = st.knobs.get(key) if isinstance(key, str) else None
        if t == "epoch":
            st.epoch = int(r.get("epoch", st.epoch + 1))
            st.open = True
            st.knobs = {}
        elif t == "clean":
            st.open = False
            st.knobs = {}
        elif t == "txn":
            st.last_txn = max(st.last_txn, int(r.get("txn", 0)))
            st.unfinished_txn = int(r.get("txn", 0))
        elif t == "txn-end":
            st.unfinished_txn = None
        elif t == "baseline" and isinstance(key, str):
            if key not in st.knobs:
                v = r.get("value")
                st.knobs[key] = KnobHistory(key, len(st.knobs), r.get("state"), v, v)
            elif r.get("extend") is True:
                known = st.knobs[key]
                known.baseline_state = r.get("state")
                known.baseline_value = r.get("value")
        elif h is None:
            continue
        elif t == "intent":
            h.settled = False
            h.restored = False
        elif t in ("applied", "undone", "observed"):
            h.settled = True
            h.last_value = r.get("value")
            if t == "applied":
                h.restored = False
        elif t == "released":
            parts = r.get("parts")
            if isinstance(parts, list) and parts:
                h.released_parts = h.released_parts | frozenset(str(p) for p in parts)
            else:
                h.released = True
                h.released_live = r.get("live")
        elif t == "restored":
            h.restored = True
            h.settled = True
            h.last_value = h.baseline_value
        elif t == "gone":
            h.gone = True
    return st


class Journal:
    """Durable record of baselines, intents and applied values (see module doc)."""

    def __init__(self, state_dir: Path | str, *, clock: Clock) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / JOURNAL_NAME
        self.clock = clock
        self._seq: int | None = None
        self._fd: int | None = None
        self._lock_fd: int | None = None

    # -- reading ---------------------------------------------------------------------------
    def load(self) -> ParsedJournal:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return ParsedJournal((), 0, 0)
        except OSError as e:
            raise JournalError(f"{self.path}: cannot read: {e.strerror}") from e
        return parse_journal(data, str(self.path))

    def records(self) -> tuple[dict[str, Any], ...]:
        return self.load().records

    def state(self) -> JournalState:
        return replay(self.records())

    # -- locking ---------------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive writer lock (STATE_DIR/journal.lock); LockedError if another process holds it."""
        if self._lock_fd is not None:  # re-entrant within one Journal
            yield
            return
        self._ensure_dir()
        fd = os.open(self.dir / LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o600)
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
                raise JournalError(f"{self.dir}: cannot create state directory: {e.strerror}") from e

    def _open_for_append(self) -> int:
        if self._fd is not None:
            return self._fd
        self._ensure_dir()
        parsed = self.load()
        created = not self.path.exists()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as e:
            raise JournalError(f"{self.path}: cannot open for append: {e.strerror}") from e
        if parsed.torn_bytes:
            os.ftruncate(fd, parsed.good_bytes)  # repair the torn tail before appending
            os.fsync(fd)
        if created:
            dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
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
            n = os.write(fd, data)
            if n != len(data):
                raise OSError(5, "short write")
            os.fsync(fd)
        except OSError as e:
            self.close()
            raise JournalError(f"{self.path}: append failed: {e.strerror}",
                               hint="no knob was written after this failure") from e
        self._seq += 1
        return rec

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def compact(self) -> bool:
        """Checkpoint: rewrite the journal as the minimal records that replay to the same state
        (epoch, baselines in first-touch order, each knob's latest status), via a fsync'd temporary
        file renamed over the journal (atomic: a crash leaves either the old or the new file).
        A clean journal is simply emptied. Call with the lock held. Returns True when rewritten."""
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
                add("baseline", key=h.key, state=h.baseline_state, value=h.baseline_value)
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
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"".join(encode_record(r) for r in recs))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._seq = None

"""The actuator: the only caller of Knob.write/restore. Journal first, then write.

apply(assignment) is a transaction:

1. validate every value (KnobValueError before anything is written) and check the knobs exist;
2. admin check: a managed knob whose live value differs from what polltuned last left there is
   *released* (journaled; never written again; rollback leaves it alone) and skipped;
3. open an epoch if the host is clean; journal the baseline (snapshot) of every knob touched for
   the first time in the epoch — all baselines are fsync'd before the first write;
4. per knob: journal ``intent`` -> write -> read back and verify -> journal ``applied``;
5. on any failure, every knob this call touched is put back to its pre-call state in reverse
   order (``undone``) and the error is raised;
6. knobs changed as a side effect of our own writes (sysfs write-all clobbers per-NAPI values)
   are journaled as ``observed`` so they are not mistaken for admin changes.

rollback() restores every baseline of the open epoch in reverse first-touch order, skipping
released knobs and reporting vanished ones; when nothing failed it closes the epoch (``clean``).
It needs nothing but the state directory, so it works from a fresh process after a crash. Each
restore is journaled (``intent`` with ``rollback``) before it is written, like an apply.
When the journal is damaged (head lost, emptied, cut inside a baseline, a bad record) it restores
from the baseline copy instead (journal.py), sets the damaged journal aside once every knob is
back, and raises JournalRecovered (exit 7) carrying the report: damage is never reported as clean.
Both rollbacks run the same loop (``_restore_all``); a recovery cannot append to the damaged
journal, so it hands the loop a ``record`` callable that only logs.

Per-part ownership: a knob made of independent parts (IRQ affinity: one part per IRQ, see
Knob.parts) is judged part by part. A part someone else changed is released alone (``released``
with ``parts``), the knob keeps managing the others, and rollback restores only what polltuned
still owns. A part back at its original value, vanished, or newly created by the kernel is a
kernel reset, never an admin change. Components the kernel created after the first touch
(re-created NAPIs, new IRQs) are added to the baseline before polltuned first writes them
(``baseline`` with ``extend``; the baseline copy is rewritten with the extension before that
write too), so rollback, from the journal or from the copy, puts them back to the kernel's
defaults.

plan(assignment) is apply without side effects (``polltuned apply --dry-run``): the records the
transaction would journal (releases, baselines and their extensions, intents, expected writes),
nothing written or locked.

Test hook: ``POLLTUNED_TEST_PAUSE_AFTER=STAGE[:N]`` (STAGE in baseline, intent, write) makes the
process SIGSTOP itself right after the Nth such step (default 1st; the record is already
fsync'd), so a crash test can SIGKILL it exactly there.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, NoReturn

from polltuned.clock import Clock
from polltuned.errors import (
    HostError,
    JournalError,
    JournalUnverified,
    KnobUnsupported,
    ParseError,
    PermissionNeeded,
    PolltunedError,
    StateNotWritable,
)
from polltuned.host.fs import Host
from polltuned.journal import COMPACT_BYTES, BaselineCopy, Journal, JournalState, KnobHistory
from polltuned.knobs.base import JsonValue, Knob, KnobGone
from polltuned.knobs.registry import KnobRegistry
from polltuned.records import KnobValue

log = logging.getLogger("polltuned.actuator")

PAUSE_ENV = "POLLTUNED_TEST_PAUSE_AFTER"


@dataclass(frozen=True)
class KnobChange:
    key: str
    before: KnobValue | None
    after: KnobValue


@dataclass(frozen=True)
class ApplyResult:
    txn: int
    changes: tuple[KnobChange, ...]
    skipped_released: tuple[str, ...] = ()
    released_now: tuple[str, ...] = ()


RollbackOutcome = Literal["restored", "already", "released", "gone", "failed"]


@dataclass(frozen=True)
class RollbackItem:
    key: str
    outcome: RollbackOutcome
    value: KnobValue | None = None
    detail: str = ""


#: a rollback item's detail when the journal's record of polltuned's last write of the knob may be
#: lost (a damaged, short or unverified journal): the knob is restored, never released
EVIDENCE_LOST = "the journal's record of polltuned's last write is lost: restored, not taken for an admin change"


@dataclass(frozen=True)
class RollbackReport:
    items: tuple[RollbackItem, ...]
    clean: bool                       # epoch closed: nothing of polltuned's left on the host
    was_dirty: bool
    #: what still makes the rollback an error after every restore: the journal could not record it
    #: (state-not-writable) or cannot be proven complete (journal-unverified)
    problem: PolltunedError | None = None

    @property
    def ok(self) -> bool:
        return all(i.outcome != "failed" for i in self.items)


VerifyState = Literal["holds", "admin-changed", "partly-released", "kernel-reset", "gone", "released", "restored",
                      "interrupted", "unknown"]


@dataclass(frozen=True)
class VerifyRow:
    key: str
    state: VerifyState
    expected: KnobValue | None
    live: KnobValue | None
    baseline: KnobValue | None
    detail: str = ""
    #: parts released to the admin by this verification (state partly-released)
    released_now: tuple[str, ...] = ()
    #: parts back at their original value, vanished or new (a kernel reset of those parts)
    reset_parts: tuple[str, ...] = ()
    #: every part released so far (this verification and earlier ones)
    released_parts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ManagedKnob:
    key: str
    baseline: KnobValue | None
    last_written: KnobValue | None
    live: KnobValue | None
    state: Literal["polltuned", "released", "unsupported", "gone", "restored"]
    #: parts released to the admin (IRQ numbers); the knob still manages the others
    released_parts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Judgement:
    """How a knob's live value relates to what polltuned left there (see Actuator.judge)."""

    state: Literal["holds", "kernel-reset", "admin-changed", "partly-released"]
    admin_parts: tuple[str, ...] = ()
    reset_parts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ApplyPlan:
    """What ``apply`` would do (``polltuned apply --dry-run``): the journal records of the
    transaction in order (``type`` plus payload; ``applied`` carries the value apply expects to
    read back, or for a knob with parts left to the admin the value apply writes and verifies:
    the parts polltuned still owns), the changes, and the knobs it would skip or release."""

    records: tuple[dict[str, Any], ...]
    changes: tuple[KnobChange, ...]
    skipped_released: tuple[str, ...] = ()
    released_now: tuple[str, ...] = ()


@dataclass(frozen=True)
class JournalHealth:
    """``clean`` / ``dirty`` / ``corrupt`` / ``unknown`` for status. ``corrupt`` carries the error and,
    when the baseline copy is usable, the knobs it lists with their live values (``from_copy``).
    ``unknown``: the journal cannot be proven complete (copy missing or damaged) and no knob it
    knows carries a polltuned value: never reported as clean (error: JournalUnverified)."""

    state: Literal["clean", "dirty", "corrupt", "unknown"]
    error: JournalError | None = None
    note: str = ""
    from_copy: tuple[ManagedKnob, ...] = ()
    #: corrupt, but the baseline copy is usable: ``rollback`` can restore from it
    restorable: bool = False
    #: clean, but these knobs were released to the admin in the last epoch (left as the admin set them)
    released: tuple[str, ...] = ()


class JournalRecovered(JournalError):
    """The journal was damaged; rollback restored what it could from the baseline copy (``report``).
    Still an error (exit 7): the damage is reported, never passed off as a clean host."""

    def __init__(self, damage: JournalError, report: RollbackReport, copy_path: Path, aside: Path | None) -> None:
        counts: dict[str, int] = {}
        for i in report.items:
            counts[i.outcome] = counts.get(i.outcome, 0) + 1
        summary = ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "nothing left to restore"
        tail = f"; damaged journal kept as {aside}" if aside is not None else \
            ("; the damaged journal stays until every knob is restored" if not report.clean else "")
        super().__init__(f"{damage.message}; rolled back from the baseline copy {copy_path}: {summary}{tail}",
                         hint="every knob is back at its original value (or released to the admin)" if report.clean
                         else "fix what failed and run `polltuned rollback` again")
        self.damage = damage
        self.report = report
        self.aside = aside


Record = Callable[..., object]


def _refuse_unverified(why: str) -> JournalUnverified:
    return JournalUnverified(f"{why}: nothing is written over a journal that may have lost records",
                             hint="run `polltuned rollback`, check the knobs, then "
                                  "`polltuned rollback --accept-unknown`")


def _tolerant(record: Record) -> tuple[Record, list[StateNotWritable]]:
    """``record`` that, once the state directory cannot take a write (disk full, read-only), only
    logs: the rollback goes on restoring knobs (the host matters more than the record); the caller
    reports the failure (the list holds it)."""
    lost: list[StateNotWritable] = []

    def rec(type_: str, **payload: object) -> None:
        if not lost:
            try:
                record(type_, **payload)
                return
            except StateNotWritable as e:
                lost.append(e)
                log.error("%s: rollback goes on without journaling", e.message)
        log.info("unjournaled: %s %s", type_, payload.get("key", ""))

    return rec, lost


class _Pauser:
    def __init__(self) -> None:
        spec = os.environ.get(PAUSE_ENV, "")
        stage, _, n = spec.partition(":")
        self.stage = stage
        self.at = int(n) if n.isdigit() else 1
        self.count = 0

    def step(self, stage: str) -> None:
        if not self.stage or stage != self.stage:
            return
        self.count += 1
        if self.count == self.at:
            os.kill(os.getpid(), signal.SIGSTOP)


def _same(a: object, b: object) -> bool:
    return (a == b and type(a) is type(b)) or (isinstance(a, int) and isinstance(b, int) and a == b)


class Actuator:
    def __init__(self, host: Host, journal: Journal, *, registry: KnobRegistry | None = None,
                 app_cpus: Sequence[int] = (), clock: Clock) -> None:
        self.host = host
        self.journal = journal
        self.registry = registry or KnobRegistry(host, app_cpus=app_cpus)
        self.clock = clock

    # -- reading ------------------------------------------------------------------------------
    def knob(self, key: str) -> Knob:
        return self.registry.get(key)

    def read(self, keys: Iterable[str]) -> dict[str, KnobValue]:
        return {k: self.knob(k).read() for k in keys}

    # -- apply --------------------------------------------------------------------------------
    def _prepare(self, assignment: Mapping[str, KnobValue], *, warn: bool = True
                 ) -> tuple[dict[str, Knob], dict[str, KnobValue]]:
        """Step 1: validate every value and check every knob is present and writable."""
        knobs: dict[str, Knob] = {}
        values: dict[str, KnobValue] = {}
        for key, raw in assignment.items():  # 1. validate everything before touching anything
            k = self.knob(key)
            values[key] = k.validate(raw)
            knobs[key] = k
        for key, k in knobs.items():
            av = k.availability()
            if not av.present:
                raise KnobUnsupported(f"{key}: {av.reason}")
            for w in av.warnings if warn else ():
                log.warning("%s: %s", key, w, extra={"knob": key})
            if not av.writable:
                raise PermissionNeeded(f"{key}: {av.reason}") if "root" in av.reason or "CAP_" in av.reason \
                    else KnobUnsupported(f"{key}: {av.reason}")
        return knobs, values

    def plan(self, assignment: Mapping[str, KnobValue], *, reason: str = "") -> ApplyPlan:
        """The transaction apply() would journal, computed read-only: no lock, no record, no write.
        Raises what apply() would raise before its first write (bad value, missing knob, damaged
        journal)."""
        knobs, values = self._prepare(assignment, warn=False)
        st = self.journal.state()
        if st.unverified:
            raise _refuse_unverified(st.unverified)
        recs: list[dict[str, Any]] = []
        released_now: list[str] = []
        parts_now: dict[str, frozenset[str]] = {}
        for key, h in st.knobs.items():
            if h.released or h.gone:
                continue
            found = self._admin_live(key, h)
            if found is not None:
                live, j = found
                recs.append({"type": "released", **self._release_payload(key, h, live, j)})
                if j.state == "admin-changed":
                    released_now.append(key)
                else:
                    parts_now[key] = frozenset(j.admin_parts)
        skipped = [k for k in values if (k in st.knobs and st.knobs[k].released) or k in released_now]
        todo = [k for k in values if k not in skipped]
        if not st.open:
            recs.append({"type": "epoch", "epoch": self.journal.next_epoch(st)})
        txn = st.last_txn + 1
        recs.append({"type": "txn", "txn": txn, "reason": reason, "keys": todo})
        pre: dict[str, JsonValue] = {key: knobs[key].snapshot() for key in todo}
        before: dict[str, KnobValue] = {key: knobs[key].read() for key in todo}
        baselines: dict[str, JsonValue] = {}
        for key in todo:
            hist = st.knobs.get(key)
            if hist is None:
                recs.append({"type": "baseline", "key": key, "state": pre[key], "value": before[key],
                             "kind": knobs[key].kind})
                baselines[key] = pre[key]
            else:
                state, value = knobs[key].extend_baseline(hist.baseline_state, hist.baseline_value, pre[key],
                                                          before[key])
                if state != hist.baseline_state or value != hist.baseline_value:
                    recs.append({"type": "baseline", "key": key, "state": state, "value": value,
                                 "kind": knobs[key].kind, "extend": True})
                baselines[key] = state
        writes: dict[str, KnobValue] = {}
        for key in todo:
            hist = st.knobs.get(key)
            released = (hist.released_parts if hist is not None else frozenset()) | parts_now.get(key, frozenset())
            writes[key] = values[key] if not released else \
                knobs[key].without_parts(values[key], baselines[key], released)
            recs.append({"type": "intent", "key": key, "value": values[key], "txn": txn})
            recs.append({"type": "applied", "key": key, "value": writes[key], "txn": txn})
        recs.append({"type": "txn-end", "txn": txn, "ok": True})
        return ApplyPlan(tuple(recs), tuple(KnobChange(k, before[k], values[k]) for k in todo), tuple(skipped),
                         tuple(released_now))

    def apply(self, assignment: Mapping[str, KnobValue], *, reason: str = "") -> ApplyResult:
        knobs, values = self._prepare(assignment)
        pause = _Pauser()
        with self.journal.locked():
            if self.journal.size() > COMPACT_BYTES:
                self.journal.compact()
            st = self.journal.state()
            released_now: list[str] = []
            skipped: list[str] = []
            # 2. admin wins (checked for every managed knob, so later changes are our side effects);
            #    knobs with parts (IRQ affinity) may lose only some parts to the admin
            if st.unverified:
                raise _refuse_unverified(st.unverified)
            for key, h in st.knobs.items():
                if h.released or h.gone:
                    continue
                if self._admin_changed(key, h):
                    released_now.append(key)
            st = self.journal.state()
            todo = []
            for key in values:
                prev = st.knobs.get(key)
                if prev is not None and prev.released:
                    skipped.append(key)
                    log.warning("%s: released (changed by the admin); not writing it", key, extra={"knob": key})
                else:
                    todo.append(key)
            # 3. epoch and baselines (and extensions), all durable before the first write
            if st.copy_note:
                log.warning("%s", st.copy_note)
            if not st.open:
                self.journal.append("epoch", epoch=self.journal.next_epoch(st))
            txn = st.last_txn + 1
            self.journal.append("txn", txn=txn, reason=reason, keys=todo)
            # the live state before this transaction: the baseline at first touch, and what undo restores
            pre: dict[str, JsonValue] = {key: knobs[key].snapshot() for key in todo}
            before: dict[str, KnobValue] = {key: knobs[key].read() for key in todo}
            baselines: dict[str, JsonValue] = {}
            for key in todo:
                hist = st.knobs.get(key)
                if hist is None:
                    self.journal.append("baseline", key=key, state=pre[key], value=before[key], kind=knobs[key].kind)
                    pause.step("baseline")
                    baselines[key] = pre[key]
                else:
                    baselines[key] = self._extend_baseline(knobs[key], hist, pre[key], before[key])
            # the second copy of the baselines (extensions included), durable before the first write
            self.journal.sync_copy()
            others = {key: h for key, h in self.journal.state().knobs.items()
                      if key not in todo and not h.released and not h.gone and h.settled}
            touched: list[str] = []
            changes: list[KnobChange] = []
            try:
                for key in todo:  # 4. intent -> write -> verify -> applied
                    k = knobs[key]
                    self.journal.append("intent", key=key, value=values[key], txn=txn)
                    pause.step("intent")
                    touched.append(key)
                    hist = st.knobs.get(key)
                    mine = values[key] if hist is None or not hist.released_parts else \
                        k.without_parts(values[key], baselines[key], hist.released_parts)
                    k.write(mine, baseline=baselines[key])
                    pause.step("write")
                    if not k.verify(mine):
                        raise HostError(f"{key}: wrote {mine!r} but the kernel reads back {k.read()!r}",
                                        hint="the kernel or driver clamped/rejected the value; nothing kept")
                    after = k.read()
                    self.journal.append("applied", key=key, value=after, txn=txn)
                    changes.append(KnobChange(key, before[key], after))
            except Exception as e:
                failures = self._undo(knobs, touched, pre, txn)
                self.journal.append("txn-end", txn=txn, ok=False, error=str(e))
                self._mark()
                msg = e.message if isinstance(e, PolltunedError) else f"{type(e).__name__}: {e}"
                if failures:
                    msg += "; undo failed for " + ", ".join(failures) + " (run `polltuned rollback`)"
                else:
                    msg += "; every knob of this change was put back"
                err = PolltunedError(f"apply failed: {msg}", code="apply-failed")
                raise err from e
            try:
                # 6. side effects of our own writes
                for key, h in others.items():
                    try:
                        live = self.knob(key).read()
                    except (HostError, PolltunedError):
                        continue
                    if not _same(live, h.last_value):
                        self.journal.append("observed", key=key, value=live, txn=txn)
                self.journal.append("txn-end", txn=txn, ok=True)
            except StateNotWritable as e:
                raise StateNotWritable(f"{e.message}: the new values are written and journaled, but not the end of "
                                       "the transaction", hint="free space on the state directory's file system; "
                                       "`polltuned rollback` restores the originals") from e
            self._mark()
        for c in changes:
            # unchanged knobs are rewritten on every trial (the assignment is whole): only real changes at info
            log.log(logging.INFO if c.before != c.after else logging.DEBUG, "%s: %r -> %r%s", c.key, c.before,
                    c.after, f" ({reason})" if reason else "", extra={"knob": c.key})
        return ApplyResult(txn, tuple(changes), tuple(skipped), tuple(released_now))

    def _mark(self) -> None:
        """The copy vouches for the journal's length (journal.py) at a transaction's end. A full disk
        here loses nothing: the journal holds the transaction; the mark only lags (less detection)."""
        try:
            self.journal.sync_copy(mark=True)
        except StateNotWritable as e:
            log.warning("%s: the baseline copy's length mark lags", e.message)

    def _undo(self, knobs: Mapping[str, Knob], touched: list[str], pre: Mapping[str, JsonValue],
              txn: int) -> list[str]:
        failures = []
        for key in reversed(touched):
            k = knobs[key]
            try:
                if not k.matches(pre[key]):  # a write that failed may have left nothing to undo
                    k.restore(pre[key])
                try:
                    self.journal.append("undone", key=key, value=k.read(), txn=txn)
                except StateNotWritable:  # put back, but unrecorded: unsettled, so rollback restores it
                    log.warning("%s: put back, but the journal could not record it (disk full)", key)
            except Exception as e:  # keep undoing the others; rollback will retry from the baseline
                log.error("%s: undo failed: %s", key, e, extra={"knob": key})
                failures.append(key)
        return failures

    def _extend_baseline(self, k: Knob, h: KnobHistory, now_state: JsonValue, now_value: KnobValue) -> JsonValue:
        """The baseline plus the components the kernel created since (NAPIs re-created by a link
        down/up, new IRQs), journaled before polltuned first writes them (and copied: apply syncs
        the baseline copy after this). Every component polltuned ever wrote is therefore in the
        baseline, and rollback restores it to the kernel's value."""
        state, value = k.extend_baseline(h.baseline_state, h.baseline_value, now_state, now_value)
        if state != h.baseline_state or value != h.baseline_value:
            self.journal.append("baseline", key=h.key, state=state, value=value, kind=k.kind, extend=True)
            log.info("%s: components created by the kernel since the first touch added to the baseline",
                     h.key, extra={"knob": h.key})
        return state

    def judge(self, key: str, h: KnobHistory, live: KnobValue | None) -> Judgement:
        """Compare a settled knob's live value with what polltuned last left there (no write, no record).

        Indivisible knobs: the same -> holds; back at the original -> kernel-reset (a knob back at its
        original value is never an admin release); anything else -> admin-changed. Knobs with parts
        (Knob.parts) are judged part by part, skipping parts already released: a part someone else
        changed is an admin part; a part back at its original, vanished or newly created is a reset
        part. Admin parts covering every owned part -> admin-changed (the whole knob); some ->
        partly-released; only reset parts -> kernel-reset."""
        k = self.knob(key)
        last, now = k.parts(h.last_value), k.parts(live)
        if last is None or now is None:
            if _same(live, h.last_value):
                return Judgement("holds")
            if _same(live, h.baseline_value):
                return Judgement("kernel-reset")
            return Judgement("admin-changed")
        base = k.parts(h.baseline_value) or {}
        owned = [p for p in last if p not in h.released_parts]
        admin: list[str] = []
        reset: list[str] = []
        for p in owned:
            if p not in now:
                reset.append(p)            # IRQ freed or re-numbered, now managed by the kernel
            elif now[p] == last[p]:
                continue
            elif base.get(p) == now[p]:
                reset.append(p)
            else:
                admin.append(p)
        reset += [p for p in now if p not in last and p not in h.released_parts]  # created by the kernel
        if admin and len(admin) == len(owned) and not reset:
            return Judgement("admin-changed", tuple(admin))
        if admin:
            return Judgement("partly-released", tuple(admin), tuple(reset))
        if reset:
            return Judgement("kernel-reset", (), tuple(reset))
        return Judgement("holds")

    def _release_payload(self, key: str, h: KnobHistory, live: KnobValue | None, j: Judgement) -> dict[str, Any]:
        """The ``released`` record for ``j``: the whole knob, or (partly-released) only its admin parts."""
        if j.state == "partly-released":
            k = self.knob(key)
            now, last = k.parts(live) or {}, k.parts(h.last_value) or {}
            return {"key": key, "parts": list(j.admin_parts), "live": {p: now.get(p) for p in j.admin_parts},
                    "expected": {p: last.get(p) for p in j.admin_parts}}
        return {"key": key, "live": live, "expected": h.last_value}

    def _release(self, key: str, h: KnobHistory, live: KnobValue | None, j: Judgement, why: str,
                 record: Record | None = None) -> None:
        """Journal admin wins for ``j`` (the whole knob, or only its admin parts) through ``record``
        (default: the journal)."""
        (record or self.journal.append)("released", **self._release_payload(key, h, live, j))
        if j.state == "partly-released":
            k = self.knob(key)
            now, last = k.parts(live) or {}, k.parts(h.last_value) or {}
            log.warning("%s: %s changed outside polltuned (%s): released, %s; polltuned keeps the rest",
                        key, ", ".join(j.admin_parts),
                        ", ".join(f"{p}: {last.get(p)} -> {now.get(p)}" for p in j.admin_parts), why,
                        extra={"knob": key})
            return
        log.warning("%s: changed outside polltuned (%r, polltuned left %r): released, %s",
                    key, live, h.last_value, why, extra={"knob": key})

    def _admin_live(self, key: str, h: KnobHistory) -> tuple[KnobValue | None, Judgement] | None:
        """The live value and its judgement when someone else changed the knob, or some of its parts
        (admin-changed / partly-released, see judge); None when it holds, was reset by the kernel,
        cannot be read, or its last write was interrupted."""
        if not h.settled:  # interrupted write: we do not know; rollback restores the baseline
            return None
        try:
            live = self.knob(key).read()
        except KnobGone:
            return None
        except (HostError, PolltunedError):
            return None
        j = self.judge(key, h, live)
        return (live, j) if j.state in ("admin-changed", "partly-released") else None

    def _admin_changed(self, key: str, h: KnobHistory) -> bool:
        """Journal a release when the live value differs from what polltuned last left there.
        True when the whole knob was released (a part released alone leaves the knob managed)."""
        found = self._admin_live(key, h)
        if found is None:
            return False
        live, j = found
        self._release(key, h, live, j, "admin wins")
        return j.state == "admin-changed"

    # -- rollback -----------------------------------------------------------------------------
    def rollback(self) -> RollbackReport:
        """Restore every baseline of the open epoch (module doc). Raises JournalRecovered (after
        restoring from the baseline copy) when the journal is damaged, JournalError when nothing
        can be restored safely."""
        with self.journal.locked():
            try:
                st = self.journal.state()
            except JournalError as damage:
                self._rollback_damaged(damage)
            if st.copy_note:
                log.warning("%s", st.copy_note)
            unverified = JournalUnverified(
                f"{st.unverified}; host state unknown: every knob the journal records is restored, but a knob "
                "first changed in records that may be lost cannot be known", hint="check the knobs by hand "
                "(`polltuned check`), then `polltuned rollback --accept-unknown`") \
                if st.unverified else None
            if not st.open:
                if unverified is not None:  # the copy stays missing: unknown until the admin accepts it
                    return RollbackReport((), True, False, unverified)
                try:
                    self.journal.sync_copy(st, mark=True)
                except StateNotWritable as e:
                    return RollbackReport((), True, False, e)
                return RollbackReport((), True, False)
            if st.unverified:  # the record of polltuned's last write may be lost: restore, never release
                for h in st.knobs.values():
                    h.evidence_lost = True
            record, lost = _tolerant(self.journal.append)
            items = self._restore_all(st, record)
            clean = all(i.outcome != "failed" for i in items)
            if lost:
                return RollbackReport(tuple(items), False, True, StateNotWritable(
                    f"{lost[0].message}: the knobs were restored as listed, but the journal could not record "
                    "it", hint="free space on (or remount read-write) the state directory's file system, then "
                               "run `polltuned rollback` again to close the journal"))
            if clean:
                self.journal.append("clean", epoch=st.epoch)
                if unverified is None:  # unverified: the copy stays missing (unknown until accepted)
                    self.journal.sync_copy(mark=True)
                    if self.journal.size() > COMPACT_BYTES:
                        self.journal.compact()
            return RollbackReport(tuple(items), clean, True, unverified)

    def accept_unknown(self) -> Path | None:
        """The admin checked the knobs by hand after an unverified or damaged journal (``polltuned
        rollback --accept-unknown``): the journal is set aside (journal.jsonl.damaged-N) and a closed
        copy written, so the state is known again (clean). Refused while the journal records a knob
        that is not at its original value."""
        with self.journal.locked():
            try:
                st = self.journal.state()
            except JournalError as e:
                st = self.journal.recovery(e)
            if st.open and self._dirty(st):
                raise JournalUnverified("the journal still records knobs that are not at their original value: "
                                        "not accepted", hint="run `polltuned rollback` first")
            aside = self.journal.set_aside()
            self.journal.write_copy(BaselineCopy(max(st.epoch, st.copy_epoch), False))
            return aside

    def _restore_all(self, st: JournalState, record: Record) -> list[RollbackItem]:
        """The rollback loop, for the journal (``record`` appends) and for a recovery from the baseline
        copy (``record`` only logs): prechecks for every knob first, then each restore, journaled
        (``intent`` with ``rollback``) before it is written."""
        ordered = sorted(st.knobs.values(), key=lambda x: x.order, reverse=True)
        # admin check for every knob first: restoring one knob may legitimately change another
        # (sysfs write-all resets per-NAPI values), which must not look like an admin change
        early: dict[str, RollbackItem] = {}
        now: dict[str, KnobHistory] = {}   # with the parts the prechecks released to the admin
        for h in ordered:
            pre, now[h.key] = self._rollback_precheck(h, record)
            if pre is not None:
                early[h.key] = pre
        return [early[h.key] if h.key in early else self._rollback_one(now[h.key], record) for h in ordered]

    def _rollback_damaged(self, damage: JournalError) -> NoReturn:
        """Rollback of a damaged journal from the baseline copy; always raises."""
        st = self.journal.recovery(damage)  # re-raises when the copy cannot help

        def record(type_: str, **payload: object) -> None:  # the damaged journal takes no appends
            log.info("recovery: %s %s", type_, payload.get("key", ""))

        items = self._restore_all(st, record) if st.open else []
        report = RollbackReport(tuple(items), all(i.outcome != "failed" for i in items), bool(items))
        aside = None
        if report.clean:
            try:
                aside = self.journal.set_aside()
                self.journal.write_copy(BaselineCopy(max(st.epoch, st.copy_epoch), False))
            except StateNotWritable as e:  # restored, but the damage stays on disk: the next rollback retries
                log.warning("%s", e.message)
                report = replace(report, clean=False, problem=e)
        for i in items:  # info: the caller reports the items and the damage (one error line)
            log.info("%s: %s %r (from the baseline copy)%s", i.key, i.outcome, i.value,
                     f": {i.detail}" if i.detail else "", extra={"knob": i.key})
        raise JournalRecovered(damage, report, self.journal.copy_path, aside)

    def _rollback_precheck(self, h: KnobHistory, record: Record) -> tuple[RollbackItem | None, KnobHistory]:
        """Released / gone / admin-changed decided before any restore: (item, h) when that decides the
        knob; (None, h') = restore it, h' being h plus the parts released to the admin just now."""
        key = h.key
        if h.released:
            return RollbackItem(key, "released", h.released_live, "changed by the admin; left alone"), h
        if h.gone:
            return RollbackItem(key, "gone", None, "vanished earlier"), h
        try:
            live = self.knob(key).read()
        except KnobGone as e:
            record("gone", key=key, detail=e.message)
            return RollbackItem(key, "gone", None, e.message), h
        except ParseError as e:  # unreadable live value: nobody chose it; put the baseline back
            log.warning("%s: live value unreadable (%s); restoring the baseline", key, e.message, extra={"knob": key})
            return None, h
        except PolltunedError as e:
            return RollbackItem(key, "failed", None, e.message), h
        # back at its original value = not an admin choice (kernel reset): restore it fully. An
        # unsettled knob (a write or a restore interrupted, or any knob of a recovery) is never judged
        if h.settled and not h.evidence_lost:
            j = self.judge(key, h, live)
            if j.state == "admin-changed":
                self._release(key, h, live, j, "rollback leaves it", record)
                return RollbackItem(key, "released", live, "changed by the admin; left alone"), h
            if j.state == "partly-released":
                self._release(key, h, live, j, "rollback leaves it", record)
                return None, replace(h, released_parts=h.released_parts | frozenset(j.admin_parts))
        return None, h

    def _rollback_one(self, h: KnobHistory, record: Record) -> RollbackItem:
        key = h.key
        try:
            k = self.knob(key)
            released = h.released_parts   # released to the admin (now, or earlier): left as the admin set them
            target = k.state_without(h.baseline_state, released)
            left = f"; {', '.join(sorted(released))} left to the admin" if released else ""
            try:
                already = k.matches(target)
            except ParseError:
                already = False
            if already:
                record("restored", key=key, value=h.baseline_value)
                return RollbackItem(key, "already", h.baseline_value, left.lstrip("; "))
            # journal first, as for apply: a rollback killed inside a composite restore (one NAPI or
            # IRQ of several put back) leaves an unsettled knob that the next rollback restores,
            # never a half-restored value that would look like an admin change
            record("intent", key=key, value=h.baseline_value, rollback=True)
            k.restore(target)
            if not k.matches(target):
                return RollbackItem(key, "failed", k.read(), f"restore of {h.baseline_value!r} did not stick")
        except KnobGone as e:
            record("gone", key=key, detail=e.message)
            return RollbackItem(key, "gone", None, e.message)
        except PolltunedError as e:
            return RollbackItem(key, "failed", None, e.message)
        record("restored", key=key, value=h.baseline_value)
        log.info("%s: restored %r%s", key, h.baseline_value, left, extra={"knob": key})
        if h.evidence_lost:
            left = f"; {EVIDENCE_LOST}{left}"
        return RollbackItem(key, "restored", h.baseline_value, left.lstrip("; "))

    # -- verify / status ---------------------------------------------------------------------
    def verify(self) -> list[VerifyRow]:
        return self.verify_all()[0]

    def verify_all(self) -> tuple[list[VerifyRow], str]:
        """verify() plus why the journal cannot be proven complete ("" = it can): then a knob whose
        live value differs from polltuned's last recorded write is "unknown", never released."""
        rows: list[VerifyRow] = []
        with self.journal.locked():
            st = self.journal.state()
            if not st.open:
                return rows, st.unverified
            for h in sorted(st.knobs.values(), key=lambda x: x.order):
                h.evidence_lost = bool(st.unverified)
                rows.append(self._verify_one(h))
        return rows, st.unverified

    def _verify_one(self, h: KnobHistory) -> VerifyRow:
        key = h.key
        if h.released:
            return VerifyRow(key, "released", h.last_value, h.released_live, h.baseline_value,
                             "changed by the admin earlier; polltuned no longer writes it")
        try:
            live: KnobValue | None = self.knob(key).read()
        except KnobGone as e:
            return VerifyRow(key, "gone", h.last_value, None, h.baseline_value, e.message)
        except PolltunedError as e:
            return VerifyRow(key, "gone", h.last_value, None, h.baseline_value, e.message)
        earlier = tuple(sorted(h.released_parts))
        if not h.settled:
            return VerifyRow(key, "interrupted", h.last_value, live, h.baseline_value,
                             "a write was interrupted (crash); rollback restores the baseline",
                             released_parts=earlier)
        if h.restored and _same(live, h.last_value):
            return VerifyRow(key, "restored", h.last_value, live, h.baseline_value, released_parts=earlier)
        j = self.judge(key, h, live)
        note = f"; {', '.join(earlier)} released to the admin earlier" if earlier else ""
        if h.evidence_lost and j.state in ("admin-changed", "partly-released"):
            return VerifyRow(key, "unknown", h.last_value, live, h.baseline_value,
                             "differs from polltuned's last recorded write, but that record may not be the last "
                             "(journal unverified): rollback restores it", released_parts=earlier)
        if j.state == "holds":
            return VerifyRow(key, "holds", h.last_value, live, h.baseline_value, note.lstrip("; "),
                             released_parts=earlier)
        if j.state == "kernel-reset":
            what = f"{', '.join(j.reset_parts)} " if j.reset_parts else ""
            return VerifyRow(key, "kernel-reset", h.last_value, live, h.baseline_value,
                             f"{what}back at the original value or re-created by the kernel (link down/up, "
                             "driver reset)" + note,
                             reset_parts=j.reset_parts, released_parts=earlier)
        self._release(key, h, live, j, "admin wins")
        if j.state == "partly-released":
            return VerifyRow(key, "partly-released", h.last_value, live, h.baseline_value,
                             f"{', '.join(j.admin_parts)} changed outside polltuned: released (admin wins); "
                             "polltuned keeps the rest", released_now=j.admin_parts, reset_parts=j.reset_parts,
                             released_parts=tuple(sorted(h.released_parts | set(j.admin_parts))))
        return VerifyRow(key, "admin-changed", h.last_value, live, h.baseline_value,
                         "changed outside polltuned: released (admin wins)", released_parts=earlier)

    def state(self) -> JournalState:
        return self.journal.state()

    def is_dirty(self) -> bool:
        """Does some knob still carry a polltuned value? Raises JournalError when the journal is
        damaged (a damaged journal is never reported as clean)."""
        return self._dirty(self.journal.state())

    def health(self) -> JournalHealth:
        """clean / dirty / corrupt, for status. PermissionNeeded propagates (cannot even look)."""
        try:
            st = self.journal.state()
        except JournalError as e:
            try:
                rows = tuple(self._managed_rows(self.journal.recovery(e), from_copy=True))
            except JournalError:
                return JournalHealth("corrupt", e)
            return JournalHealth("corrupt", e, "", rows, restorable=True)
        dirty = self._dirty(st)
        if st.unverified and not dirty:
            return JournalHealth("unknown", JournalUnverified(
                f"{st.unverified}: host state unknown (polltuned may have written knobs it no longer records)",
                hint="`polltuned rollback` restores what the journal records; check the knobs by hand "
                     "(`polltuned check`), then `polltuned rollback --accept-unknown`"), st.copy_note)
        return JournalHealth("dirty" if dirty else "clean", None, st.unverified or st.copy_note,
                             released=() if dirty else st.closed_released)

    def _dirty(self, st: JournalState) -> bool:
        if not st.open:
            return False
        for h in st.knobs.values():
            if h.released or h.gone:
                continue
            try:
                k = self.knob(h.key)
                if not h.settled or not k.matches(k.state_without(h.baseline_state, h.released_parts)):
                    return True
            except KnobGone:
                continue
            except PolltunedError:
                return True
        return False

    def managed(self) -> list[ManagedKnob]:
        return self._managed_rows(self.journal.state())

    def _managed_rows(self, st: JournalState, *, from_copy: bool = False) -> list[ManagedKnob]:
        out: list[ManagedKnob] = []
        if not st.open:
            return out
        for h in sorted(st.knobs.values(), key=lambda x: x.order):
            live: KnobValue | None = None
            state: Literal["polltuned", "released", "unsupported", "gone", "restored"]
            try:
                k = self.knob(h.key)
                live = k.read()
                if from_copy:  # what matters is only: still the original (parts left to the admin aside), or not
                    state = "restored" if k.matches(k.state_without(h.baseline_state, h.released_parts)) \
                        else "polltuned"
                else:
                    state = "released" if h.released else ("restored" if h.restored else "polltuned")
            except KnobGone:
                state = "gone"
            except PolltunedError:
                state = "unsupported"
            out.append(ManagedKnob(h.key, h.baseline_value, h.last_value, live, state,
                                   tuple(sorted(h.released_parts))))
        return out


def build_actuator(host: Host, state_dir: Path, clock: Clock, *, app_cpus: Sequence[int] = ()) -> Actuator:
    """The one builder of the actuator (the daemon, the CLI's knob commands, ``sim`` and the bench):
    its journal in ``state_dir`` (the journal creates the directory, 0700, at its first write) and
    the knob registry with ``app_cpus``, the application CPUs the IRQ/vhost strategies keep clear."""
    return Actuator(host, Journal(state_dir, clock=clock), registry=KnobRegistry(host, app_cpus=app_cpus),
                    app_cpus=app_cpus, clock=clock)

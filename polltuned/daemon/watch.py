"""HOLD's watcher: what polltuned deployed is verified, not just assumed.

In HOLD the controller calls :meth:`Watcher.step` between its steps. A verification runs at once
when a managed device sends an rtnetlink link notification (link down/up, driver reset, device
removed: polltuned.host.netlink), and every ``hold.verify_every`` HOLD windows otherwise. Every
managed knob is verified through the actuator (Actuator.verify judges it, journals admin
releases) and acted on:

=================  ==========================================================================
verify says        the watcher
=================  ==========================================================================
holds              ``ok``
kernel-reset       ``reapplied``: the deployed value is written again through the actuator
                   (journal first; logged with KNOB=). A knob back at its original value, or
                   whose NAPIs/IRQs were re-created with the kernel's defaults, is never an
                   admin change.
admin-changed      ``released``: the actuator journaled the release; never written again,
                   left as the admin set it by rollback (house rule 12)
partly-released    ``partly-released``: only the parts someone else changed are released (one
                   IRQ moved by irqbalance releases that IRQ; the NIC's others stay managed)
gone               ``gone``: the device vanished; reported (logged once, not every time)
released earlier   ``admin``; ``restored`` / ``interrupted`` as verify says
=================  ==========================================================================

A re-apply that fails is ``failed`` (logged once per distinct error). :meth:`Watcher.status` is
the ``last_verification`` block of the status document (the metrics exporter reads ``t``, ``ok``
and ``counts`` from it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from polltuned.actuator import Actuator, VerifyRow
from polltuned.clock import Clock
from polltuned.errors import PolltunedError
from polltuned.host.netlink import LinkEvent, LinkEventSource
from polltuned.records import KnobValue

log = logging.getLogger("polltuned.watch")

WatchState = Literal["ok", "reapplied", "released", "partly-released", "admin", "gone", "failed", "interrupted",
                     "restored"]
#: states that mean "polltuned's deployed configuration is what the host runs" (the rest are news)
QUIET: frozenset[str] = frozenset({"ok", "admin", "restored"})
REAPPLY_REASON = "kernel reset: re-applying the deployed value"
VERIFY_KEY = "(verification)"   # _reported entry of the verification itself (not a knob key)


@dataclass(frozen=True)
class WatchRow:
    key: str
    state: WatchState
    live: KnobValue | None = None
    value: KnobValue | None = None      # polltuned's value: held, or re-applied
    detail: str = ""
    parts: tuple[str, ...] = ()         # parts released (partly-released) or reset by this verification

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"key": self.key, "state": self.state, "live": self.live, "value": self.value,
                             "detail": self.detail}
        if self.parts:
            d["parts"] = list(self.parts)
        return d


@dataclass(frozen=True)
class Verification:
    t: float
    trigger: str
    rows: tuple[WatchRow, ...]
    error: str = ""                      # the verification could not run (e.g. journal locked)

    @property
    def ok(self) -> bool:
        return not self.error and all(r.state in QUIET for r in self.rows)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.state] = out.get(r.state, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"t": self.t, "trigger": self.trigger, "ok": self.ok, "knobs": len(self.rows),
                             "counts": self.counts(),
                             "changes": [r.to_json() for r in self.rows if r.state not in ("ok", "restored")]}
        if self.error:
            d["error"] = self.error
        return d


@dataclass
class Watcher:
    """Verifies the managed knobs in HOLD and acts per knob (see the module doc)."""

    actuator: Actuator
    clock: Clock
    #: opens the link notification source at the first step (None: verify on the interval only)
    open_events: Callable[[], LinkEventSource] | None = None
    last: Verification | None = None
    verifications: int = 0
    #: actions since the daemon started: reapplied / released / partly-released / gone / failed
    totals: dict[str, int] = field(default_factory=dict)
    _events: LinkEventSource | None = None
    _opened: bool = False
    _reported: dict[str, str] = field(default_factory=dict)   # key -> last state logged (no log loops)

    # -- triggers ----------------------------------------------------------------------------
    def step(self, *, window: int | None, every: int, deployed: Mapping[str, KnobValue]) -> Verification | None:
        """Called between HOLD steps: after every sleep slice (``window`` None: link events only)
        and after every HOLD window ``window`` (1, 2, ...). Returns the verification it ran, if any."""
        trigger = self._event_trigger()
        if not trigger and window is not None and every > 0 and window % every == 0:
            trigger = f"every {every} HOLD window{'s' if every != 1 else ''}"
        if not trigger:
            return None
        return self.verify(trigger, deployed)

    def _poll(self) -> list[LinkEvent]:
        if not self._opened:
            self._opened = True
            if self.open_events is not None:
                try:
                    self._events = self.open_events()
                except PolltunedError as e:
                    log.warning("link events unavailable (%s): verifying every hold.verify_every windows only",
                                e.message)
        if self._events is None:
            return []
        try:
            return self._events.poll()
        except PolltunedError as e:
            log.warning("link events stopped (%s): verifying every hold.verify_every windows only", e.message)
            self.close()
            return []

    def _link_device(self, key: str) -> str | None:
        """The host-netns device a managed knob lives on, or None (sysctls, module parameters,
        devices inside a named netns: their events are not seen from the host's rtnetlink socket;
        they are verified every ``verify_every`` windows)."""
        try:
            return self.actuator.registry.key(key).host_device
        except PolltunedError:
            return None

    def _event_trigger(self) -> str:
        events = self._poll()
        if not events:
            return ""
        lost = [e for e in events if e.kind == "lost"]
        if lost:
            return "link event: " + lost[0].describe()
        try:
            devices = {d for d in map(self._link_device, self.actuator.state().knobs) if d is not None}
        except PolltunedError:
            devices = set()
        mine = [e for e in events if e.ifname in devices]
        if not mine:
            return ""
        seen: list[str] = []
        for e in mine:   # the latest state of each device that sent one
            text = e.describe()
            seen = [s for s in seen if not s.startswith(e.ifname + " ")] + [text]
        return "link event: " + ", ".join(seen)

    # -- one verification --------------------------------------------------------------------
    def verify(self, trigger: str, deployed: Mapping[str, KnobValue] | None = None) -> Verification:
        deployed = deployed or {}
        t = self.clock.wall()
        try:
            checked = self.actuator.verify()
        except PolltunedError as e:
            if self._reported.get(VERIFY_KEY) != "failed":
                log.error("verification skipped: %s", e.message)
            return self._done(Verification(t, trigger, (), error=e.message))
        rows: dict[str, WatchRow] = {}
        todo: dict[str, KnobValue] = {}
        for r in checked:
            row = self._row(r)
            if r.state == "kernel-reset" or (r.state == "partly-released" and r.reset_parts):
                value = self._value(r, deployed)
                if value is None:
                    row = WatchRow(r.key, "failed", r.live, r.expected,
                                   f"back at its original value, but {r.expected!r} cannot be written again")
                else:
                    todo[r.key] = value
            rows[r.key] = row
        if todo:
            rows.update(self._reapply(todo, rows, {r.key: r for r in checked}))
        v = Verification(t, trigger, tuple(rows[r.key] for r in checked))
        for row in v.rows:
            self._log(row)
        return self._done(v)

    def _row(self, r: VerifyRow) -> WatchRow:
        if r.state == "holds":
            return WatchRow(r.key, "ok", r.live, r.expected, r.detail)
        if r.state == "admin-changed":
            return WatchRow(r.key, "released", r.live, r.expected, r.detail)
        if r.state == "partly-released":
            return WatchRow(r.key, "partly-released", r.live, r.expected, r.detail, r.released_now)
        if r.state == "released":
            return WatchRow(r.key, "admin", r.live, r.expected, r.detail)
        if r.state == "kernel-reset":
            return WatchRow(r.key, "reapplied", r.live, r.expected, r.detail, r.reset_parts)
        if r.state == "gone":
            return WatchRow(r.key, "gone", r.live, r.expected, r.detail)
        if r.state == "interrupted":
            return WatchRow(r.key, "interrupted", r.live, r.expected, r.detail)
        return WatchRow(r.key, "restored", r.live, r.expected, r.detail)

    def _value(self, r: VerifyRow, deployed: Mapping[str, KnobValue]) -> KnobValue | None:
        """What to write again: the deployed configuration's value (a strategy such as ``spread``
        re-expands over re-numbered IRQs), else what polltuned last left there; None if neither
        is a valid value of the knob (e.g. a ``mixed:`` per-NAPI reading)."""
        try:
            k = self.actuator.knob(r.key)
        except PolltunedError:
            return None
        for cand in (deployed.get(r.key), r.expected):
            if cand is None:
                continue
            try:
                return k.validate(cand)
            except PolltunedError:
                continue
        return None

    def _reapply(self, todo: Mapping[str, KnobValue], rows: Mapping[str, WatchRow],
                 checked: Mapping[str, VerifyRow]) -> dict[str, WatchRow]:
        out: dict[str, WatchRow] = {}
        try:
            res = self.actuator.apply(todo, reason=REAPPLY_REASON)
        except PolltunedError as e:
            for key, value in todo.items():
                out[key] = WatchRow(key, "failed", checked[key].live, value, f"re-apply failed: {e.message}")
            return out
        after = {c.key: c.after for c in res.changes}
        for key, value in todo.items():
            r, row = checked[key], rows[key]
            if key in res.skipped_released or key in res.released_now:
                out[key] = WatchRow(key, "released", r.live, r.expected, "changed outside polltuned while "
                                    "re-applying: released (admin wins)")
            elif row.state == "partly-released":
                out[key] = WatchRow(key, "partly-released", after.get(key, r.live), value,
                                    f"{row.detail}; {', '.join(r.reset_parts)} reset by the kernel: re-applied",
                                    row.parts)
            else:
                out[key] = WatchRow(key, "reapplied", after.get(key, r.live), value,
                                    f"re-applied {value!r} (was {r.live!r}): {r.detail}", r.reset_parts)
        return out

    def _done(self, v: Verification) -> Verification:
        self.last = v
        self.verifications += 1
        if v.error:
            self._reported[VERIFY_KEY] = "failed"
        else:
            self._reported.pop(VERIFY_KEY, None)
        for r in v.rows:
            prev = self._reported.get(r.key)
            if r.state in ("reapplied", "released", "partly-released") or (r.state in ("gone", "failed")
                                                                            and prev != r.state):
                self.totals[r.state] = self.totals.get(r.state, 0) + 1
            self._reported[r.key] = r.state
        return v

    # -- logging: news once, not on every verification ------------------------------------------
    def _log(self, row: WatchRow) -> None:
        """Called before _done records the row: ``_reported`` still holds the previous state."""
        prev = self._reported.get(row.key)
        if row.state == "reapplied":
            log.warning("%s: kernel reset: %s", row.key, row.detail, extra={"knob": row.key})
        elif row.state in ("failed", "gone", "interrupted") and prev != row.state:
            log.log(logging.ERROR if row.state == "failed" else logging.WARNING, "%s: %s: %s", row.key, row.state,
                    row.detail, extra={"knob": row.key})
        elif row.state == "ok" and prev == "gone":
            log.info("%s: back, and holds polltuned's value", row.key, extra={"knob": row.key})
        # released / partly-released: the actuator logged the release when it journaled it

    # -- status ----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any] | None:
        """The ``last_verification`` block of the status document, or None before the first one."""
        if self.last is None:
            return None
        return {**self.last.to_json(), "verifications": self.verifications, "totals": dict(self.totals)}

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None


def summarize(counts: Mapping[str, Any], order: Sequence[str] = ("ok", "reapplied", "released", "partly-released",
                                                                 "admin", "gone", "failed", "interrupted",
                                                                 "restored")) -> str:
    """``4 ok, 1 re-applied`` from a counts mapping (pure; used by the status renderer)."""
    names = {"reapplied": "re-applied", "partly-released": "partly released", "admin": "left to the admin"}
    keys = [k for k in order if counts.get(k)] + sorted(k for k in counts if k not in order and counts.get(k))
    return ", ".join(f"{counts[k]} {names.get(k, k)}" for k in keys) or "no managed knobs"

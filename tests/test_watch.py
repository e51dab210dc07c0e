"""HOLD watches what it deployed (issue 10 item 3): kernel resets re-applied within one verification
interval (a simulated link down/up that re-creates NAPIs with default values), admin changes released
knob by knob and IRQ by IRQ, vanished devices reported, link events verifying at once, and the last
verification in status and metrics. All on fake /proc+/sys trees with fake netdev genl and fake
rtnetlink link notifications."""

from __future__ import annotations

import json
import logging
import shutil
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from polltuned.actuator import Actuator
from polltuned.clock import FakeClock
from polltuned.daemon.controller import HOLD, STOPPED, Controller
from polltuned.daemon.metrics import metrics_from_status
from polltuned.daemon.render import render_status
from polltuned.daemon.statusdoc import build_status
from polltuned.daemon.watch import Watcher, summarize
from polltuned.daemon.wiring import build_daemon
from polltuned.engine.actions import Action, Apply, Done, Measure
from polltuned.engine.phases import Event, EventKind, Phase, WindowKind
from polltuned.engine.session import TuningResult
from polltuned.errors import PolicyError, PolltunedError
from polltuned.host.fs import FsHost
from polltuned.host.netlink import (
    FileLinkEvents,
    LinkEvent,
    NetlinkLinkEvents,
    encode_link_message,
    parse_link_messages,
)
from polltuned.journal import JOURNAL_NAME, Journal, replay
from polltuned.knobs.keys import parse_key
from polltuned.knobs.registry import KnobRegistry
from polltuned.policy.loader import load_policy, policy_from_dict
from polltuned.policy.schema import Policy
from polltuned.probes.sim import make_fake_host_tree
from polltuned.records import Config, KnobValue, Window
from tests.engine_run import result_with
from tests.test_knobs_faketree import make_tree, tree_values

REPO = Path(__file__).resolve().parents[1]
NAPI = "eth0:napi:defer-hard-irqs"
GRO = "eth0:napi:gro-flush-timeout"
IRQ = "eth0:irq_affinity"
BUSY = "net.core.busy_poll"


# ---- fakes: a link that flaps, a tuner that deploys through the real actuator ------------------

def link_event(root: Path, ev: LinkEvent) -> None:
    """Append one rtnetlink notification to the fake tree's link-event feed (FileLinkEvents)."""
    p = root / "netlink" / "link-events"
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("a") as f:
        f.write(encode_link_message(ev).hex() + "\n")


def link_flap(root: Path, dev: str = "eth0", new_ids: tuple[int, ...] = (259, 260), *, events: bool = True) -> None:
    """What a link down/up (or a GRO toggle, a driver reset) does to a device without persistent
    per-NAPI config: its NAPIs are deleted and new ones created, with the device-level values
    (sysfs napi_defer_hard_irqs / gro_flush_timeout) and irq-suspend-timeout 0."""
    d = root / "netdev" / "-" / dev
    for nid in list(d.iterdir()):
        shutil.rmtree(nid)
    defaults = {"defer-hard-irqs": (root / f"sys/class/net/{dev}/napi_defer_hard_irqs").read_text(),
                "gro-flush-timeout": (root / f"sys/class/net/{dev}/gro_flush_timeout").read_text(),
                "irq-suspend-timeout": "0\n"}
    for nid in new_ids:
        (d / str(nid)).mkdir()
        for attr, text in defaults.items():
            (d / str(nid) / attr).write_text(text)
    if events:
        link_event(root, LinkEvent("new", 2, dev, up=False, running=False, operstate="down"))
        link_event(root, LinkEvent("new", 2, dev, up=True, running=True, operstate="up"))


def napi_values(root: Path, attr: str, dev: str = "eth0") -> dict[str, str]:
    d = root / "netdev" / "-" / dev
    return {n.name: (n / attr).read_text().strip() for n in sorted(d.iterdir())}


def make_actuator(root: Path, state: Path, clock: FakeClock) -> Actuator:
    h = FsHost(root)
    return Actuator(h, Journal(state, clock=clock), registry=KnobRegistry(h, app_cpus=[1]), app_cpus=[1],
                    clock=clock)


class DeployingEngine:
    """Deploys ``config`` through the actuator, as the engine does at the end of CONFIRM, then
    asks for HOLD windows (as the engine in follow mode) until stopped."""

    def __init__(self, act: Actuator, config: Mapping[str, KnobValue]) -> None:
        self.act, self.config = act, dict(config)
        self.events: list[Event] = []
        self.deployed = False
        self.stopped = False
        self.holds = 0

    def next_action(self) -> Action:
        if self.stopped:
            return Done(result_with(self.config))
        if not self.deployed:
            self.act.apply(self.config, reason="deploy")
            self.deployed = True
            self.events.append(Event(Phase.APPLY, "deployed", kind=EventKind.DEPLOY))
            return Apply({}, WindowKind.CONFIRM)
        self.holds += 1
        self.events.append(Event(Phase.HOLD, f"hold window {self.holds}"))
        return Measure(self.holds, WindowKind.HOLD)

    def observe(self, window: Window) -> None:
        pass

    def apply_failed(self, error: PolltunedError) -> None:
        raise AssertionError("SteadyEnv.apply never fails")

    def drain_events(self) -> list[Event]:
        out, self.events = self.events, []
        return out

    def request_stop(self) -> None:
        self.stopped = True

    @property
    def result(self) -> TuningResult | None:
        return result_with(self.config) if self.deployed else None

    def hold_status(self) -> dict[str, object]:
        return {}


@dataclass
class SteadyEnv:
    calls: int = 0
    on_measure: list[Any] = field(default_factory=list)

    def current(self) -> dict[str, KnobValue]:
        return {}

    def apply(self, config: Config) -> None:
        pass

    def measure(self, window_index: int) -> Window:
        self.calls += 1
        for f in self.on_measure:
            f(self.calls)
        return Window(ok=True, latency={"p99": 100.0}, cpu_cores=0.1)

    def describe(self) -> Mapping[str, object]:
        return {}


def _policy(keys: list[str], **hold: Any) -> Policy:
    return policy_from_dict({
        "name": "watch", "app_cpus": [1],
        "knobs": {k: {"type": "categorical", "values": ["spread", "avoid-app"]} if k.endswith("irq_affinity")
                  else {"min": 0, "max": 100000} for k in keys},
        "probe": {"kind": "sim", "scenario": "x.py"},
        "hold": {"interval_s": 2.0, "drift_threshold": 0.3, "drift_windows": 2, "retune": False, **hold},
    })


def _controller(root: Path, tmp: Path, config: Mapping[str, KnobValue], *, every: int = 3,
                events: bool = True) -> tuple[Controller, Actuator, SteadyEnv, Watcher]:
    clock = FakeClock()
    act = make_actuator(root, tmp / "state", clock)
    host = FsHost(root)
    watcher = Watcher(act, clock, open_events=(lambda: FileLinkEvents(host)) if events else None)
    env = SteadyEnv()
    c = Controller(policy=_policy(list(config), verify_every=every), actuator=act, env=env,
                   make_engine=lambda p, e: DeployingEngine(act, config), clock=clock, watcher=watcher)
    return c, act, env, watcher


# ---- the target ----------------------------------------------------------------------

@pytest.mark.parametrize("flap_after", [1, 2, 3])
def test_link_flap_in_hold_is_reapplied_within_one_verification_interval(tmp_path: Path, flap_after: int) -> None:
    """A link down/up re-creates the NAPIs with default values (no link event seen: the interval
    alone must catch it): the deployed per-NAPI values are back within hold.verify_every windows,
    the re-apply is journaled, and the journal still restores the originals, re-created NAPIs included."""
    root = make_tree(tmp_path / "root")
    originals = tree_values(root)
    every = 3
    c, act, env, watcher = _controller(root, tmp_path, {NAPI: 10, GRO: 20000, BUSY: 50}, every=every, events=False)
    steps = c.steps()
    flapped_at = back_at = None
    for phase in steps:
        if phase != HOLD:
            continue
        if flapped_at is None and env.calls == flap_after:
            assert napi_values(root, "defer-hard-irqs") == {"257": "10", "258": "10"}
            link_flap(root, events=False)
            assert napi_values(root, "defer-hard-irqs") == {"259": "0", "260": "0"}   # kernel defaults
            flapped_at = env.calls
        if back_at is None and flapped_at is not None and \
                napi_values(root, "defer-hard-irqs") == {"259": "10", "260": "10"}:
            back_at = env.calls
            assert napi_values(root, "gro-flush-timeout") == {"259": "20000", "260": "20000"}
            c.request_stop()
    assert flapped_at is not None and back_at is not None
    assert back_at - flapped_at <= every, f"re-applied {back_at - flapped_at} windows after the flap"
    assert watcher.last is not None and watcher.last.trigger == f"every {every} HOLD windows"
    assert watcher.last.counts() == {"reapplied": 2, "ok": 1}
    types = [json.loads(x) for x in (tmp_path / "state" / JOURNAL_NAME).read_text().splitlines()]
    assert any(r["type"] == "txn" and r["reason"].startswith("kernel reset") for r in types)
    ext = [r for r in types if r["type"] == "baseline" and r.get("extend")]
    assert {r["key"] for r in ext} == {NAPI, GRO}
    assert ext[0]["state"]["napi"] == {"257": 0, "258": 0, "259": 0, "260": 0}
    # the exit rollback (on_exit = restore) put everything back, the re-created NAPIs included
    assert c.phase == STOPPED
    assert napi_values(root, "defer-hard-irqs") == {"259": "0", "260": "0"}
    assert napi_values(root, "gro-flush-timeout") == {"259": "0", "260": "0"}
    assert (root / "proc/sys/net/core/busy_poll").read_text() == originals["proc/sys/net/core/busy_poll"]
    assert not act.is_dirty()


def test_link_event_triggers_a_verification_at_once(tmp_path: Path) -> None:
    """With link notifications the re-apply does not wait for the interval: it happens before the
    next HOLD window is measured."""
    root = make_tree(tmp_path / "root")
    c, act, env, watcher = _controller(root, tmp_path, {NAPI: 10, BUSY: 50}, every=100)
    steps = c.steps()
    windows_at_flap = None
    for phase in steps:
        if phase == HOLD and env.calls == 1 and windows_at_flap is None:
            link_flap(root)
            windows_at_flap = env.calls
        if windows_at_flap is not None and watcher.last is not None:
            break
    assert watcher.last is not None
    assert env.calls == windows_at_flap, "verified only after another window"
    assert watcher.last.trigger == "link event: eth0 up"
    assert napi_values(root, "defer-hard-irqs") == {"259": "10", "260": "10"}
    assert {r.key: r.state for r in watcher.last.rows} == {NAPI: "reapplied", BUSY: "ok"}
    c.request_stop()
    list(steps)
    assert napi_values(root, "defer-hard-irqs") == {"259": "0", "260": "0"} and not act.is_dirty()


def test_link_events_of_other_devices_do_not_trigger_lost_ones_do(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "root")
    clock = FakeClock()
    act = make_actuator(root, tmp_path / "st", clock)
    act.apply({NAPI: 10, "ptb/vb:napi_defer_hard_irqs": 2, BUSY: 50})
    host = FsHost(root)
    w = Watcher(act, clock, open_events=lambda: FileLinkEvents(host))
    assert w.step(window=None, every=3, deployed={}) is None          # opens the feed: nothing yet
    link_event(root, LinkEvent("new", 7, "docker0", up=True, operstate="up"))
    assert w.step(window=None, every=3, deployed={}) is None          # not a managed device
    assert w.step(window=1, every=3, deployed={}) is None             # not due
    v = w.step(window=3, every=3, deployed={})
    assert v is not None and v.trigger == "every 3 HOLD windows" and v.ok
    link_event(root, LinkEvent("del", 2, "eth0"))
    v = w.step(window=None, every=3, deployed={})
    assert v is not None and v.trigger == "link event: eth0 removed"
    (root / "netlink" / "link-events").open("a").write("zz-not-hex\n")  # a datagram that cannot be read
    v = w.step(window=None, every=0, deployed={})
    assert v is not None and v.trigger == "link event: link events lost (socket overflow)"
    assert w.verifications == 3
    keys = (NAPI, "ptb/vb:napi_defer_hard_irqs", BUSY, IRQ)
    assert [parse_key(k).host_device for k in keys] == ["eth0", None, None, "eth0"]


# ---- admin wins, knob by knob and IRQ by IRQ -------------------------------------------------------

def test_admin_change_releases_only_that_knob(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = make_tree(tmp_path / "root")
    clock = FakeClock()
    act = make_actuator(root, tmp_path / "st", clock)
    act.apply({BUSY: 50, "net.core.busy_read": 50, NAPI: 10})
    (root / "proc/sys/net/core/busy_poll").write_text("30\n")        # the admin
    link_flap(root, events=False)                                      # and a kernel reset, same window
    w = Watcher(act, clock)
    with caplog.at_level(logging.INFO):
        v = w.verify("test", {BUSY: 50, "net.core.busy_read": 50, NAPI: 10})
    assert {r.key: r.state for r in v.rows} == {BUSY: "released", "net.core.busy_read": "ok", NAPI: "reapplied"}
    assert not v.ok and v.counts() == {"released": 1, "ok": 1, "reapplied": 1}
    assert (root / "proc/sys/net/core/busy_poll").read_text() == "30\n"     # never overwritten
    assert napi_values(root, "defer-hard-irqs") == {"259": "10", "260": "10"}
    assert any(getattr(r, "knob", None) == NAPI and "kernel reset" in r.getMessage() for r in caplog.records)
    v2 = w.verify("again", {BUSY: 50})                                       # released stays released
    assert {r.key: r.state for r in v2.rows}[BUSY] == "admin" and v2.ok
    assert (root / "proc/sys/net/core/busy_poll").read_text() == "30\n"
    rep = act.rollback()
    assert {i.key: i.outcome for i in rep.items}[BUSY] == "released"
    assert (root / "proc/sys/net/core/busy_poll").read_text() == "30\n"
    assert (root / "proc/sys/net/core/busy_read").read_text() == "0\n"


def test_one_irq_moved_releases_that_irq_only(tmp_path: Path) -> None:
    """irqbalance moves IRQ 39: IRQ 39 is released (left where irqbalance put it, by every later write
    and by rollback); the knob keeps managing IRQ 38 (a kernel reset of 38 is re-applied)."""
    root = make_tree(tmp_path / "root")
    clock = FakeClock()
    act = make_actuator(root, tmp_path / "st", clock)
    act.apply({IRQ: "spread", BUSY: 50})
    irq = {n: root / f"proc/irq/{n}/smp_affinity_list" for n in (38, 39)}
    assert irq[38].read_text() == "0\n" and irq[39].read_text() == "1\n"
    irq[39].write_text("0\n")                                                 # irqbalance
    w = Watcher(act, clock)
    v = w.verify("test", {IRQ: "spread", BUSY: 50})
    row = {r.key: r for r in v.rows}[IRQ]
    assert row.state == "partly-released" and row.parts == ("39",)
    assert act.state().knobs[IRQ].released_parts == frozenset({"39"}) and not act.state().knobs[IRQ].released
    assert [m.released_parts for m in act.managed() if m.key == IRQ] == [("39",)]
    # later: IRQ 38 reset by the kernel (back to all CPUs): re-applied; 39 stays irqbalance's
    irq[38].write_text("0-1\n")
    v = w.verify("again", {IRQ: "spread", BUSY: 50})
    row = {r.key: r for r in v.rows}[IRQ]
    assert row.state == "reapplied" and row.parts == ("38",)
    assert irq[38].read_text() == "0\n" and irq[39].read_text() == "0\n"
    # a new strategy leaves IRQ 39 alone too
    act.apply({IRQ: "avoid-app"})
    assert irq[38].read_text() == "0\n" and irq[39].read_text() == "0\n"
    irq[39].write_text("1\n")                                                  # irqbalance again: still not ours
    assert {r.key: r.state for r in w.verify("3rd", {}).rows}[IRQ] == "ok"
    # rollback restores only what polltuned still owns
    rep = act.rollback()
    item = {i.key: i for i in rep.items}[IRQ]
    assert item.outcome == "restored" and "39 left to the admin" in item.detail and rep.clean
    assert irq[38].read_text() == "0-1\n" and irq[39].read_text() == "1\n"
    assert (root / "proc/irq/37/smp_affinity_list").read_text() == "0-1\n"


def test_every_irq_moved_releases_the_whole_knob(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "root")
    clock = FakeClock()
    act = make_actuator(root, tmp_path / "st", clock)
    act.apply({IRQ: "spread"})
    for n in (38, 39):
        (root / f"proc/irq/{n}/smp_affinity_list").write_text("1\n" if n == 38 else "0\n")
    v = Watcher(act, clock).verify("t", {})
    assert [(r.key, r.state) for r in v.rows] == [(IRQ, "released")]
    assert act.state().knobs[IRQ].released


def test_partial_release_survives_compaction_and_is_new_fields_only(tmp_path: Path) -> None:
    """Journal format: the partial release and the baseline extension are fields added to existing
    record types; replay keeps them through a checkpoint, and a record without them means what it
    always meant."""
    root = make_tree(tmp_path / "root")
    clock = FakeClock()
    act = make_actuator(root, tmp_path / "st", clock)
    act.apply({IRQ: "spread", NAPI: 10})
    (root / "proc/irq/39/smp_affinity_list").write_text("0\n")
    link_flap(root, events=False)
    Watcher(act, clock).verify("t", {IRQ: "spread", NAPI: 10})
    recs = act.journal.records()
    rel = [r for r in recs if r["type"] == "released"]
    assert rel and rel[0]["parts"] == ["39"] and rel[0]["live"] == {"39": "0"} and rel[0]["expected"] == {"39": "1"}
    before = replay(recs)
    with act.journal.locked():
        act.journal.compact()
    after = act.journal.state()
    for key in (IRQ, NAPI):
        a, b = before.knobs[key], after.knobs[key]
        assert (a.released_parts, a.baseline_state, a.baseline_value, a.released) == \
               (b.released_parts, b.baseline_state, b.baseline_value, b.released)
    assert after.knobs[NAPI].baseline_state == {"napi": {"257": 0, "258": 0, "259": 0, "260": 0}}
    # an old-style release (no parts) still releases the whole knob
    old = replay((*recs, {"type": "released", "key": NAPI, "live": 3, "expected": 10}))
    assert old.knobs[NAPI].released and not old.knobs[NAPI].released_parts


# ---- vanished devices --------------------------------------------------------------------------

def test_vanished_device_is_gone_reported_once_not_an_error_loop(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    root = make_tree(tmp_path / "root")
    clock = FakeClock()
    act = make_actuator(root, tmp_path / "st", clock)
    act.apply({"ptb/vb:napi_defer_hard_irqs": 2, BUSY: 50})
    w = Watcher(act, clock)
    shutil.rmtree(root / "netns/ptb")                                         # the netns is deleted
    with caplog.at_level(logging.WARNING, logger="polltuned.watch"):
        states = [{r.key: r.state for r in w.verify(f"v{i}", {}).rows} for i in range(5)]
    assert all(s == {"ptb/vb:napi_defer_hard_irqs": "gone", BUSY: "ok"} for s in states)
    gone_logs = [r for r in caplog.records if "gone" in r.getMessage()]
    assert len(gone_logs) == 1 and gone_logs[0].levelno == logging.WARNING
    assert w.totals == {"gone": 1}
    assert act.rollback().ok
    assert (root / "proc/sys/net/core/busy_poll").read_text() == "0\n"


def test_a_verification_that_cannot_run_is_reported_not_raised(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "root")
    clock = FakeClock()
    act = make_actuator(root, tmp_path / "st", clock)
    act.apply({BUSY: 50})
    other = Journal(tmp_path / "st", clock=clock)             # `polltuned apply` holding the journal lock
    with other.locked():
        v = Watcher(act, clock).verify("t", {})
    assert v.error and "another polltuned process" in v.error and not v.ok and v.rows == ()


# ---- status and metrics ------------------------------------------------------------------------

def test_status_and_metrics_show_the_last_verification(tmp_path: Path) -> None:
    """Through the daemon's own wiring (build_daemon on a fake tree, simulated world): HOLD, an admin
    change and a link event for the policy's nic -> an immediate verification, in status (JSON and
    text) and in the metrics."""
    pol_file = tmp_path / "p.toml"
    pol_file.write_text(f'include = ["{REPO}/policies/sim-default.toml"]\nname = "w"\n'
                        "[tuning]\nbudget = 6\n[confirm]\npairs = 2\n[hold]\ninterval_s = 1\nverify_every = 50\n"
                        "retune = false\n")
    pol = load_policy(str(pol_file))
    root = tmp_path / "root"
    make_fake_host_tree(root, pol.knobs)
    d = build_daemon(policy=pol, host_root=str(root), state_dir=str(tmp_path / "state"), clock=FakeClock())
    assert d.watcher is not None and d.controller.watcher is d.watcher
    steps = d.controller.steps()
    changed = None
    doc: dict[str, Any] = {}
    for phase in steps:
        if phase == HOLD and changed is None:
            managed = [m for m in d.actuator.managed() if m.state == "polltuned" and isinstance(m.live, int)
                       and m.key.startswith("net.")]
            changed = managed[0].key
            (root / "proc/sys" / changed.replace(".", "/")).write_text(f"{int(managed[0].live or 0) + 7}\n")
        if changed is not None and d.watcher._opened and d.watcher.verifications == 0 and \
                not (root / "netlink").exists():   # subscribed (the first HOLD step): now the link flaps
            link_event(root, LinkEvent("new", 3, pol.nic or "sim0", up=True, running=True, operstate="up"))
        if changed is not None and d.watcher.last is not None:
            doc = build_status(d, d.controller)
            break
    ver = doc["last_verification"]
    assert ver["trigger"].startswith("link event: ") and ver["ok"] is False
    assert ver["counts"]["released"] == 1 and ver["counts"]["ok"] == ver["knobs"] - 1
    assert [ch["key"] for ch in ver["changes"]] == [changed] and ver["totals"] == {"released": 1}
    json.dumps(doc)
    text = render_status(doc, running=True, dirty=None, now=ver["t"] + 3)
    assert f"verification: 3 s ago ({ver['trigger']}): {ver['knobs'] - 1} ok, 1 released" in text
    assert f"  released          {changed} — " in text
    fams = {m.name: m for m in metrics_from_status(doc)}
    by = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in fams.values() for s in m.samples}
    assert by[("polltuned_last_verification_ok", ())] == 0
    assert by[("polltuned_last_verification_timestamp_seconds", ())] == ver["t"]
    assert by[("polltuned_last_verification_knobs", (("state", "released"),))] == 1
    assert by[("polltuned_last_verification_knobs", (("state", "ok"),))] == ver["knobs"] - 1
    d.controller.request_stop()
    list(steps)


def test_status_rows_show_a_partial_release(tmp_path: Path) -> None:
    doc = {"phase": "HOLD", "knobs": [{"key": IRQ, "original": "38:0-1;39:0-1", "current": "38:0;39:0",
                                      "best": "spread", "owner": "polltuned (partly released)",
                                      "released_parts": ["39"], "note": ""}],
           "last_verification": {"t": 100.0, "trigger": "every 3 HOLD windows", "ok": False, "knobs": 1,
                                 "counts": {"partly-released": 1},
                                 "changes": [{"key": IRQ, "state": "partly-released", "parts": ["39"],
                                              "detail": "39 changed outside polltuned: released (admin wins)"}]}}
    text = render_status(doc, running=True, dirty=None, now=110.0)
    assert "polltuned (partly released: 39 left to the admin)" in text
    assert "verification: 10 s ago (every 3 HOLD windows): 1 partly released" in text
    owners = [s for m in metrics_from_status(doc) if m.name == "polltuned_knob_owner" for s in m.samples]
    assert [s.labels["owner"] for s in owners] == ["partly_released"]
    assert summarize({"ok": 4, "reapplied": 1, "gone": 2}) == "4 ok, 1 re-applied, 2 gone"


# ---- policy field, link-event parsing, the real socket -----------------------------------------------

def test_verify_every_policy_field() -> None:
    assert _policy([BUSY]).hold.verify_every == 3
    assert _policy([BUSY], verify_every=0).hold.verify_every == 0
    with pytest.raises(PolicyError, match="verify_every"):
        _policy([BUSY], verify_every=-1)


def test_parse_link_messages_from_kernel_bytes() -> None:
    """RTM_NEWLINK as the kernel sends it (nlmsghdr + ifinfomsg + rtattrs, 4-byte aligned): eth0
    (ifindex 2) up, IFF_UP|IFF_BROADCAST|IFF_RUNNING|IFF_MULTICAST, IFLA_OPERSTATE 6 (up); then an
    RTM_DELLINK for veth1 in the same datagram; a message of another type in between is skipped."""
    ifname = bytes.fromhex("0900" "0300") + b"eth0\0" + b"\0\0\0"                 # rtattr len 9, IFLA_IFNAME
    oper = bytes.fromhex("0500" "1000") + b"\x06" + b"\0\0\0"                     # rtattr len 5, IFLA_OPERSTATE
    ifi = bytes.fromhex("00" "00" "0100" "02000000" "43100100" "00000000")         # AF_UNSPEC, ARPHRD_ETHER, 2
    body = ifi + ifname + oper
    new = (16 + len(body)).to_bytes(4, "little") + bytes.fromhex("1000" "0000" "00000000" "00000000") + body
    other = (20).to_bytes(4, "little") + bytes.fromhex("1400" "0000" "00000000" "00000000") + b"\0" * 4  # RTM_NEWADDR
    dname = bytes.fromhex("0a00" "0300") + b"veth1\0" + b"\0\0"
    dbody = bytes.fromhex("00" "00" "0100" "07000000" "00100000" "00000000") + dname
    dele = (16 + len(dbody)).to_bytes(4, "little") + bytes.fromhex("1100" "0000" "00000000" "00000000") + dbody
    evs = parse_link_messages(new + other + dele)
    assert evs == [LinkEvent("new", 2, "eth0", up=True, running=True, operstate="up"),
                   LinkEvent("del", 7, "veth1", up=False, running=False, operstate="")]
    assert parse_link_messages(new[:-3]) == []                                    # truncated: nothing invented
    ev = LinkEvent("new", 4, "ens3", up=False, running=False, operstate="lowerlayerdown")
    assert parse_link_messages(encode_link_message(ev)) == [ev] and ev.describe() == "ens3 lowerlayerdown"


def test_real_rtnetlink_subscription_polls_without_blocking() -> None:
    """Opens the host's rtnetlink socket and subscribes to RTMGRP_LINK (reads only, changes nothing)."""
    try:
        src = NetlinkLinkEvents()
    except Exception as e:  # no AF_NETLINK in this sandbox
        pytest.skip(f"no rtnetlink here: {e}")
    try:
        got = src.poll()
        assert isinstance(got, list) and all(isinstance(e, LinkEvent) for e in got)
        assert src._sock is not None and src._sock.getsockname()[1] == 1   # bound to RTMGRP_LINK
        assert src._sock.gettimeout() == 0.0 and src._sock.type & socket.SOCK_RAW
    finally:
        src.close()
    assert src.poll() == []


def test_cli_verify_and_rollback_show_the_partial_release(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from polltuned.cli.main import main

    root = make_tree(tmp_path / "root")
    g = ["--host-root", str(root), "--state-dir", str(tmp_path / "st")]
    assert main([*g, "apply", "--app-cpus", "1", f"{IRQ}=spread"]) == 0
    (root / "proc/irq/39/smp_affinity_list").write_text("0\n")                 # irqbalance
    capsys.readouterr()
    assert main([*g, "verify", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert (row["key"], row["state"], row["released_parts"]) == (IRQ, "partly-released", ["39"])
    assert main([*g, "verify", "--json"]) == 0                                  # the next look: holds
    row = json.loads(capsys.readouterr().out)[0]
    assert (row["state"], row["released_parts"]) == ("holds", ["39"])
    assert main([*g, "rollback"]) == 0
    out = capsys.readouterr().out
    assert "39 left to the admin" in out
    assert (root / "proc/irq/38/smp_affinity_list").read_text() == "0-1\n"
    assert (root / "proc/irq/39/smp_affinity_list").read_text() == "0\n"

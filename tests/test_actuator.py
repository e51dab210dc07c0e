"""Actuator behaviour on a fake tree: bounds before writes, transactional undo, admin wins,
vanished devices, idempotent rollback, epochs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polltuned.actuator import Actuator
from polltuned.clock import FakeClock
from polltuned.errors import KnobUnsupported, KnobValueError, PolltunedError
from polltuned.host.fs import FsHost
from polltuned.journal import JOURNAL_NAME, Journal
from polltuned.knobs.registry import KnobRegistry
from tests.test_knobs_faketree import make_tree, tree_values


def act(root: Path, state: Path, app: tuple[int, ...] = (1,)) -> Actuator:
    c = FakeClock()
    h = FsHost(root)
    return Actuator(h, Journal(state, clock=c), registry=KnobRegistry(h, app_cpus=app), app_cpus=app, clock=c)


def rd(root: Path, rel: str) -> str:
    return (root / rel).read_text().strip()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "root")


def test_out_of_range_refused_before_any_write(root: Path, tmp_path: Path) -> None:
    before = tree_values(root)
    a = act(root, tmp_path / "st")
    cases = [({"net.core.busy_read": 50, "net.core.busy_poll": 70_000_000_000}, "busy_poll: 70000000000"),
             ({"net.core.busy_read": 50, "net.core.netdev_budget": 0}, "netdev_budget: 0 is outside 1.."),
             ({"net.core.busy_read": 50, "net.core.netdev_budget_usecs": 2000}, "2000 is outside 8000.."),
             ({"net.core.busy_read": 50, "eth0:threaded": 2}, "threaded: 2 is outside 0..1"),
             ({"net.core.busy_read": 50, "kernel.timer_migration": "yes"}, "not an integer"),
             ({"net.core.busy_read": 50, "eth0:irq_affinity": "everywhere"}, "is not one of")]
    for assignment, msg in cases:
        with pytest.raises(KnobValueError, match=msg) as ei:
            a.apply(assignment)
        assert ei.value.render().startswith("polltuned: error[knob-value]: ")
    assert tree_values(root) == before
    assert not (tmp_path / "st" / JOURNAL_NAME).exists()  # not even a journal record


def test_failed_write_undoes_the_whole_transaction(root: Path, tmp_path: Path) -> None:
    a = act(root, tmp_path / "st")
    a2 = act(root, tmp_path / "st")
    # the 3rd write fails at write time (after validation and availability passed)
    knob = a2.registry.get("eth0:gro_flush_timeout")
    orig_write = knob.write

    def failing(value: object, *, baseline: object = None) -> None:
        raise PolltunedError("injected EIO")

    knob.write = failing  # type: ignore[method-assign,assignment]
    with pytest.raises(PolltunedError, match="apply failed: injected EIO; every knob of this change was put back"):
        a2.apply({"net.core.busy_poll": 50, "net.core.busy_read": 60, "eth0:gro_flush_timeout": 5})
    knob.write = orig_write  # type: ignore[method-assign]
    assert rd(root, "proc/sys/net/core/busy_poll") == "0"
    assert rd(root, "proc/sys/net/core/busy_read") == "0"
    types = [json.loads(x)["type"] for x in (tmp_path / "st" / JOURNAL_NAME).read_text().splitlines()]
    assert types.count("undone") == 3 and types[-1] == "txn-end"
    assert not a.is_dirty()


def test_verify_failure_is_undone(root: Path, tmp_path: Path) -> None:
    a = act(root, tmp_path / "st")
    knob = a.registry.get("net.core.busy_poll")
    knob.verify = lambda value: False  # type: ignore[method-assign]  # the kernel "clamped" it
    with pytest.raises(PolltunedError, match="reads back"):
        a.apply({"net.core.busy_read": 10, "net.core.busy_poll": 50})
    assert rd(root, "proc/sys/net/core/busy_poll") == "0" and rd(root, "proc/sys/net/core/busy_read") == "0"


def test_admin_change_is_released_never_overwritten_and_left_by_rollback(root: Path, tmp_path: Path) -> None:
    a = act(root, tmp_path / "st")
    a.apply({"net.core.busy_poll": 50, "net.core.busy_read": 50})
    (root / "proc/sys/net/core/busy_poll").write_text("30\n")  # the admin
    rows = {r.key: r for r in act(root, tmp_path / "st").verify()}
    assert rows["net.core.busy_poll"].state == "admin-changed"
    assert rows["net.core.busy_read"].state == "holds"
    res = a.apply({"net.core.busy_poll": 70, "net.core.busy_read": 70})
    assert res.skipped_released == ("net.core.busy_poll",)
    assert rd(root, "proc/sys/net/core/busy_poll") == "30"
    assert rd(root, "proc/sys/net/core/busy_read") == "70"
    rep = act(root, tmp_path / "st").rollback()
    out = {i.key: i.outcome for i in rep.items}
    assert out == {"net.core.busy_poll": "released", "net.core.busy_read": "restored"}
    assert rd(root, "proc/sys/net/core/busy_poll") == "30"
    assert rd(root, "proc/sys/net/core/busy_read") == "0"


def test_admin_change_detected_by_rollback_itself(root: Path, tmp_path: Path) -> None:
    act(root, tmp_path / "st").apply({"net.core.gro_normal_batch": 32, "kernel.timer_migration": 0})
    (root / "proc/sys/net/core/gro_normal_batch").write_text("16\n")
    rep = act(root, tmp_path / "st").rollback()
    assert {i.key: i.outcome for i in rep.items}["net.core.gro_normal_batch"] == "released"
    assert rd(root, "proc/sys/net/core/gro_normal_batch") == "16"
    assert rd(root, "proc/sys/kernel/timer_migration") == "1"


def test_own_side_effects_are_not_admin_changes(root: Path, tmp_path: Path) -> None:
    a = act(root, tmp_path / "st")
    a.apply({"eth0:napi:gro-flush-timeout": 20000})

    # emulate the kernel's write-all: a sysfs write sets every NAPI too
    knob = a.registry.get("eth0:gro_flush_timeout")
    orig = knob.write

    def write_all(value: object, *, baseline: object = None) -> None:
        orig(value)  # type: ignore[arg-type]
        for nid in ("257", "258"):
            (root / f"netdev/-/eth0/{nid}/gro-flush-timeout").write_text(f"{value}\n")

    knob.write = write_all  # type: ignore[method-assign,assignment]
    a.apply({"eth0:gro_flush_timeout": 5000})
    rows = {r.key: r.state for r in a.verify()}
    assert rows == {"eth0:napi:gro-flush-timeout": "holds", "eth0:gro_flush_timeout": "holds"}
    a.rollback()
    assert rd(root, "sys/class/net/eth0/gro_flush_timeout") == "0"
    assert rd(root, "netdev/-/eth0/257/gro-flush-timeout") == "0"


def test_vanished_device_is_gone_and_does_not_fail_rollback(root: Path, tmp_path: Path) -> None:
    import shutil

    a = act(root, tmp_path / "st")
    a.apply({"ptb/vb:napi_defer_hard_irqs": 2, "net.core.busy_poll": 50})
    shutil.rmtree(root / "netns/ptb")  # netns deleted
    assert {r.key: r.state for r in a.verify()}["ptb/vb:napi_defer_hard_irqs"] == "gone"
    rep = act(root, tmp_path / "st").rollback()
    assert rep.ok and rep.clean
    assert {i.key: i.outcome for i in rep.items}["ptb/vb:napi_defer_hard_irqs"] == "gone"
    assert rd(root, "proc/sys/net/core/busy_poll") == "0"


def test_rollback_idempotent_and_new_epoch_has_fresh_baselines(root: Path, tmp_path: Path) -> None:
    st = tmp_path / "st"
    act(root, st).apply({"net.core.busy_poll": 50})
    assert act(root, st).is_dirty()
    assert act(root, st).rollback().clean
    again = act(root, st).rollback()
    assert again.items == () and not again.was_dirty
    (root / "proc/sys/net/core/busy_poll").write_text("5\n")  # admin sets a new normal while clean
    act(root, st).apply({"net.core.busy_poll": 50})
    act(root, st).rollback()
    assert rd(root, "proc/sys/net/core/busy_poll") == "5"


def test_irq_strategies_and_kernel_default(root: Path, tmp_path: Path) -> None:
    a = act(root, tmp_path / "st", app=(1,))
    a.apply({"eth0:irq_affinity": "spread"})
    assert rd(root, "proc/irq/38/smp_affinity_list") == "0" and rd(root, "proc/irq/39/smp_affinity_list") == "1"
    assert rd(root, "proc/irq/37/smp_affinity_list") == "0-1"  # config vector untouched
    a.apply({"eth0:irq_affinity": "avoid-app"})
    assert rd(root, "proc/irq/38/smp_affinity_list") == "0" and rd(root, "proc/irq/39/smp_affinity_list") == "0"
    a.apply({"eth0:irq_affinity": "kernel-default"})
    assert rd(root, "proc/irq/39/smp_affinity_list") == "0-1"
    with pytest.raises(KnobValueError, match="app_cpus"):
        act(root, tmp_path / "st2", app=()).apply({"eth0:irq_affinity": "pack-app"})


def test_read_only_and_absent_knobs_are_refused(root: Path, tmp_path: Path) -> None:
    a = act(root, tmp_path / "st")
    with pytest.raises(PolltunedError, match="read-only"):
        a.apply({"module:kvm:halt_poll_ns": 100})
    with pytest.raises(KnobUnsupported, match="no vhost workers"):
        a.apply({"vhost:affinity": "kernel-default"})
    assert rd(root, "sys/module/kvm/parameters/halt_poll_ns") == "200000"


def test_torn_tail_tolerated_and_repaired(root: Path, tmp_path: Path) -> None:
    st = tmp_path / "st"
    act(root, st).apply({"net.core.busy_poll": 50})
    j = st / JOURNAL_NAME
    j.write_bytes(j.read_bytes() + b'{"v":1,"seq":99,"ty')  # power loss mid-append
    act(root, st).apply({"net.core.busy_read": 7})  # repairs the tail, then appends
    assert all(line.endswith("}") for line in j.read_text().splitlines())
    act(root, st).rollback()
    assert rd(root, "proc/sys/net/core/busy_poll") == "0" and rd(root, "proc/sys/net/core/busy_read") == "0"


def test_managed_queue_irq_skipped_with_one_notice(root: Path, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    (root / "proc/irq/39/smp_affinity_list").chmod(0o444)  # managed since 6.12: mode 0444
    a = act(root, tmp_path / "st")
    with caplog.at_level("WARNING", logger="polltuned.actuator"):
        a.apply({"eth0:irq_affinity": "spread"})
    notices = [r.message for r in caplog.records if "managed IRQs skipped" in r.message]
    assert len(notices) == 1 and "39" in notices[0]
    assert rd(root, "proc/irq/38/smp_affinity_list") == "0"
    assert rd(root, "proc/irq/39/smp_affinity_list") == "0-1"

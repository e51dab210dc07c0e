"""vhost worker affinity (fake /proc), the QEMU poll-us recommendation, module parameter parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from polltuned.actuator import Actuator
from polltuned.clock import FakeClock
from polltuned.host.fs import FsHost
from polltuned.journal import Journal
from polltuned.knobs.keys import KnobKeyError, parse_key
from polltuned.knobs.modparam import parse_param_text
from polltuned.knobs.registry import KnobRegistry
from polltuned.knobs.vhost import parse_comm, recommend_vhost_poll_us, vhost_threads
from tests.test_knobs_faketree import make_tree


def test_param_text_and_keys() -> None:
    assert parse_param_text("200000\n") == 200000
    assert parse_param_text("Y\n") == "Y"
    k = parse_key("module:kvm:halt_poll_ns")       # the module grammar lives in its kind's descriptor
    assert (k.kind, k.module, k.attr, k.file) == ("module-param", "kvm", "halt_poll_ns",
                                                  "/sys/module/kvm/parameters/halt_poll_ns")
    for bad in ("module:kvm", "module::x"):
        with pytest.raises(KnobKeyError):
            parse_key(bad)
    assert parse_comm("vhost-4242\n") == "vhost-4242"


def test_poll_us_recommendation() -> None:
    assert recommend_vhost_poll_us(50, sessions=60, cpu_headroom_cores=2.0).poll_us == 50
    assert recommend_vhost_poll_us(500).poll_us == 100
    assert recommend_vhost_poll_us(50, sessions=10).poll_us == 0
    assert recommend_vhost_poll_us(0).poll_us == 0
    assert "poll-us=50" in recommend_vhost_poll_us(50).render()


def test_vhost_affinity_pack_and_restore(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "root")
    for pid, tid, comm in ((900, 900, "qemu-system-x86"), (900, 901, "vhost-900"), (900, 902, "vhost-900")):
        d = root / f"proc/{pid}/task/{tid}"
        d.mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")
        (root / f"proc/{tid}").mkdir(parents=True, exist_ok=True)
        (root / f"proc/{tid}/polltuned_affinity").write_text("0-1\n")
    host = FsHost(root)
    assert vhost_threads(host) == [901, 902]
    c = FakeClock()
    a = Actuator(host, Journal(tmp_path / "st", clock=c), registry=KnobRegistry(host, app_cpus=[1]), clock=c)
    a.apply({"vhost:affinity": "avoid-app"})
    assert (root / "proc/901/polltuned_affinity").read_text() == "0\n"
    assert (root / "proc/900/polltuned_affinity").read_text() == "0-1\n"  # QEMU's main thread untouched
    a.rollback()
    assert (root / "proc/902/polltuned_affinity").read_text() == "0-1\n"


@pytest.mark.parametrize("key", ["module:haltpoll:guest_halt_poll_ns", "module:haltpoll:guest_halt_poll_allow_shrink"])
def test_module_param_domains(tmp_path: Path, key: str) -> None:
    root = make_tree(tmp_path / "root")
    (root / "sys/module/haltpoll/parameters/guest_halt_poll_allow_shrink").write_text("Y\n")
    k = KnobRegistry(FsHost(root)).get(key)
    if k.domain.kind == "choice":
        assert k.domain.choices == ("Y", "N") and k.validate("N") == "N"
    else:
        assert k.domain.hi == 2**32 - 1 and k.validate("100000") == 100000

"""Kernel compatibility matrix: fake trees of 5.14 (RHEL 9), 6.1 (Debian 12), 6.6, 6.12 (Debian 13) and
6.18 (this VM), every shipped policy fitted to each (polltuned.engine.compat), `polltuned check` on each,
and a simulated `polltuned run --max-rounds 1` of every shipped policy on each tree."""

from __future__ import annotations

import errno
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from polltuned.cli.main import main
from polltuned.clock import FakeClock
from polltuned.counters.sampler import Sampler
from polltuned.daemon.render import render_status
from polltuned.engine.compat import detect, fit_knob
from polltuned.errors import HostError, KnobUnsupported
from polltuned.host.fs import FsHost
from polltuned.host.netdev_genl import FileNetdev
from polltuned.knobs.irq import IrqAffinityKnob
from polltuned.knobs.registry import KnobRegistry
from polltuned.policy.loader import load_policy, policy_from_dict
from tests.fixtures.compat_trees import KERNELS, build_tree

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.stem for p in (REPO / "policies").glob("*.toml"))
OLD = ("5.14", "6.1", "6.6", "6.12")

#: what each shipped policy loses on each tree (key suffix -> words its reason must contain)
SUSPEND = "eth0:napi:irq-suspend-timeout"
EXPECTED_DROPS: dict[str, dict[str, dict[str, str]]] = {
    "latency-critical": {"5.14": {SUSPEND: "before 6.3"}, "6.1": {SUSPEND: "before 6.3"},
                         "6.6": {SUSPEND: "before 6.13"}, "6.12": {SUSPEND: "before 6.13"}, "6.18": {}},
    "bench": {"5.14": {SUSPEND: "before 6.3", "module:haltpoll:guest_halt_poll_ns": "not loaded"},
              "6.1": {SUSPEND: "before 6.3"}, "6.6": {SUSPEND: "before 6.13"}, "6.12": {SUSPEND: "before 6.13"},
              "6.18": {}},
    **{name: {"5.14": {SUSPEND: "before 6.3", "module:haltpoll:guest_halt_poll_ns": "not loaded"},
              "6.1": {SUSPEND: "before 6.3"}, "6.6": {SUSPEND: "before 6.13"}, "6.12": {SUSPEND: "before 6.13"},
              "6.18": {}} for name in ("bench-nginx", "bench-memcached")},
    # bench-mix has no guest_halt_poll_ns (the daemon's CPU term cannot see cpuidle POLL time)
    "bench-mix": {"5.14": {SUSPEND: "before 6.3"}, "6.1": {SUSPEND: "before 6.3"}, "6.6": {SUSPEND: "before 6.13"},
                  "6.12": {SUSPEND: "before 6.13"}, "6.18": {}},
    "virt-host": {"5.14": {"vhost:affinity": "needs app_cpus"},
                  **{k: {"module:kvm:halt_poll_ns": "not loaded", "module:kvm:halt_poll_ns_grow": "not loaded",
                         "vhost:affinity": "no vhost workers"} for k in ("6.1", "6.6", "6.12")},
                  "6.18": {"module:kvm:halt_poll_ns": "read-only", "module:kvm:halt_poll_ns_grow": "read-only",
                           "vhost:affinity": "no vhost workers"}},
    "colocated": {k: {"eth0:irq_affinity": "needs app_cpus"} for k in KERNELS},
    "throughput": {k: {} for k in KERNELS},
    "balanced": {k: {} for k in KERNELS},
    "sim-default": {k: {} for k in KERNELS},
}


@pytest.fixture(params=sorted(KERNELS))
def kernel(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def tree(tmp_path: Path, kernel: str) -> Path:
    return build_tree(tmp_path / f"root-{kernel}", kernel)


@pytest.fixture
def quiet_logging() -> Iterator[None]:
    """`polltuned run` reconfigures the polltuned logger; put it back for the other tests."""
    lg = logging.getLogger("polltuned")
    saved = (list(lg.handlers), lg.level, lg.propagate)
    try:
        yield
    finally:
        lg.handlers[:] = saved[0]
        lg.setLevel(saved[1])
        lg.propagate = saved[2]


def test_every_shipped_policy_is_covered() -> None:
    assert sorted(EXPECTED_DROPS) == SHIPPED


# ---- the trees have the feature sets the version matrix says -------------------------------------

def test_tree_features(tree: Path, kernel: str) -> None:
    host = FsHost(tree)
    f = KERNELS[kernel]
    assert host.read_text("/proc/sys/kernel/osrelease").strip() == f.release
    caps = FileNetdev(host, None, {}).caps()
    assert caps.present == (kernel == "6.18")
    if kernel in ("5.14", "6.1"):
        assert "before 6.3" in caps.reason
    elif kernel != "6.18":
        assert "before 6.13" in caps.reason
    else:
        assert caps.attrs["threaded"] == (0, 1) and caps.attrs["irq-suspend-timeout"][1] == 2**64 - 1
    api = FileNetdev(host, None, {2: "eth0"})
    if kernel in ("5.14", "6.1", "6.6"):
        with pytest.raises(HostError) as ei:
            api.napis(2)
        assert ei.value.errno == errno.EOPNOTSUPP
    else:
        napis = api.napis(2)
        assert [n.id for n in napis] == [8193]
        assert bool(napis[0].values) == (kernel == "6.18")   # per-NAPI config in napi-get: 6.13+
    managed_ro = not host.is_writable("/proc/irq/36/smp_affinity_list")
    assert managed_ro == (kernel in ("6.12", "6.18"))
    rows = host.read_text("/proc/net/softnet_stat").splitlines()
    assert {len(r.split()) for r in rows} == {13 if kernel in ("5.14", "6.1") else 15}
    assert host.exists("/proc/pressure/irq") == (kernel in ("6.1", "6.12"))
    if f.schedstat is None:
        assert not host.exists("/proc/schedstat")
    else:
        assert host.read_text("/proc/schedstat").startswith(f"version {f.schedstat}\n")
    # the counters read every tree without disabling a family that exists there
    with Sampler(host, clock=FakeClock(), nic="eth0") as s:
        snap = s.sample()
    assert snap.stat is not None and snap.softirqs is not None and snap.softnet is not None
    assert (snap.pressure is not None and snap.pressure.irq is not None) == (kernel in ("6.1", "6.12"))
    assert (snap.schedstat is not None) == (f.schedstat is not None)
    assert not [k for k in snap.unavailable if k in ("stat", "softirqs", "softnet", "links")], snap.unavailable


# ---- detect() -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SHIPPED)
def test_detect_drops_exactly_what_each_kernel_lacks(tree: Path, kernel: str, name: str) -> None:
    pol = load_policy(name, nic="eth0")
    c = detect(KnobRegistry(FsHost(tree), app_cpus=pol.app_cpus), pol)
    want = EXPECTED_DROPS[name][kernel]
    assert set(c.dropped) == set(want), c.dropped
    for key, words in want.items():
        assert words in c.dropped[key], (key, c.dropped[key])
    assert set(c.policy.knobs) == set(pol.knobs) - set(want)
    for spec in c.policy.knobs.values():   # requires_nonzero only names kept knobs
        assert set(spec.requires_nonzero) <= set(c.policy.knobs)


def test_detect_cleans_requires_nonzero_and_narrows(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "r", "6.1")
    pol = policy_from_dict({
        "name": "t", "nic": "eth0", "probe": {"kind": "sim", "scenario": "cliff"},
        "knobs": {"{nic}:napi:defer-hard-irqs": {"min": 0, "max": 10},
                  "{nic}:gro_flush_timeout": {"min": 0, "max": 1000,
                                              "requires_nonzero": ["{nic}:napi:defer-hard-irqs"]},
                  "net.core.netdev_budget_usecs": {"min": 100, "max": 16000, "scale": "log", "seeds": [1000, 9000]},
                  "{nic}:threaded": {"type": "categorical", "values": [0, 1, 2], "seeds": [2]}},
    }).resolve_nic()
    c = detect(KnobRegistry(FsHost(tree)), pol)
    assert list(c.dropped) == ["eth0:napi:defer-hard-irqs"]
    assert c.policy.knobs["eth0:gro_flush_timeout"].requires_nonzero == []
    b = c.policy.knobs["net.core.netdev_budget_usecs"]
    assert (b.min, b.max, b.seeds) == (8000, 16000, [9000])          # HZ=250: 2 jiffies = 8000 µs
    assert "clamped to 8000..16000" in c.narrowed["net.core.netdev_budget_usecs"]
    t = c.policy.knobs["eth0:threaded"]
    assert t.values == [0, 1] and t.seeds == []                        # threaded=2 needs a kernel after 6.18
    assert "2 (" in c.narrowed["eth0:threaded"]
    assert c.to_json()["kept"] == list(c.policy.knobs)


def test_detect_nothing_left_is_one_error(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "r", "6.1")
    pol = policy_from_dict({"name": "t", "probe": {"kind": "sim", "scenario": "cliff"},
                            "knobs": {"eth0:napi:irq-suspend-timeout": {"min": 0, "max": 10},
                                      "vhost:affinity": {"type": "categorical",
                                                         "values": ["kernel-default", "pack-app"]}}})
    with pytest.raises(KnobUnsupported) as ei:
        detect(KnobRegistry(FsHost(tree)), pol)
    msg = ei.value.message
    assert ei.value.exit_code == 4 and "none of its 2 knobs" in msg
    assert "eth0:napi:irq-suspend-timeout: netdev genl family not available" in msg and "vhost:affinity" in msg


def test_colocated_with_app_cpus_keeps_every_strategy(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "r", "6.12")
    pol = load_policy("colocated").model_copy(update={"app_cpus": [1]})
    c = detect(KnobRegistry(FsHost(tree), app_cpus=[1]), pol)
    assert not c.dropped and not c.needs_app_cpus
    assert c.policy.knobs["eth0:irq_affinity"].values == ["kernel-default", "avoid-app", "pack-app"]


def test_fit_knob_numeric_outside_the_kernel_range_drops(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "r", "6.18")
    reg = KnobRegistry(FsHost(tree))
    pol = policy_from_dict({"name": "t", "probe": {"kind": "sim", "scenario": "cliff"},
                            "knobs": {"net.core.netdev_budget_usecs": {"min": 10, "max": 100}}})
    spec, why = fit_knob(reg.get("net.core.netdev_budget_usecs"), pol.knobs["net.core.netdev_budget_usecs"])
    assert spec is None and "10..100 lies outside" in why and "8000.." in why


# ---- managed IRQs before 6.12: 0644 and EIO at write time -----------------------------------------

class _EioHost(FsHost):
    """A fake tree where writing the named IRQs' affinity fails EIO, as managed IRQs do before 6.12."""

    def __init__(self, root: Path, managed: set[int]) -> None:
        super().__init__(root)
        self.managed = managed

    def write_text(self, p: str, data: str) -> None:
        for n in self.managed:
            if p == f"/proc/irq/{n}/smp_affinity_list":
                raise HostError(f"writing {data.strip()!r} to {p} failed: Input/output error", errno=errno.EIO)
        super().write_text(p, data)


def test_managed_irq_found_at_write_time_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tree = build_tree(tmp_path / "r", "6.1")
    host = _EioHost(tree, {38})
    k = IrqAffinityKnob(host, "eth0", [])
    assert k.availability().writable            # 0644: the mode does not tell
    lg = logging.getLogger("polltuned")
    old = lg.propagate
    with caplog.at_level(logging.WARNING, logger="polltuned.knobs.irq"):
        lg.propagate = True   # `polltuned run` (setup_logging) may have turned it off in this process
        try:
            k.write("spread")
        finally:
            lg.propagate = old
    assert (tree / "proc/irq/39/smp_affinity_list").read_text() == "1\n"
    assert (tree / "proc/irq/38/smp_affinity_list").read_text() == "0-1\n"
    assert k.verify("spread")
    assert k.read() == "39:1" and k.settable_irqs() == ([39], [38])
    assert any("irq 38 is managed" in r.message and "EIO" in r.message for r in caplog.records)
    with pytest.raises(HostError):              # every queue IRQ managed: nothing applied, the error surfaces
        IrqAffinityKnob(_EioHost(tree, {38, 39}), "eth0", []).write("spread")


def test_explicit_affinity_read_value_round_trips(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "r", "6.18")
    k = IrqAffinityKnob(FsHost(tree), "eth0", [])
    base = k.read()
    assert base == "38:0-1;39:0-1"
    k.write(k.validate("spread"))
    assert k.read() == "38:0;39:1"
    k.write(k.validate(base))                   # the read form is a valid value: the engine's baseline
    assert k.read() == base and k.verify(base)
    with pytest.raises(Exception, match="not one of"):
        k.validate("38:x")


# ---- check and run on every tree ------------------------------------------------------------------

@pytest.mark.parametrize("name", SHIPPED)
def test_check_every_shipped_policy(tree: Path, kernel: str, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--host-root", str(tree), "check", name, "--nic", "eth0", "--no-probe"])
    out, err = capsys.readouterr()
    edits = [ln for ln in out.splitlines() if ln.startswith("polltuned: check: needs editing: ")]
    if name in ("colocated",) or (name == "virt-host" and kernel == "5.14"):
        assert rc == 2 and len(edits) == 1, out
        assert "app_cpus is empty but knobs." in edits[0] and f"policies/{name}.toml" in edits[0]
    else:
        assert rc == 0 and not edits, out
    for key in EXPECTED_DROPS[name][kernel]:
        assert f"dropped: {key}: " in out
    assert "Traceback" not in err


def test_check_json_lists_dropped_knobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = build_tree(tmp_path / "r", "6.1")
    assert main(["--host-root", str(tree), "check", "latency-critical", "--json", "--no-probe"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # busy_read: its tcp_rtt probe measures established sockets, which cannot see it (knob semantics)
    assert list(doc["dropped"]) == ["net.core.busy_read", SUSPEND] and "before 6.3" in doc["dropped"][SUSPEND]
    assert "sockets created afterwards" in doc["dropped"]["net.core.busy_read"]
    assert SUSPEND not in doc["knobs"] and len(doc["knobs"]) == 4 and doc["needs_editing"] == []
    assert doc["kernel"] == KERNELS["6.1"].release
    inputs = {r["input"]: r for r in doc["probe"]["inputs"]}
    assert inputs["drops"]["needed"] and inputs["drops"]["by_design"] is True
    assert "measured" not in inputs["p99"]           # --no-probe


def _fast(tmp: Path, name: str) -> Path:
    """The shipped policy with a small budget and the random optimiser: the matrix is about the host,
    not the search (the full policies run unmodified in test_full_shipped_policy_daemon)."""
    p = tmp / f"{name}-fast.toml"
    p.write_text(f'include = ["{REPO}/policies/{name}.toml"]\nnic = "eth0"\n'
                 '[tuning]\nbudget = 5\ninitial_points = 3\noptimiser = "random"\n[confirm]\npairs = 2\n')
    return p


def _knob_files(tree: Path) -> dict[str, str]:
    out = {}
    for base in ("proc/sys", "sys/class/net/eth0", "proc/irq", "sys/module", "netdev"):
        for f in sorted((tree / base).rglob("*")):
            if f.is_file():
                out[str(f.relative_to(tree))] = f.read_text()
    return out


@pytest.mark.parametrize("name", SHIPPED)
def test_simulated_run_every_shipped_policy(tree: Path, kernel: str, name: str, tmp_path: Path,
                                            capfd: pytest.CaptureFixture[str], quiet_logging: None) -> None:
    before = _knob_files(tree)
    scenario = "gro_batch" if name == "throughput" else "busypoll_split"  # gro_batch reports throughput
    run_dir = tmp_path / "run"
    rc = main(["--host-root", str(tree), "--state-dir", str(tmp_path / "state"), "--run-dir", str(run_dir),
               "run", "--policy", str(_fast(tmp_path, name)), "--simulate", scenario, "--sim-speed", "0",
               "--max-rounds", "1"])
    _, err = capfd.readouterr()
    assert rc == 0, err
    assert "Traceback" not in err and "ERROR" not in err
    drops = [ln for ln in err.splitlines() if " dropped: " in ln and "knob " in ln]
    assert len(drops) == len(EXPECTED_DROPS[name][kernel]), drops          # one log line per dropped knob
    doc = json.loads((run_dir / "status.json").read_text())
    assert set(doc["dropped_knobs"]) == set(EXPECTED_DROPS[name][kernel])
    assert doc["phase"] == "STOPPED" and doc["result"]["windows_used"] >= 3
    assert {k["key"] for k in doc["knobs"]} == set(load_policy(name, nic="eth0").knobs) - set(doc["dropped_knobs"])
    text = render_status(doc, running=False, dirty=False)
    for key in doc["dropped_knobs"]:
        assert f"  {key}: " in text
    assert _knob_files(tree) == before          # on_exit = restore: every file as it was


def test_full_shipped_policy_daemon_on_debian12(tmp_path: Path) -> None:
    """The issue's case, unmodified: latency-critical on a 6.1 tree used to exit at start."""
    tree = build_tree(tmp_path / "r", "6.1")
    r = subprocess.run([sys.executable, "-m", "polltuned", "--host-root", str(tree), "--state-dir",
                        str(tmp_path / "st"), "--run-dir", str(tmp_path / "run"), "run", "--policy",
                        "latency-critical", "--simulate", "busypoll_split", "--sim-speed", "0", "--max-rounds", "1"],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert [ln for ln in r.stderr.splitlines() if "dropped" in ln] == [
        "polltuned: WARNING: knob eth0:napi:irq-suspend-timeout dropped: netdev genl family not available "
        "(kernel before 6.3)"]
    assert "STOPPED: stopped; host restored" in r.stderr


def test_simulate_refuses_the_real_tree(capsys: pytest.CaptureFixture[str], quiet_logging: None) -> None:
    rc = main(["--host-root", "/", "run", "--policy", "latency-critical", "--simulate", "nope_no_such"])
    assert rc == 2 and "nope_no_such" in capsys.readouterr().err
    rc = main(["--host-root", "/.", "run", "--policy", "latency-critical", "--simulate", "cliff",
               "--sim-speed", "0", "--max-rounds", "1"])
    assert rc == 2 and "never runs against the real kernel" in capsys.readouterr().err


def test_sim_command_fits_the_policy_to_its_fake_tree(capsys: pytest.CaptureFixture[str]) -> None:
    """`polltuned sim` makes a tree without per-NAPI netlink: the knob is dropped, not fatal."""
    rc = main(["sim", "--policy", "latency-critical", "--scenario", "busypoll_split", "--trials", "5",
               "--optimiser", "random", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["windows_used"] >= 5
    assert SUSPEND not in out["baseline_config"] and "net.core.busy_read" in out["baseline_config"]

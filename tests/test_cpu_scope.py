"""The objective's CPU term (issue 10.4): cgroup of the service, NIC-queue + app CPUs, whole host only as a
fallback. Fake cgroup trees with cpu.stat files; the recorded VM tree (virtio eth0, 2 CPUs) for the CPU scope."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from polltuned.clock import FakeClock
from polltuned.counters import Sampler
from polltuned.errors import ParseError
from polltuned.host.cgroup import (
    CgroupUnavailable,
    cgroup_of_pid,
    find_unit_cgroup,
    parse_cpu_stat,
    parse_proc_cgroup,
    unit_name,
)
from polltuned.host.fs import FsHost
from polltuned.metrics.cpu_scope import (
    CgroupCpuScope,
    CpusCpuScope,
    HostCpuScope,
    NoCpuScope,
    format_cpus,
    make_cpu_scope,
    parse_cpu_mask,
)
from polltuned.metrics.window import MetricUnavailable
from polltuned.objective import score
from polltuned.policy.loader import policy_from_dict
from polltuned.policy.schema import Policy
from polltuned.records import Window

VM = Path(__file__).parent / "fixtures" / "vm" / "snap1"
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")


# ---------------------------------------------------------------- fake trees
def cgroup_tree(root: Path, *, version: str = "v2") -> Path:
    cg = root / "sys/fs/cgroup"
    if version == "v1":
        for c in ("cpu,cpuacct", "memory"):
            (cg / c / "system.slice/nginx.service").mkdir(parents=True)
        return root
    base = cg / "unified" if version == "hybrid" else cg
    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text("cpuset cpu io memory pids\n" if version == "v2" else "\n")
    add_unit(base, "system.slice/nginx.service", usage=5_000_000, user=3_000_000, system=2_000_000)
    add_unit(base, "system.slice/polltuned.service", usage=1, user=0, system=1)
    add_unit(base, "user.slice/user-1000.slice/user@1000.service/app.slice/kv.service", usage=10, user=5, system=5)
    return root


def add_unit(base: Path, rel: str, *, usage: int, user: int, system: int) -> Path:
    d = base / rel
    d.mkdir(parents=True)
    (d / "cgroup.procs").write_text("4242\n")
    write_cpu_stat(d, usage, user, system)
    return d


def write_cpu_stat(d: Path, usage: int, user: int, system: int) -> None:
    # a cgroup with the cpu controller enabled: base stats first, then the controller's keys
    (d / "cpu.stat").write_text(f"usage_usec {usage}\nuser_usec {user}\nsystem_usec {system}\n"
                                "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\nnr_bursts 0\nburst_usec 0\n")


def vm_tree(tmp: Path) -> Path:
    dst = tmp / "vm"
    shutil.copytree(VM, dst, symlinks=True)
    return dst


def bump_stat(tree: Path, per_cpu: dict[int, dict[str, int]]) -> None:
    """Advance /proc/stat in place (same inode: the sampler keeps the file open) by ticks per CPU."""
    p = tree / "proc/stat"
    lines = p.read_text().splitlines()
    total = [0] * len(STAT_FIELDS)
    for i, line in enumerate(lines):
        name, *vals = line.split()
        if name.startswith("cpu") and name != "cpu":
            cpu = int(name[3:])
            nums = [int(v) for v in vals]
            for f, d in per_cpu.get(cpu, {}).items():
                nums[STAT_FIELDS.index(f)] += d
                total[STAT_FIELDS.index(f)] += d
            lines[i] = " ".join([name, *map(str, nums)])
    for i, line in enumerate(lines):
        name, *vals = line.split()
        if name == "cpu":
            lines[i] = "cpu  " + " ".join(str(int(v) + d) for v, d in zip(vals, total))
    p.write_text("\n".join(lines) + "\n")


def set_irq_counts(tree: Path, irq: int, counts: list[int]) -> None:
    (tree / f"sys/kernel/irq/{irq}/per_cpu_count").write_text(",".join(map(str, counts)) + "\n")


def policy(**over: object) -> Policy:
    data: dict[str, object] = {
        "name": "scope", "nic": "eth0",
        "knobs": {"net.core.busy_poll": {"min": 0, "max": 100}},
        "probe": {"kind": "command", "argv": ["kv-bench"], "regex": r"p99=(?P<p99>\S+)"},
        "objective": {"combine": "latency_cpu_budget", "constraints": {"cpu_budget_cores": 1.5}},
    }
    probe_over = over.pop("probe", None)
    if isinstance(probe_over, dict):
        data["probe"] = {**data["probe"], **probe_over}  # type: ignore[dict-item]
    data.update(over)
    return policy_from_dict(data)


# ---------------------------------------------------------------- cgroup parsers and resolution
def test_parse_proc_cgroup_v2_hybrid_and_v1() -> None:
    assert parse_proc_cgroup("0::/system.slice/nginx.service\n").unified == "/system.slice/nginx.service"
    hybrid = parse_proc_cgroup("12:cpu,cpuacct:/system.slice/nginx.service\n1:name=systemd:/system.slice/"
                               "nginx.service\n0::/system.slice/nginx.service\n")
    assert hybrid.unified == "/system.slice/nginx.service" and hybrid.v1["cpu,cpuacct"] == "/system.slice/nginx.service"
    v1 = parse_proc_cgroup("4:cpu,cpuacct:/\n1:name=systemd:/init.scope\n")
    assert v1.unified is None and set(v1.v1) == {"cpu,cpuacct", "name=systemd"}
    with pytest.raises(ParseError, match=r"/proc/self/cgroup:2"):
        parse_proc_cgroup("0::/\nnonsense\n")


def test_parse_cpu_stat() -> None:
    st = parse_cpu_stat("usage_usec 10\nuser_usec 6\nsystem_usec 4\nnr_periods 0\n")
    assert (st.usage_usec, st.user_usec, st.system_usec) == (10, 6, 4)
    with pytest.raises(ParseError, match="missing system_usec"):
        parse_cpu_stat("usage_usec 10\nuser_usec 6\n", "x/cpu.stat")
    with pytest.raises(ParseError, match=r"cpu\.stat:2"):
        parse_cpu_stat("usage_usec 10\nuser_usec -6\nsystem_usec 4\n")


def test_unit_cgroup_resolution(tmp_path: Path) -> None:
    host = FsHost(cgroup_tree(tmp_path / "v2"))
    assert find_unit_cgroup(host, "nginx.service") == "/sys/fs/cgroup/system.slice/nginx.service"
    assert find_unit_cgroup(host, "nginx") == "/sys/fs/cgroup/system.slice/nginx.service"   # systemctl's reading
    assert find_unit_cgroup(host, "kv.service") == \
        "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/kv.service"
    with pytest.raises(CgroupUnavailable, match=r"unit redis.service has no cgroup .*not running"):
        find_unit_cgroup(host, "redis")
    with pytest.raises(CgroupUnavailable, match="not a systemd unit name"):
        unit_name("../etc")
    hyb = FsHost(cgroup_tree(tmp_path / "hybrid", version="hybrid"))
    assert find_unit_cgroup(hyb, "nginx.service") == "/sys/fs/cgroup/unified/system.slice/nginx.service"
    v1 = FsHost(cgroup_tree(tmp_path / "v1", version="v1"))
    with pytest.raises(CgroupUnavailable, match="cgroup v1 only"):
        find_unit_cgroup(v1, "nginx.service")
    with pytest.raises(CgroupUnavailable, match="no cgroup filesystem"):
        find_unit_cgroup(FsHost(tmp_path / "empty"), "nginx.service")


def test_cgroup_of_pid(tmp_path: Path) -> None:
    root = cgroup_tree(tmp_path / "t")
    (root / "proc/4242").mkdir(parents=True)
    (root / "proc/4242/cgroup").write_text("0::/system.slice/nginx.service\n")
    assert cgroup_of_pid(FsHost(root), 4242) == "/sys/fs/cgroup/system.slice/nginx.service"


# ---------------------------------------------------------------- cgroup scope
def test_cgroup_scope_measures_the_units_system_time(tmp_path: Path) -> None:
    root = cgroup_tree(tmp_path / "t")
    unit = root / "sys/fs/cgroup/system.slice/nginx.service"
    clock = FakeClock()
    scope = CgroupCpuScope(FsHost(root), "nginx.service", clock=clock)
    scope.begin()
    clock.advance(2.0)
    write_cpu_stat(unit, 5_000_000 + 1_400_000, 3_000_000 + 1_000_000, 2_000_000 + 400_000)
    r = scope.end()
    assert r.scope == "cgroup nginx.service" and r.cores == pytest.approx(0.2)   # 0.4 s system over 2 s
    assert scope.status()["kind"] == "cgroup" and scope.status()["last_cores"] == pytest.approx(0.2)

    usage = CgroupCpuScope(FsHost(root), "nginx", clock=clock, field="usage")
    usage.begin()
    clock.advance(1.0)
    write_cpu_stat(unit, 6_400_000 + 700_000, 4_000_000, 2_400_000)
    assert usage.end().cores == pytest.approx(0.7)

    # the unit restarted during the window: its cgroup is a new directory, the numbers do not compare
    # (kernfs never reuses a cgroup's inode number; a plain filesystem might, so the old one stays until then)
    scope.begin()
    unit.rename(unit.with_name("old"))
    add_unit(root / "sys/fs/cgroup", "system.slice/nginx.service", usage=9_000_000, user=1, system=9_000_000)
    shutil.rmtree(unit.with_name("old"))
    clock.advance(1.0)
    with pytest.raises(MetricUnavailable, match="re-created during the window"):
        scope.end()
    # the unit stopped: the window fails with the reason, the next one works once it runs again
    shutil.rmtree(unit)
    with pytest.raises(MetricUnavailable, match=r"nginx\.service has no cgroup"):
        scope.begin()
    with pytest.raises(MetricUnavailable, match="no begin"):
        scope.end()


# ---------------------------------------------------------------- the CPU scope on the recorded VM tree
def test_cpu_mask_and_cpu_list_formats() -> None:
    assert parse_cpu_mask("00000000,00000003\n") == [0, 1]
    assert parse_cpu_mask("0\n") == [] and parse_cpu_mask("80000000,00000001") == [0, 63]
    with pytest.raises(ParseError):
        parse_cpu_mask("zz")
    assert format_cpus([1, 0]) == "0-1" and format_cpus([0, 1, 2, 3, 8]) == "0-3,8"


def test_choice_order(tmp_path: Path) -> None:
    tree = vm_tree(tmp_path)
    cgroup_tree(tree)
    host = FsHost(tree)
    clock = FakeClock()
    s = Sampler(host, clock=clock, nic="eth0")
    # 1. the policy names the service's unit and the host has cgroup v2
    sc = make_cpu_scope(policy(probe={"unit": "nginx.service"}), host, s, s.nics, clock=clock)
    assert isinstance(sc, CgroupCpuScope) and sc.describe() == "cgroup nginx.service" and sc.fallbacks == ()
    # 2. no unit: the NIC's queue CPUs (+ app_cpus)
    sc = make_cpu_scope(policy(app_cpus=[0]), host, s, s.nics, clock=clock)
    assert isinstance(sc, CpusCpuScope) and sc.describe() == "cpus 0 (app)"
    # a unit on a cgroup v1 host: CPU scope, and the reason is kept for status
    v1 = vm_tree(tmp_path / "v1")
    cgroup_tree(v1, version="v1")
    s1 = Sampler(FsHost(v1), clock=clock, nic="eth0")
    sc = make_cpu_scope(policy(probe={"unit": "nginx.service"}, app_cpus=[1]), FsHost(v1), s1, s1.nics, clock=clock)
    assert isinstance(sc, CpusCpuScope)
    assert len(sc.fallbacks) == 1 and "cgroup of nginx.service unavailable" in sc.fallbacks[0]
    assert "cgroup v1 only" in sc.fallbacks[0] and sc.status()["fallbacks"] == list(sc.fallbacks)
    # 3. whole host, said so: a virtual NIC without queue IRQs and no app_cpus
    sv = Sampler(host, clock=clock, nic="ifb0")
    sc = make_cpu_scope(policy(nic="ifb0"), host, sv, sv.nics, clock=clock)
    assert isinstance(sc, HostCpuScope)
    assert sc.describe().startswith("whole host (fallback: nic ifb0 has no queue IRQs (no device link")
    sc = make_cpu_scope(policy(nic="ns1/veth0"), host, s, s.nics, clock=clock)
    assert sc.describe() == ("whole host (fallback: nic ns1/veth0 is inside a network namespace and the policy "
                             "sets no app_cpus)")
    # no counters at all: every window says why instead of inventing a number
    sc = make_cpu_scope(policy(), host, None, None, clock=clock)
    assert isinstance(sc, NoCpuScope)
    with pytest.raises(MetricUnavailable, match="no counters sampler"):
        sc.begin()


def test_issue_load_generator_outside_the_scope_does_not_break_the_budget(tmp_path: Path) -> None:
    """Issue 10.4: 2 vCPUs, the key-value server and the NIC's queue IRQs on CPU 0, its load generator
    (the benchmark client) on CPU 1. Whole-host CPU counted the client and ruled busy_poll=50 infeasible
    under a 1.5-core budget; the scoped CPU does not."""
    tree = vm_tree(tmp_path)
    for irq in (38, 39):                       # the queue IRQs of eth0 serve CPU 0 here
        set_irq_counts(tree, irq, [2163, 0])
    host = FsHost(tree)
    clock = FakeClock()
    sampler = Sampler(host, clock=clock, nic="eth0")
    pol = policy(app_cpus=[0])
    scoped = make_cpu_scope(pol, host, sampler, sampler.nics, clock=clock)
    whole = HostCpuScope(sampler, "for comparison")
    scoped.begin()
    whole.begin()
    clock.advance(1.0)
    # one second = 100 ticks per CPU. CPU 0: the server busy polling (system) + NET_RX softirq = 0.6 cores;
    # CPU 1: the load generator, almost all kernel time sending = 0.95 cores
    bump_stat(tree, {0: {"user": 20, "system": 40, "softirq": 20, "idle": 20},
                     1: {"user": 5, "system": 50, "softirq": 45}})
    set_irq_counts(tree, 38, [2163 + 5000, 0])
    a, b = scoped.end(), whole.end()
    assert a.scope == "cpus 0 (nic queues + app)" and a.cpus == (0,)
    assert a.cores == pytest.approx(0.6)
    assert b.cores == pytest.approx(1.55) and b.scope == "whole host (fallback: for comparison)"
    obj = pol.objective
    ok = score(Window(ok=True, latency={"p99": 12.0}, cpu_cores=a.cores, observations=100), obj)
    bad = score(Window(ok=True, latency={"p99": 12.0}, cpu_cores=b.cores, observations=100), obj)
    assert ok.feasible and not bad.feasible
    assert any("cpu_budget_cores 1.5" in r for r in bad.reasons)


def test_scope_follows_the_nic_irqs_and_never_shrinks(tmp_path: Path) -> None:
    """A trial that moves the queue IRQs (irq_affinity avoid-app) cannot hide their CPU cost: the CPU they
    fired on joins the scope, and stays for later windows (baseline and candidate compare on the same CPUs)."""
    tree = vm_tree(tmp_path)
    for irq in (38, 39):
        set_irq_counts(tree, irq, [0, 0])
    host = FsHost(tree)
    clock = FakeClock()
    sampler = Sampler(host, clock=clock, nic="eth0")
    scope = make_cpu_scope(policy(app_cpus=[0]), host, sampler, sampler.nics, clock=clock)
    load = {0: {"system": 30, "idle": 70}, 1: {"softirq": 40, "idle": 60}}

    def window(irq_cpu1: int) -> tuple[float, str]:
        scope.begin()
        clock.advance(1.0)
        bump_stat(tree, load)
        set_irq_counts(tree, 38, [0, irq_cpu1])
        r = scope.end()
        return round(r.cores, 9), r.scope

    assert window(0) == (0.3, "cpus 0 (app)")
    assert window(7000) == (0.7, "cpus 0-1 (nic queues + app)")   # IRQs moved to CPU 1
    assert window(7000) == (0.7, "cpus 0-1 (nic queues + app)")   # no new IRQs: CPU 1 stays


def test_irq_affinity_and_rps_define_the_queue_cpus(tmp_path: Path) -> None:
    tree = vm_tree(tmp_path)
    (tree / "proc/irq/38").mkdir(parents=True)
    (tree / "proc/irq/38/effective_affinity_list").write_text("1\n")
    (tree / "proc/irq/39").mkdir(parents=True)
    (tree / "proc/irq/39/smp_affinity_list").write_text("0-1\n")   # allowed set only: not a target
    host = FsHost(tree)
    clock = FakeClock()
    sampler = Sampler(host, clock=clock, nic="eth0")
    scope = make_cpu_scope(policy(), host, sampler, sampler.nics, clock=clock)
    assert scope.describe() == "cpus 1 (nic queues)"
    rps = next((tree / "sys/class/net/eth0/queues").resolve().glob("rx-*")) / "rps_cpus"
    rps.write_text("00000001\n")
    scope.begin()
    clock.advance(1.0)
    bump_stat(tree, {0: {"system": 10, "idle": 90}, 1: {"irq": 5, "softirq": 15, "idle": 80}})
    r = scope.end()
    assert r.scope == "cpus 0-1 (nic queues)" and r.cores == pytest.approx(0.3)
    assert not math.isnan(r.cores)


def test_policy_probe_unit_field() -> None:
    assert policy(probe={"unit": "nginx.service"}).probe.unit == "nginx.service"
    assert policy().probe.unit is None
    from polltuned.errors import PolicyError

    with pytest.raises(PolicyError, match=r"probe.unit: String should match pattern"):
        policy(probe={"unit": "nginx service; rm"})


# ---------------------------------------------------------------- idle polling (issue 15.4)
def add_cpuidle(tree: Path, cpus: int = 2) -> None:
    """cpuidle-haltpoll's two states per CPU: state0 POLL (time: cumulative µs), state1 haltpoll."""
    for cpu in range(cpus):
        for st, name in ((0, "POLL"), (1, "haltpoll idle")):
            d = tree / f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state{st}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "name").write_text(name + "\n")
            (d / "time").write_text("1000\n")
    (tree / "sys/devices/system/cpu/cpuidle").mkdir(parents=True, exist_ok=True)
    (tree / "sys/devices/system/cpu/cpuidle/current_driver").write_text("haltpoll\n")


def bump_poll(tree: Path, per_cpu_us: dict[int, int]) -> None:
    for cpu, us in per_cpu_us.items():
        t = tree / f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state0/time"
        t.write_text(str(int(t.read_text()) + us) + "\n")


def test_idle_poll_is_counted_on_the_scopes_cpus(tmp_path: Path) -> None:
    """/proc/stat counts POLL as idle: the scope adds it, on its own CPUs only."""
    tree = vm_tree(tmp_path)
    add_cpuidle(tree)
    for irq in (38, 39):
        set_irq_counts(tree, irq, [0, 0])
    host = FsHost(tree)
    clock = FakeClock()
    sampler = Sampler(host, clock=clock, nic="eth0")
    scoped = make_cpu_scope(policy(app_cpus=[0]), host, sampler, sampler.nics, clock=clock)
    whole = make_cpu_scope(policy(nic="ns1/veth0"), host, sampler, sampler.nics, clock=clock)
    blind = make_cpu_scope(policy(app_cpus=[0]), host, sampler, sampler.nics, clock=clock, idle_poll=False)
    assert isinstance(whole, HostCpuScope) and scoped.idle_poll_note() == "counted (cpuidle POLL state)"
    for s in (scoped, whole, blind):
        s.begin()
    clock.advance(1.0)
    bump_stat(tree, {0: {"system": 30, "idle": 70}, 1: {"idle": 100}})
    bump_poll(tree, {0: 200_000, 1: 500_000})         # 0.2 s spinning on CPU 0, 0.5 s on CPU 1
    a, b, c = scoped.end(), whole.end(), blind.end()
    assert a.idle_poll_cores == pytest.approx(0.2) and a.cores == pytest.approx(0.5)
    assert b.idle_poll_cores == pytest.approx(0.7) and b.cores == pytest.approx(1.0)
    assert c.idle_poll_cores is None and c.cores == pytest.approx(0.3)
    assert scoped.status()["last_idle_poll_cores"] == pytest.approx(0.2)


def test_no_poll_state_is_said(tmp_path: Path) -> None:
    tree = vm_tree(tmp_path)          # the fixture has no cpuidle directories
    host = FsHost(tree)
    clock = FakeClock()
    sampler = Sampler(host, clock=clock, nic="eth0")
    scope = make_cpu_scope(policy(app_cpus=[0]), host, sampler, sampler.nics, clock=clock)
    assert "no POLL state" in scope.idle_poll_note() and "not counted" in scope.idle_poll_note()
    scope.begin()
    clock.advance(1.0)
    bump_stat(tree, {0: {"system": 30, "idle": 70}})
    r = scope.end()
    assert r.idle_poll_cores is None and r.cores == pytest.approx(0.3)


@pytest.mark.parametrize("over", [{"nic": "ns1/veth0"}, {"app_cpus": [0]}])
def test_daemon_and_bench_count_the_same_cores_for_one_window(tmp_path: Path, over: dict[str, object]) -> None:
    """Issue 15.4: the daemon's scope and the bench's env measure the same window within 5 % (one
    module: they agree exactly here), idle polling included in both."""
    from polltuned.bench.session import host_env
    from polltuned.daemon.wiring import CountersView, daemon_cpu_scope
    from tests.test_sim import act_stub

    tree = vm_tree(tmp_path)
    add_cpuidle(tree)
    for irq in (38, 39):
        set_irq_counts(tree, irq, [0, 0])
    host = FsHost(tree)
    clock = FakeClock()
    pol = policy(**over)
    daemon = daemon_cpu_scope(pol, host, CountersView(host, clock, pol.nic_device), clock)

    class BusyProbe:
        name = "busy"

        def start(self) -> None: ...
        def restart(self) -> None: ...
        def close(self) -> None: ...

        def measure(self, duration_s: float, window_index: int) -> Window:
            daemon.begin()               # the daemon's scope watches the very same window
            clock.advance(2.0)
            bump_stat(tree, {0: {"system": 60, "softirq": 20, "idle": 120}, 1: {"system": 10, "idle": 190}})
            bump_poll(tree, {0: 300_000, 1: 100_000})
            return Window(ok=True, latency={"p99": 20.0})

    bench = host_env(pol, act_stub(), BusyProbe(), host, clock)
    w = bench.measure(0)
    d = daemon.end()
    assert w.ok and w.cpu_cores is not None and d.idle_poll_cores is not None
    assert w.cpu_cores == pytest.approx(d.cores, rel=0.05)
    assert w.extra["idle_poll_cores"] == pytest.approx(d.idle_poll_cores, rel=0.05)
    want_poll = 0.2 if "nic" in over else 0.15      # both CPUs (whole host) or CPU 0 only (app_cpus)
    assert d.idle_poll_cores == pytest.approx(want_poll)
    assert d.cores > d.idle_poll_cores

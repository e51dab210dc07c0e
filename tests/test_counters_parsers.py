"""Pure parsers: literal kernel-format strings, every malformed-input path, and hypothesis
properties (arbitrary text -> a record or ParseError, never another exception)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polltuned.counters.interrupts import parse_interrupts
from polltuned.counters.irq_percpu import parse_per_cpu_count
from polltuned.counters.links import parse_stat_file
from polltuned.counters.loadavg import parse_loadavg
from polltuned.counters.nicmap import classify_irq_name
from polltuned.counters.pressure import parse_psi
from polltuned.counters.procs import parse_pid_stat
from polltuned.counters.schedstat import parse_schedstat
from polltuned.counters.softirqs import parse_softirqs
from polltuned.counters.softnet import parse_softnet
from polltuned.counters.stat import parse_stat
from polltuned.errors import ParseError

SYN = Path(__file__).parent / "fixtures" / "synthetic"

# fs/proc/stat.c show_stat() — as printed by this 6.18 VM
STAT = """cpu  4310 0 2117 386496 361 0 29 11 0 0
cpu0 574 0 728 195322 6 0 7 4 0 0
cpu1 3735 0 1389 191174 354 0 22 7 0 0
intr 154753 0 0 0 1 1 14
ctxt 292566
btime 1796067990
processes 4635
procs_running 1
procs_blocked 0
softirq 131311 0 25473 3 3367 36183 0 3 39539 0 26743
"""

# fs/proc/softirqs.c show_softirqs(): "CPU%-8d" header, "%12s:" + " %10u" rows
SOFTIRQS = ("                    CPU0       CPU1       \n"  # trailing blanks as printed
            """          HI:          0          0
       TIMER:      12283      13190
      NET_TX:          3          0
      NET_RX:       1237       2130
       BLOCK:          0      36183
    IRQ_POLL:          0          0
     TASKLET:          3          0
       SCHED:      21401      18137
     HRTIMER:          0          0
         RCU:      11408      15333
""")

# kernel/irq/proc.c show_interrupts() + arch/x86 arch_show_interrupts()
INTERRUPTS = ("           CPU0       CPU1       \n"
              """ 24:          1          0  IO-APIC   5-edge      ACPI:Ged
 38:          0       2163 PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0
 39:       1278          0 PCI-MSIX-0000:00:03.0   2-edge      virtio2-output.0
NMI:          0          0   Non-maskable interrupts
LOC:      26223      28933   Local timer interrupts
ERR:          0
MIS:          0
""")

# net/core/net-procfs.c softnet_seq_show(), 15 columns on 6.4+
SOFTNET15 = (
    "00000013 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 "
    "00000000 00000000 00000000 00000000 00000000\n"
    "00000bd7 00000002 00000005 00000000 00000000 00000000 00000000 00000000 00000000 00000007 "
    "00000000 00000000 00000003 00000000 00000000\n"
)
# 13 columns (5.10 .. 6.3)
SOFTNET13 = (
    "0000ffff 00000001 00000002 00000000 00000000 00000000 00000000 00000000 00000000 00000000 "
    "00000000 00000000 00000000\n"
)
PID_STAT = ("4635 (my (weird) comm) S 1 4635 4635 0 -1 4194560 300 0 0 0 250 75 0 0 20 0 1 0 "
            "12345 10000000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n")


def test_stat_literal() -> None:
    r = parse_stat(STAT)
    assert sorted(r.cpus) == [0, 1]
    assert r.cpus[1].user == 3735 and r.cpus[1].system == 1389 and r.cpus[1].softirq == 22
    assert r.cpus[0].steal == 4 and r.total.idle == 386496
    assert r.procs_running == 1 and r.ctxt == 292566 and r.procs_blocked == 0


def test_stat_offline_cpu_and_short_rows() -> None:
    r = parse_stat("cpu  1 2 3 4\ncpu0 1 2 3 4\ncpu3 5 6 7 8\n")
    assert sorted(r.cpus) == [0, 3]          # offline cpu1/cpu2 skipped, mapped by name
    assert r.cpus[3].iowait == 0 and r.cpus[3].idle == 8


@pytest.mark.parametrize("text,needle", [
    ("intr 1 2\n", "no 'cpu'"),
    ("cpu  1 2 3 4\n", "no 'cpu'"),
    ("cpu  1 2 3 4\ncpu0 1 x 3 4\n", "unsigned decimal"),
    ("cpu  1 2 3 4\ncpu0 1 2 3\n", "4..10"),
    ("cpu  1 2 3 4\ncpu0 1 2 3 4 5 6 7 8 9 10 11\n", "4..10"),
    ("cpu  1 2 3 4\ncpuX 1 2 3 4\n", "cpu<N>"),
    ("cpu  1 2 3 4\ncpu0 1 2 3 4\ncpu0 1 2 3 4\n", "duplicate"),
    ("cpu  1 2 3 4\ncpu  1 2 3 4\ncpu0 1 2 3 4\n", "duplicate"),
    ("cpu  1 2 3 4\ncpu0 1 2 3 4\nprocs_running -1\n", "procs_running"),
    ("cpu  1 2 3 4\ncpu0 -1 2 3 4\n", "unsigned"),
    ("cpu  1 2 3 4\ncpu0 ١ 2 3 4\n", "unsigned"),      # non-ASCII digit int() would accept
])
def test_stat_malformed(text: str, needle: str) -> None:
    with pytest.raises(ParseError) as e:
        parse_stat(text)
    assert needle in e.value.reason and e.value.path == "/proc/stat"


def test_softirqs_literal() -> None:
    r = parse_softirqs(SOFTIRQS)
    assert r.cpus == (0, 1)
    assert r.for_cpu("NET_RX") == {0: 1237, 1: 2130}
    assert r.counts["BLOCK"] == (0, 36183) and len(r.counts) == 10


def test_softirqs_possible_cpu_header_names_columns() -> None:
    r = parse_softirqs("   CPU0  CPU2\nNET_RX: 5 7\n")
    assert r.for_cpu("NET_RX") == {0: 5, 2: 7}


@pytest.mark.parametrize("text,line", [
    ("", 1), ("   CPUx\nNET_RX: 1\n", 1), ("CPU0 CPU0\nNET_RX: 1 2\n", 1),
    ("CPU0 CPU1\nNET_RX: 1\n", 2), ("CPU0\nNET_RX 1\n", 2), ("CPU0\nNET_RX: a\n", 2),
    ("CPU0\nNET_RX: 1\nNET_RX: 2\n", 3), ("CPU0\nHI: 1\n", None), ("CPU0\nNET RX: 1\n", 2),
])
def test_softirqs_malformed(text: str, line: int | None) -> None:
    with pytest.raises(ParseError) as e:
        parse_softirqs(text)
    assert e.value.line == line


def test_interrupts_literal() -> None:
    r = parse_interrupts(INTERRUPTS)
    assert r.cpus == (0, 1)
    assert r.rows["38"].counts == (0, 2163) and r.rows["38"].desc.endswith("virtio2-input.0")
    assert r.rows["ERR"].counts is None and r.rows["ERR"].total == 0
    assert r.rows["LOC"].total == 26223 + 28933
    assert r.per_cpu_total() == {0: 1279, 1: 2163}


@pytest.mark.parametrize("text", [
    "", "CPU0 CPU1\n 38: 1 PCI-MSIX 1-edge x\n", "CPU0\n38 1\n", "CPU0\n38: 1\n38: 2\n",
    "CPU0 CPU1\n 7: 5\n", "CPU0\nN-M: 1\n",
])
def test_interrupts_malformed(text: str) -> None:
    with pytest.raises(ParseError):
        parse_interrupts(text)


def test_per_cpu_count() -> None:
    r = parse_per_cpu_count("0,2163\n", "/sys/kernel/irq/38/per_cpu_count", 38)
    assert r.per_cpu() == {0: 0, 1: 2163}


@pytest.mark.parametrize("text", ["0,2163", "0,,1\n", ",1\n", "1,\n", "1,a\n", "1\n2\n", "\n", "1,-2\n",
                                  "99999999999,1\n", "1, 2\n"])
def test_per_cpu_count_malformed(text: str) -> None:
    with pytest.raises(ParseError):
        parse_per_cpu_count(text, "/sys/kernel/irq/1/per_cpu_count", 1)


def test_softnet_15_and_13_columns() -> None:
    r = parse_softnet(SOFTNET15)
    assert sorted(r) == [0, 3]                # row 2 carries cpu id 3: rows are not CPU-indexed
    assert r[3].processed == 0xbd7 and r[3].dropped == 2 and r[3].time_squeeze == 5
    assert r[3].received_rps == 7
    assert parse_softnet(SOFTNET13)[0].processed == 0xFFFF


@pytest.mark.parametrize("text", [
    "", "0000001 " * 13, "00000001 " * 11 + "00000001\n", SOFTNET15.replace("00000013", "0000001G"),
    SOFTNET15.replace("00000013", "0X000013"), SOFTNET15 + SOFTNET15,
])
def test_softnet_malformed(text: str) -> None:
    with pytest.raises(ParseError):
        parse_softnet(text)


def test_schedstat_v15_v17_files() -> None:
    v15 = parse_schedstat((SYN / "schedstat_v15.txt").read_text())
    v17 = parse_schedstat((SYN / "schedstat_v17.txt").read_text())
    assert v15.version == 15 and v17.version == 17
    assert v15.cpus[0].run_delay_ns == 123456789 and v15.cpus[0].rq_cpu_time_ns == 987654321
    assert v17.cpus[0].run_delay_ns - v15.cpus[0].run_delay_ns == 500_000_000
    assert v17.cpus[1].pcount == 6100


@pytest.mark.parametrize("text", [
    "", "version 14\ncpu0 1 2 3 4 5 6 7 8 9\n", "version 17\n", "cpu0 1 2 3 4 5 6 7 8 9\n",
    "version 17\ncpu0 1 2 3\n", "version 17\ncpu0 1 2 3 4 5 6 7 8 x\n", "version 17\nbogus\n",
    "version 17\nversion 17\ncpu0 1 2 3 4 5 6 7 8 9\n",
    "version 17\ncpu0 1 2 3 4 5 6 7 8 9\ncpu0 1 2 3 4 5 6 7 8 9\n",
])
def test_schedstat_malformed(text: str) -> None:
    with pytest.raises(ParseError):
        parse_schedstat(text)


def test_loadavg() -> None:
    r = parse_loadavg("0.01 0.06 0.03 1/92 4638\n")
    assert (r.procs_running, r.threads, r.load1) == (1, 92, 0.01)


@pytest.mark.parametrize("text", ["", "0.01 0.06 0.03 1 4638\n", "0.01 0.06 0.03 1/92\n", "a b c 1/2 3\n",
                                  "0.01 0.06 0.03 1/92 4638\nx\n", "-1 0 0 1/2 3\n"])
def test_loadavg_malformed(text: str) -> None:
    with pytest.raises(ParseError):
        parse_loadavg(text)


def test_psi_cpu_and_irq() -> None:
    cpu = parse_psi("some avg10=0.02 avg60=0.19 avg300=0.10 total=3875869\n"
                    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", "/proc/pressure/cpu")
    assert cpu.some is not None and cpu.some.total_us == 3875869 and cpu.some.avg60 == 0.19
    irq = parse_psi((SYN / "pressure_irq.txt").read_text(), "/proc/pressure/irq")
    assert irq.some is None and irq.full is not None and irq.full.total_us == 81234


@pytest.mark.parametrize("text", ["", "some avg10=0.02\n", "half avg10=0 avg60=0 avg300=0 total=1\n",
                                  "some avg10=0 avg60=0 avg300=0 total=x\n",
                                  "some avg10=0 avg60=0 avg300=0 avg300=1\n",
                                  "some avg10=0 avg60=0 avg300=0 total=1\nsome avg10=0 avg60=0 avg300=0 total=1\n"])
def test_psi_malformed(text: str) -> None:
    with pytest.raises(ParseError):
        parse_psi(text, "/proc/pressure/cpu")


def test_pid_stat_comm_with_parens() -> None:
    r = parse_pid_stat(PID_STAT, "/proc/4635/stat")
    assert (r.pid, r.user_s, r.system_s, r.start) == (4635, 2.5, 0.75, 12345.0)


@pytest.mark.parametrize("text", ["", "4635 comm S 1", "4635 (c) S 1 2 3\n", "x (c) " + "1 " * 30,
                                  "4635 (c) S " + "-1 " * 30])
def test_pid_stat_malformed(text: str) -> None:
    with pytest.raises(ParseError):
        parse_pid_stat(text, "/proc/4635/stat")


def test_sysfs_stat_file() -> None:
    assert parse_stat_file("18446744073709551615\n", "/x") == 2**64 - 1
    for bad in ("", "1\n2\n", "-1\n", "0x10\n"):
        with pytest.raises(ParseError):
            parse_stat_file(bad, "/x")


@pytest.mark.parametrize("name,dev,vdev,label", [
    ("virtio2-input.0", "eth0", "virtio2", "rx-0"), ("virtio2-output.3", "eth0", "virtio2", "tx-3"),
    ("virtio2-config", "eth0", "virtio2", "misc"), ("virtio3-input.0", "eth0", "virtio2", None),
    ("ice-ens1f0-TxRx-12", "ens1f0", None, "combined-12"), ("ens1f0-TxRx-2", "ens1f0", None, "combined-2"),
    ("ens5-Tx-Rx-7", "ens5", None, "combined-7"), ("mlx5_comp3@pci:0000:08:00.0", "enp8s0", None, "combined-3"),
    ("gve-ntfy-blk4@pci:0000:00:04.0", "ens4", None, "combined-4"), ("eth1-rx-1", "eth1", None, "rx-1"),
    ("eth1-tx-0", "eth1", None, "tx-0"), ("ice-0000:3b:00.0:misc", "ens1f0", None, None),
    ("eth1", "eth1", None, "misc"),
])
def test_classify_irq_name(name: str, dev: str, vdev: str | None, label: str | None) -> None:
    assert classify_irq_name(name, dev, vdev) == label


# ---- properties -------------------------------------------------------------------------------

PARSERS = {
    "stat": lambda t: parse_stat(t),
    "softirqs": lambda t: parse_softirqs(t),
    "interrupts": lambda t: parse_interrupts(t),
    "per_cpu_count": lambda t: parse_per_cpu_count(t, "/sys/kernel/irq/1/per_cpu_count", 1),
    "softnet": lambda t: parse_softnet(t),
    "schedstat": lambda t: parse_schedstat(t),
    "loadavg": lambda t: parse_loadavg(t),
    "psi": lambda t: parse_psi(t, "/proc/pressure/cpu"),
    "pid_stat": lambda t: parse_pid_stat(t, "/proc/1/stat"),
    "sysfs_stat": lambda t: parse_stat_file(t, "/sys/class/net/x/statistics/rx_packets"),
}
SEEDS = {"stat": STAT, "softirqs": SOFTIRQS, "interrupts": INTERRUPTS, "per_cpu_count": "0,2163\n",
         "softnet": SOFTNET15, "schedstat": (SYN / "schedstat_v17.txt").read_text(),
         "loadavg": "0.01 0.06 0.03 1/92 4638\n", "psi": "some avg10=0.02 avg60=0.19 avg300=0.10 total=3\n",
         "pid_stat": PID_STAT, "sysfs_stat": "12\n"}
ALPHABET = st.sampled_from([*"0123456789abcdefx:,./=()- \n\tCPUcpuNETRX_Xsomefullavgtotalversion١²", "\x00"])


def _mutations() -> st.SearchStrategy[str]:
    """Valid files with random edits: the inputs most likely to produce a *wrong number*."""
    return st.tuples(st.sampled_from(sorted(SEEDS)), st.integers(0, 10_000), st.integers(0, 8),
                     st.text(ALPHABET, max_size=6)).map(
        lambda t: (t[0], SEEDS[t[0]][: t[1] % (len(SEEDS[t[0]]) + 1)] + t[3]
                   + SEEDS[t[0]][t[1] % (len(SEEDS[t[0]]) + 1) + t[2]:]))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(PARSERS)), st.text(max_size=300))
def test_arbitrary_text_gives_record_or_parse_error(name: str, text: str) -> None:
    try:
        PARSERS[name](text)
    except ParseError as e:
        assert e.reason and e.path.startswith("/")


@settings(max_examples=600, deadline=None)
@given(_mutations())
def test_mutated_files_give_record_or_parse_error(case: tuple[str, str]) -> None:
    name, text = case
    try:
        PARSERS[name](text)
    except ParseError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**32 - 1), min_size=10, max_size=10), min_size=1, max_size=8))
def test_softirqs_round_trip(rows: list[list[int]]) -> None:
    ncpu = len(rows)
    names = ("HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU")
    text = "                    " + "".join(f"CPU{c:<8d}" for c in range(ncpu)) + "\n"
    for v, name in enumerate(names):
        text += f"{name:>12}:" + "".join(f" {rows[c][v]:10d}" for c in range(ncpu)) + "\n"
    r = parse_softirqs(text)
    for v, name in enumerate(names):
        assert r.counts[name] == tuple(rows[c][v] for c in range(ncpu))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
                min_size=1, max_size=8), st.booleans())
def test_softnet_round_trip(rows: list[tuple[int, int, int]], wide: bool) -> None:
    lines = []
    for cpu, (p, d, t) in enumerate(rows):
        cols = [p, d, t, 0, 0, 0, 0, 0, 0, 0, 0, 0, cpu * 2] + ([0, 0] if wide else [])
        lines.append(" ".join(f"{v:08x}" for v in cols))
    r = parse_softnet("\n".join(lines) + "\n")
    assert {c: (x.processed, x.dropped, x.time_squeeze) for c, x in r.items()} == {
        cpu * 2: row for cpu, row in enumerate(rows)}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**60), min_size=10, max_size=10), min_size=1, max_size=6))
def test_stat_round_trip(cpus: list[list[int]]) -> None:
    total = [sum(c[i] for c in cpus) for i in range(10)]
    text = "cpu  " + " ".join(map(str, total)) + "\n"
    text += "".join(f"cpu{n} " + " ".join(map(str, c)) + "\n" for n, c in enumerate(cpus))
    text += "intr 5 1 2 3\nctxt 9\nprocs_running 2\n"
    r = parse_stat(text)
    assert [list(vars(r.cpus[n]).values()) for n in range(len(cpus))] == cpus
    assert r.procs_running == 2


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
def test_per_cpu_count_round_trip(vals: list[int]) -> None:
    r = parse_per_cpu_count(",".join(map(str, vals)) + "\n", "/sys/kernel/irq/1/per_cpu_count", 1)
    assert r.counts.tolist() == vals


def test_fast_and_strict_paths_agree() -> None:
    """The numpy fast paths and the line-by-line fallbacks give identical records."""
    fast = parse_stat(STAT)
    slow = parse_stat(STAT.replace("cpu1 3735", "cpu1  3735"))      # double space: strict path
    assert fast.ids == slow.ids and fast.ticks.tolist() == slow.ticks.tolist() and fast.cpus == slow.cpus
    s_fast = parse_softirqs(SOFTIRQS)
    s_slow = parse_softirqs(SOFTIRQS.replace("      NET_RX:       1237", "      NET_RX: 1237"))
    assert s_fast.counts == s_slow.counts and s_fast.cpus == s_slow.cpus
    v17 = (SYN / "schedstat_v17.txt").read_text()
    sc_fast = parse_schedstat(v17)
    sc_slow = parse_schedstat(v17.replace("cpu0 0 0", "cpu0  0 0"))
    assert sc_fast.cpus == sc_slow.cpus and sc_fast.ids == sc_slow.ids

"""End to end on the real kernel: a short `polltuned bench` (root; holds the real-kernel lock).

Asserts: knobs really changed during the run (read live from /proc while it ran), every knob and
namespace is back afterwards, the JSON/table are well-formed, and the deployed configuration is the
baseline or one whose confirmation was significant.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from polltuned.bench.run import run_bench
from polltuned.bench.session import BenchSettings
from polltuned.bench.table import render_table
from polltuned.clock import SystemClock
from polltuned.host.fs import FsHost

GLOBAL_KNOBS = ("/proc/sys/net/core/busy_read", "/proc/sys/net/core/busy_poll",
                "/proc/sys/net/core/gro_normal_batch", "/proc/sys/kernel/timer_migration",
                "/proc/sys/net/core/netdev_budget", "/proc/sys/net/core/netdev_budget_usecs",
                "/sys/module/haltpoll/parameters/guest_halt_poll_ns")


def _snapshot(host: FsHost, *, bench_netns: bool = True) -> dict[str, str]:
    snap = {p: host.read_text(p).strip() for p in GLOBAL_KNOBS if host.exists(p)}
    # With bench_netns=False the bench's own namespaces (ptb-*) are left out: a killed earlier run
    # may leave them, and the bench removes such leftovers itself at start (asserted separately).
    snap["netns"] = ",".join(n for n in host.glob("/run/netns", "*") if bench_netns or not n.startswith("ptb-"))
    return snap


def _bench_paused_at_first_write(state: Path, *args: str) -> subprocess.Popen[bytes]:
    """A `polltuned bench` that stops itself (SIGSTOP) right after its first real knob write; the
    caller SIGKILLs it. Fails the test if the bench exits or never gets there within 120 s."""
    env = {**os.environ, "POLLTUNED_TEST_PAUSE_AFTER": "write:1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "polltuned", "--state-dir", str(state), "bench", "--no-lock", *args,
         "--budget", "4", "--window", "1", "--rounds", "1"], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"bench exited before its first write: {proc.stderr.read().decode()[-2000:]}"
                        if proc.stderr else "bench exited early")
        if psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED:
            return proc
        time.sleep(0.2)
    proc.kill()
    proc.wait(10)
    pytest.fail("bench never reached its first knob write")


@pytest.mark.realkernel
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_real_bench_short(real_kernel: None, tmp_path: Path) -> None:
    for tool in ("sockperf", "ethtool", "ip"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    host = FsHost("/")
    before = _snapshot(host, bench_netns=False)
    live_busy_read: set[str] = set()

    def progress(msg: str) -> None:
        live_busy_read.add(host.read_text("/proc/sys/net/core/busy_read").strip())

    settings = BenchSettings(workload="single", budget=5, window_s=1.0, compare_rounds=1, confirm_pairs=2,
                             state_dir=tmp_path / "state", record=tmp_path / "rec.jsonl")
    res = run_bench(settings, host=host, clock=SystemClock(), progress=progress)

    after = _snapshot(host, bench_netns=False)
    assert after == before, "a knob or namespace was not restored"
    assert not [n for n in host.glob("/run/netns", "ptb-*")]
    assert res.restored
    assert len(live_busy_read) > 1, f"busy_read never changed during the run: {live_busy_read}"

    d = json.loads(json.dumps(res.to_json()))
    for arm in ("default", "static", "deployed"):
        assert arm in d and d[arm]["objective"] is not None and math.isfinite(d[arm]["objective"])
        assert d[arm]["p99_us"] > 0 and d[arm]["windows"] >= 1
    assert d["static"]["config"]["net.core.busy_read"] == 50
    table = render_table(res)
    assert table.count("\n") >= 5 and "p99 µs" in table

    tuning = d["tuning"]
    conf = tuning["confirmation"]
    assert tuning["deployed_is_baseline"] or (conf is not None and conf["significant"] and conf["deploy"])

    lines = (tmp_path / "rec.jsonl").read_text().splitlines()
    assert len(lines) >= 5
    first = json.loads(lines[0])
    assert set(first) >= {"v", "workload", "config", "window"} and first["workload"] == "single"
    assert os.path.getsize(tmp_path / "rec.jsonl") > 0


@pytest.mark.realkernel
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_crashed_bench_is_cleaned_up(real_kernel: None, tmp_path: Path) -> None:
    """SIGKILL a bench right after its first real knob write; recover() puts everything back."""
    import signal

    from polltuned.bench.session import recover

    if shutil.which("sockperf") is None:
        pytest.skip("sockperf not installed")
    host = FsHost("/")
    before = _snapshot(host, bench_netns=False)
    state = tmp_path / "st"
    proc = _bench_paused_at_first_write(state)
    try:
        crashed = _snapshot(host)
        assert crashed != before, "the paused bench should have changed a knob and created namespaces"
        assert "ptb-c" in crashed["netns"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        if proc.stderr:
            proc.stderr.close()
    dirty, removed = recover(state / "bench", host=host, clock=SystemClock())
    assert dirty
    assert sorted(removed) == ["ptb-c", "ptb-s"]
    assert _snapshot(host, bench_netns=False) == before
    assert recover(state / "bench", host=host, clock=SystemClock()) == (False, [])


@pytest.mark.realkernel
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigint_and_sigterm_restore_everything(real_kernel: None, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) and SIGTERM in the middle of tuning: every knob and namespace is put back."""
    import signal
    import subprocess
    import sys
    import time

    if shutil.which("sockperf") is None:
        pytest.skip("sockperf not installed")
    host = FsHost("/")
    before = _snapshot(host, bench_netns=False)
    for sig in (signal.SIGINT, signal.SIGTERM):
        proc = subprocess.Popen(
            [sys.executable, "-m", "polltuned", "--state-dir", str(tmp_path / sig.name), "bench", "--no-lock",
             "--budget", "8", "--window", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        seen = []
        deadline = time.monotonic() + 90
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("[MEASURE] J=") or time.monotonic() > deadline:
                break  # a trial window was measured: knobs are changed now
        changed = _snapshot(host) != before
        proc.send_signal(sig)
        try:
            rest = proc.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:
            proc.kill()  # never leave a bench running into the next test
            proc.communicate(timeout=30)
            from polltuned.bench.session import recover
            recover(tmp_path / sig.name / "bench", host=host, clock=SystemClock())
            pytest.fail(f"{sig.name}: the bench did not stop within 60 s")
        assert changed or any("apply" in s for s in seen), "".join(seen)[-2000:]
        assert proc.returncode != 0
        assert _snapshot(host, bench_netns=False) == before, f"{sig.name}: not restored\n{rest[-2000:]}"


def _app_pids() -> set[tuple[int, str]]:
    import psutil

    out: set[tuple[int, str]] = set()
    for p in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        if p.info.get("status") == psutil.STATUS_ZOMBIE:
            continue  # killed, waiting for init to reap it
        cmd = " ".join(p.info.get("cmdline") or [])
        if p.info.get("name") in ("nginx", "memcached", "wrk") or "polltuned.host.kvclient" in cmd:
            out.add((int(p.info["pid"]), str(p.info.get("name"))))
    return out


@pytest.mark.realkernel
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("workload", ["nginx", "memcached"])
def test_real_bench_application_workloads(real_kernel: None, tmp_path: Path, workload: str) -> None:
    """A tiny `polltuned bench --workload nginx|memcached`: the long-running server is measured by
    the command probe; afterwards every knob, namespace, process and file of the world is gone."""
    need = {"nginx": ("nginx", "wrk"), "memcached": ("memcached",)}[workload]
    for tool in (*need, "sockperf", "ethtool", "ip", "ss"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    host = FsHost("/")
    before = _snapshot(host, bench_netns=False)
    apps_before = _app_pids()
    settings = BenchSettings(workload=workload, budget=4, window_s=1.0, compare_rounds=1, max_rounds=1,
                             confirm_pairs=2, state_dir=tmp_path / "state")
    res = run_bench(settings, host=host, clock=SystemClock())

    assert _snapshot(host, bench_netns=False) == before, "a knob or namespace was not restored"
    assert _app_pids() == apps_before, "a server or client was left running"
    assert not (tmp_path / "state" / "bench-app").exists() and not (tmp_path / "state" / "bench-world.json").exists()
    assert res.restored
    d = json.loads(json.dumps(res.to_json()))
    assert d["policy"] == f"bench-{workload}" and d["world"]["app"] == workload
    assert d["comparison"]["rounds"] == 1 and "hard cap" in d["comparison"]["stop_reason"]
    for arm in ("default", "static", "deployed"):
        a = d[arm]
        assert a["windows"] == 1 and a["failed"] == 0, a
        assert a["p99_us"] > 0 and a["objective"] > 0 and a["throughput"] > 0
    assert d["static"]["config"]["net.core.busy_poll"] == 50
    ok = [t for t in d["trials"] if t["window"]["ok"]]
    assert len(ok) >= 3
    assert render_table(res).count("\n") >= 6


@pytest.mark.realkernel
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_crashed_nginx_bench_is_cleaned_up_by_cleanup(real_kernel: None, tmp_path: Path) -> None:
    """SIGKILL an nginx bench after its first knob write (nginx running in ptb-s, its config in the
    state dir); `polltuned bench --cleanup` kills the orphaned nginx, removes the namespaces and the
    application directory, and rolls the knobs back."""
    import signal
    import subprocess
    import sys
    import time


    for tool in ("nginx", "wrk", "sockperf"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    host = FsHost("/")
    before = _snapshot(host, bench_netns=False)
    apps_before = _app_pids()
    state = tmp_path / "st"
    proc = _bench_paused_at_first_write(state, "--workload", "nginx")
    try:
        assert any(name == "nginx" for _, name in _app_pids() - apps_before), "nginx should be running"
        assert (state / "bench" / "bench-app" / "nginx.conf").exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        if proc.stderr:
            proc.stderr.close()
    assert any(name == "nginx" for _, name in _app_pids() - apps_before), "the killed bench orphaned nginx"
    r = subprocess.run([sys.executable, "-m", "polltuned", "--state-dir", str(state), "bench", "--cleanup",
                        "--no-lock"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "knobs rolled back: yes" in r.stdout and "ptb-c" in r.stdout and "ptb-s" in r.stdout
    deadline = time.monotonic() + 5                      # SIGKILL is delivered asynchronously
    while _app_pids() != apps_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _app_pids() == apps_before
    assert not (state / "bench" / "bench-app").exists()
    assert _snapshot(host, bench_netns=False) == before

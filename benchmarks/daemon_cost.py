"""What the real daemon costs while it holds: RSS and CPU of ``polltuned run`` in HOLD (issue 14).

The world is the mix bench's (polltuned.bench.world + polltuned.bench.mix, reused, not copied): two
namespaces of this benchmark's own (``ptb-rssc`` / ``ptb-rsss``, veth 198.18.231.1/2), one sockperf
server on CPU1 for the whole run, and the daemon's probe the ``command`` probe of ``bench-mix``
(``python -m polltuned.host.mixclient``: one sockperf ping-pong session per window on CPU0). The
daemon is the real one (``python -m polltuned run``, its own state and run directories, a small
budget so it reaches HOLD quickly, ``hold.interval_s`` as given: the production default is 10 s).

Once status.json says HOLD, the benchmark samples every second, for ``--hold-s`` seconds:

* the daemon's own process: VmRSS and VmHWM (/proc/PID/status), utime + stime (/proc/PID/stat)
  -> its CPU as a share of one core over the HOLD span;
* the daemon's children, separately: the model worker (``polltuned.optimiser.worker``: RSS, CPU,
  seconds alive) and the probe's clients (the daemon's cutime + cstime: reaped children, i.e. the
  per-window ``ip netns exec ... mixclient`` + sockperf; the worker's CPU is subtracted);
* the foreign CPU (every other process) over the span, as the bench prints it.

Needs root; takes /tmp/polltuned-realkernel.lock for the whole run; everything is undone in
``finally`` (daemon stopped with SIGTERM — it restores its originals —, server stopped, namespaces
removed; a killed daemon's journal is rolled back).

    flock /tmp/polltuned-realkernel.lock is taken by the script itself:
    .venv/bin/python benchmarks/daemon_cost.py [--budget 8] [--hold-s 90] [--interval 10] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from polltuned.bench.cpu import foreign_cores
from polltuned.bench.mix import (
    DaemonProcess,
    MixPaths,
    client_argv,
    daemon_policy_toml,
    mix_recover,
    mix_recover_daemon,
    phase_load,
)
from polltuned.bench.world import DefaultWorld, Workload, WorldConfig
from polltuned.clock import SystemClock
from polltuned.daemon.status import read_status
from polltuned.errors import HostError, PolltunedError
from polltuned.host.exec import SubprocessRunner, foreign_cpu_seconds
from polltuned.host.fs import FsHost, Host
from polltuned.host.mixclient import write_phase
from polltuned.policy.loader import find_policy

LOCK = "/tmp/polltuned-realkernel.lock"
WORLD = WorldConfig(client_ns="ptb-rssc", server_ns="ptb-rsss", client_dev="rssc", server_dev="rsss",
                    client_addr="198.18.231.1", server_addr="198.18.231.2")
WORKER_MODULE = "polltuned.optimiser.worker"
#: --profile: the daemon under cProfile with a CPU-time clock (where its CPU goes, not its waits)
PROFILE_BOOT = """
import cProfile, runpy, signal, sys, time
out = sys.argv.pop(1)
sys.argv[0] = "polltuned"
prof = cProfile.Profile(time.process_time)
signal.signal(signal.SIGUSR2, lambda *a: prof.enable())   # the benchmark sends it once HOLD begins
try:
    runpy.run_module("polltuned", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    prof.disable()
    prof.dump_stats(out)
"""


# ---------------------------------------------------------------------------- /proc parsing (pure)

@dataclass(frozen=True)
class ProcSample:
    pid: int
    ppid: int
    utime: int        # clock ticks
    stime: int
    cutime: int
    cstime: int
    rss_kb: int = 0
    hwm_kb: int = 0


def parse_stat(text: str) -> tuple[int, int, int, int, int]:
    """Pure: (ppid, utime, stime, cutime, cstime) from /proc/PID/stat (proc(5): the fields after the
    parenthesised comm, which may contain spaces; ppid is field 4, utime..cstime fields 14-17)."""
    rest = text[text.rindex(")") + 2:].split()
    return int(rest[1]), int(rest[11]), int(rest[12]), int(rest[13]), int(rest[14])


def parse_status_kb(text: str, key: str) -> int:
    """Pure: a ``Key:   1234 kB`` line of /proc/PID/status, in kB (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def sample_proc(host: Host, pid: int) -> ProcSample | None:
    try:
        ppid, ut, st, cut, cst = parse_stat(host.read_text(f"/proc/{pid}/stat"))
        status = host.read_text(f"/proc/{pid}/status")
    except (PolltunedError, ValueError, IndexError):
        return None
    return ProcSample(pid, ppid, ut, st, cut, cst, parse_status_kb(status, "VmRSS"), parse_status_kb(status, "VmHWM"))


def worker_pids(host: Host, parent: int) -> list[int]:
    """Children of ``parent`` whose command line runs the model worker."""
    out: list[int] = []
    for d in host.glob("/proc", "[0-9]*"):
        try:
            pid = int(d)
            ppid = parse_stat(host.read_text(f"/proc/{pid}/stat"))[0]
            if ppid == parent and WORKER_MODULE in host.read_text(f"/proc/{pid}/cmdline").replace("\0", " "):
                out.append(pid)
        except (PolltunedError, ValueError, IndexError):
            continue
    return out


# ---------------------------------------------------------------------------- the run

@dataclass
class WorkerLife:
    pid: int
    first_t: float
    last_t: float
    rss_kb: int = 0
    cpu_ticks: int = 0          # its CPU (utime + stime) when last seen
    cpu_at_first: int = 0       # ... when first seen (a worker already running when sampling began)
    started_before: bool = False
    ended: bool = False


@dataclass
class Result:
    hold_s: float = 0.0
    daemon_cpu_share: float = 0.0           # of one core, over the HOLD span
    daemon_rss_mb: list[float] = field(default_factory=list)
    daemon_hwm_mb: float = 0.0
    probe_cpu_share: float = 0.0
    worker_cpu_share: float = 0.0
    workers: list[WorkerLife] = field(default_factory=list)
    hold_windows: int = 0
    left_hold_s: float = 0.0
    roles: dict[str, int] = field(default_factory=dict)
    foreign_cores: float = 0.0
    to_hold_s: float = 0.0
    daemon_exit: int | None = None
    restored: bool = False
    imported: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        rss = sorted(self.daemon_rss_mb)
        return {
            "hold_s": round(self.hold_s, 1), "to_hold_s": round(self.to_hold_s, 1),
            "daemon_cpu_pct_of_core": round(100 * self.daemon_cpu_share, 3),
            "daemon_rss_mb": {"min": rss[0] if rss else None, "median": rss[len(rss) // 2] if rss else None,
                              "max": rss[-1] if rss else None},
            "daemon_hwm_mb": self.daemon_hwm_mb,
            "worker": {"cpu_pct_of_core": round(100 * self.worker_cpu_share, 3),
                       "rss_mb_s": round(sum(w.rss_kb / 1024 * (w.last_t - w.first_t + 1.0) for w in self.workers), 1),
                       "lives": [{"pid": w.pid, "alive_s_in_span": round(w.last_t - w.first_t + 1.0, 1),
                                  "started_before_span": w.started_before, "ended_in_span": w.ended,
                                  "rss_mb": round(w.rss_kb / 1024, 1),
                                  "cpu_s_in_span": (w.cpu_ticks - w.cpu_at_first) / os.sysconf("SC_CLK_TCK")}
                                 for w in self.workers]},
            "probe_clients_cpu_pct_of_core": round(100 * self.probe_cpu_share, 2),
            "hold_windows_seen": self.hold_windows, "roles": self.roles,
            "seconds_outside_hold": round(self.left_hold_s, 1),
            "foreign_cores": round(self.foreign_cores, 3),
            "daemon_exit": self.daemon_exit, "restored": self.restored,
            "heavy_modules_mapped": self.imported,
        }


def run(args: argparse.Namespace) -> Result:
    clock = SystemClock()
    host = FsHost("/")
    runner = SubprocessRunner()
    tck = os.sysconf("SC_CLK_TCK")
    state_dir = Path(args.state_dir)
    paths = MixPaths(state_dir / "mix")
    owner = os.getpid()
    world = DefaultWorld(host, runner, clock, state_dir, config=WORLD, ncpus=2,
                         workload=Workload("daemon-cost", "one sockperf server on CPU1; one session from CPU0",
                                           client_cpus=(0,), server_cpus=(1,)))
    c = world.config
    res = Result()
    server: Any = None
    daemon: DaemonProcess | None = None
    try:
        mix_recover(state_dir, host=host, clock=clock, progress=print)
        if paths.root.exists():
            shutil.rmtree(paths.root)
        paths.root.mkdir(parents=True, mode=0o700)
        world.setup()
        server = runner.spawn(["sockperf", "server", "-i", c.server_addr, "-p", str(c.port)],
                              netns=c.server_ns, cpus=[1])
        clock.sleep(0.5)
        if not server.running():
            raise HostError("daemon_cost: the sockperf server did not start")
        write_phase(str(paths.phase_file), phase_load(0, "single"))
        base = find_policy("bench-mix").resolve()
        paths.policy.write_text(daemon_policy_toml(base, client_argv(paths, c.server_addr, c.port, None), c.client_ns,
                                                   budget=args.budget, window_s=args.window_s)
                                + f"\n[hold]\ninterval_s = {float(args.interval)!r}\n"
                                + (f"explore_share = {float(args.explore_share)!r}\n"
                                   if args.explore_share is not None else ""))
        paths.config.write_text(f"status_interval_s = {float(args.status_interval)!r}\n")
        head = [sys.executable, "-c", PROFILE_BOOT, str(Path(args.profile).resolve())] if args.profile else \
            [sys.executable, "-m", "polltuned"]
        argv = [*head, "--state-dir", str(paths.daemon_state), "--run-dir",
                str(paths.daemon_run), "run", "--config", str(paths.config), "--policy", str(paths.policy),
                "--nic", c.nic, "--log-level", "info"]
        t0 = clock.monotonic()
        daemon = DaemonProcess(runner, argv, paths.daemon_log)
        paths.daemon_pid.write_text(f"{daemon.pid}\n")
        pid = daemon.pid
        # ---- until HOLD
        while True:
            clock.sleep(1.0)
            if not daemon.running():
                raise HostError("daemon_cost: the daemon exited", hint=" | ".join(daemon.tail(5)))
            doc = read_status(paths.daemon_run) or {}
            if doc.get("phase") == "HOLD":
                break
            if clock.monotonic() - t0 > args.max_wait_s:
                raise HostError(f"daemon_cost: no HOLD after {args.max_wait_s:.0f} s", hint=str(doc.get("message")))
        res.to_hold_s = clock.monotonic() - t0
        print(f"HOLD after {res.to_hold_s:.0f} s; sampling {args.hold_s:.0f} s", flush=True)
        clock.sleep(args.settle_s)
        if args.profile:
            os.kill(pid, signal.SIGUSR2)   # the profile covers HOLD only
        first = sample_proc(host, pid)
        f0 = foreign_cpu_seconds(owner)
        h0 = clock.monotonic()
        if first is None:
            raise HostError("daemon_cost: cannot read the daemon's /proc entry")
        lives: dict[int, WorkerLife] = {}
        for wp in worker_pids(host, pid):
            ws = sample_proc(host, wp)
            if ws is not None:
                lives[wp] = WorkerLife(wp, 0.0, 0.0, ws.rss_kb, ws.utime + ws.stime, ws.utime + ws.stime, True)
        last = first
        seen_windows: set[Any] = set()
        while clock.monotonic() - h0 < args.hold_s:
            clock.sleep(1.0)
            t = clock.monotonic() - h0
            s = sample_proc(host, pid)
            if s is None:
                raise HostError("daemon_cost: the daemon exited during HOLD", hint=" | ".join(daemon.tail(5)))
            last = s
            res.daemon_rss_mb.append(round(s.rss_kb / 1024, 1))
            alive = set(worker_pids(host, pid))
            for wp in alive:
                ws = sample_proc(host, wp)
                if ws is None:
                    continue
                life = lives.setdefault(wp, WorkerLife(wp, t, t))
                life.last_t = t
                life.rss_kb = max(life.rss_kb, ws.rss_kb)
                life.cpu_ticks = ws.utime + ws.stime
            for wp, life in lives.items():
                if wp not in alive:
                    life.ended = True
            doc = read_status(paths.daemon_run) or {}
            hold = doc.get("hold") if isinstance(doc.get("hold"), dict) else {}
            role = str((hold or {}).get("role") or doc.get("phase"))
            res.roles[role] = res.roles.get(role, 0) + 1
            if doc.get("phase") != "HOLD":
                res.left_hold_s += 1.0
            seen_windows.add((hold or {}).get("windows"))
        span = clock.monotonic() - h0
        res.foreign_cores = foreign_cores(f0, foreign_cpu_seconds(owner), span)
        res.hold_s = span
        res.daemon_cpu_share = (last.utime + last.stime - first.utime - first.stime) / tck / span
        res.daemon_hwm_mb = round(last.hwm_kb / 1024, 1)
        res.workers = list(lives.values())
        # in the span: what each worker used since it was first seen; reaped workers' whole CPU is
        # in the daemon's cutime + cstime (the rest of which is the probe's clients)
        res.worker_cpu_share = sum(w.cpu_ticks - w.cpu_at_first for w in res.workers) / tck / span
        reaped = sum(w.cpu_ticks for w in res.workers if w.ended)
        res.probe_cpu_share = max(0.0, (last.cutime + last.cstime - first.cutime - first.cstime - reaped) / tck / span)
        res.hold_windows = len({w for w in seen_windows if w is not None})
        with contextlib.suppress(PolltunedError):
            res.imported = [m for m in ("skopt", "sklearn", "scipy", "numpy")
                            if f"/{m}/" in host.read_text(f"/proc/{pid}/maps")]
        code, clean = daemon.stop(60.0, clock)
        daemon = None
        res.daemon_exit = code
        res.restored = clean and code == 0
        return res
    finally:
        try:
            if daemon is not None and daemon.running():
                daemon.stop(60.0, clock)
            dirty = mix_recover_daemon(paths, host=host, clock=clock, progress=print)
            if dirty:
                res.restored = False
        finally:
            if server is not None:
                server.stop(1.0)
            world.teardown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=int, default=8, help="the first round's search windows (default 8)")
    p.add_argument("--window-s", type=float, default=1.0, help="probe window (default 1 s)")
    p.add_argument("--interval", type=float, default=10.0, help="hold.interval_s (default 10, the production default)")
    p.add_argument("--status-interval", type=float, default=5.0, help="status_interval_s of the daemon config")
    p.add_argument("--explore-share", type=float, default=None,
                   help="hold.explore_share (default: the policy's, 0.05: a challenger every ~120 HOLD windows)")
    p.add_argument("--hold-s", type=float, default=90.0, help="seconds of HOLD sampled (default 90)")
    p.add_argument("--settle-s", type=float, default=5.0, help="seconds after HOLD starts before sampling")
    p.add_argument("--max-wait-s", type=float, default=600.0)
    p.add_argument("--state-dir", default="/var/lib/polltuned/daemon-cost")
    p.add_argument("--json", action="store_true")
    p.add_argument("--profile", metavar="FILE",
                   help="profile the daemon in HOLD (cProfile, CPU time), its stats to FILE (inflates its CPU)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("daemon_cost: needs root (it runs the real daemon on the real kernel)", file=sys.stderr)
        return 2
    with open(LOCK, "a+") as fd:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            res = run(args)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    doc = res.to_json()
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(f"daemon in HOLD for {doc['hold_s']} s ({doc['hold_windows_seen']} HOLD windows, roles {doc['roles']}, "
              f"{doc['seconds_outside_hold']} s outside HOLD), reached after {doc['to_hold_s']} s")
        print(f"  daemon process: CPU {doc['daemon_cpu_pct_of_core']} % of a core; RSS {doc['daemon_rss_mb']} MB; "
              f"VmHWM {doc['daemon_hwm_mb']} MB; heavy modules mapped: {res.imported or 'none'}")
        print(f"  model worker: CPU {doc['worker']['cpu_pct_of_core']} % of a core; lives {doc['worker']['lives']}")
        print(f"  probe clients (reaped children): CPU {doc['probe_clients_cpu_pct_of_core']} % of a core")
        print(f"  foreign CPU: {doc['foreign_cores']} cores; daemon exit {doc['daemon_exit']}, "
              f"restored: {'yes' if doc['restored'] else 'NO'}")
    return 0 if res.restored else 1


if __name__ == "__main__":
    raise SystemExit(main())

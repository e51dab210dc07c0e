"""polltuned.service under a real systemd: a container booted on this machine with systemd-nspawn.

The container is ``systemd-nspawn --directory=/ --volatile=yes``: a tmpfs root with the host's /usr.
/etc and /usr are overlays whose upper layers live in the test's tmp directory, so
``config/install.sh --setup`` can create the group, the unit, the tmpfiles.d/sysusers.d entries and
/usr/local/bin/polltuned inside while the host stays untouched (and the host's /etc means no
first-boot prompt). The checkout and its venv's Python are bound read-only at their own paths; a
host directory bound at /srv/pt holds the fake /proc+/sys tree and the sim policy, so the test reads
the knob files directly. It boots into basic.target (none of the host's services start) and is not
registered with machined (this VM has no systemd as PID 1): commands run inside through nsenter.

Checks (issue 10, item 7): start -> active only after READY=1; reload -> still active, same PID,
a new tuning round with the new policy; WATCHDOG=1 pings seen, and a daemon that stops pinging
(SIGSTOP) is killed by the watchdog, rolled back by ExecStopPost and restarted; ``systemctl kill -s
KILL`` -> ExecStopPost restored every knob of the fake tree byte for byte; stop -> restored; the
tmpfiles group exists, the run directory and status file are root:polltuned 0750/0640, a member of
the group can run ``polltuned status`` and a non-member gets a one-line permission error.

Skips with the reason when the container cannot boot here (not root, no systemd-nspawn/nsenter,
boot failure). Always powers the container off (finally); nothing is registered, no scope is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from polltuned.policy.loader import load_policy
from polltuned.probes.sim import make_fake_host_tree

REPO = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)
PT = str(VENV / "bin" / "polltuned")
BOOT_TIMEOUT_S = 30.0

POLICY = """
include = ["{repo}/policies/sim-default.toml"]
name = "{name}"
[tuning]
budget = 10
window_s = 0.02
settle_s = 0
[confirm]
pairs = 3
[hold]
interval_s = 0.2
drift_windows = 50
"""

CONFIG = 'policy = "/srv/pt/policy.toml"\nstatus_interval_s = 0.2\n'

DROPIN = """[Service]
ExecStart=
ExecStart={pt} --host-root /srv/pt/root run --config /etc/polltuned/polltuned.toml
ExecStopPost=
ExecStopPost={pt} --host-root /srv/pt/root rollback --if-dirty
ReadWritePaths=/srv/pt/root
WatchdogSec=3s
RestartSec=2s
LimitCORE=0
{extra}"""


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.append(int(d.name))
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Container:
    """One booted container; ``sh``/``run`` execute inside it (nsenter into its PID 1)."""

    def __init__(self, tmp: Path, srv: Path) -> None:
        self.tmp = tmp
        self.name = f"pt-test-{os.getpid()}"
        self.log = tmp / "container.log"
        binds = {str(REPO)}
        for p in (VENV, Path(sys.base_prefix)):
            if not str(p).startswith("/usr/") and not any(str(p).startswith(b + "/") for b in binds):
                binds.add(str(p))
        (tmp / "etc-upper").mkdir()
        (tmp / "usr-upper").mkdir()
        self.argv = [
            "systemd-nspawn", "--quiet", "--directory=/", "--volatile=yes", "--register=no", "--keep-unit",
            f"--machine={self.name}", "--console=read-only",
            f"--overlay=/etc:{tmp / 'etc-upper'}:/etc", f"--overlay=/usr:{tmp / 'usr-upper'}:/usr",
            *[f"--bind-ro={b}" for b in sorted(binds)], f"--bind={srv}:/srv/pt",
            "--boot", "systemd.unit=basic.target",
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.leader = 0
        self.boot_s = 0.0

    def boot(self) -> None:
        t0 = time.monotonic()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        end = t0 + BOOT_TIMEOUT_S
        while time.monotonic() < end and self.proc.poll() is None and not self.leader:
            self.leader = next((c for c in _children(self.proc.pid) if _comm(c) == "systemd"), 0)
            time.sleep(0.05)
        state = ""
        while self.leader and time.monotonic() < end and self.proc.poll() is None:
            state = self.run("systemctl", "is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                self.boot_s = time.monotonic() - t0
                return
            time.sleep(0.05)
        tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"container did not boot within {BOOT_TIMEOUT_S:.0f} s (state {state!r}): "
                           + " | ".join(tail))

    def run(self, *argv: str, check: bool = True, user: str | None = None, stdin: str | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = ["nsenter", "-t", str(self.leader), "-a", "--"]
        if user is not None:
            cmd += ["runuser", "-u", user, "--"]
        r = subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=timeout, input=stdin)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def write(self, path: str, text: str) -> None:
        self.run("sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path, stdin=text)

    def show(self, *props: str) -> dict[str, str]:
        out = self.run("systemctl", "show", "polltuned.service", *[f"--property={p}" for p in props]).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self) -> str:
        return self.run("journalctl", "--no-pager", "-o", "cat", "-u", "polltuned.service").stdout

    def shutdown(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None and self.leader:
            with contextlib.suppress(Exception):
                self.run("systemctl", "poweroff", "--no-block", check=False, timeout=10)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
        if self.proc.poll() is None:  # nspawn turns SIGTERM into a clean poweroff of the container
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            if self.leader:  # PID 1 of the container: its whole pid namespace goes with it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.leader, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait(timeout=10)
        # nspawn leaves its (empty) mount-propagation directory behind when /run is not a tmpfs
        with contextlib.suppress(OSError):
            os.rmdir(f"/run/systemd/nspawn/propagate/{self.name}")


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root: boots a container with systemd-nspawn"
    for tool in ("systemd-nspawn", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (apt-get install systemd-container; config/install.sh --dev does it)"
    if not Path("/usr/lib/systemd/systemd").exists() and not Path("/lib/systemd/systemd").exists():
        return "no systemd binary to boot"
    return None


@pytest.fixture
def container(tmp_path: Path) -> Iterator[tuple[Container, Path]]:
    why = _why_not()
    if why:
        pytest.skip(why)
    srv = tmp_path / "srv"
    srv.mkdir()
    c = Container(tmp_path, srv)
    try:
        try:
            c.boot()
        except (RuntimeError, OSError) as e:
            pytest.skip(f"the container cannot boot here: {e}")
        yield c, srv
    finally:
        c.shutdown()
    assert c.proc is not None and c.proc.poll() is not None, "container still running after teardown"


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _wait(pred: object, what: str, timeout: float = 30.0, every: float = 0.05) -> object:
    end = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < end:
        last = pred()  # type: ignore[operator]
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


@pytest.mark.slow
def test_unit_under_real_systemd(container: tuple[Container, Path]) -> None:
    c, srv = container
    t_start = time.monotonic()
    print(f"container booted in {c.boot_s:.2f} s")
    policy = srv / "policy.toml"
    policy.write_text(POLICY.format(repo=REPO, name="container-test"))
    root = srv / "root"
    make_fake_host_tree(root, load_policy(str(policy)).knobs)
    originals = _tree(root)

    # ---- the set-up (what `config/install.sh` does after pip), twice: it must be idempotent
    for _ in range(2):
        c.run("bash", str(REPO / "config/install.sh"), "--setup", str(VENV))
    group = c.run("getent", "group", "polltuned").stdout
    assert group.startswith("polltuned:")
    assert c.run("readlink", "/usr/local/bin/polltuned").stdout.strip() == PT
    tmpfiles = c.run("systemd-tmpfiles", "--create", "/usr/lib/tmpfiles.d/polltuned.conf", check=False)
    assert tmpfiles.returncode == 0 and "resolve" not in tmpfiles.stderr, tmpfiles.stderr
    c.run("useradd", "--no-create-home", "--groups", "polltuned", "ptmember")
    c.run("useradd", "--no-create-home", "ptstranger")
    # the checkout's venv Python lives where the real unit's ProtectHome=yes would hide it (pyenv under
    # /root): the test's drop-in lifts that, and the container's /root (its own tmpfs) becomes traversable
    extra = ""
    if str(Path(sys.base_prefix).resolve()).startswith(("/root", "/home")):
        extra = "ProtectHome=read-only\n"
        c.run("chmod", "0755", "/root")
    # a checkout under /tmp (a CI runner's scratch clone) would be hidden by the unit's PrivateTmp=yes
    if any(str(p.resolve()).startswith(("/tmp/", "/var/tmp/")) for p in (REPO, VENV, Path(sys.base_prefix))):
        extra += "PrivateTmp=no\n"
    c.write("/etc/systemd/system/polltuned.service.d/test.conf", DROPIN.format(pt=PT, extra=extra))
    c.write("/etc/polltuned/polltuned.toml", CONFIG)
    c.run("systemctl", "daemon-reload")
    verify = c.run("systemd-analyze", "verify", "polltuned.service", check=False)
    assert "polltuned.service" not in verify.stderr, verify.stderr

    # ---- start: Type=notify, so `systemctl start` returns once READY=1 (sent after recovery) arrived
    c.run("systemctl", "start", "polltuned.service")
    st = c.show("ActiveState", "SubState", "StatusText", "MainPID", "NRestarts", "Type", "Group")
    assert (st["ActiveState"], st["SubState"], st["Type"], st["Group"]) == ("active", "running", "notify",
                                                                             "polltuned"), st
    assert st["StatusText"], "no STATUS= reached systemd"
    pid = st["MainPID"]
    assert "RECOVER: host is clean" in c.journal()

    def status(user: str | None = None) -> dict[str, object]:
        r = c.run(PT, "--host-root", "/srv/pt/root", "status", "--json", user=user, check=False)
        return json.loads(r.stdout) if r.stdout.startswith("{") else {}

    doc = _wait(lambda: (d := status()) and d.get("phase") == "HOLD" and d, "HOLD", every=0.2)
    assert isinstance(doc, dict) and doc["policy"] == "container-test" and doc["progress"]["round"] == 1
    assert _tree(root) != originals, "the daemon changed no knob of the fake tree"

    # ---- the group: run dir and status file readable by members only
    perms = c.run("stat", "-c", "%a %U %G %n", "/run/polltuned", "/run/polltuned/status.json",
                  "/var/lib/polltuned").stdout.split("\n")
    assert perms[0] == "750 root polltuned /run/polltuned", perms
    assert perms[1] == "640 root polltuned /run/polltuned/status.json", perms
    assert perms[2] == "750 root polltuned /var/lib/polltuned", perms
    member = c.run(PT, "status", user="ptmember", check=False)
    assert member.returncode == 0, member.stderr
    assert "running (pid" in member.stdout and "container-test" in member.stdout
    assert status(user="ptmember")["running"] is True
    stranger = c.run(PT, "status", user="ptstranger", check=False)
    assert stranger.returncode == 5 and stranger.stderr.startswith("polltuned: error[permission]:"), stranger
    assert "Traceback" not in stranger.stderr

    # ---- the watchdog: pings are seen; a daemon that stops pinging is killed, rolled back, restarted
    w1 = int(c.show("WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"])
    w2 = int(_wait(lambda: (w := int(c.show("WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"])) > w1
                   and w, "a WATCHDOG=1 ping", timeout=5))  # type: ignore[arg-type]
    assert w2 > w1 > 0
    assert _tree(root) != originals  # HOLD with a deployed configuration: there is something to restore
    c.run("systemctl", "kill", "--kill-who=main", "--signal=SIGSTOP", "polltuned.service")
    _wait(lambda: c.show("SubState")["SubState"] == "auto-restart", "the watchdog to kill the hung daemon",
          timeout=15)
    assert _tree(root) == originals, "ExecStopPost after the watchdog kill did not restore every knob"
    assert "Watchdog timeout" in c.run("journalctl", "--no-pager", "-u", "polltuned.service").stdout
    # the next run starts without trial history, so that its first round surely deploys something
    # (with a warm start it may keep the baseline, and the SIGKILL check below would restore nothing)
    c.run("rm", "-rf", "/var/lib/polltuned/studies")
    _wait(lambda: (s := c.show("ActiveState", "NRestarts", "MainPID"))["ActiveState"] == "active"
          and s["NRestarts"] == "1" and s["MainPID"] != pid, "the restart after the watchdog", timeout=20)
    _wait(lambda: (d := status()) and d.get("phase") == "HOLD", "HOLD after the restart", every=0.2)

    # ---- kill -s KILL: ExecStopPost (rollback --if-dirty) puts every knob back, byte for byte
    assert _tree(root) != originals, "the restarted daemon deployed nothing"
    c.run("systemctl", "kill", "--signal=SIGKILL", "polltuned.service")
    _wait(lambda: c.show("SubState")["SubState"] == "auto-restart", "ExecStopPost after SIGKILL", timeout=15)
    assert _tree(root) == originals, "ExecStopPost after SIGKILL did not restore every knob"
    c.run("rm", "-rf", "/var/lib/polltuned/studies")
    _wait(lambda: (s := c.show("ActiveState", "NRestarts"))["ActiveState"] == "active" and s["NRestarts"] == "2",
          "Restart=on-failure after SIGKILL", timeout=20)
    _wait(lambda: (d := status()) and d.get("phase") == "HOLD", "HOLD after the restart", every=0.2)
    pid = c.show("MainPID")["MainPID"]

    # ---- reload in HOLD: same process, still active, a new round with the new policy
    policy.write_text(POLICY.format(repo=REPO, name="container-reloaded"))
    c.run("systemctl", "reload", "polltuned.service")
    doc = _wait(lambda: (d := status()) and d.get("policy") == "container-reloaded" and d.get("phase") == "HOLD"
                and d, "a new round with the reloaded policy in HOLD", every=0.2)
    assert isinstance(doc, dict) and doc["progress"]["round"] == 2
    st = c.show("ActiveState", "SubState", "MainPID", "NRestarts")
    assert (st["ActiveState"], st["SubState"], st["MainPID"], st["NRestarts"]) == ("active", "running", pid, "2"), st
    assert "reloaded policy 'container-reloaded'" in c.journal()
    # an invalid policy: refused (one log line), the old one keeps running, the unit is not left
    # "reloading" (READY=1 answered the RELOADING=1)
    policy.write_text(POLICY.format(repo=REPO, name="container-broken") + "\n[tuning.bogus]\nx = 1\n")
    c.run("systemctl", "reload", "polltuned.service")
    _wait(lambda: "reload refused, keeping policy 'container-reloaded'" in c.journal(), "the refusal", every=0.2)
    _wait(lambda: c.show("ActiveState", "SubState") == {"ActiveState": "active", "SubState": "running"},
          "active after the refused reload", timeout=10)
    assert c.show("MainPID")["MainPID"] == pid and status()["policy"] == "container-reloaded"

    # ---- stop: on_exit = restore, then ExecStopPost finds nothing to do
    assert _tree(root) != originals  # the reloaded round started from the deployed values
    c.run("systemctl", "stop", "polltuned.service")
    st = c.show("ActiveState", "Result")
    assert st == {"ActiveState": "inactive", "Result": "success"}, st
    assert _tree(root) == originals, "stop did not restore every knob"
    assert c.run("test", "-e", "/run/polltuned", check=False).returncode != 0  # RuntimeDirectoryPreserve=no
    # a member, with the daemon stopped: the journal is root's, so the host state is "unknown", not "clean"
    member = c.run(PT, "--host-root", "/srv/pt/root", "status", user="ptmember", check=False)
    # stopped: a member sees "not running, host state unknown" and a non-zero exit (the journal is
    # root's: whether the host is clean cannot be known by this user)
    assert member.returncode == 5 and "not running" in member.stdout and "unknown" in member.stdout, member
    assert member.stderr.startswith("polltuned: error[permission]:"), member
    assert "clean" in c.run(PT, "--host-root", "/srv/pt/root", "status").stdout  # root can tell
    print(f"systemd checks took {time.monotonic() - t_start:.1f} s after boot")

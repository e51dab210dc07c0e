"""Running system tools (sockperf, stress-ng, ip, ethtool, taskset).

This is the only module that spawns system tools. Everything else takes a :class:`Runner`, so tests
substitute a scripted fake and never fork. A command can be placed in a network namespace
(``ip netns exec NS``) and pinned to CPUs (``taskset -c``); both wrappers are applied here so the
callers only state intent.

Spawned processes get their own session (process group) so that stopping one also stops the
children of ``ip netns exec`` / ``taskset`` wrappers; stop() sends SIGTERM, then SIGKILL after a
grace period, and always reaps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from polltuned.errors import HostError


@dataclass(frozen=True)
class ExecResult:
    argv: tuple[str, ...]
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.returncode == 0

    def describe(self) -> str:
        """One line for logs: the command, how it ended and the last stderr line."""
        cmd = " ".join(self.argv)
        how = f"timed out after {self.duration_s:.1f} s" if self.timed_out else f"exit {self.returncode}"
        tail = (self.stderr.strip().splitlines() or [""])[-1]
        return f"{cmd}: {how}" + (f": {tail}" if tail else "")


class Spawned(Protocol):
    """A running background process."""

    argv: tuple[str, ...]

    @property
    def pid(self) -> int: ...
    def running(self) -> bool: ...
    def wait(self, timeout_s: float) -> ExecResult:
        """Wait for exit; on timeout kill the process group and return a timed-out result."""
        ...
    def stop(self, grace_s: float = 1.0) -> ExecResult: ...


class Runner(Protocol):
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        netns: str | None = None,
        cpus: Sequence[int] | None = None,
        check: bool = False,
    ) -> ExecResult: ...

    def spawn(
        self,
        argv: Sequence[str],
        *,
        netns: str | None = None,
        cpus: Sequence[int] | None = None,
    ) -> Spawned: ...


def wrap_argv(argv: Sequence[str], *, netns: str | None = None, cpus: Sequence[int] | None = None) -> list[str]:
    """The full command line: ``ip netns exec NS taskset -c CPUS argv...`` (each part only if asked)."""
    out: list[str] = []
    if netns is not None:
        out += ["ip", "netns", "exec", netns]
    if cpus:
        out += ["taskset", "-c", ",".join(str(c) for c in cpus)]
    out += list(argv)
    return out


def _kill_group(proc: subprocess.Popen[str], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        proc.send_signal(sig)


class _Proc:
    def __init__(self, argv: list[str], proc: subprocess.Popen[str]) -> None:
        self.argv = tuple(argv)
        self._proc = proc
        self._t0 = time.monotonic()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def running(self) -> bool:
        return self._proc.poll() is None

    def _result(self, timed_out: bool) -> ExecResult:
        try:
            out, err = self._proc.communicate(timeout=5.0)
        except subprocess.TimeoutExpired:
            _kill_group(self._proc, signal.SIGKILL)
            out, err = self._proc.communicate()
        return ExecResult(self.argv, self._proc.returncode, out or "", err or "", timed_out,
                          time.monotonic() - self._t0)

    def wait(self, timeout_s: float) -> ExecResult:
        # communicate, not wait: a child printing more than a pipe holds (64 KiB: sockperf's
        # per-sample log) would block on its write and never exit while we wait for it
        try:
            out, err = self._proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(self._proc, signal.SIGKILL)
            return self._result(True)
        return ExecResult(self.argv, self._proc.returncode, out or "", err or "", False,
                          time.monotonic() - self._t0)

    def stop(self, grace_s: float = 1.0) -> ExecResult:
        if self._proc.poll() is None:
            _kill_group(self._proc, signal.SIGTERM)
            try:
                self._proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _kill_group(self._proc, signal.SIGKILL)
        # the process is gone; its group may still hold children of the wrappers
        _kill_group(self._proc, signal.SIGKILL)
        return self._result(False)


class SubprocessRunner:
    """The real runner (needs the tools on PATH; namespaces need root)."""

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        netns: str | None = None,
        cpus: Sequence[int] | None = None,
        check: bool = False,
    ) -> ExecResult:
        full = wrap_argv(argv, netns=netns, cpus=cpus)
        proc = self._popen(full)
        res = _Proc(full, proc).wait(timeout_s)
        if check and not res.ok:
            raise HostError(res.describe())
        return res

    def spawn(
        self,
        argv: Sequence[str],
        *,
        netns: str | None = None,
        cpus: Sequence[int] | None = None,
    ) -> Spawned:
        full = wrap_argv(argv, netns=netns, cpus=cpus)
        return _Proc(full, self._popen(full))

    @staticmethod
    def _popen(full: list[str]) -> subprocess.Popen[str]:
        try:
            return subprocess.Popen(
                full,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                start_new_session=True,
            )
        except OSError as e:
            raise HostError(f"cannot run {full[0]}: {os.strerror(e.errno or 0)}", errno=e.errno,
                            hint=f"is {full[0]} installed and on PATH?") from e


def kill_pid(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal one process by id (leftover cleanup of processes found in our own namespaces)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def foreign_cpu_seconds(owner_pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of every user-space process that is not ``owner_pid`` or one of
    its descendants; kernel threads (children of kthreadd, pid 2) are left out because our own
    traffic runs in them (softirq, napi/ threads). Used to tell a disturbed measurement."""
    import psutil

    out: dict[int, float] = {}
    ours: set[int] = {owner_pid}
    try:
        ours.update(c.pid for c in psutil.Process(owner_pid).children(recursive=True))
    except psutil.Error:
        pass
    for p in psutil.process_iter(["pid", "ppid", "cpu_times"]):
        info = p.info
        pid = int(info["pid"])
        if pid in ours or pid == 2 or info.get("ppid") == 2 or info.get("cpu_times") is None:
            continue
        t = info["cpu_times"]
        out[pid] = float(t.user) + float(t.system)
    return out

"""The model worker's process: spawned, spoken to in JSON lines over a pipe, with a deadline on
every reply (polltuned.optimiser.proxy drives it; polltuned.optimiser.worker is the other end).

The worker runs with the daemon's own interpreter (``sys.executable``) in isolated mode (``-I``: no
PYTHON* variables, no user site, not the working directory) and with the daemon's own package
directory first on its path, so it runs exactly the code the daemon runs. As root, the interpreter
and the worker module (and every directory above them) must not be writable by anyone else
(polltuned.trust, as for policies and scenarios), or nothing is started.

The worker inherits stderr (its traceback lands in the daemon's log); stdout carries only replies.
It is a child of the daemon in the daemon's session: when the daemon dies, its stdin reaches end of
file and it exits.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from polltuned.errors import ModelWorkerError, ModelWorkerGone
from polltuned.trust import require_trusted

#: the code ``python -I -c`` runs: the package directory (argv[1]) first on the path, then the worker
BOOT = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
        "from polltuned.optimiser.worker import main; raise SystemExit(main())")
MAX_LINE = 64 << 20


def package_root() -> Path:
    """The directory that holds the daemon's ``polltuned`` package (this file is polltuned/host/modelproc.py)."""
    return Path(__file__).resolve().parent.parent.parent


def worker_argv(*, idle_s: float | None, python: str | None = None, root: Path | None = None) -> list[str]:
    """The worker's command line (pure but for the defaults: this interpreter, this package)."""
    argv = [python or sys.executable, "-I", "-c", BOOT, str(root or package_root())]
    if idle_s is not None:
        argv += ["--idle-s", repr(float(idle_s))]
    return argv


def check_trusted(argv: Sequence[str], root: Path) -> None:
    """As root: refuse an interpreter or worker module someone else can write (UntrustedFile, exit 5)."""
    require_trusted(argv[0], "model worker interpreter")
    require_trusted(root / "polltuned" / "optimiser" / "worker.py", "model worker module")


class PipeProcess:
    """A child process answering one line per request on stdout. ``readline`` has a deadline; a
    child that exits, closes its output, or sends a line longer than ``MAX_LINE`` is a
    ModelWorkerError."""

    def __init__(self, argv: Sequence[str], *, monotonic: Callable[[], float] = time.monotonic,
                 env: dict[str, str] | None = None) -> None:
        self.argv = tuple(argv)
        self._monotonic = monotonic
        try:
            self._p = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
                                       close_fds=True, env=env, bufsize=0)
        except OSError as e:
            raise ModelWorkerError(f"cannot start the model worker ({argv[0]}): {e}") from e
        self._buf = b""

    @property
    def pid(self) -> int:
        return int(self._p.pid)

    def alive(self) -> bool:
        return self._p.poll() is None

    def write_line(self, line: str) -> None:
        assert self._p.stdin is not None
        data = (line + "\n").encode()
        try:
            self._p.stdin.write(data)
            self._p.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise ModelWorkerGone(f"the model worker (pid {self.pid}) is gone: {e}") from e

    def readline(self, timeout_s: float) -> str:
        assert self._p.stdout is not None
        fd = self._p.stdout.fileno()
        deadline = self._monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - self._monotonic()
            if left <= 0:
                raise ModelWorkerError(f"the model worker (pid {self.pid}) did not answer within {timeout_s:g} s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self._p.poll()
                raise ModelWorkerGone(f"the model worker (pid {self.pid}) exited "
                                       f"(status {self._p.returncode}) without answering")
            self._buf += chunk
            if len(self._buf) > MAX_LINE:
                raise ModelWorkerError(f"the model worker (pid {self.pid}) sent more than {MAX_LINE} bytes in a line")
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            return line.decode()
        except UnicodeDecodeError as e:
            raise ModelWorkerError(f"the model worker (pid {self.pid}) sent a line that is not UTF-8") from e

    def close(self, grace_s: float = 2.0) -> int | None:
        """End of input (the worker exits), wait up to ``grace_s``, then kill; always reaps."""
        if self._p.stdin is not None:
            try:
                self._p.stdin.close()
            except OSError:
                pass
        try:
            return self._p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._p.kill()
            return self._p.wait()
        finally:
            if self._p.stdout is not None:
                self._p.stdout.close()


def spawn_model_worker(*, idle_s: float | None) -> PipeProcess:
    """The model worker of this daemon (trust-checked as root)."""
    root = package_root()
    argv = worker_argv(idle_s=idle_s, root=root)
    check_trusted(argv, root)
    return PipeProcess(argv)

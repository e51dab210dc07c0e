"""The daemon's published state: run_dir/status.json, written atomically, read by `polltuned status`.

The file is read-only data (nothing in it can change the host). Mode 0640 so root and the
`polltuned` group can read it. Versioned: readers accept v1 and ignore unknown fields.
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import fcntl
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polltuned.errors import LockedError, PermissionNeeded, PolltunedError

STATUS_VERSION = 1
STATUS_FILE = "status.json"
LOCK_FILE = "polltuned.lock"


def write_status(run_dir: str | Path, doc: Mapping[str, Any]) -> None:
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{STATUS_FILE}.{os.getpid()}.tmp"
    data = json.dumps({"v": STATUS_VERSION, **doc}, indent=1, sort_keys=True, default=str)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    try:
        os.write(fd, data.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, d / STATUS_FILE)


def read_status(run_dir: str | Path) -> dict[str, Any] | None:
    p = Path(run_dir) / STATUS_FILE
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


class InstanceLock:
    """One daemon per run directory: an flock held for the life of the process."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = holder_pid(self.path.parent)
            raise LockedError(
                f"another polltuned is already running (pid {holder or '?'}, lock {self.path})",
                hint="stop it first (systemctl stop polltuned) or use another --run-dir",
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def holder_pid(run_dir: str | Path) -> int | None:
    try:
        txt = (Path(run_dir) / LOCK_FILE).read_text().strip()
        return int(txt) if txt else None
    except (OSError, ValueError):
        return None


def daemon_running(run_dir: str | Path) -> bool:
    """True when some process holds the instance lock (works across pid namespaces).
    PermissionNeeded when the lock cannot be opened (not root)."""
    p = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(p, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise _state_error(p, "open", e) from e
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


KEEP_MARKER = "kept.json"


def mark_kept(state_dir: str | Path, info: Mapping[str, Any]) -> None:
    """The daemon exited cleanly with on_exit = keep: `rollback --if-dirty` (ExecStopPost) must not undo it."""
    p = Path(state_dir) / KEEP_MARKER
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(info), default=str))
    os.replace(tmp, p)


def clear_kept(state_dir: str | Path) -> bool:
    p = Path(state_dir) / KEEP_MARKER
    try:
        p.unlink()
        return True
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        return False
    except OSError as e:
        raise _state_error(p, "remove", e) from e


def _state_error(path: Path, action: str, e: OSError) -> PolltunedError:
    why = e.strerror or str(e)
    if e.errno in (errno_mod.EACCES, errno_mod.EPERM):
        return PermissionNeeded(f"{path}: cannot {action}: {why}", hint="run polltuned as root (sudo)")
    return PolltunedError(f"{path}: cannot {action}: {why}", code="os-error")


def is_kept(state_dir: str | Path) -> bool:
    return (Path(state_dir) / KEEP_MARKER).exists()

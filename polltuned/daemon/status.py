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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polltuned.errors import LockedError, PermissionNeeded, PolltunedError, StateNotWritable

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

    PermissionNeeded when the run directory or the lock cannot be read (it is root:polltuned 0750)."""
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
KEEP_VERSION = 1


@dataclass(frozen=True)
class KeepMarker:
    """STATE_DIR/kept.json: the daemon exited cleanly with on_exit = keep in journal epoch ``epoch``.

    It covers that epoch only, and only until the next daemon starts: recovery honours it (the
    deployed values stay) and removes it, so a crash of the new run is rolled back by ExecStopPost.
    ``epoch`` None is a marker written before markers carried one (honoured once, like any other)."""

    epoch: int | None
    policy: str = ""
    t: float = 0.0

    def applies_to(self, epoch: int, open_: bool) -> bool:
        """Does the marker cover the journal's current state (an open epoch, the one it names)?"""
        return open_ and (self.epoch is None or self.epoch == epoch)


def mark_kept(state_dir: str | Path, *, epoch: int, policy: str, t: float) -> None:
    """The daemon exited cleanly with on_exit = keep: `rollback --if-dirty` (ExecStopPost) must not undo it."""
    p = Path(state_dir) / KEEP_MARKER
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps({"v": KEEP_VERSION, "epoch": epoch, "policy": policy, "t": t}))
    os.replace(tmp, p)


def read_kept(state_dir: str | Path) -> KeepMarker | None:
    """The marker, or None when there is none (an unreadable or damaged one counts as none: the
    safe reading, since without a marker ExecStopPost restores the originals)."""
    try:
        doc = json.loads((Path(state_dir) / KEEP_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    epoch = doc.get("epoch")
    t = doc.get("t")
    return KeepMarker(epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None,
                      str(doc.get("policy", "")), float(t) if isinstance(t, (int, float)) else 0.0)


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
    if e.errno in (errno_mod.ENOSPC, errno_mod.EDQUOT, errno_mod.EROFS):
        return StateNotWritable(f"{path}: cannot {action}: {why}",
                                hint="free space on (or remount read-write) the state directory's file system")
    return PolltunedError(f"{path}: cannot {action}: {why}", code="os-error")


def is_kept(state_dir: str | Path, epoch: int, open_: bool) -> bool:
    """A keep marker exists and covers the journal's open epoch ``epoch``."""
    m = read_kept(state_dir)
    return m is not None and m.applies_to(epoch, open_)

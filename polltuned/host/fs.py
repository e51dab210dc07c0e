"""Filesystem access to /proc and /sys under a configurable root."""

from __future__ import annotations

import contextlib
import errno as errno_mod
import fnmatch
import os
from pathlib import Path
from typing import Protocol

from polltuned.errors import HostError

#: suffix of the temporary file an atomic fake-tree write renames over its target (never listed)
TMP_SUFFIX = ".polltuned-tmp"


class Host(Protocol):
    """What every collector, knob and probe may use to reach the kernel."""

    root: Path

    @property
    def is_real(self) -> bool: ...
    def path(self, p: str) -> Path: ...
    def read_text(self, p: str) -> str: ...
    def exists(self, p: str) -> bool: ...
    def listdir(self, p: str) -> list[str]: ...
    def glob(self, directory: str, pattern: str) -> list[str]: ...
    def write_text(self, p: str, data: str) -> None: ...
    def is_writable(self, p: str) -> bool: ...
    def readlink(self, p: str) -> str: ...


class KeptFile:
    """A file kept open and re-read with ``pread(fd, n, 0)``: procfs seq_files and sysfs
    attributes regenerate their content when read from offset 0, so this skips the path walk
    and open/close of every sample (knobs.md 4.11). Errors surface as HostError."""

    def __init__(self, path: Path, kernel_path: str, *, regular_file: bool = False) -> None:
        # On a fake tree the files are regular files: an open fd keeps a deleted file readable,
        # unlike sysfs (ENODEV once the attribute is removed), so removal is checked with fstat.
        self._regular = regular_file
        self._kernel_path = kernel_path
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise HostError(f"cannot open {kernel_path}: {os.strerror(e.errno or 0)}", errno=e.errno) from e

    def read(self) -> str:
        if self._fd is None:
            raise HostError(f"{self._kernel_path}: read after close", errno=errno_mod.EBADF)
        try:
            if self._regular and os.fstat(self._fd).st_nlink == 0:
                raise HostError(f"cannot read {self._kernel_path}: file was removed", errno=errno_mod.ENOENT)
            data = os.pread(self._fd, 65536, 0)
            if len(data) == 65536:
                parts = [data]
                while True:
                    more = os.pread(self._fd, 1 << 20, sum(map(len, parts)))
                    if not more:
                        break
                    parts.append(more)
                data = b"".join(parts)
        except OSError as e:
            raise HostError(f"cannot read {self._kernel_path}: {os.strerror(e.errno or 0)}", errno=e.errno) from e
        return data.decode("utf-8", errors="replace")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class FsHost:
    """Host rooted at ``root`` (``/`` on a real machine, a fixture directory in tests).

    Paths are given in kernel form (``/proc/stat``); they are joined under the root.
    Errors are raised as HostError with the errno preserved and the kernel path named.
    """

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = Path(root).resolve()

    @property
    def is_real(self) -> bool:
        return str(self.root) == "/"

    def path(self, p: str) -> Path:
        if not p.startswith("/"):
            raise ValueError(f"host paths must be absolute: {p!r}")
        return self.root / p.lstrip("/")

    def read_text(self, p: str) -> str:
        try:
            with open(self.path(p), encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except OSError as e:
            raise HostError(f"cannot read {p}: {os.strerror(e.errno or 0)}", errno=e.errno) from e

    def open_kept(self, p: str) -> KeptFile:
        """Open ``p`` once for repeated whole-file reads (see KeptFile). Not part of the Host
        protocol: callers fall back to read_text() for other Host implementations."""
        return KeptFile(self.path(p), p, regular_file=not self.is_real)

    def exists(self, p: str) -> bool:
        return self.path(p).exists()

    def listdir(self, p: str) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.path(p)) if not n.endswith(TMP_SUFFIX))
        except OSError as e:
            raise HostError(f"cannot list {p}: {os.strerror(e.errno or 0)}", errno=e.errno) from e

    def glob(self, directory: str, pattern: str) -> list[str]:
        """Names in ``directory`` matching ``pattern``; [] when the directory is missing."""
        try:
            names = os.listdir(self.path(directory))
        except OSError:
            return []
        return sorted(n for n in names if fnmatch.fnmatch(n, pattern) and not n.endswith(TMP_SUFFIX))

    def write_text(self, p: str, data: str) -> None:
        """Write one value the way sysctl(8) does: a single write() of the whole string.

        The kernel's procfs/sysfs stores are atomic: a reader (or a process killed mid-write) sees
        the old value or the new one, never an empty or half-written file. On a fake tree (not
        ``/``) the same holds: the value goes to a temporary file in the same directory that is
        renamed over the target (the target must exist and be writable, as a kernel attribute
        must; its mode is kept)."""
        target = self.path(p)
        try:
            fd = os.open(target, os.O_WRONLY)
        except OSError as e:
            raise HostError(f"cannot open {p} for writing: {os.strerror(e.errno or 0)}", errno=e.errno) from e
        payload = data.encode()
        if not self.is_real:
            os.close(fd)
            self._replace(p, target, payload, data)
            return
        try:
            n = os.write(fd, payload)
            if n != len(payload):
                raise HostError(f"short write to {p} ({n} of {len(payload)} bytes)", errno=errno_mod.EIO)
        except OSError as e:
            raise HostError(
                f"writing {data.strip()!r} to {p} failed: {os.strerror(e.errno or 0)}", errno=e.errno
            ) from e
        finally:
            os.close(fd)

    @staticmethod
    def _replace(p: str, target: Path, payload: bytes, data: str) -> None:
        tmp = target.with_name(f".{target.name}{TMP_SUFFIX}")
        try:
            mode = target.stat().st_mode & 0o7777
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, payload)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise HostError(
                f"writing {data.strip()!r} to {p} failed: {os.strerror(e.errno or 0)}", errno=e.errno
            ) from e

    def is_writable(self, p: str) -> bool:
        target = self.path(p)
        try:
            st = target.stat()
        except OSError:
            return False
        # procfs/sysfs advertise read-only knobs (e.g. managed IRQs since 6.12) via mode 0444.
        if not st.st_mode & 0o222:
            return False
        return os.access(target, os.W_OK)

    def readlink(self, p: str) -> str:
        try:
            return os.readlink(self.path(p))
        except OSError as e:
            raise HostError(f"cannot readlink {p}: {os.strerror(e.errno or 0)}", errno=e.errno) from e

"""Trust checks for the files a root polltuned reads and acts on (issue 16).

A policy can name a ``command`` probe whose argv polltuned runs, and a ``sim`` probe can name a
Python scenario file polltuned imports: a file that someone other than root can change is code
that runs as root. As sshd's StrictModes does for authorized_keys (and tuned for its profiles),
polltuned running as root refuses a policy, config, include or scenario file that is not owned by
root or is group/other-writable, or whose path goes through a directory that is (up to ``/``,
for the path as given and for the path its symlinks resolve to). A root-owned directory with the
sticky bit (``/tmp``, ``/dev/shm``) may be world-writable: nobody else can replace root's entries
in it. Not root: nothing is checked (the file cannot do more than its reader can).

Only ``os.stat`` and ``pwd``: no kernel interface (house rule 1 concerns /proc, /sys, sockets).
"""

from __future__ import annotations

import os
import pwd
import stat as stat_mod
from collections.abc import Callable
from pathlib import Path

from polltuned.errors import PermissionNeeded

Stat = Callable[[str], os.stat_result]


class UntrustedFile(PermissionNeeded):
    """A file root would act on can be changed by someone else (exit 5)."""

    code = "untrusted-file"


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _chain(path: Path) -> list[Path]:
    """The path as given (absolute) and as resolved, each with every directory up to ``/``; the
    file itself first, no duplicates."""
    out: list[Path] = []
    given = Path(os.path.abspath(path))
    try:
        resolved = given.resolve(strict=True)
    except (OSError, RuntimeError):
        resolved = given
    for p in (given, resolved):
        for q in (p, *p.parents):
            if q not in out:
                out.append(q)
    return out


def untrusted_reason(path: Path | str, *, euid: int | None = None, stat: Stat = os.stat) -> str | None:
    """Why root must not act on ``path`` (one line: file, owner, mode), or None when it may (or
    when not running as root)."""
    if (os.geteuid() if euid is None else euid) != 0:
        return None
    p = Path(path)
    for q in _chain(p):
        try:
            st = stat(str(q))
        except OSError:
            continue  # a missing file is reported by its reader; a dangling link's target is checked below
        mode = stat_mod.S_IMODE(st.st_mode)
        is_dir = stat_mod.S_ISDIR(st.st_mode)
        what = "" if q == Path(os.path.abspath(p)) else (" (directory)" if is_dir else " (via a symlink)")
        if st.st_uid != 0:
            return f"{q}{what}: owned by {_owner(st.st_uid)}, mode {mode:04o}: not owned by root"
        if mode & 0o022 and not (is_dir and mode & stat_mod.S_ISVTX):
            return (f"{q}{what}: owned by {_owner(st.st_uid)}, mode {mode:04o}: writable by "
                    f"{'group and other' if mode & 0o022 == 0o022 else 'group' if mode & 0o020 else 'other'}")
    return None


def require_trusted(path: Path | str, what: str, *, euid: int | None = None, stat: Stat = os.stat) -> None:
    """Raise UntrustedFile (exit 5) when root must not act on ``path`` (a ``what``: policy, config,
    include, scenario)."""
    why = untrusted_reason(path, euid=euid, stat=stat)
    if why is not None:
        raise UntrustedFile(f"{path}: refusing the {what} file as root: {why}",
                            hint="root runs what this file names: make it and every directory above it owned by "
                                 "root and not group/other-writable (chown root:root FILE; chmod go-w FILE)")

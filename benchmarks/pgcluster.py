#!/usr/bin/env python3
"""A private, throw-away PostgreSQL cluster for the tests and the fleet benchmark.

``initdb`` + ``pg_ctl`` from Debian's postgresql package (/usr/lib/postgresql/*/bin) in a fresh
temporary directory, run as the ``postgres`` system user when started as root (initdb refuses
root), trust authentication, listening only on a Unix socket inside that directory (no TCP port
at all), stopped and deleted by ``stop()``. Never the system cluster.

    with PrivateCluster.start() as pg:      # raises ClusterUnavailable with the reason
        dsn = pg.dsn                        # "host=/tmp/ptpg-xxxx/sock dbname=polltuned user=polltuned"

``python benchmarks/pgcluster.py`` starts one, prints its DSN and stops it (a smoke test).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType


class ClusterUnavailable(RuntimeError):
    """PostgreSQL cannot be started here (the reason is the message)."""


def find_bindir() -> Path:
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]) if
                  d.split("/")[-2].isdigit() else 0)
    for d in reversed(dirs):
        if os.access(os.path.join(d, "initdb"), os.X_OK) and os.access(os.path.join(d, "pg_ctl"), os.X_OK):
            return Path(d)
    raise ClusterUnavailable("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb): "
                             "apt-get install postgresql")


class PrivateCluster:
    def __init__(self, base: Path, bindir: Path, user: str | None) -> None:
        self.base = base
        self.bindir = bindir
        self.user = user
        self.data = base / "data"
        self.sock = base / "sock"
        self.dsn = f"host={self.sock} dbname=polltuned user=polltuned"
        self.running = False

    def _run(self, argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        cmd = (["runuser", "-u", self.user, "--"] if self.user else []) + argv
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)

    @classmethod
    def start(cls, *, max_connections: int = 100, fsync: bool = True) -> PrivateCluster:
        bindir = find_bindir()
        user: str | None = None
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise ClusterUnavailable("running as root and there is no 'postgres' user to run initdb as") from None
            user = pw.pw_name
        base = Path(tempfile.mkdtemp(prefix="ptpg-"))
        pg = cls(base, bindir, user)
        try:
            pg.sock.mkdir()
            if user is not None:
                pw = pwd.getpwnam(user)
                for p in (base, pg.sock):
                    os.chown(p, pw.pw_uid, pw.pw_gid)
            r = pg._run([str(bindir / "initdb"), "-D", str(pg.data), "-U", "polltuned", "--auth=trust",
                         "-E", "UTF8", "--no-sync", "--no-instructions"])
            if r.returncode != 0:
                raise ClusterUnavailable("initdb failed: " + (r.stderr.strip().splitlines() or ["?"])[-1])
            opts = (f"-c listen_addresses='' -c unix_socket_directories='{pg.sock}' "
                    f"-c max_connections={max_connections} -c fsync={'on' if fsync else 'off'} "
                    "-c shared_buffers=32MB")
            r = pg._run([str(bindir / "pg_ctl"), "-D", str(pg.data), "-o", opts, "-l", str(base / "log"),
                         "-w", "-t", "60", "start"])
            if r.returncode != 0:
                log = (base / "log").read_text(errors="replace") if (base / "log").exists() else ""
                raise ClusterUnavailable("pg_ctl start failed: " + (log.strip().splitlines() or [r.stderr])[-1])
            pg.running = True
            r = pg._run([str(bindir / "createdb"), "-h", str(pg.sock), "-U", "polltuned", "polltuned"])
            if r.returncode != 0:
                raise ClusterUnavailable("createdb failed: " + r.stderr.strip())
        except (OSError, subprocess.SubprocessError, ClusterUnavailable) as e:
            pg.stop()
            if isinstance(e, ClusterUnavailable):
                raise
            raise ClusterUnavailable(f"{type(e).__name__}: {e}") from None
        return pg

    def stop(self) -> None:
        if self.running:
            self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])
            self.running = False
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PrivateCluster:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


if __name__ == "__main__":
    with PrivateCluster.start() as c:
        print(c.dsn)

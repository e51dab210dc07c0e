"""One owner of the host at a time (issue 16): ``apply`` and ``rollback`` while a daemon runs are
refused (exit 6, naming the daemon's pid) unless ``--force``, which asks the daemon to hand over:
SIGUSR1 makes it end its round safely, roll back every knob (whatever the policy's on_exit says)
and exit; the command waits (bounded) until the instance lock is free, then proceeds."""

from __future__ import annotations

import argparse
import os
import signal
import time

from polltuned.daemon.status import daemon_running, holder_pid
from polltuned.errors import LockedError, PermissionNeeded

#: the signal that asks a running daemon to stop its round, roll back and hand over the host
HANDOVER_SIGNAL = signal.SIGUSR1
HANDOVER_TIMEOUT_S = 120.0


def add_force(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true",
                   help="with a daemon running: ask it to stop its round, roll back and hand over the host "
                        f"(signal {HANDOVER_SIGNAL.name}), wait for it to exit, then go on")


def claim_host(args: argparse.Namespace, what: str) -> None:
    """Refuse ``what`` (apply/rollback) while a daemon holds the run directory's instance lock,
    or, with ``--force``, take the host over from it."""
    try:
        if not daemon_running(args.run_dir):
            return
    except PermissionNeeded:
        return  # not root: this user cannot change knobs either; the command says what it cannot do

    pid = holder_pid(args.run_dir)
    if not getattr(args, "force", False):
        raise LockedError(f"{what} refused: the polltuned daemon (pid {pid or '?'}) owns the host "
                          f"(lock {args.run_dir}/polltuned.lock); its measurements would be corrupted",
                          hint="stop it (systemctl stop polltuned), or add --force: the daemon rolls back "
                               "and hands over")
    if pid is None or pid == os.getpid():
        raise LockedError(f"{what} --force: cannot tell which process holds {args.run_dir}/polltuned.lock")
    try:
        os.kill(pid, HANDOVER_SIGNAL)
    except ProcessLookupError:
        pass  # exited meanwhile
    except PermissionError:
        raise LockedError(f"{what} --force: not allowed to signal the daemon (pid {pid})",
                          hint="run as root") from None
    end = time.monotonic() + HANDOVER_TIMEOUT_S
    while daemon_running(args.run_dir):
        if time.monotonic() > end:
            raise LockedError(f"{what} --force: the daemon (pid {pid}) did not hand over within "
                              f"{HANDOVER_TIMEOUT_S:.0f} s", hint="stop it: systemctl stop polltuned")
        time.sleep(0.1)

"""Ctrl-C and SIGTERM during a bench: both unwind as a KeyboardInterrupt so every ``finally``
restores the host; a checkpoint at each window catches a signal whose first raise was swallowed."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from types import FrameType


class BenchInterrupted(KeyboardInterrupt):
    """SIGTERM during a bench: unwinds like Ctrl-C so every finally block restores the host."""


_interrupted: list[int] = []  # signals received inside signals_raise(), cleared when it exits


def raise_if_interrupted() -> None:
    """A checkpoint on the forward path (each window's apply and measure; never the undo path).

    A signal handler's exception is *swallowed* by the interpreter when the signal lands while an
    at-fork callback runs (logging's ``_releaseLock`` after every subprocess or pyroute2 fork prints
    "Exception ignored" and carries on): without this checkpoint such a Ctrl-C or SIGTERM was lost
    and the bench ran to the end."""
    if _interrupted:
        raise BenchInterrupted(f"signal {_interrupted[0]}")


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise BenchInterrupted (a KeyboardInterrupt) in this process only.

    pyroute2 opens sockets inside a named netns from a forked child and stops that child with
    SIGTERM (and Ctrl-C reaches the whole process group); the child inherits this handler. Raising
    there would unwind the *parent's* copied stack in the child (running its finally/undo code
    against the real host), so a child exits at once. The signal is also remembered, so that
    :func:`raise_if_interrupted` raises it at the next window if the first raise was swallowed."""
    owner = os.getpid()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner:
            os._exit(0)
        _interrupted.append(signum)
        raise BenchInterrupted(f"signal {signum}")

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        _interrupted.clear()

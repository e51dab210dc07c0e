"""systemd integration: sd_notify and structured journal logging (systemd-python).

Under systemd (NOTIFY_SOCKET / JOURNAL_STREAM set) messages go to the notify socket and the
journal with structured fields; otherwise notify is a no-op and logs go to stderr.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping


def _monotonic_usec() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class Notifier:
    """Sends sd_notify(3) messages when NOTIFY_SOCKET is set (systemd-python's implementation).

    ``systemd.daemon.notify`` passes the string through unchanged (several ``KEY=VALUE`` lines in
    one datagram are fine); it adds nothing itself, so MONOTONIC_USEC= is ours to send."""

    def __init__(self, environ: Mapping[str, str] | None = None,
                 monotonic_usec: Callable[[], int] = _monotonic_usec) -> None:
        env = os.environ if environ is None else environ
        self.enabled = bool(env.get("NOTIFY_SOCKET"))
        self.monotonic_usec = monotonic_usec
        self.sent: deque[str] = deque(maxlen=256)  # the latest messages (tests; bounded for a daemon)

    def _send(self, message: str) -> None:
        self.sent.append(message)
        if not self.enabled:
            return
        from systemd import daemon

        daemon.notify(message)

    def ready(self, status: str) -> None:
        self._send(f"READY=1\nSTATUS={status}")

    def status(self, status: str) -> None:
        self._send(f"STATUS={status}")

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def reloading(self, status: str = "reloading") -> None:
        """Start of a reload. systemd >= 253 (Type=notify-reload) only accepts RELOADING=1 carrying
        the CLOCK_MONOTONIC time it was sent at, to tell it from an older cycle; READY=1 must follow."""
        self._send(f"RELOADING=1\nMONOTONIC_USEC={self.monotonic_usec()}\nSTATUS={status}")

    def stopping(self, status: str) -> None:
        self._send(f"STOPPING=1\nSTATUS={status}")


class _FieldsFilter(logging.Filter):
    """Maps `extra={"knob": .., "trial": .., "phase": .., "policy": ..}` to journal fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name in ("knob", "trial", "phase", "policy"):
            val = getattr(record, name, None)
            if val is not None:
                setattr(record, name.upper(), str(val))
        return True


def setup_logging(level: str = "info", *, environ: Mapping[str, str] | None = None) -> None:
    """Journal handler with structured fields under systemd, plain stderr otherwise."""
    env = os.environ if environ is None else environ
    root = logging.getLogger("polltuned")
    root.handlers.clear()
    root.setLevel(level.upper())
    root.propagate = False
    handler: logging.Handler
    if env.get("JOURNAL_STREAM") or env.get("INVOCATION_ID"):
        try:
            from systemd.journal import JournalHandler

            handler = JournalHandler(SYSLOG_IDENTIFIER="polltuned")
            handler.addFilter(_FieldsFilter())
        except ImportError:  # pragma: no cover - systemd-python is a dependency
            handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("polltuned: %(levelname)s: %(message)s"))
    root.addHandler(handler)

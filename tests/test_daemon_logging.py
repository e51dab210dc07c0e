"""Journal fields: KNOB=, TRIAL=, PHASE=, POLICY= from logging extras; stderr when not under systemd."""

from __future__ import annotations

import logging

from polltuned.host.systemd import Notifier, _FieldsFilter, setup_logging


def test_extras_become_uppercase_journal_fields() -> None:
    rec = logging.LogRecord("polltuned.actuator", logging.INFO, __file__, 1, "x", None, None)
    rec.knob = "net.core.busy_poll"
    rec.trial = 3
    rec.phase = "APPLY"
    assert _FieldsFilter().filter(rec)
    assert rec.KNOB == "net.core.busy_poll" and rec.TRIAL == "3" and rec.PHASE == "APPLY"
    assert not hasattr(rec, "POLICY")


def test_plain_stderr_outside_systemd_and_journal_handler_inside() -> None:
    setup_logging("info", environ={})
    handlers = logging.getLogger("polltuned").handlers
    assert len(handlers) == 1 and type(handlers[0]) is logging.StreamHandler
    setup_logging("debug", environ={"JOURNAL_STREAM": "8:1234"})
    h = logging.getLogger("polltuned").handlers[0]
    assert type(h).__name__ == "JournalHandler"
    assert any(isinstance(f, _FieldsFilter) for f in h.filters)
    setup_logging("info", environ={})


def test_notifier_is_silent_without_notify_socket() -> None:
    n = Notifier(environ={})
    n.ready("x")
    n.watchdog()
    assert not n.enabled and list(n.sent) == ["READY=1\nSTATUS=x", "WATCHDOG=1"]

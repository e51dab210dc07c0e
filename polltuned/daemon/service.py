"""The foreground service loop behind `polltuned run` (systemd ExecStart, Type=notify).

Signals only set flags; the loop acts on them between controller steps:
  SIGTERM/SIGINT: end the current trial safely, then the policy's on_exit (restore | keep), exit 0.
  SIGUSR1 (``apply/rollback --force``, polltuned.cli._owner): hand over the host: end the current
  trial safely, roll back every knob whatever on_exit says, exit 0.
  SIGHUP: in any phase, reload config + policy and re-tune with it (the controller ends the current
  round safely first); an invalid one is refused with one log line and STATUS=, and the old policy
  keeps running. A reload never ends the daemon.
sd_notify: READY=1 once recovery is done, STATUS= on every phase change, WATCHDOG=1 every step.
A reload is announced with RELOADING=1 + MONOTONIC_USEC= (what Type=notify-reload, systemd >= 253,
requires) and always answered with READY=1, whether the new policy was taken or refused.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, Protocol

from polltuned.clock import Clock
from polltuned.daemon.controller import HOLD, RECOVER, Controller
from polltuned.daemon.status import InstanceLock, write_status
from polltuned.errors import PolltunedError
from polltuned.host.systemd import Notifier
from polltuned.policy.schema import Policy

log = logging.getLogger("polltuned.daemon")


class MetricsSink(Protocol):
    """polltuned.daemon.metrics.MetricsExporter: listener opened at start, fed every status, closed at exit."""

    def start(self) -> None: ...
    def publish(self, doc: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


@dataclass
class _Flags:
    stop: bool = False
    reload: bool = False
    handover: bool = False


class Service:
    def __init__(
        self,
        *,
        controller: Controller,
        notifier: Notifier,
        run_dir: str,
        clock: Clock,
        build_status: Callable[[Controller], dict[str, Any]],
        reload_policy: Callable[[], Policy],
        status_interval_s: float = 5.0,
        metrics: MetricsSink | None = None,
        hold_status_interval_s: float | None = None,
    ) -> None:
        self.controller = controller
        self.notifier = notifier
        self.run_dir = run_dir
        self.clock = clock
        self.build_status = build_status
        self.reload_policy = reload_policy
        self.status_interval_s = status_interval_s
        #: the periodic refresh while holding (None: status_interval_s); a change (phase or
        #: message: every HOLD window's result) is published at once in any phase
        self.hold_status_interval_s = status_interval_s if hold_status_interval_s is None else hold_status_interval_s
        self.metrics = metrics
        self.flags = _Flags()
        self.lock = InstanceLock(run_dir)
        self.ready = False  # READY=1 sent (start-up finished)
        self._pid = os.getpid()

    def _foreign(self, signum: int) -> bool:
        """A forked child (pyroute2 forks one to open netlink sockets inside a named netns and stops it
        with SIGTERM) inherits these handlers: there the signal must keep its default action."""
        if os.getpid() == self._pid:
            return False
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return True

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        if not self._foreign(signum):
            self.flags.stop = True

    def _on_handover(self, signum: int, frame: FrameType | None) -> None:
        if not self._foreign(signum):
            self.flags.handover = True
            self.flags.stop = True

    def _on_hup(self, signum: int, frame: FrameType | None) -> None:
        if not self._foreign(signum):
            self.flags.reload = True

    def _publish(self) -> None:
        doc = self.build_status(self.controller)
        doc["pid"] = os.getpid()
        doc["updated"] = self.clock.wall()
        try:
            write_status(self.run_dir, doc)
        except OSError as e:
            log.warning("cannot write status file in %s: %s", self.run_dir, e.strerror)
        if self.metrics is not None:
            self.metrics.publish(doc)

    def _short(self) -> str:
        c = self.controller
        s = f"{c.phase}"
        if c.trial is not None:
            s += f" trial {c.trial}"
        if c.message:
            s += f": {c.message}"
        return s[:200]

    def run(self) -> int:
        self.lock.acquire()
        if self.metrics is not None:
            self.metrics.start()
        old = {
            signal.SIGTERM: signal.signal(signal.SIGTERM, self._on_stop),
            signal.SIGINT: signal.signal(signal.SIGINT, self._on_stop),
            signal.SIGHUP: signal.signal(signal.SIGHUP, self._on_hup),
            signal.SIGUSR1: signal.signal(signal.SIGUSR1, self._on_handover),
        }
        last_phase = ""
        last_message = ""
        last_publish = -1e18
        last_ping = -1e18
        try:
            for phase in self.controller.steps():
                if self.flags.stop and not self.controller.stopping:
                    log.info("%s: finishing the current step safely", "hand-over requested (apply/rollback --force)"
                             if self.flags.handover else "stop requested")
                    self.notifier.stopping("finishing the current trial, then exiting")
                    self.controller.request_stop()
                if self.flags.reload:
                    self.flags.reload = False
                    self._reload()
                if not self.ready and (phase != RECOVER or self.controller.recovery):
                    self.ready = True
                    self.notifier.ready(self._short())
                now = self.clock.monotonic()
                if now - last_ping >= 1.0:  # WatchdogSec is minutes; one ping a second is plenty
                    self.notifier.watchdog()
                    last_ping = now
                message = self.controller.message
                changed = phase != last_phase or message != last_message
                every = self.hold_status_interval_s if phase == HOLD else self.status_interval_s
                if (changed and now - last_publish >= 0.2) or now - last_publish >= every:
                    self._publish()
                    self.notifier.status(self._short())
                    last_phase, last_message, last_publish = phase, message, now
            if self.flags.handover:
                self._hand_over()
            self._publish()
            return 0
        except PolltunedError:
            self._publish()
            raise
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            if self.metrics is not None:
                self.metrics.close()
            self.lock.release()

    def _hand_over(self) -> None:
        """Another command takes the host (``--force``): whatever on_exit says, nothing of the
        daemon's stays behind; that command proceeds once the instance lock is free."""
        act = getattr(self.controller, "actuator", None)
        if act is None:
            return
        try:
            if act.is_dirty():
                act.rollback()
                log.info("handed over: every knob rolled back")
        except PolltunedError as e:
            log.error("hand-over rollback failed: %s", e.message)

    def _reload(self) -> None:
        if self.controller.stopping:
            log.info("reload ignored: stopping")
            return
        # before start-up finished systemd is not waiting for a reload: the new policy is simply
        # used from the first round on, and READY=1 comes when recovery is done
        announce = self.ready
        if announce:
            self.notifier.reloading("reloading the configuration and policy")
        status = ""
        try:
            try:
                policy = self.reload_policy()
            except Exception as e:  # whatever goes wrong, a reload must not end the daemon
                msg = e.message if isinstance(e, PolltunedError) else f"{type(e).__name__}: {e}"
                msg = msg.replace("\n", "; ")
                log.error("reload refused, keeping policy %r: %s", self.controller.policy.name, msg)
                self.controller.reload_refused(msg)
                status = f"reload refused: {msg[:150]}"
                return
            log.info("reloaded policy %r; re-tuning (the current round ends safely first)", policy.name)
            self.controller.request_reload(policy)
            status = f"reloaded policy {policy.name}: re-tuning"
        finally:
            if announce:
                self.notifier.ready(status or self._short())
            elif status:
                self.notifier.status(status)

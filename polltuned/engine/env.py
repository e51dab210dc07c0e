"""The boundary between the tuning engine and the world it tunes.

The engine only ever talks to a :class:`TrialEnv`. Implementations:
  * :class:`HostEnv` (here): the live host, the simulated world on a fake tree (``polltuned sim``)
    and the embedded world of ``polltuned bench`` — knobs through the Actuator (journal first,
    verify, transactional), latency from a Probe, CPU from the one CPU account
    (polltuned.metrics.cpu_scope, idle polling included) when the probe does not report it;
  * ``polltuned.worlds.env.ScenarioEnv``: an in-process world for the tuner-quality benchmark.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from polltuned.clock import Clock
from polltuned.errors import PolltunedError
from polltuned.knobs.keys import Effect
from polltuned.policy.schema import Policy
from polltuned.probes.base import Probe
from polltuned.records import Config, KnobValue, Window

log = logging.getLogger("polltuned.engine")


class TrialEnv(Protocol):
    def current(self) -> dict[str, KnobValue]:
        """Live values of every knob in the search space (the baseline when tuning starts)."""
        ...

    def apply(self, config: Config) -> None:
        """Apply a whole assignment as one transaction (journal first, verify, undo on failure).
        Raises PolltunedError when it could not be applied; the host is then unchanged."""
        ...

    def measure(self, window_index: int) -> Window:
        """Settle, restart the probe (fresh sockets) and measure one window under the applied config."""
        ...

    def describe(self) -> Mapping[str, object]:
        """Facts for reports: host, nic, probe, workload."""
        ...


class CpuReadingLike(Protocol):
    @property
    def cores(self) -> float: ...
    @property
    def idle_poll_cores(self) -> float | None: ...


class CpuScopeLike(Protocol):
    """``polltuned.metrics.cpu_scope.CpuScope`` as seen from here."""

    def begin(self) -> None: ...
    def end(self) -> CpuReadingLike: ...
    def describe(self) -> str: ...


class ContextMeterLike(Protocol):
    """``polltuned.metrics.context.ContextMeter`` as seen from here: ``begin()`` right before the
    probe's window, ``end(window)`` returns the window with its ``context`` filled."""

    def begin(self) -> None: ...
    def end(self, w: Window) -> Window: ...


class ActuatorLike(Protocol):
    def read(self, keys: Sequence[str]) -> Mapping[str, Any]: ...
    def apply(self, assignment: Config, *, reason: str = "") -> Any: ...


def _value(v: Any) -> KnobValue:
    """Actuator.read returns KnobValue (or a record carrying .value); normalise to a plain value."""
    if isinstance(v, (int, float, str)):
        return v
    inner = getattr(v, "value", v)
    if isinstance(inner, (int, float, str)):
        return inner
    return str(inner)


class HostEnv:
    def __init__(self, policy: Policy, actuator: ActuatorLike, probe: Probe, *, clock: Clock,
                 cpu_scope: CpuScopeLike | None = None, context: ContextMeterLike | None = None) -> None:
        self.policy = policy
        self.actuator = actuator
        self.probe = probe
        self.clock = clock
        #: where the objective's CPU comes from when the probe does not report it: the one CPU
        #: account (polltuned.metrics.cpu_scope: the service's cgroup, the NIC-queue + app CPUs, or
        #: the whole host as a stated fallback; idle polling included). None: only the probe's own
        #: CPU (the simulated world reports it)
        self.cpu_scope = cpu_scope
        self._affinity_pending: dict[str, KnobValue] = {}
        #: the measured knobs as polltuned's last apply left them (the outside-write check)
        self._written: dict[str, object] | None = None
        #: fills Window.context (the load the window saw, polltuned.metrics.context); None: no context
        self.context = context

    def current(self) -> dict[str, KnobValue]:
        keys = list(self.policy.knobs)
        got = self.actuator.read(keys)
        return {k: _value(got[k]) for k in keys if k in got}

    def apply(self, config: Config) -> None:
        self.actuator.apply(config, reason="trial")
        self._written = self._measured_values()
        keys = self.policy.knob_keys
        self._affinity_pending = {k: v for k, v in config.items()
                                  if k in keys and keys[k].effect is Effect.AFTER_AFFINITY}

    def _settle_affinity(self) -> None:
        """IRQ affinity acts once ``effective_affinity`` has caught up (at the IRQ's next
        interrupt): before a window, wait (bounded: 20 x 50 ms) until no IRQ of an affinity knob
        just written reports a pending move, so the window measures the new placement."""
        keys, self._affinity_pending = self._affinity_pending, {}
        knob_of = getattr(self.actuator, "knob", None)
        if not keys or knob_of is None:
            return
        for _ in range(20):
            pending = False
            for key, value in keys.items():
                try:
                    k = knob_of(key)
                    k.verify(value)
                except PolltunedError:
                    continue
                pending = pending or bool(getattr(k, "pending", []))
            if not pending:
                return
            self.clock.sleep(0.05)

    def measure(self, window_index: int) -> Window:
        """One window, discarded (failed) when a knob it measures was changed from outside
        polltuned since the last apply or during the window (issue 16: an ``apply``/``sysctl -w``
        while the daemon measures must not corrupt the experiment). The check is two reads of the
        policy's knobs, in every phase that measures through this env."""
        start = self._measured_values()
        w = self._measure_window(window_index)
        return self._outside_write(w, self._written if self._written is not None else start, start)

    def _measured_values(self) -> dict[str, object] | None:
        try:
            return dict(self.actuator.read(list(self.policy.knobs)))
        except PolltunedError:
            return None  # a knob that cannot be read: the window itself reports what is wrong

    def _outside_write(self, w: Window, before: dict[str, object] | None,
                       start: dict[str, object] | None) -> Window:
        after = self._measured_values()
        if before is None or after is None:
            return w
        changed = [k for k in before if (k in after and after[k] != before[k])
                   or (start is not None and k in start and start[k] != before[k])]
        if not changed:
            return w
        # only the window the change fell in is discarded: later ones measure the host as it now is
        # (HOLD's watcher releases or re-applies the knob)
        self._written = after
        what = ", ".join(f"{k} {before[k]!r} -> {after.get(k)!r}" for k in changed)
        log.warning("window discarded: changed outside polltuned while measuring: %s", what)
        return Window.failed(f"changed outside polltuned while measuring ({what}): window discarded",
                             w.duration_s)

    def _measure_window(self, window_index: int) -> Window:
        self.clock.sleep(self.policy.tuning.settle_s)
        self._settle_affinity()
        self.probe.restart()
        if self.cpu_scope is None:
            w = self._probe_window(window_index)
        else:
            w = self._measure_scoped(window_index, self.cpu_scope)
        if self.context is not None and w.ok:
            w = self.context.end(w)
        return w

    def _probe_window(self, window_index: int) -> Window:
        if self.context is not None:
            self.context.begin()
        return self.probe.measure(self.policy.tuning.window_s, window_index)

    def _measure_scoped(self, window_index: int, scope: CpuScopeLike) -> Window:
        try:
            scope.begin()
        except PolltunedError as e:
            return Window.failed(e.message)
        w = self._probe_window(window_index)
        if w.ok and w.cpu_cores is None:
            try:
                r = scope.end()
            except PolltunedError as e:
                return Window.failed(e.message, w.duration_s)
            extra = dict(w.extra)
            if r.idle_poll_cores is not None:
                extra["idle_poll_cores"] = r.idle_poll_cores
            # keeps everything else the probe gave (histogram, context)
            w = replace(w, cpu_cores=r.cores, extra=extra)
        return w

    def describe(self) -> Mapping[str, object]:
        return {"probe": getattr(self.probe, "name", "?"), "policy": self.policy.name,
                "cpu_scope": self.cpu_scope.describe() if self.cpu_scope is not None else None}

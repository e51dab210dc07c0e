"""BenchEnv: the bench's TrialEnv wrapper (adds other processes' CPU and steal to every window,
logs every window with its phase and configuration, writes ``--record`` lines). The window's own
CPU, idle polling included, comes from the inner HostEnv's CPU scope (polltuned.metrics.cpu_scope),
the daemon's account."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import IO

from polltuned.bench.cpu import foreign_cores, read_steal_ticks
from polltuned.bench.signals import raise_if_interrupted
from polltuned.clock import Clock
from polltuned.counters.stat import USER_HZ
from polltuned.engine.env import TrialEnv
from polltuned.host.fs import Host
from polltuned.records import Config, KnobValue, Window


@dataclass
class WindowLog:
    """Every window measured in this run: (phase, config, window)."""

    entries: list[tuple[str, dict[str, KnobValue], Window]] = field(default_factory=list)


class BenchEnv:
    """A TrialEnv wrapper: adds idle-poll CPU, logs every window, and writes ``--record`` lines."""

    def __init__(self, inner: TrialEnv, *, host: Host, clock: Clock, workload: str,
                 record: IO[str] | None = None, log_: WindowLog | None = None,
                 foreign: Callable[[], Mapping[int, float]] | None = None) -> None:
        self.inner = inner
        self.host = host
        self.clock = clock
        self.workload = workload
        self.record = record
        self.windows = log_ or WindowLog()
        self.phase = "tune"
        self._config: dict[str, KnobValue] = {}
        self._foreign = foreign

    def current(self) -> dict[str, KnobValue]:
        cur = self.inner.current()
        if not self._config:
            self._config = dict(cur)
        return cur

    def apply(self, config: Config) -> None:
        raise_if_interrupted()
        self.inner.apply(config)
        self._config = {**self._config, **dict(config)}

    def describe(self) -> Mapping[str, object]:
        return self.inner.describe()

    def measure(self, window_index: int) -> Window:
        raise_if_interrupted()
        s0 = read_steal_ticks(self.host)
        f0 = self._foreign() if self._foreign is not None else None
        t0 = self.clock.monotonic()
        w = self.inner.measure(window_index)
        elapsed = self.clock.monotonic() - t0
        s1 = read_steal_ticks(self.host)
        f1 = self._foreign() if self._foreign is not None else None
        if w.ok and elapsed > 0:
            extra = dict(w.extra)  # idle_poll_cores: from the CPU scope (already part of cpu_cores)
            if f0 is not None and f1 is not None:
                extra["foreign_cores"] = foreign_cores(f0, f1, elapsed)
            if s0 is not None and s1 is not None:
                extra["steal_cores"] = max(0, s1 - s0) / USER_HZ / elapsed
            w = replace(w, extra=extra)
        cfg = dict(self._config)
        self.windows.entries.append((self.phase, cfg, w))
        if self.record is not None:
            self.record.write(json.dumps({"v": 1, "workload": self.workload, "config": cfg,
                                          "window": w.to_json(), "phase": self.phase},
                                         sort_keys=True, default=str) + "\n")
            self.record.flush()
        return w

"""Injected time. Product code never calls time.time()/sleep() directly."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def wall(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """A clock for tests: sleep() advances time instantly."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if seconds > 0:
            self._now += seconds

    def advance(self, seconds: float) -> None:
        self._now += seconds


class ScaledClock:
    """Simulated time for ``polltuned run --simulate``: ``sleep(s)`` advances ``monotonic()`` by ``s``
    at once and waits ``s / speed`` real seconds (``speed`` 0 or infinite: no wait at all), so a
    simulated daemon runs its windows ``speed`` times faster than real time. ``wall()`` stays the
    real wall clock (status timestamps, journal records)."""

    def __init__(self, speed: float, start: float | None = None) -> None:
        self.speed = speed
        self._now = time.monotonic() if start is None else start

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        self._now += seconds
        if 0 < self.speed < float("inf"):
            time.sleep(seconds / self.speed)

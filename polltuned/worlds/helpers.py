"""Helpers for scenario authors (the contract is in :mod:`polltuned.worlds.scenario`, which hands
these on): a knob's value whatever the device is called, and window noise. A leaf: the scenario
loader and the random family (:mod:`polltuned.worlds.family`) both build on it."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from polltuned.records import KnobValue


def knob(config: Mapping[str, KnobValue], name: str, default: float = 0.0) -> float:
    """Numeric value of a knob by full key or by its suffix after ``DEV:`` (device-independent)."""
    if name in config:
        v = config[name]
    else:
        for k, val in config.items():
            if k.endswith(":" + name):
                v = val
                break
        else:
            return default
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def noisy(rng: np.random.Generator, value: float, cv: float, outlier_p: float = 0.05,
          outlier_x: float = 1.35) -> float:
    """Lognormal window noise with occasional outlier windows (heavy tail, as measured in vm-bench §7)."""
    v = value * math.exp(rng.normal(0.0, cv))
    if rng.random() < outlier_p:
        v *= outlier_x
    return v

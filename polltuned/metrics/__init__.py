"""Metrics: rates between two counter Snapshots (see polltuned.metrics.window)."""

from polltuned.metrics.window import CpuRates, MetricUnavailable, NicRates, Rates, SystemRates, rates

__all__ = ["CpuRates", "MetricUnavailable", "NicRates", "Rates", "SystemRates", "rates"]

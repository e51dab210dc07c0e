"""polltuned: measured, reversible tuning of Linux host network polling knobs."""

__version__ = "0.1.0"

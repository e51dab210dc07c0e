"""Knobs: one module per kernel interface, plus the explicit registry (:mod:`.registry`)."""

"""The names of the optimisers a policy may ask for (``tuning.optimiser``); a leaf: it imports nothing.

The policy schema validates against them; :data:`polltuned.optimiser.OPTIMISERS` maps each to its
factory, in this order (tests/test_import_graph.py holds the two equal).
"""

from __future__ import annotations

OPTIMISER_NAMES: tuple[str, ...] = ("skopt", "random", "grid", "skopt-worker")

"""The names of the optimisers (a leaf module: it imports nothing).

The policy schema validates ``tuning.optimiser`` against these without importing the optimisers;
:data:`polltuned.optimiser.OPTIMISERS` maps each to its factory, in this order.
"""

from __future__ import annotations

OPTIMISER_NAMES: tuple[str, ...] = ("skopt", "random", "grid")

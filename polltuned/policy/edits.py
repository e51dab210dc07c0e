"""Pure edits of a validated policy (each returns a new Policy; the input is never changed)."""

from __future__ import annotations

from polltuned.policy.schema import Policy


def strip_seeds(policy: Policy) -> Policy:
    """``policy`` with every knob's ``seeds`` removed: the engine must find the good values by itself
    (``polltuned bench --no-seeds``, ``benchmarks/tuner_quality.py --no-seeds``)."""
    return policy.model_copy(update={"knobs": {k: v.model_copy(update={"seeds": []})
                                               for k, v in policy.knobs.items()}})

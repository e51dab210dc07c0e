"""Policy files: one per workload (TOML, validated with pydantic at the edge)."""

from polltuned.policy.loader import load_policy, policy_search_path
from polltuned.policy.schema import KnobSpec, Policy

__all__ = ["KnobSpec", "Policy", "load_policy", "policy_search_path"]

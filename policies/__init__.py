"""Policies: pure functions from (profile, topology, batch distribution) to a Plan."""

from policies.base import InstancePlan, Plan, Policy
from policies.registry import available_policies, get_policy

__all__ = ["InstancePlan", "Plan", "Policy", "available_policies", "get_policy"]

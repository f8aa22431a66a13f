"""Policies: pure functions from (profile, topology, batch distribution) to a Plan."""

from policies.base import InstancePlan, Plan, Policy, PolicySettings
from policies.registry import available_policies, get_policy, policy_from_settings

__all__ = [
    "InstancePlan",
    "Plan",
    "Policy",
    "PolicySettings",
    "available_policies",
    "get_policy",
    "policy_from_settings",
]

"""The fixed policy: a user's plan text (command line, TOML, `packrat reconfigure`) read, bounded before anything
is built from it, and served as written."""

from __future__ import annotations

import re

import pytest

from packrat_daemon.wire.errors import PolicyError
from policies.base import InstancePlan, PolicySettings
from policies.fixed import MAX_PLAN_CHARS, FixedPolicy, PlanItem, parse_items, parse_plan
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology
from policies.registry import policy_from_settings

TWO_CORES = Topology.synthetic(2)


@pytest.mark.parametrize("plan", ["1000000000*1x1", "10000000*1x1", "3*1x1", "1*3x1", "1x1,1x1,1x1"])
def test_a_plan_needing_more_cores_than_usable_is_refused_from_its_counts(plan: str) -> None:
    # Before the fix, 1000000000*1x1 built a billion instances before the core check (the OOM killer came).
    policy = policy_from_settings("fixed", PolicySettings(plan, 0.05, max_batch=16))
    with pytest.raises(PolicyError, match="only 2 are usable"):
        policy.plan(None, TWO_CORES, BatchDistribution.single(4))


def test_a_huge_count_is_refused_without_building_an_instance() -> None:
    with pytest.raises(PolicyError, match="needs 1000000000000 cores"):
        parse_plan("1000000000000*1x1", 2)


def test_a_batch_beyond_max_batch_is_refused_saying_the_limit() -> None:
    with pytest.raises(PolicyError, match="more than|at most max_batch 16"):
        policy_from_settings("fixed", PolicySettings("1x100000", 0.05, max_batch=16))
    plan = policy_from_settings("fixed", PolicySettings("2*1x16", 0.05, max_batch=16)).plan(
        None, TWO_CORES, BatchDistribution.single(16)
    )
    assert [i.batch for i in plan.instances] == [16, 16]


def test_a_plan_text_too_long_is_refused_before_it_is_read() -> None:
    text = ",".join(["1x1"] * (MAX_PLAN_CHARS // 4 + 1))
    with pytest.raises(PolicyError, match="characters long"):
        parse_plan(text, 2)
    with pytest.raises(PolicyError, match="characters long"):
        parse_plan("1" * 5000 + "x1", 2)  # not even the digits are converted (int() refuses 4300+ digits)


# -- reading a plan text ----------------------------------------------------------------------------
def test_items_are_counts_of_threads_and_batch_with_a_count_of_one_by_default() -> None:
    assert parse_items("2*1x8, 4x16") == (PlanItem(2, 1, 8), PlanItem(1, 4, 16))
    assert parse_items(" 3 * 2 x 4 ") == (PlanItem(3, 2, 4),)  # spaces around the signs are fine


@pytest.mark.parametrize("text", ["0*1x4", "0x4", "1x0"])
def test_a_zero_anywhere_is_refused(text: str) -> None:
    with pytest.raises(PolicyError, match=f"plan item '{re.escape(text)}': count, threads and batch must all be >= 1"):
        parse_items(text)


@pytest.mark.parametrize("text", ["", "2*1y4", "1x4,", "-1x4", "1.5x4", "x4", "2**1x4"])
def test_an_unreadable_item_is_named_with_the_syntax(text: str) -> None:
    with pytest.raises(PolicyError, match=r"cannot read plan item .*\[COUNT\*\]THREADSxBATCH"):
        parse_items(text)


def test_the_instances_are_the_items_expanded_in_order() -> None:
    instances = parse_plan("2*1x8,2x4", usable_cores=4)
    assert instances == (InstancePlan(1, 8), InstancePlan(1, 8), InstancePlan(2, 4))
    assert parse_plan("4*1x1", usable_cores=4) == (InstancePlan(1, 1),) * 4  # exactly the usable cores


# -- the policy -------------------------------------------------------------------------------------
def test_fixed_policy_without_plan_asks_for_one() -> None:
    for empty in (None, ""):
        with pytest.raises(PolicyError, match="needs a plan, e.g. --plan 2\\*1x8"):
            FixedPolicy(plan=empty)


def test_an_unreadable_plan_is_refused_when_it_is_given_not_when_it_is_planned() -> None:
    with pytest.raises(PolicyError, match=r"\[COUNT\*\]THREADSxBATCH"):
        FixedPolicy(plan="2*1y4")


def test_fixed_plan_needing_more_cores_than_usable_is_refused() -> None:
    policy = FixedPolicy(plan="3*2x4")
    with pytest.raises(PolicyError, match="the fixed plan '3\\*2x4' needs 6 cores but only 4 are usable"):
        policy.plan(None, Topology.synthetic(4), BatchDistribution.single(8))


def test_the_plan_is_the_users_whatever_the_batch_sizes() -> None:
    policy = FixedPolicy(plan="2*1x4")
    for distribution in (BatchDistribution.single(1), BatchDistribution.from_counts({2: 1, 32: 3})):
        plan = policy.plan(None, TWO_CORES, distribution)
        assert plan.instances == (InstancePlan(1, 4), InstancePlan(1, 4))
        assert (plan.policy, plan.reason) == ("fixed", "the user's plan 2*1x4")
        assert plan.split == "exact" and not plan.oversubscribed and not plan.alternatives
        assert plan.predicted_latency_ms is None  # no profile


def test_with_a_profile_the_prediction_is_the_slowest_instances() -> None:
    profile = Profile.from_latencies({(1, 4): 10.0, (1, 8): 18.0, (2, 4): 6.0})
    plan = FixedPolicy(plan="1x8,2x4").plan(profile, Topology.synthetic(3), BatchDistribution.single(12))
    assert plan.predicted_latency_ms == 18.0
    # One instance the profile has no row for: no prediction rather than a partial one.
    plan = FixedPolicy(plan="1x8,1x16").plan(profile, TWO_CORES, BatchDistribution.single(24))
    assert plan.predicted_latency_ms is None


def test_the_serve_options_give_the_plan_and_max_batch() -> None:
    assert FixedPolicy.from_settings(PolicySettings("2*1x4", 0.05, max_batch=8)).items == (PlanItem(2, 1, 4),)
    with pytest.raises(PolicyError, match="use a batch of at most 2"):
        FixedPolicy.from_settings(PolicySettings("2*1x4", 0.05, max_batch=2))

"""A user's plan text (command line, TOML, `packrat reconfigure`) is bounded before anything is built from it."""

from __future__ import annotations

import pytest

from packrat_daemon.wire.errors import PolicyError
from policies.base import PolicySettings
from policies.fixed import MAX_PLAN_CHARS, parse_plan
from policies.planning.distribution import BatchDistribution
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

"""Every built-in policy against the policy contract; the registry; Packrat on batch-size distributions."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from packrat_daemon.wire.errors import InfeasibleError, PolicyError
from policies.base import Policy, PolicySettings
from policies.fixed import FixedPolicy
from policies.packrat import PackratPolicy
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology
from policies.registry import ENTRY_POINT_GROUP, available_policies, get_policy, policy_from_settings
from policies.single import SinglePolicy
from policies.solver import solve
from policies.split import split_batch
from policies.testing import PolicyContract, amdahl_profile, assert_well_formed
from policies.torchserve import TorchServePolicy

BUILTIN_NAMES = {"packrat", "single", "torchserve", "fixed"}


# -- the contract, for every built-in ------------------------------------------------------------
class TestPackratPolicy(PolicyContract):
    @pytest.fixture
    def policy(self) -> Policy:
        return get_policy("packrat")


class TestSinglePolicy(PolicyContract):
    @pytest.fixture
    def policy(self) -> Policy:
        return get_policy("single")


class TestTorchServePolicy(PolicyContract):
    @pytest.fixture
    def policy(self) -> Policy:
        return get_policy("torchserve")


class TestFixedPolicy(PolicyContract):
    splits_batch = False  # the user's plan says what each instance takes

    @pytest.fixture
    def policy(self) -> Policy:
        return get_policy("fixed", plan="2*1x4")

    @pytest.fixture
    def settings(self) -> PolicySettings:
        return PolicySettings(plan="2*1x4", min_split_gain=0.3)

    @pytest.fixture
    def topology(self) -> Topology:
        return Topology.synthetic(2)


def test_registry_gives_the_builtin_classes() -> None:
    policies = available_policies()
    assert set(policies) >= BUILTIN_NAMES
    assert policies["packrat"] is PackratPolicy
    assert policies["single"] is SinglePolicy
    assert policies["torchserve"] is TorchServePolicy
    assert policies["fixed"] is FixedPolicy


# -- registry errors -----------------------------------------------------------------------------
def test_unknown_policy_error_lists_every_available_name() -> None:
    with pytest.raises(PolicyError, match="unknown policy 'fastest'") as caught:
        get_policy("fastest")
    for name in BUILTIN_NAMES:
        assert name in str(caught.value)


def test_fixed_policy_without_plan_asks_for_one() -> None:
    with pytest.raises(PolicyError, match="--plan"):
        get_policy("fixed")


def test_fixed_policy_with_unreadable_plan_shows_the_syntax() -> None:
    with pytest.raises(PolicyError, match=r"\[COUNT\*\]THREADSxBATCH"):
        get_policy("fixed", plan="2*1y4")


def test_fixed_plan_needing_more_cores_than_usable_is_refused() -> None:
    policy = get_policy("fixed", plan="3*2x4")
    with pytest.raises(PolicyError, match="needs 6 cores but only 4"):
        policy.plan(None, Topology.synthetic(4), BatchDistribution.single(8))


def test_option_a_policy_does_not_take_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="'single' does not take these options"):
        get_policy("single", plan="2*1x4")


# -- building a policy from the serve options ----------------------------------------------------
def test_each_policy_reads_the_serve_options_it_declares() -> None:
    settings = PolicySettings(plan="2*1x4", min_split_gain=0.3)
    fixed = policy_from_settings("fixed", settings)
    assert isinstance(fixed, FixedPolicy) and fixed.text == "2*1x4"
    packrat = policy_from_settings("packrat", settings)
    assert isinstance(packrat, PackratPolicy) and packrat.min_split_gain == 0.3
    assert isinstance(policy_from_settings("single", settings), SinglePolicy)  # reads none, refuses none


def test_serve_options_are_checked_by_the_policy_that_reads_them() -> None:
    with pytest.raises(PolicyError, match="--plan"):
        policy_from_settings("fixed", PolicySettings(plan=None, min_split_gain=0.05))
    with pytest.raises(PolicyError, match="min_split_gain"):
        policy_from_settings("packrat", PolicySettings(plan=None, min_split_gain=1.5))


def test_among_the_builtins_only_packrat_adapts_and_checks_its_splits() -> None:
    builtins = {name: cls for name, cls in available_policies().items() if name in BUILTIN_NAMES}
    assert {name for name, cls in builtins.items() if cls.adapts} == {"packrat"}
    assert {name for name, cls in builtins.items() if cls.checks_splits} == {"packrat"}


# -- third-party policies through the entry point -------------------------------------------------
PLUGIN_MODULE = "packrat_contract_test_plugin"

PLUGIN_SOURCE = textwrap.dedent(
    """
    from policies.base import InstancePlan, Plan, Policy


    class HalfPolicy(Policy):
        name = "half"

        def plan(self, profile, topology, distribution):
            threads = max(1, topology.usable_cores // 2)
            return Plan((InstancePlan(threads, distribution.max_batch),), self.name, "half the cores")


    class Impostor(Policy):
        name = "single"

        def plan(self, profile, topology, distribution):
            raise AssertionError("a plugin must never replace a built-in")


    class Needy(Policy):
        name = "needy"

        def __init__(self, width):
            self.width = width

        def plan(self, profile, topology, distribution):
            raise AssertionError("never built")


    NOT_A_POLICY = 42
    """
)


@pytest.fixture
def install_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Install a real distribution (a .dist-info folder on sys.path) declaring the given entry points."""

    def install(entry_points: str) -> None:
        (tmp_path / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SOURCE)
        dist_info = tmp_path / "packrat_contract_test_plugin-1.0.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: packrat-contract-test-plugin\nVersion: 1.0\n")
        (dist_info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{textwrap.dedent(entry_points)}")
        monkeypatch.syspath_prepend(str(tmp_path))

    yield install
    sys.modules.pop(PLUGIN_MODULE, None)


def test_third_party_policy_is_found_through_its_entry_point(install_plugin: Callable[[str], None]) -> None:
    assert "half" not in available_policies()
    install_plugin(f"half = {PLUGIN_MODULE}:HalfPolicy\n")
    policy = get_policy("half")
    assert type(policy).__module__ == PLUGIN_MODULE
    assert policy.name == "half"
    topology = Topology.synthetic(4)
    plan = policy.plan(None, topology, BatchDistribution.single(8))
    assert_well_formed(plan, topology)
    assert plan.thread_counts == [2]


def test_a_plugin_that_needs_arguments_but_reads_no_serve_option_says_what_to_do(
    install_plugin: Callable[[str], None],
) -> None:
    install_plugin(f"needy = {PLUGIN_MODULE}:Needy\n")
    with pytest.raises(PolicyError, match="'needy' cannot be built from the serve options.*from_settings"):
        policy_from_settings("needy", PolicySettings(plan=None, min_split_gain=0.05))


def test_unknown_name_error_lists_third_party_policies_too(install_plugin: Callable[[str], None]) -> None:
    install_plugin(f"half = {PLUGIN_MODULE}:HalfPolicy\n")
    with pytest.raises(PolicyError, match="half"):
        get_policy("fastest")


def test_third_party_policy_cannot_replace_a_builtin(install_plugin: Callable[[str], None]) -> None:
    install_plugin(f"single = {PLUGIN_MODULE}:Impostor\n")
    assert type(get_policy("single")) is SinglePolicy


def test_entry_point_that_is_not_a_policy_is_reported_when_asked_for(install_plugin: Callable[[str], None]) -> None:
    install_plugin(f"number = {PLUGIN_MODULE}:NOT_A_POLICY\n")
    assert "number" not in available_policies()
    with pytest.raises(PolicyError, match="'number'.*not a Policy subclass"):
        get_policy("number")


def test_broken_plugin_does_not_break_the_builtins(install_plugin: Callable[[str], None]) -> None:
    install_plugin("broken = packrat_no_such_module_anywhere:Policy\n")
    assert type(get_policy("packrat")) is PackratPolicy


# -- the packrat policy on a distribution of batch sizes ------------------------------------------
def expected_latency(profile: Profile, pool: list[int], distribution: BatchDistribution) -> float | None:
    total = 0.0
    for batch, weight in distribution.weights:
        try:
            latency, _ = split_batch(profile, pool, batch)
        except InfeasibleError:
            return None
        total += weight * latency
    return total


MIXED = BatchDistribution.from_counts({1: 5, 3: 1, 8: 3, 16: 2})


def test_packrat_pool_carries_every_batch_of_the_distribution() -> None:
    profile, topology = amdahl_profile(), Topology.synthetic(4)
    plan = PackratPolicy().plan(profile, topology, MIXED)
    for batch in MIXED.batches:
        _, sizes = split_batch(profile, plan.thread_counts, batch)
        assert sum(sizes) == batch


def test_packrat_pool_is_no_worse_than_any_single_batch_proposal() -> None:
    profile, topology = amdahl_profile(), Topology.synthetic(4)
    plan = PackratPolicy().plan(profile, topology, MIXED)
    # The prediction is the expected latency when every batch runs on the fastest of the plan's layouts.
    per_batch_best = sum(
        weight * min(split_batch(profile, [i.threads for i in layout], batch)[0] for layout in plan.layouts)
        for batch, weight in MIXED.weights
    )
    assert plan.predicted_latency_ms == pytest.approx(per_batch_best)
    main_only = expected_latency(profile, plan.thread_counts, MIXED)
    assert main_only is not None and plan.predicted_latency_ms <= main_only + 1e-9
    pools = {tuple(t for t, _ in solve(profile, topology.usable_cores, b).instances) for b in MIXED.batches}
    assert len(pools) > 1, "the test needs proposals that differ"
    for pool in pools:
        score = expected_latency(profile, list(pool), MIXED)
        if score is not None:
            assert plan.predicted_latency_ms <= score + 1e-9, f"pool {pool} scores {score}"


def test_packrat_never_picks_a_pool_that_cannot_carry_the_largest_batch() -> None:
    # Rows stop at batch 8: the one 4-thread instance that is best for the likely batch 1 cannot take 16.
    profile = amdahl_profile(batches=(1, 2, 4, 8))
    topology = Topology.synthetic(4)
    distribution = BatchDistribution.from_counts({1: 9, 16: 1})
    assert solve(profile, 4, 1).instances == ((4, 1),)
    plan = PackratPolicy().plan(profile, topology, distribution)
    _, sizes = split_batch(profile, plan.thread_counts, 16)
    assert sum(sizes) == 16


def test_packrat_keeps_a_spare_layout_when_batch_sizes_disagree() -> None:
    # One 2-thread instance wins for one input; two 1-thread instances win for sixteen.
    profile = Profile.from_latencies(
        {(1, 1): 100.0, (1, 8): 600.0, (2, 1): 60.0, (2, 16): 1300.0, (2, 8): 700.0, (1, 16): 1250.0}
    )
    distribution = BatchDistribution.from_counts({1: 1.0, 16: 1.0})
    plan = get_policy("packrat").plan(profile, Topology.synthetic(2), distribution)
    layouts = sorted(sorted(i.threads for i in layout) for layout in plan.layouts)
    assert layouts == [[1, 1], [2]]
    # Expected latency: each batch size on its best layout: (60 + 600) / 2.
    assert plan.predicted_latency_ms == pytest.approx(330.0)
    assert plan.to_json()["alternatives"]
    assert "1 spare layout(s) cutting 5.7%" in plan.reason  # against (100 + 600) / 2 on two 1-thread instances


def test_packrat_says_how_much_a_refused_spare_layout_would_cut() -> None:
    # The 2-thread instance is now barely faster for one input: (99 + 600) / 2 against (100 + 600) / 2.
    profile = Profile.from_latencies(
        {(1, 1): 100.0, (1, 8): 600.0, (2, 1): 99.0, (2, 16): 1300.0, (2, 8): 700.0, (1, 16): 1250.0}
    )
    plan = get_policy("packrat").plan(profile, Topology.synthetic(2), BatchDistribution.from_counts({1: 1, 16: 1}))
    assert plan.alternatives == () and plan.predicted_latency_ms == pytest.approx(350.0)
    assert "another layout would cut 0.1%, under 1%" in plan.reason


def test_packrat_keeps_one_layout_when_it_serves_every_batch_best() -> None:
    profile = Profile.from_latencies({(1, 1): 50.0, (1, 8): 300.0, (2, 1): 60.0, (2, 16): 1300.0})
    plan = get_policy("packrat").plan(profile, Topology.synthetic(2), BatchDistribution.from_counts({1: 1, 16: 1}))
    assert plan.alternatives == ()


# -- the split margin ----------------------------------------------------------------------------
def near_tie(split_ms: float, single_ms: float = 1000.0) -> Profile:
    """Two cores, batch 16: two 1-thread instances of 8 (split_ms) against one 2-thread instance."""
    return Profile.from_latencies({(1, 8): split_ms, (1, 16): 2 * split_ms, (2, 8): single_ms / 2, (2, 16): single_ms})


def test_packrat_keeps_one_instance_when_a_split_gains_less_than_the_margin() -> None:
    plan = PackratPolicy().plan(near_tie(970.0), Topology.synthetic(2), BatchDistribution.single(16))
    assert [(i.threads, i.batch) for i in plan.layouts[0]] == [(2, 16)] and not plan.alternatives
    assert plan.predicted_latency_ms == pytest.approx(1000.0)
    assert "3.0% faster" in plan.reason and "5%" in plan.reason


def test_packrat_splits_when_the_gain_clears_the_margin() -> None:
    plan = PackratPolicy().plan(near_tie(900.0), Topology.synthetic(2), BatchDistribution.single(16))
    assert sorted((i.threads, i.batch) for i in plan.instances) == [(1, 8), (1, 8)]
    assert plan.predicted_latency_ms == pytest.approx(900.0)


def test_a_zero_margin_gives_the_exact_optimum() -> None:
    plan = PackratPolicy(min_split_gain=0.0).plan(near_tie(970.0), Topology.synthetic(2), BatchDistribution.single(16))
    assert plan.thread_counts == [1, 1]


def test_the_margin_applies_to_a_distribution_and_its_spare_layouts() -> None:
    profile = Profile.from_latencies(
        {(1, 1): 100.0, (1, 8): 600.0, (2, 1): 60.0, (2, 16): 1300.0, (2, 8): 700.0, (1, 16): 1250.0}
    )
    distribution = BatchDistribution.from_counts({1: 1.0, 16: 1.0})
    # With spares the expected latency is 330 ms. The best single instance is, on this profile, a 1-thread
    # one: (100 + 1250) / 2 = 675 ms (a 2-thread one: 680 ms). A split gains 1 - 330/675 = 51%.
    assert len(PackratPolicy(min_split_gain=0.5).plan(profile, Topology.synthetic(2), distribution).layouts) == 2
    plan = PackratPolicy(min_split_gain=0.6).plan(profile, Topology.synthetic(2), distribution)
    assert plan.thread_counts == [1] and not plan.alternatives
    assert plan.predicted_latency_ms == pytest.approx(675.0)


@pytest.mark.parametrize("gain", [-0.1, 1.0, 2.0])
def test_an_impossible_margin_is_refused(gain: float) -> None:
    with pytest.raises(PolicyError, match="min_split_gain"):
        get_policy("packrat", min_split_gain=gain)


def test_a_plan_shows_a_small_models_prediction_and_says_when_there_is_none() -> None:
    from policies.base import InstancePlan, Plan

    assert "predicted 0.0312 ms" in Plan((InstancePlan(1, 1),), "single", "test", 0.03124).describe()
    shared = Plan((InstancePlan(2, 1), InstancePlan(2, 1)), "torchserve", "test", oversubscribed=True)
    assert "latency not predicted (its instances share cores)" in shared.describe()

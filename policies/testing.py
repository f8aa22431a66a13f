"""Contract tests every policy must pass, built-in or third-party (as in optuna's `testing` package).

Use it from a test module::

    from policies.testing import PolicyContract

    class TestMyPolicy(PolicyContract):
        @pytest.fixture
        def policy(self) -> Policy:
            return MyPolicy()

Override the `profile`, `topology`, `batch` or `mixed_distribution` fixtures to run the contract on
other inputs, the `settings` fixture for a policy that needs serve options (the `fixed` policy's plan),
and set ``splits_batch = False`` for a policy whose instance batches do not come from the batch being
served (the `fixed` policy's user plan).

This module imports pytest, so the daemon never imports it.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any, ClassVar

import pytest

from packrat_daemon.wire.errors import PolicyError
from policies.base import InstancePlan, Plan, Policy, PolicySettings
from policies.packrat import MIN_SPLIT_GAIN
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology
from policies.registry import available_policies

_JSON_SCALARS = (str, int, float, bool, type(None))


def amdahl_profile(
    max_threads: int = 4,
    batches: tuple[int, ...] = (1, 2, 4, 8, 16),
    *,
    serial_ms: float = 1.0,
    parallel_ms: float = 3.0,
    overhead_ms: float = 2.0,
) -> Profile:
    """L(t, b) = overhead + b · (serial + parallel / t): diminishing returns in threads, as real models show."""
    return Profile.from_latencies(
        {(t, b): overhead_ms + b * (serial_ms + parallel_ms / t) for t in range(1, max_threads + 1) for b in batches},
        model="amdahl",
    )


def assert_plain_json(value: Any, where: str = "plan.to_json()") -> None:
    """Only JSON's own types, exactly: a numpy integer or float (a subclass or not) is refused."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert type(key) is str, f"{where}: key {key!r} is {type(key).__name__}, not str"
            assert_plain_json(item, f"{where}[{key!r}]")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            assert_plain_json(item, f"{where}[{index}]")
    else:
        assert type(value) in _JSON_SCALARS, f"{where} is {type(value).__name__} ({value!r}), not a plain JSON value"
        if type(value) is float:
            assert math.isfinite(value), f"{where} is {value}, which JSON cannot carry"


def assert_well_formed(plan: Plan, topology: Topology) -> None:
    """Instances exist, have whole positive thread counts and non-negative batches, and fit the cores."""
    assert isinstance(plan, Plan), f"expected a Plan, got {type(plan).__name__}"
    assert plan.instances, "a plan must run at least one instance"
    for instance in plan.instances:
        assert isinstance(instance, InstancePlan), f"instances must be InstancePlan, got {instance!r}"
        assert type(instance.threads) is int and instance.threads >= 1, f"bad thread count in {instance}"
        # 0 is allowed: TorchServe starts a worker even when the even split leaves it no input.
        assert type(instance.batch) is int and instance.batch >= 0, f"bad batch in {instance}"
    if not plan.oversubscribed:
        assert plan.total_threads <= topology.usable_cores, (
            f"{plan.describe()} uses {plan.total_threads} threads on {topology.usable_cores} usable cores "
            "without declaring itself oversubscribed"
        )


class PolicyContract:
    """Pytest tests that any `Policy` must pass. Subclasses provide the `policy` fixture."""

    # False for a policy whose instance batches are its own (a user's plan), not a split of the batch.
    splits_batch: ClassVar[bool] = True

    # -- fixtures a subclass provides or may override ------------------------------------------
    @pytest.fixture
    def policy(self) -> Policy:
        raise NotImplementedError("a PolicyContract subclass must provide a `policy` fixture")

    @pytest.fixture
    def profile(self) -> Profile:
        return amdahl_profile()

    @pytest.fixture
    def topology(self) -> Topology:
        # SMT 2: 4 usable cores but 8 logical CPUs, so policies that confuse the two are caught.
        return Topology.synthetic(4, smt=2)

    @pytest.fixture(params=[1, 5, 16], ids=lambda b: f"batch{b}")
    def batch(self, request: pytest.FixtureRequest) -> int:
        # 5 is not a profiled batch; 16 is the largest profiled one.
        return request.param

    @pytest.fixture
    def distribution(self, batch: int) -> BatchDistribution:
        return BatchDistribution.single(batch)

    @pytest.fixture
    def mixed_distribution(self) -> BatchDistribution:
        return BatchDistribution.from_counts({1: 5, 3: 1, 8: 3, 16: 2})

    @pytest.fixture
    def settings(self) -> PolicySettings:
        """Serve options under which `from_settings` builds a policy equal to the `policy` fixture."""
        return PolicySettings(plan=None, min_split_gain=MIN_SPLIT_GAIN)

    # -- the contract ------------------------------------------------------------------------
    def test_returns_a_well_formed_plan(
        self,
        policy: Policy,
        profile: Profile,
        topology: Topology,
        distribution: BatchDistribution,
        mixed_distribution: BatchDistribution,
    ) -> None:
        for served in (distribution, mixed_distribution):
            assert_well_formed(policy.plan(profile, topology, served), topology)

    def test_plan_names_the_policy(
        self, policy: Policy, profile: Profile, topology: Topology, distribution: BatchDistribution
    ) -> None:
        assert policy.plan(profile, topology, distribution).policy == policy.name

    def test_single_batch_is_carried_in_full(
        self, policy: Policy, profile: Profile, topology: Topology, batch: int
    ) -> None:
        if not self.splits_batch:
            pytest.skip(f"{policy.name} does not split the batch: its instance batches are its own")
        plan = policy.plan(profile, topology, BatchDistribution.single(batch))
        assert sum(instance.batch for instance in plan.instances) == batch, plan.describe()

    def test_same_inputs_give_equal_plans(
        self, policy: Policy, profile: Profile, topology: Topology, distribution: BatchDistribution
    ) -> None:
        first = policy.plan(profile, topology, distribution)
        again = policy.plan(profile, topology, distribution)
        from_a_copy = copy.deepcopy(policy).plan(profile, topology, distribution)
        assert first == again == from_a_copy
        assert first.to_json() == again.to_json() == from_a_copy.to_json()

    def test_does_not_mutate_its_inputs(
        self, policy: Policy, profile: Profile, topology: Topology, mixed_distribution: BatchDistribution
    ) -> None:
        profile_csv, profile_cells = profile.to_csv(), list(profile.items())
        topology_before = copy.deepcopy(topology)
        distribution_before = copy.deepcopy(mixed_distribution)
        policy.plan(profile, topology, mixed_distribution)
        assert profile.to_csv() == profile_csv
        assert list(profile.items()) == profile_cells
        assert topology == topology_before
        assert mixed_distribution == distribution_before

    def test_is_registered_under_its_name(self, policy: Policy) -> None:
        registered = available_policies()
        assert policy.name, "a policy must set a non-empty `name`"
        assert policy.name in registered, f"{policy.name!r} is not in {sorted(registered)}"
        assert isinstance(policy, registered[policy.name])

    def test_plan_json_is_plain(
        self, policy: Policy, profile: Profile, topology: Topology, distribution: BatchDistribution
    ) -> None:
        plan = policy.plan(profile, topology, distribution)
        data = plan.to_json()
        assert_plain_json(data)
        assert json.loads(json.dumps(data)) == data
        assert data["instances"] == [{"threads": i.threads, "batch": i.batch} for i in plan.instances]
        assert Plan.from_json(json.loads(json.dumps(data))) == plan, "a plan read back is the plan written"

    def test_predicted_latency_is_positive_or_unknown(
        self, policy: Policy, profile: Profile, topology: Topology, distribution: BatchDistribution
    ) -> None:
        predicted = policy.plan(profile, topology, distribution).predicted_latency_ms
        assert predicted is None or (math.isfinite(predicted) and predicted > 0)

    def test_an_adapting_policy_predicts_expected_latency(
        self, policy: Policy, profile: Profile, topology: Topology, mixed_distribution: BatchDistribution
    ) -> None:
        plan = policy.plan(profile, topology, mixed_distribution)
        expected = policy.expected_latency(profile, plan, mixed_distribution)
        assert expected is not None or not policy.adapts, f"{policy.name} adapts, so the tuner needs a prediction"
        assert expected is None or expected > 0

    def test_builds_from_the_serve_settings(
        self, policy: Policy, settings: PolicySettings, profile: Profile, topology: Topology
    ) -> None:
        built = type(policy).from_settings(settings)
        assert type(built) is type(policy)
        distribution = BatchDistribution.single(8)
        assert built.plan(profile, topology, distribution) == policy.plan(profile, topology, distribution)

    def test_missing_profile_is_refused_or_not_needed(
        self, policy: Policy, topology: Topology, distribution: BatchDistribution
    ) -> None:
        if policy.needs_profile:
            with pytest.raises(PolicyError, match="profile"):
                policy.plan(None, topology, distribution)
        else:
            assert_well_formed(policy.plan(None, topology, distribution), topology)

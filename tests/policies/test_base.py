"""Plans as values: their layouts and thread counts, how they read and are written out, and what a policy
that overrides nothing does."""

from __future__ import annotations

import json

import pytest

from policies.base import InstancePlan, Plan, Policy, PolicySettings, format_ms
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology

SPLIT = Plan(
    (InstancePlan(1, 8), InstancePlan(1, 8)),
    "packrat",
    "a split",
    12.5,
    alternatives=((InstancePlan(2, 16),),),
)


def test_a_plans_layouts_are_its_instances_then_its_spares() -> None:
    assert SPLIT.layouts == (SPLIT.instances, (InstancePlan(2, 16),))
    assert SPLIT.layout_threads == ((1, 1), (2,))
    assert SPLIT.thread_counts == [1, 1] and SPLIT.total_threads == 2  # the main layout's


@pytest.mark.parametrize(
    ("ms", "text"), [(0.03124, "0.0312 ms"), (1.0, "1 ms"), (12.34, "12.3 ms"), (99.94, "99.9 ms"), (1234.6, "1235 ms")]
)
def test_a_latency_reads_with_three_significant_digits_or_whole_milliseconds(ms: float, text: str) -> None:
    assert format_ms(ms) == text


def test_a_plan_reads_as_its_groups_of_equal_instances() -> None:
    assert (
        SPLIT.describe()
        == "packrat: 2×⟨1 thread, batch 8⟩, predicted 12.5 ms (+1 spare layout(s) for other batch sizes)"
    )
    mixed = Plan((InstancePlan(2, 4), InstancePlan(1, 2), InstancePlan(2, 4)), "fixed", "the user's plan")
    assert mixed.describe() == "fixed: 2×⟨2 threads, batch 4⟩ + 1×⟨1 thread, batch 2⟩"


def test_a_plan_shows_a_small_models_prediction_and_says_when_there_is_none() -> None:
    assert "predicted 0.0312 ms" in Plan((InstancePlan(1, 1),), "single", "test", 0.03124).describe()
    shared = Plan((InstancePlan(2, 1), InstancePlan(2, 1)), "torchserve", "test", oversubscribed=True)
    assert "latency not predicted (its instances share cores)" in shared.describe()


def test_the_json_holds_every_field_in_plain_types() -> None:
    assert json.loads(json.dumps(SPLIT.to_json())) == {
        "policy": "packrat",
        "instances": [{"threads": 1, "batch": 8}, {"threads": 1, "batch": 8}],
        "predicted_latency_ms": 12.5,
        "oversubscribed": False,
        "split": "exact",
        "alternatives": [[{"threads": 2, "batch": 16}]],
        "reason": "a split",
    }


def test_a_plan_read_back_from_its_json_is_the_plan() -> None:
    oversubscribed = Plan((InstancePlan(1, 4),) * 3, "torchserve", "", None, oversubscribed=True, split="even")
    for plan in (SPLIT, oversubscribed):
        assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    bare = {"instances": [{"threads": 2, "batch": 4}]}  # a coordinator may leave out all but the instances
    assert Plan.from_json(bare, policy="coordinate", reason="assigned") == Plan(
        (InstancePlan(2, 4),), "coordinate", "assigned"
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"instances": []}, "a layout is [], not a non-empty list"),
        ({"instances": [{"threads": "two", "batch": 1}]}, "an instance's threads is 'two', not an integer"),
        ({"instances": [{"threads": 1, "batch": True}]}, "an instance's batch is True"),
        ({"instances": [{"threads": 1 << 21, "batch": 1}]}, "not an integer from 1 to 1048576"),
        ({"instances": [[1, 1]]}, "an instance is not an object"),
        ({"alternatives": [[]]}, "a layout is []"),
        ({"alternatives": {}}, "its spare layouts are {}, not a list"),
        ({"split": "sideways"}, "its split is 'sideways', neither 'exact' nor 'even'"),
        ({"oversubscribed": 1}, "its oversubscribed is 1, not true or false"),
        ({"predicted_latency_ms": "fast"}, "its predicted_latency_ms is 'fast'"),
        ({"predicted_latency_ms": float("nan")}, "its predicted_latency_ms is nan"),
        ({"policy": 7}, "its policy is 7, not text"),
        ({"reason": None}, "its reason is None, not text"),
    ],
)
def test_a_plan_json_that_is_not_one_is_refused_naming_what_is_wrong(change: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        Plan.from_json(SPLIT.to_json() | change)
    with pytest.raises(ValueError, match="a plan is '" + "x" * 36 + r"\.\.\., not an object"):
        Plan.from_json("x" * 1000)  # a crafted field is shortened in the message
    with pytest.raises(ValueError, match="its policy is None"):
        Plan.from_json({"instances": [{"threads": 1, "batch": 1}]})  # no policy, and none stood for it


def test_policy_settings_come_from_a_serve_configuration() -> None:
    from packrat_daemon.config import ServeConfig

    config = ServeConfig(plan="2*1x4", min_split_gain=0.3, max_batch=8)
    assert PolicySettings.from_config(config) == PolicySettings("2*1x4", 0.3, 8)


def test_a_plan_that_fits_has_no_misfit_and_each_misfit_says_why() -> None:
    two = Topology.synthetic(2)
    assert SPLIT.misfit(two, 16) is None
    assert SPLIT.misfit(two, None) is None  # max_batch unknown: not checked
    empty = Plan((), "x", "test")
    assert "a layout has no instances" in (empty.misfit(two, None) or "")
    no_threads = Plan((InstancePlan(0, 1),), "x", "test")
    assert "fewer than 1 thread" in (no_threads.misfit(two, None) or "")
    oversubscribed = Plan((InstancePlan(2, 1),) * 3, "torchserve", "test", oversubscribed=True)
    assert "3 oversubscribed worker(s) of up to 2 threads exceed this machine's 2 CPUs" in (
        oversubscribed.misfit(two, None) or ""
    )
    assert oversubscribed.misfit(Topology.synthetic(2, smt=2), None) is None


class Minimal(Policy):
    name = "minimal"

    def plan(self, profile: Profile | None, topology: Topology, distribution: BatchDistribution) -> Plan:
        return Plan((InstancePlan(1, distribution.max_batch),), self.name, "the least a policy writes")


def test_a_policy_that_overrides_nothing_reads_no_option_predicts_nothing_and_does_not_adapt() -> None:
    policy = Minimal.from_settings(PolicySettings(plan="2*1x4", min_split_gain=0.5))
    assert type(policy) is Minimal
    plan = policy.plan(None, Topology.synthetic(1), BatchDistribution.single(4))
    assert policy.expected_latency(Profile.from_latencies({(1, 4): 1.0}), plan, BatchDistribution.single(4)) is None
    assert not (Minimal.needs_profile or Minimal.adapts or Minimal.checks_splits)


def test_a_policy_must_say_how_it_plans() -> None:
    class Planless(Policy):
        name = "planless"

    with pytest.raises(TypeError, match="abstract"):
        Planless()  # type: ignore[abstract]

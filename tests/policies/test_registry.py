"""Policies by name: the built-ins, the errors that name what is available, building a policy from the serve
options, and third-party policies through the entry point group."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from packrat_daemon.wire.errors import PolicyError
from policies.base import PolicySettings
from policies.fixed import FixedPolicy
from policies.packrat import PackratPolicy
from policies.planning.distribution import BatchDistribution
from policies.planning.topology import Topology
from policies.registry import ENTRY_POINT_GROUP, available_policies, get_policy, policy_from_settings
from policies.single import SinglePolicy
from policies.testing import assert_well_formed
from policies.torchserve import TorchServePolicy

BUILTIN_NAMES = {"packrat", "single", "torchserve", "fixed"}


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

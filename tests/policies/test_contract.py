"""Every built-in policy against the policy contract (policies.testing), and what each says it can do."""

from __future__ import annotations

import pytest

from policies.base import Policy, PolicySettings
from policies.planning.topology import Topology
from policies.registry import available_policies, get_policy
from policies.testing import PolicyContract

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


def test_among_the_builtins_only_packrat_adapts_and_checks_its_splits() -> None:
    builtins = {name: cls for name, cls in available_policies().items() if name in BUILTIN_NAMES}
    assert {name for name, cls in builtins.items() if cls.adapts} == {"packrat"}
    assert {name for name, cls in builtins.items() if cls.checks_splits} == {"packrat"}

"""Online adaptation as the daemon's loop drives it: who gets a tuner, when it is asked, what is learned."""

from __future__ import annotations

import time

from packrat_daemon.adapt.online import OnlineAdaptation
from packrat_daemon.config import ServeConfig
from policies.base import InstancePlan, Plan
from policies.fixed import FixedPolicy
from policies.packrat import PackratPolicy
from policies.planning.profile import Profile
from policies.planning.topology import Topology

TOPOLOGY = Topology.synthetic(2)
OFFLINE = Profile.from_latencies({(1, 1): 1.0, (1, 4): 2.5, (2, 1): 0.6, (2, 4): 2.6}, model="m")
ONE = Plan((InstancePlan(2, 4),), "packrat", "test")


def test_only_a_policy_that_adapts_with_a_profile_gets_a_tuner() -> None:
    config = ServeConfig(adapt_interval_s=5.0)
    assert OnlineAdaptation(config, PackratPolicy(), OFFLINE, TOPOLOGY).tuner is not None
    assert OnlineAdaptation(config, FixedPolicy("2x4"), OFFLINE, TOPOLOGY).tuner is None
    assert OnlineAdaptation(config, PackratPolicy(), None, TOPOLOGY).tuner is None
    assert OnlineAdaptation(ServeConfig(adapt=False), PackratPolicy(), OFFLINE, TOPOLOGY).tuner is None


def test_the_loop_asks_once_per_interval_and_a_reload_can_switch_it_off() -> None:
    adaptation = OnlineAdaptation(ServeConfig(adapt_interval_s=5.0), PackratPolicy(), OFFLINE, TOPOLOGY)
    assert adaptation.due == 0.0
    assert adaptation.propose(ONE, OFFLINE, now=100.0) is None  # no batch seen yet
    assert adaptation.due == 105.0
    adaptation.retune(ServeConfig(adapt_interval_s=1.0), FixedPolicy("2x4"), OFFLINE)
    assert adaptation.tuner is None and adaptation.propose(ONE, OFFLINE, now=106.0) is None
    assert adaptation.due == 107.0


def test_learned_is_the_offline_profile_with_production_timings_for_the_served_runtime() -> None:
    adaptation = OnlineAdaptation(ServeConfig(), PackratPolicy(), OFFLINE, TOPOLOGY)
    assert adaptation.learned(OFFLINE, ONE, "m", "openvino") is None  # nothing measured yet
    now = time.monotonic()
    for k in range(5):
        adaptation.production.observe(2, 4, 1.3, now + k * 0.01)
    learned = adaptation.learned(OFFLINE, ONE, "m", "openvino")
    assert learned is not None and learned.runtime == "openvino" and learned.model == "m"
    assert learned.cell(2, 4).samples > 1 and learned.latency(2, 4) < OFFLINE.latency(2, 4)
    shared = Plan((InstancePlan(1, 2), InstancePlan(1, 2)), "torchserve", "test", oversubscribed=True)
    assert adaptation.learned(OFFLINE, shared, "m", "openvino") is None  # timings of shared cores are not cells


class OneFork:
    """The reconciler as adaptation asks it: every switch forks one 1-thread worker, which took 4 s."""

    fork_s = 4.0

    def forks_needed(self, plan: Plan) -> list[int]:
        return [1]


def test_a_switch_that_forks_waits_until_the_new_traffic_has_lasted_long_enough_to_pay_for_it() -> None:
    # Served for single inputs (one 2-thread worker); clients now send four at a time, for which two 1-thread workers
    # are predicted 54% faster: worth a 4 s fork on one of the two cores once the traffic has lasted 3.7 s.
    offline = Profile.from_latencies({(1, 1): 1.0, (1, 2): 1.2, (1, 4): 2.5, (2, 1): 0.6, (2, 4): 2.6}, model="m")
    adaptation = OnlineAdaptation(ServeConfig(adapt_interval_s=1.0), PackratPolicy(), offline, TOPOLOGY)
    adaptation.costs(OneFork())
    adaptation.retune(ServeConfig(adapt_interval_s=1.0), PackratPolicy(), offline)  # a reload keeps the costs
    ones = Plan((InstancePlan(2, 1),), "packrat", "test")
    for k in range(200):
        adaptation.estimator.observe(1, 10.0 + k * 0.05)
    for k in range(20):  # from 20 s, batches of four: the traffic moved
        adaptation.estimator.observe(4, 20.0 + k * 0.05)
    assert adaptation.estimator.restarts == 1
    assert adaptation.propose(ones, offline, now=21.5) is None
    assert adaptation.tuner is not None and "does not pay" in adaptation.tuner.declined
    for k in range(60):
        adaptation.estimator.observe(4, 21.5 + k * 0.05)
    switched = adaptation.propose(ones, offline, now=24.6)
    assert switched is not None and sorted(switched.thread_counts) == [1, 1]

"""Closed-loop clients at batch 1 on one instance no longer take turns (issue 43), in the simulated daemon: the
batcher holds the next batch for the clients just answered when merging is predicted to pay. Against the same
simulation with that hold turned off, as the daemon batched before it."""

from __future__ import annotations

import pytest

from packrat_daemon.config import ServeConfig
from packrat_daemon.load.arrivals import BatchMix, Poisson
from packrat_daemon.requests.waiting import WaitingRule
from packrat_daemon.simulate import DaemonCosts, Simulation, Traffic
from policies.planning.profile import Profile

# ResNet-50 on torch, 2 cores: docs/peers.md's profile from the peers run's own figures (ms).
RESNET50 = {(2, 1): 88, (2, 2): 165, (2, 4): 280, (2, 8): 440, (2, 16): 800}
RESNET50 |= {(1, 1): 130, (1, 2): 240, (1, 4): 450, (1, 8): 860, (1, 16): 1680}


def simulate(traffic: Traffic) -> dict:
    """One 2-thread instance for every batch (the run's plan, no adaptation), 2 ms round trips."""
    config = ServeConfig(policy="fixed", plan="2x16", adapt=False, max_batch=16)
    costs = DaemonCosts(transport_ms=(2.0, 0.0))
    return Simulation(config, Profile.from_latencies(RESNET50), 2, costs=costs).run(traffic).to_json()


def closed_loop(clients: int) -> Traffic:
    return Traffic(BatchMix.single(1), concurrency=clients, duration_s=60.0)


@pytest.fixture
def no_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batcher as it was: never held for the clients just answered."""
    monkeypatch.setattr(WaitingRule, "cohort_pays", lambda self, now: False)


@pytest.mark.parametrize(("clients", "before_ms", "after_ms"), [(2, 176.0, 167.0), (4, 368.0, 282.0)])
def test_closed_loop_clients_share_a_batch_instead_of_taking_turns(
    clients: int, before_ms: float, after_ms: float
) -> None:
    result = simulate(closed_loop(clients))
    # 2 × L(1) = 176 ms before (each waits for the other's batch of one); L(2) + the 2 ms round trip now.
    assert result["latency_ms"]["p50"] == pytest.approx(after_ms)
    assert result["mean_batch"] == pytest.approx(clients, rel=0.05)  # but the first rounds, to tell a closed loop
    assert after_ms < before_ms


@pytest.mark.parametrize(("clients", "before_ms"), [(2, 176.0), (4, 368.0)])
def test_without_the_hold_they_take_turns(no_hold: None, clients: int, before_ms: float) -> None:
    result = simulate(closed_loop(clients))
    assert result["latency_ms"]["p50"] == pytest.approx(before_ms)
    assert result["mean_batch"] == pytest.approx(clients / 2, rel=0.02)


def test_a_lone_client_and_poisson_traffic_are_served_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    traffics = [closed_loop(1)] + [
        Traffic(BatchMix.single(1), process=Poisson(rate), duration_s=30.0, seed=1) for rate in (5.0, 10.0, 15.0)
    ]
    now = [simulate(traffic) for traffic in traffics]
    monkeypatch.setattr(WaitingRule, "cohort_pays", lambda self, now: False)
    before = [simulate(traffic) for traffic in traffics]
    for after, then in zip(now, before, strict=True):
        assert (after["latency_ms"], after["batches"]) == (then["latency_ms"], then["batches"])

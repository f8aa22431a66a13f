"""The simulated daemon: the daemon's own batcher, splitter and adaptation on the virtual clock."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from packrat_daemon.config import ServeConfig
from packrat_daemon.load.arrivals import BatchMix, Burst, Poisson, Trace, open_loop_schedule
from packrat_daemon.simulate import DaemonCosts, Simulation, Traffic
from packrat_daemon.wire.errors import ConfigError
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology
from policies.registry import get_policy

CORES = 16
BATCHES = [1, 2, 4, 8, 16, 32, 64]


def amdahl_profile() -> Profile:
    """A per-batch fixed cost plus work with a serial fraction: small batches favour few big instances."""
    return Profile.from_latencies(
        {(t, b): 4.0 + 3.0 * b * (0.08 + 0.92 / t) for t in range(1, CORES + 1) for b in BATCHES}
    )


def simulate(traffic: Traffic, **settings: object) -> dict:
    profile = amdahl_profile()
    config = ServeConfig(**{"max_batch": 64, **settings})
    return Simulation(config, profile, CORES).run(traffic).to_json()


@pytest.mark.parametrize("policy", ["packrat", "single"])
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_one_client_at_a_time_sees_the_plans_predicted_latency(policy: str, batch: int):
    # One client at a time: the next request comes only after this one's answer, so none waits for company.
    result = simulate(Traffic(BatchMix.single(batch), concurrency=1, requests=50), policy=policy, batches=[batch])
    plan = get_policy(policy).plan(amdahl_profile(), Topology.synthetic(CORES), BatchDistribution.single(batch))
    wait_ms = 0.0
    assert plan.predicted_latency_ms is not None
    assert result["latency_ms"]["p50"] == pytest.approx(
        plan.predicted_latency_ms + wait_ms, abs=5e-4
    )  # the report rounds to µs
    assert result["sent"] == result["ok"] == 50 and result["errors"] == {}
    assert result["simulated"] is True


@pytest.mark.slow
def test_the_same_seed_gives_the_same_result_and_another_seed_another():
    traffic = Traffic(BatchMix.parse("1:0.5,8:0.3,32:0.2"), process=Poisson(150.0), duration_s=60.0, seed=3)
    first, again = simulate(traffic), simulate(traffic)
    other = simulate(Traffic(traffic.mix, process=Poisson(150.0), duration_s=60.0, seed=4))
    assert first == again
    assert other["latency_ms"] != first["latency_ms"]


def test_open_loop_counts_every_request_and_an_overload_is_refused_not_lost():
    # One 16-thread instance computes a batch of 64 in 30.4 ms on this table (about 2 100 inputs/s):
    # 100 requests/s of 32 inputs are far over it.
    traffic = Traffic(BatchMix.single(32), process=Poisson(100.0), duration_s=30.0, seed=1)
    result = simulate(traffic, policy="single", max_queue=256)
    assert result["sent"] == result["ok"] + sum(result["errors"].values())
    assert result["errors"].get("OVERLOADED", 0) > 0
    light = simulate(Traffic(BatchMix.single(1), process=Poisson(20.0), duration_s=30.0, seed=1), policy="single")
    assert light["errors"] == {} and light["throughput_rps"] == pytest.approx(20.0, rel=0.15)


def test_adaptation_replans_for_the_live_batch_sizes_and_reports_when():
    # Planned for batch 64, sent single inputs: the tuner should move to a plan for batch 1 once it has seen
    # adapt_min_batches batches, and not before adapt_interval_s.
    traffic = Traffic(BatchMix.single(1), concurrency=1, duration_s=60.0)
    adapted = simulate(traffic, batches=[64])
    changes = adapted["plan_changes"]
    assert changes[0]["reason"] == "start" and changes[0]["t_s"] == 0.0
    assert [c["reason"] for c in changes[1:]] == ["adapt"]
    assert changes[1]["t_s"] >= 5.0
    fixed = simulate(traffic, batches=[64], adapt=False)
    assert [c["reason"] for c in fixed["plan_changes"]] == ["start"]
    assert adapted["latency_ms"]["p50"] < fixed["latency_ms"]["p50"]


def test_burst_and_trace_arrivals_run_and_end():
    burst = simulate(Traffic(BatchMix.single(4), process=Burst(1.0, 2.0, 300.0), duration_s=9.0, seed=2))
    assert 600 < burst["sent"] < 1200 and burst["sent"] == burst["ok"]
    trace = simulate(Traffic(BatchMix.single(1), process=Trace(((0.0, 2), (0.5, 8), (0.5, 8)))))
    assert trace["sent"] == trace["ok"] == 3


def test_traffic_must_say_how_it_is_sent_and_when_it_ends():
    with pytest.raises(ConfigError, match="either an arrival process"):
        Traffic(BatchMix.single(1), process=Poisson(1.0), concurrency=2, duration_s=1.0)
    with pytest.raises(ConfigError, match="never ends"):
        Traffic(BatchMix.single(1), process=Poisson(1.0))
    with pytest.raises(ConfigError, match="exceed max_batch"):
        simulate(Traffic(BatchMix.single(128), concurrency=1, requests=1))


def test_open_loop_traffic_is_the_schedule_packrat_load_sends_for_the_same_seed():
    mix = BatchMix.parse("1:0.5,8:0.5")
    schedule = open_loop_schedule(Poisson(80.0), mix, duration_s=20.0, rng=random.Random(9))
    result = simulate(Traffic(mix, process=Poisson(80.0), duration_s=20.0, seed=9), max_delay_ms=0.0)
    assert result["sent"] == len(schedule)
    assert result["samples_per_s"] * result["window_s"] == pytest.approx(sum(s for _, s in schedule), rel=1e-4)


def test_the_daemons_costs_add_to_a_lone_request_and_keep_each_batch_in_flight():
    profile = amdahl_profile()
    config = ServeConfig(policy="single", max_batch=64, batches=[8], max_delay_ms=0.0)
    alone = profile.lhat(CORES, 8)
    assert alone is not None
    costs = DaemonCosts(transport_ms=(0.2, 0.1), read_ms=(0.2, 0.1), dispatch_ms=0.3, answer_ms=(0.4, 0.05), hop_ms=0.6)

    # One client: each request pays the transport (0.2 + 0.1 per sample), its read (0.2 + 0.1 per sample),
    # the batch's start, the trip to the worker and the answer (0.4 + 0.05 for its one request) on top of
    # the compute.
    one_client = Traffic(BatchMix.single(8), concurrency=1, requests=40)
    p50 = Simulation(config, profile, CORES, costs=costs).run(one_client).to_json()["latency_ms"]["p50"]
    assert p50 == pytest.approx(alone + 1.0 + (0.2 + 0.8) + 0.3 + 0.6 + 0.45, abs=5e-4)
    # A second request that comes while the first computes waits for its whole cycle: the start, the trip to
    # the worker and the answer keep the worker from the next batch as the compute does.
    second = Traffic(BatchMix.single(8), process=Trace(((0.0, 8), (0.001, 8))))
    cycle = 0.3 + 0.6 + 0.45 + alone
    latencies = Simulation(config, profile, CORES, costs=replace(costs, read_ms=(0.0, 0.0))).run(second).tally
    assert [1000.0 * s for s in latencies.latencies_s] == pytest.approx([1.0 + cycle, 1.0 + 2 * cycle - 1.0])


def test_the_daemons_one_loop_reads_what_has_come_before_it_starts_a_batch():
    # Two single-input requests 1 ms apart, each taking the loop 5 ms to read. The second comes while the
    # loop reads the first, so it is read next (5 to 10 ms), and only then does the loop start a batch: both
    # together at 10 ms, as the daemon reads every waiting message before its tick.
    profile = amdahl_profile()
    config = ServeConfig(policy="single", max_batch=64, batches=[1], max_delay_ms=0.0)
    together = profile.lhat(CORES, 2)
    assert together is not None
    traffic = Traffic(BatchMix.single(1), process=Trace(((0.0, 1), (0.001, 1))))
    result = Simulation(config, profile, CORES, costs=DaemonCosts(read_ms=(5.0, 0.0))).run(traffic)
    assert [1000.0 * latency for latency in result.tally.latencies_s] == pytest.approx(
        [10.0 + together, 10.0 + together - 1.0]
    )
    assert result.batches == 1
    # The daemon counts the wait from each read's start: 10 ms for the first, 5 ms for the second.
    assert result.to_json()["queue_wait_mean_ms"] == pytest.approx(7.5)


def test_the_looks_count_from_the_daemons_start_and_a_switch_takes_the_reconcilers_time():
    # Single inputs on a plan for batch 64: enough batches for the tuner within a second, so the first look
    # with traffic switches. The daemon looks every 5 s from its own start: 2 s up when the traffic starts,
    # its looks fall at 3, 8, … s of the traffic.
    def changes(uptime_s: float, switch_ms: float = 0.0) -> list[float]:
        traffic = Traffic(BatchMix.single(1), concurrency=1, duration_s=9.0, uptime_s=uptime_s)
        config = ServeConfig(max_batch=64, batches=[64])
        result = (
            Simulation(config, amdahl_profile(), CORES, costs=DaemonCosts(switch_ms=switch_ms)).run(traffic).to_json()
        )
        return [change["t_s"] for change in result["plan_changes"]]

    assert changes(0.0) == [0.0, 5.0]
    assert changes(2.0) == [0.0, 3.0]
    assert changes(7.0) == [0.0, 3.0]
    # The old plan serves until the reconciler is done: the change is in force 400 ms after the decision.
    assert changes(2.0, switch_ms=400.0) == [0.0, pytest.approx(3.4)]
    with pytest.raises(ConfigError, match="uptime"):
        Traffic(BatchMix.single(1), concurrency=1, duration_s=1.0, uptime_s=-1.0)


def test_the_queue_wait_is_reported_as_the_daemons_metric_counts_it():
    # A lone request starts at once; one arriving 1 ms later waits for the first batch to finish.
    config = ServeConfig(policy="single", max_batch=64, batches=[8], max_delay_ms=0.0)
    traffic = Traffic(BatchMix.single(8), process=Trace(((0.0, 8), (0.001, 8))))
    result = Simulation(config, amdahl_profile(), CORES).run(traffic).to_json()
    alone = amdahl_profile().lhat(CORES, 8)
    assert alone is not None
    assert result["queue_wait_mean_ms"] == pytest.approx((0.0 + alone - 1.0) / 2, abs=1e-3)


def test_a_switch_that_forks_waits_until_the_traffic_has_lasted_long_enough_to_pay_for_the_forks():
    # Planned for single inputs (one 16-thread instance), sent 64 at a time: sixteen 1-thread instances are predicted
    # 47% faster, but fifteen of them are forks. At 0.4 s a fork the first look switches; at 20 s a fork, on 15 of
    # the 16 cores, only once the traffic has lasted 40 s (0.47 × 40 s ≥ 20 s × 15/16), in force 20 s later.
    def changes(switch_ms: float) -> list[float]:
        traffic = Traffic(BatchMix.single(64), concurrency=1, duration_s=60.0)
        config = ServeConfig(max_batch=64, batches=[1])
        result = Simulation(config, amdahl_profile(), CORES, costs=DaemonCosts(switch_ms=switch_ms)).run(traffic)
        return [change["t_s"] for change in result.to_json()["plan_changes"]]

    assert changes(400.0) == [0.0, pytest.approx(5.4)]
    slow = changes(20_000.0)
    assert len(slow) == 2 and slow[1] >= 40.0 + 20.0

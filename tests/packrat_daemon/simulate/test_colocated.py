"""Several simulated daemons on one machine: the shared cores, the coordinator's splits and its moves."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

from packrat_daemon.config import ServeConfig
from packrat_daemon.coordinate.strategies import even_counts, proportional_split
from packrat_daemon.load.arrivals import BatchMix
from packrat_daemon.measure.emulation import Interference
from packrat_daemon.simulate.clock import EventLoop, VirtualClock
from packrat_daemon.simulate.colocated import CoordinatorSettings, Model, Phase, phased, simulate_colocated
from packrat_daemon.simulate.machine import SharedMachine
from packrat_daemon.simulate.run import Simulation, Traffic
from packrat_daemon.simulate.service import ServiceModel
from packrat_daemon.wire.errors import ConfigError
from policies.planning.topology import Topology
from policies.testing import amdahl_profile, assert_well_formed

REPO = Path(__file__).resolve().parents[3]
PROFILE = amdahl_profile(8, (1, 2, 4, 8, 16, 32), serial_ms=0.5, parallel_ms=8.0)


def machine_run(cores: int, batches: list[tuple[float, list[tuple[int, int]]]]) -> list[list[float]]:
    """Each batch's slice times (ms after its start) on a shared machine, batches starting at the given times."""
    loop = EventLoop(VirtualClock())
    machine = SharedMachine(cores, loop)
    service = ServiceModel.of(PROFILE, cores, 32, Interference.named("default"))
    out: list[list[float]] = [[] for _ in batches]
    for k, (at, slices) in enumerate(batches):

        def start(k: int = k, slices: list[tuple[int, int]] = slices) -> None:
            machine.run(service, slices, out[k].extend)

        loop.at(at, start)
    loop.run(10_000)
    return out


def test_a_lone_batch_finishes_as_the_single_model_service_model_says() -> None:
    slices = [(4, 3), (2, 1), (1, 1)]
    service = ServiceModel.of(PROFILE, 8, 32, Interference.named("default"))
    (alone,) = machine_run(8, [(0.0, slices)])
    assert alone == pytest.approx(service.batch_ms(slices))


def test_two_models_on_the_same_cores_slow_each_other_and_disjoint_shares_do_not_oversubscribe() -> None:
    service = ServiceModel.of(PROFILE, 8, 32, Interference.named("default"))
    alone = service.batch_ms([(8, 4)])[0]
    (a,), (b,) = machine_run(8, [(0.0, [(8, 4)]), (0.0, [(8, 4)])])
    # 16 threads on 8 cores: each time-shares them, twice as slow (alone it already had the full machine busy).
    assert a == b == pytest.approx(alone * 2.0)
    loop = EventLoop(VirtualClock())
    machine = SharedMachine(8, loop)
    loop.at(0.0, lambda: machine.run(service, [(4, 4)], lambda ms: None))
    loop.at(0.0, lambda: machine.run(service, [(4, 4)], lambda ms: None))
    loop.run(100)
    assert machine.peak_busy == 8 and machine.oversubscribed_s == 0.0


def test_a_batch_started_later_slows_the_first_only_while_both_run() -> None:
    service = ServiceModel.of(PROFILE, 8, 32, Interference.named("none"))
    first = service.batch_ms([(8, 8)])[0]
    (a,), (b,) = machine_run(8, [(0.0, [(8, 8)]), (first / 2000.0, [(8, 1)])])
    assert first < a < 2 * first  # slowed down for part of its run only
    assert b > service.batch_ms([(8, 1)])[0]


def test_the_splits_of_the_baselines() -> None:
    assert even_counts(3, 16) == [6, 5, 5]
    assert proportional_split([3.0, 1.0], 16) == [12, 4]
    assert proportional_split([1.0, 0.0, 0.0], 8, min_cores=2) == [4, 2, 2]
    assert proportional_split([0.0, 0.0], 7) == [4, 3]
    assert sum(proportional_split([0.37, 0.21, 0.42], 13)) == 13
    with pytest.raises(ConfigError, match="models need"):
        proportional_split([1.0, 1.0, 1.0], 2)


def test_phased_traffic_follows_its_rates() -> None:
    trace = phased([Phase(10.0, 50.0), Phase(10.0, 5.0)], BatchMix.single(1), 40.0, random.Random(1))
    times = [t for t, _ in trace.rows]
    assert sum(1 for t in times if t < 10) == 500 and sum(1 for t in times if 10 <= t < 20) == 50
    assert sum(1 for t in times if 20 <= t < 30) == 500 and max(times) < 40
    with pytest.raises(ConfigError):
        phased([Phase(0.0, 1.0)], BatchMix.single(1), 10.0, random.Random(1))


def models(seconds: float, busy_rps: float, light_rps: float, phase_s: float) -> list[Model]:
    config = ServeConfig(max_batch=32, adapt=False, batches=[1], max_delay_ms=0.0)
    out = []
    for k, name in enumerate(("a", "b")):
        phases = [Phase(phase_s, busy_rps), Phase(phase_s, light_rps)]
        trace = phased(phases if k == 0 else phases[::-1], BatchMix.single(1), seconds, random.Random(k))
        out.append(Model(name, config, PROFILE, Traffic(BatchMix.single(1), process=trace)))
    return out


@pytest.mark.slow
def test_the_joint_coordinator_moves_cores_to_the_busy_model_and_never_oversubscribes() -> None:
    run = simulate_colocated(models(40.0, 300.0, 20.0, 20.0), 8, CoordinatorSettings(), Interference.named("default"))
    report = run.to_json()
    assert report["simulated"] is True
    for tenant in run.tenants:
        assert tenant.tally.ok == tenant.tally.sent and not tenant.tally.errors
        assert_well_formed(tenant.plan, Topology.synthetic(tenant.share))
    for move in report["moves"]:  # disjoint shares, or every model on all the cores, chosen as such
        assert sum(move["to"]) <= 8 or (move["mode"] == "every" and move["to"] == [8, 8])
    # a is busy for the first 20 s while b is light, then the other way round: collisions are rare, so the
    # joint strategy starts on every model on all the cores (the safe default) and holds it through a's phase;
    # it makes no move on the 3 s window that still mixes the two phases after the change (20–23 s), and
    # each move says which candidate it serves.
    moves = report["moves"]
    assert all(move["t_s"] >= 23.0 for move in moves), moves
    assert all(move["mode"] in ("every", "even", "proportional", "joint", None) for move in moves)
    every = simulate_colocated(
        models(40.0, 300.0, 20.0, 20.0), 8, CoordinatorSettings(strategy="every"), Interference.named("default")
    ).to_json()
    assert report["overall"]["p99_ms"] <= 1.05 * every["overall"]["p99_ms"]  # the safe default's p99, or better


@pytest.mark.slow
def test_independent_daemons_on_every_core_oversubscribe_and_a_static_split_never_moves() -> None:
    traffic = models(10.0, 300.0, 300.0, 10.0)
    every = simulate_colocated(traffic, 8, CoordinatorSettings(strategy="every")).to_json()
    assert every["peak_busy_threads"] > 8 and every["oversubscribed_fraction"] > 0
    even = simulate_colocated(traffic, 8, CoordinatorSettings(strategy="even")).to_json()
    assert even["moves_made"] == 0 and even["peak_busy_threads"] <= 8


def test_a_single_tenant_is_the_single_model_simulation() -> None:
    config = ServeConfig(max_batch=32, adapt=False, batches=[1], max_delay_ms=0.0)
    trace = phased([Phase(2.0, 100.0)], BatchMix.single(1), 2.0, random.Random(3))
    traffic = Traffic(BatchMix.single(1), process=trace)
    alone = Simulation(config, PROFILE, 8, Interference.named("default")).run(traffic)
    shared = simulate_colocated([Model("a", config, PROFILE, traffic)], 8, CoordinatorSettings(strategy="even"),
                                Interference.named("default"))  # fmt: skip
    assert shared.tenants[0].tally.latencies_s == pytest.approx(alone.tally.latencies_s)


def test_the_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="strategy"):
        CoordinatorSettings(strategy="greedy")
    config = ServeConfig(max_batch=32, batches=[1])  # adaptation on: the coordinator plans instead
    trace = phased([Phase(1.0, 10.0)], BatchMix.single(1), 1.0, random.Random(0))
    model = Model("a", config, PROFILE, Traffic(BatchMix.single(1), process=trace))
    with pytest.raises(ConfigError, match="adapt off"):
        simulate_colocated([model], 4, CoordinatorSettings())
    with pytest.raises(ConfigError, match="own name"):
        simulate_colocated([model, model], 4, CoordinatorSettings())


def bench_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_colocation", REPO / "bench" / "colocation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_benchmarks_smallest_case_runs_end_to_end() -> None:
    bench = bench_module()
    row = bench.run_case(16, "shift", "heavy", 40.0, seed=1)
    assert set(row["strategies"]) == {"joint", "every", "even", "proportional"}
    for name, report in row["strategies"].items():
        assert report["simulated"] is True
        for model in report["models"].values():
            assert model["ok"] == model["sent"] > 0
        if name not in ("every", "joint"):
            assert report["peak_busy_threads"] <= 16
        for move in report["moves"]:
            assert sum(move["to"]) <= 16 or (move["mode"] == "every" and move["to"] == [16, 16])
    assert row["strategies"]["every"]["peak_busy_threads"] > 16
    assert row["strategies"]["even"]["moves_made"] == 0

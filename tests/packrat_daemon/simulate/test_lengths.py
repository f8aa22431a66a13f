"""The simulation of a model of a free axis (simulate.lengths): the daemon's own sort and cut by cost, each slice
waiting the length rule at its padded length, against the naive mode that pads every slice to the batch's longest."""

from __future__ import annotations

import pytest

from packrat_daemon.config import ServeConfig
from packrat_daemon.fleet.pool import WorkerHandle, WorkerState
from packrat_daemon.load.arrivals import BatchMix, Poisson
from packrat_daemon.load.lengths import parse_lengths
from packrat_daemon.requests.batcher import Batcher, Request
from packrat_daemon.requests.splitter import Splitter
from packrat_daemon.simulate import Simulation, Traffic
from packrat_daemon.simulate.lengths import Cut, answered_apart, free_workers, ragged_model, sliced
from policies.planning.profile import Profile

CORES = 16
BATCHES = [1, 2, 4, 8, 16]
SHORT = "lognormal:median=12,p99=64,max=128"


def per_token_profile() -> Profile:
    """A text model at its longest (128 tokens): a small fixed cost per batch, the rest per sequence."""
    return Profile.from_latencies({(t, b): 2.0 + 40.0 * b * (0.1 + 0.9 / t) for t in range(1, CORES + 1)
                                   for b in BATCHES})  # fmt: skip


def simulate(mode: str, lengths: str, rate: float) -> dict:
    config = ServeConfig(max_batch=16, length_batching=mode)
    traffic = Traffic(
        BatchMix.single(1), process=Poisson(rate), duration_s=10.0, seed=2, lengths=parse_lengths(lengths)
    )
    return Simulation(config, per_token_profile(), CORES).run(traffic).to_json()


def request(length: int) -> Request:
    return Request(b"", None, None, "float32", (1,), None, length=length)


@pytest.mark.parametrize("mode", ["by-cost", "pad-batch"])
def test_a_slice_is_padded_to_its_own_longest_or_in_pad_batch_to_the_batchs(mode: str) -> None:
    config = ServeConfig(max_batch=8, length_batching=mode)
    ragged = ragged_model(config, 128, Batcher(8, 0.0, 64))
    workers = [WorkerHandle(k + 1, 4, tuple(range(4 * k, 4 * k + 4)), 1, WorkerState.READY) for k in range(2)]
    splitter = Splitter(per_token_profile(), "exact")
    cut = sliced([request(n) for n in (100, 3, 7, 5)], ragged, splitter, workers)
    assert sum(rows for _, rows, _ in cut.slices) == 4
    if mode == "pad-batch":
        assert [length for _, _, length in cut.slices] == [100] * len(cut.slices)  # by count, each padded to 100
        assert [r.length for r in cut.requests] == [100, 3, 7, 5]
    else:  # sorted: the three short ones together, the long one alone on the other instance
        assert [(rows, length) for _, rows, length in cut.slices] == [(3, 7), (1, 100)]
        assert [r.length for r in cut.requests] == [3, 5, 7, 100]


def test_a_batch_cut_by_cost_answers_each_request_once_its_rows_are_in_and_its_workers_stay_busy_until_theirs() -> None:
    # As the dispatcher's part_answered: the batch moves aside at its first slice back.
    workers = [WorkerHandle(k + 1, 4, tuple(range(4 * k, 4 * k + 4)), 1, WorkerState.READY) for k in range(2)]
    short, long = request(3), Request(b"", None, None, "float32", (2,), None, length=100)  # two rows: both slices
    cut = Cut([short, long], [(workers[0], 2, 100), (workers[1], 1, 100)])
    assert answered_apart(cut, [0.5, 2.0]) == [(0.5, [short], [0]), (2.0, [long], [1])]
    busy = {id(workers[1]): 2.0}
    assert free_workers(workers, busy, 1.0, shared_cores=False) == [workers[0]]
    assert free_workers(workers, busy, 2.5, shared_cores=False) == workers  # its slice is back
    spare = WorkerHandle(3, 8, tuple(range(8)), 1, WorkerState.READY)  # a spare layout on both workers' cores
    assert free_workers([*workers, spare], busy, 1.0, shared_cores=False) == [workers[0]]
    assert free_workers([*workers, spare], busy, 1.0, shared_cores=True) == [workers[0], spare]


def test_every_request_at_the_longest_is_served_alike_in_both_modes() -> None:
    assert (
        simulate("by-cost", "fixed:128", 300.0)["latency_ms"] == simulate("pad-batch", "fixed:128", 300.0)["latency_ms"]
    )


def test_short_queries_under_load_wait_less_when_cut_by_cost_than_padded_to_the_batchs_longest() -> None:
    # Near the capacity, where batches hold several lengths (at light load each request runs alone: no difference).
    by_cost, naive = simulate("by-cost", SHORT, 800.0), simulate("pad-batch", SHORT, 800.0)
    assert by_cost["ok"] == naive["ok"] == by_cost["sent"]
    assert by_cost["latency_ms"]["p99"] < naive["latency_ms"]["p99"]
    assert by_cost["latency_ms"]["p50"] < naive["latency_ms"]["p50"]
    assert "lengths lognormal" in Traffic(BatchMix.single(1), process=Poisson(1.0), duration_s=1.0,
                                          lengths=parse_lengths(SHORT)).describe()  # fmt: skip

"""The request path's tallies on the dispatcher's own records: histogram buckets, per-layout compute and
predictions, the bounded layout labels, own-time sums, and which reply of a batch counts the batch."""

from __future__ import annotations

import numpy as np
import pytest

from packrat_daemon.fleet.pool import WorkerHandle
from packrat_daemon.ops.tallies import (
    HOP,
    LOOP_PHASES,
    MAX_LAYOUT_LABELS,
    OTHER_LAYOUT,
    LayoutTimes,
    OwnTimes,
    Tally,
    Tokens,
    batch_predicted_ms,
    first_of_batch,
    layout_label,
)
from packrat_daemon.requests.batcher import Request
from packrat_daemon.requests.jobs import Completed, InFlightBatch, Job


def finished_batch(slices: list[tuple[int, float, float | None]]) -> list[Completed]:
    """The Completed records of one batch: one request of one row per slice, each slice given as (its
    worker's threads, measured compute ms, predicted ms)."""
    requests = [Request(b"client", None, k, "float32", (1, 4), b"") for k in range(len(slices))]
    batch = InFlightBatch(requests, np.dtype("float32"), (4,))
    jobs = [
        Job(k, batch, k, 1, WorkerHandle(k, threads, (k,), 1), 0.0, 0.0, predicted, compute_ms=measured)
        for k, (threads, measured, predicted) in enumerate(slices)
    ]
    batch.jobs = jobs
    slowest = max(measured for _, measured, _ in slices)
    return [Completed(request, np.zeros((1, 2), np.float32), 0.1, slowest, jobs) for request in requests]


# -- Tally ------------------------------------------------------------------------------------------
def test_a_value_on_a_bound_counts_in_that_bucket_and_one_past_the_last_in_inf() -> None:
    tally = Tally([0.1, 1.0])
    for value in (0.0, 0.1, 0.10001, 1.0, 5.0, 50.0):
        tally.observe(value)
    assert tally.counts == [2, 2, 2]
    assert tally.sum == pytest.approx(56.20001)
    assert tally.cumulative() == [("0.1", 2), ("1.0", 4), ("+Inf", 6)]


def test_an_empty_tally_has_every_bucket_at_zero() -> None:
    assert Tally([0.5]).cumulative() == [("0.5", 0), ("+Inf", 0)]
    assert Tally([]).cumulative() == [("+Inf", 0)]


# -- tokens ----------------------------------------------------------------------------------------
def test_padding_waste_is_the_slices_padded_tokens_over_the_requests_own() -> None:
    lengths = [3, 5, 12, 16]  # two slices, each padded to its own longest: 2 x 5 and 2 x 16
    requests = [Request(b"c", None, k, "int64", (1, n), b"", length=n) for k, n in enumerate(lengths)]
    batch = InFlightBatch(requests, np.dtype("int64"), (16,))
    jobs = [Job(k, batch, 2 * k, 2, WorkerHandle(k, 1, (k,), 1), 0.0, 0.0, None, length=(5, 16)[k]) for k in (0, 1)]
    tokens = Tokens()
    assert tokens.to_json() is None  # nothing answered: status shows no line
    for request in requests:
        tokens.answered(request.length, request.samples)
    tokens.batch(jobs)
    found = tokens.to_json()
    assert found is not None
    assert (found["real_tokens"], found["padded_tokens"]) == (36, 42)
    assert found["padding_waste"] == pytest.approx(42 / 36, abs=1e-4)
    assert found["sequences"] == 4 and found["mean_length"] == 9.0
    assert found["length_shares"] == [[4, 0.25], [8, 0.25], [16, 0.5]]  # 3 <= 4, 5 <= 8, 12 and 16 <= 16


# -- layouts ----------------------------------------------------------------------------------------
def test_a_layout_label_is_its_thread_counts_largest_first() -> None:
    assert layout_label([1, 2, 1]) == "2+1+1"
    assert layout_label([4]) == "4"


def test_a_batch_is_observed_once_at_its_compute_with_its_slowest_slices_prediction() -> None:
    times = LayoutTimes([0.005, 0.01])
    first, _ = finished_batch([(1, 4.0, 5.0), (2, 6.0, 5.5)])
    times.observe(first)
    assert set(times.observed) == {"2+1"}
    assert times.observed["2+1"].counts == [0, 1, 0] and times.observed["2+1"].sum == pytest.approx(0.006)
    assert times.predicted_s == {"2+1": pytest.approx(0.0055)} and times.predicted_batches == {"2+1": 1}


def test_a_one_worker_batch_and_the_same_layout_in_another_order_share_a_label() -> None:
    times = LayoutTimes([1.0])
    (alone,) = finished_batch([(2, 3.0, 2.0)])
    times.observe(alone)
    times.observe(finished_batch([(1, 1.0, 1.0), (2, 2.0, 2.0)])[0])
    times.observe(finished_batch([(2, 1.0, 1.0), (1, 2.0, 2.0)])[0])
    assert {label: tally.counts[0] for label, tally in times.observed.items()} == {"2": 1, "2+1": 2}
    assert times.predicted_batches == {"2": 1, "2+1": 2}


def test_a_batch_with_a_slice_unpredicted_is_measured_but_not_predicted() -> None:
    times = LayoutTimes([1.0])
    times.observe(finished_batch([(1, 2.0, 1.5), (1, 3.0, None)])[0])
    assert times.observed["1+1"].counts == [1, 0]
    assert times.predicted_s == {} and times.predicted_batches == {}


def test_past_the_label_limit_new_layouts_share_the_label_other() -> None:
    times = LayoutTimes([1.0])
    for threads in range(1, MAX_LAYOUT_LABELS + 4):
        times.observe(finished_batch([(threads, 1.0, 1.0)])[0])
    assert len(times.observed) == MAX_LAYOUT_LABELS + 1
    assert times.observed[OTHER_LAYOUT].counts == [3, 0] and times.predicted_batches[OTHER_LAYOUT] == 3
    times.observe(finished_batch([(1, 1.0, 1.0)])[0])  # a layout that has its own label keeps it
    assert times.observed["1"].counts == [2, 0] and times.observed[OTHER_LAYOUT].counts == [3, 0]


# -- own times --------------------------------------------------------------------------------------
def test_own_times_sum_seconds_and_events_per_phase_and_for_the_hop() -> None:
    own = OwnTimes()
    assert set(own.seconds) == set(own.events) == {*LOOP_PHASES, HOP}
    own.add("read", 0.002, events=3)
    own.add("read", 0.001)
    own.add(HOP, 0.0005, events=2)
    assert own.seconds["read"] == pytest.approx(0.003) and own.events["read"] == 4
    assert own.seconds[HOP] == pytest.approx(0.0005) and own.events[HOP] == 2
    assert own.events["dispatch"] == 0 and own.seconds["dispatch"] == 0.0


def test_own_times_refuse_a_phase_they_do_not_know() -> None:
    with pytest.raises(KeyError):
        OwnTimes().add("sleep", 1.0)


# -- a batch's prediction and its first reply -------------------------------------------------------
def test_a_batch_is_predicted_at_its_slowest_slice_or_not_at_all() -> None:
    assert batch_predicted_ms(finished_batch([(1, 1.0, 3.0), (2, 1.0, 7.0), (1, 1.0, 5.0)])[0]) == 7.0
    assert batch_predicted_ms(finished_batch([(1, 1.0, 3.0), (1, 1.0, None)])[0]) is None


def test_one_reply_per_batch_is_its_first() -> None:
    done = finished_batch([(1, 1.0, 1.0), (1, 1.0, 1.0), (1, 1.0, 1.0)])
    assert [first_of_batch(d) for d in done] == [True, False, False]


def test_when_the_first_request_timed_out_in_flight_the_next_one_counts_the_batch() -> None:
    done = finished_batch([(1, 1.0, 1.0), (1, 1.0, 1.0), (1, 1.0, 1.0)])
    done[0].request.answered = True  # answered TIMEOUT while its batch ran: it gets no result reply
    assert [first_of_batch(d) for d in done[1:]] == [True, False]


def test_a_record_without_slices_is_nobodys_first() -> None:
    (done,) = finished_batch([(1, 1.0, 1.0)])
    assert not first_of_batch(Completed(done.request, done.output, 0.0, 0.0, []))

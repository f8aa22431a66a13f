"""Requests of many lengths in the simulation (a text model's free axis): the daemon's own sorting and cut by cost.

A simulated model of a free axis is a masked one (BERT's `input_ids` and `attention_mask`), its longest the traffic's
longest length, which is also the profile's: a profile is measured at the model's longest (`--input int64:1..N`).
The batch is formed by the daemon's batcher under its token budget, sorted and cut across the workers by the
daemon's own `requests.slices` functions; each slice then waits the emulated workers' time at its padded length
(`workers.runtimes.emulated.Numbers.latency_s`, the length rule of `packrat_daemon.wire.length_cost`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from packrat_daemon.config import ServeConfig
from packrat_daemon.fleet.pool import WorkerHandle
from packrat_daemon.requests import slices
from packrat_daemon.requests.batcher import Batcher, Request
from packrat_daemon.requests.inflight import on_free_cores
from packrat_daemon.requests.ragged import Ragged
from packrat_daemon.requests.splitter import Splitter
from workers.models.spec import MASK_INPUT, InputSpec, TensorSpec


def ragged_model(config: ServeConfig, longest: int, batcher: Batcher) -> Ragged:
    """The simulated model's free axis (1..`longest` tokens, masked), its batcher given the daemon's token budget."""
    axis = TensorSpec("input_ids", "int64", (longest,), free_axis=0, min_length=1)
    spec = InputSpec.of([axis, TensorSpec(MASK_INPUT, "int64", (longest,), free_axis=0, min_length=1)])
    batcher.lengths(config.max_batch_tokens or config.max_batch * longest, spec.masked)
    return Ragged(spec, config.length_batching)


class Cut(NamedTuple):
    """A batch as the daemon cuts it: its requests in row order (sorted by length) and its slices."""

    requests: list[Request]
    slices: list[tuple[WorkerHandle, int, int]]  # (worker, rows, padded length) each, in row order


def sliced(batch: list[Request], ragged: Ragged, splitter: Splitter, workers: Sequence[WorkerHandle]) -> Cut:
    """The batch's slices as the daemon cuts them."""
    in_flight = slices.in_flight(batch, ragged)
    cut = []
    offset = 0
    for worker, count in slices.split(splitter, list(workers), in_flight):
        cut.append((worker, count, ragged.slice_length(in_flight.requests, offset, count)))
        offset += count
    return Cut(in_flight.requests, cut)


def answered_apart(cut: Cut, ends: Sequence[float]) -> list[tuple[float, list[Request], list[int]]]:
    """When the requests of a batch cut by cost are answered, as the daemon's dispatcher answers them
    (`InFlight.part_answered`: the batch moves aside at its first slice back, and each request is answered once its
    rows are in): (time, the requests answered then, the slices back then) in time order; `ends`: each slice's."""
    bounds, offset = [], 0
    for _, rows, _ in cut.slices:
        bounds.append((offset, offset + rows))
        offset += rows
    answered: dict[float, tuple[list[Request], list[int]]] = {end: ([], []) for end in ends}
    for k, end in enumerate(ends):
        answered[end][1].append(k)
    offset = 0
    for request in cut.requests:
        low, high = offset, offset + request.samples
        end = max(ends[k] for k, (first, last) in enumerate(bounds) if first < high and low < last)
        answered[end][0].append(request)
        offset = high
    return [(end, *answered[end]) for end in sorted(answered)]


def free_workers(
    workers: Sequence[WorkerHandle], busy_until: dict[int, float], now: float, shared_cores: bool
) -> list[WorkerHandle]:
    """The workers the next batch may take while slices of a batch aside compute (`busy_until`: each busy worker's
    end, by `id()` of its handle), by the dispatcher's rule (`requests.inflight.on_free_cores`)."""
    busy = [w for w in workers if busy_until.get(id(w), 0.0) > now]
    if not busy:
        return list(workers)
    held = set() if shared_cores else {core for w in busy for core in w.cores}
    return on_free_cores(workers, {w.id for w in busy}, held) or list(workers)

"""Requests of many lengths in the simulation (a text model's free axis): the daemon's own sorting and cut by cost.

A simulated model of a free axis is a masked one (BERT's `input_ids` and `attention_mask`), its longest the traffic's
longest length, which is also the profile's: a profile is measured at the model's longest (`--input int64:1..N`).
The batch is formed by the daemon's batcher under its token budget, sorted and cut across the workers by the
daemon's own `requests.slices` functions; each slice then waits the emulated workers' time at its padded length
(`workers.runtimes.emulated.Numbers.latency_s`, the length rule of `packrat_daemon.wire.length_cost`).
"""

from __future__ import annotations

from collections.abc import Sequence

from packrat_daemon.config import ServeConfig
from packrat_daemon.fleet.pool import WorkerHandle
from packrat_daemon.requests import slices
from packrat_daemon.requests.batcher import Batcher, Request
from packrat_daemon.requests.ragged import Ragged
from packrat_daemon.requests.splitter import Splitter
from workers.models.spec import MASK_INPUT, InputSpec, TensorSpec


def ragged_model(config: ServeConfig, longest: int, batcher: Batcher) -> Ragged:
    """The simulated model's free axis (1..`longest` tokens, masked), its batcher given the daemon's token budget."""
    axis = TensorSpec("input_ids", "int64", (longest,), free_axis=0, min_length=1)
    spec = InputSpec.of([axis, TensorSpec(MASK_INPUT, "int64", (longest,), free_axis=0, min_length=1)])
    batcher.lengths(config.max_batch_tokens or config.max_batch * longest, spec.masked)
    return Ragged(spec, config.length_batching)


def sliced(
    batch: list[Request], ragged: Ragged, splitter: Splitter, workers: Sequence[WorkerHandle]
) -> list[tuple[int, int, int]]:
    """The batch's slices as the daemon cuts them: (threads, rows, padded length) each, in the batch's row order."""
    in_flight = slices.in_flight(batch, ragged)
    cut = []
    offset = 0
    for worker, count in slices.split(splitter, list(workers), in_flight):
        cut.append((worker.threads, count, ragged.slice_length(in_flight.requests, offset, count)))
        offset += count
    return cut

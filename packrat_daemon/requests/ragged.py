"""Requests of a free axis (a text model's tokens): a slice padded to its own longest, answers cut to each request's.

A model that declares a free axis (`workers.models.spec.TensorSpec.free_axis`, e.g. `--input int64:1..128`) takes
requests of any length up to its longest. Each request keeps its rows at its own length; the dispatcher sorts a
batch by length and cuts it by predicted cost (`policies.planning.tokens`), and each slice is padded here to the
longest sequence in that slice, not the batch's or the model's: zeros, which an attention mask marks as padding
(a model without one batches only requests of one length, `Batcher`). A worker answers at the slice's length; each
request's rows of a per-token output are cut back to its own length before the reply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from packrat_daemon.wire.codec import DTYPES, pack_records, unpack_records
from workers.models.spec import RAGGED_MODES, InputSpec, TensorSpec

if TYPE_CHECKING:
    from packrat_daemon.requests.batcher import Request


BY_COST, PAD_BATCH = RAGGED_MODES  # the setting `length_batching`: sorted and cut by cost, or the baseline


class Ragged:
    """How one model's requests of several lengths are padded into a slice and its answers cut back."""

    def __init__(self, spec: InputSpec, mode: str = BY_COST) -> None:
        self.spec = spec
        self.mode = mode
        self.masked = spec.masked
        self.longest = spec.max_length
        self._at: dict[int, InputSpec] = {}

    @property
    def cut_by_cost(self) -> bool:
        """Whether a batch's slices are cut by cost (each padded to its own longest), so they end at different times."""
        return self.mode != PAD_BATCH

    def at(self, length: int) -> InputSpec:
        """The model's spec with its free axes `length` long (remembered: a handful of lengths recur)."""
        spec = self._at.get(length)
        if spec is None:
            spec = self._at[length] = self.spec.at_length(length)
        return spec

    # -- into a slice ----------------------------------------------------------------------------------------
    def rows(self, requests: list[Request], offset: int, rows: int) -> tuple[np.ndarray, int]:
        """Rows [offset, offset + rows) of a batch of `requests`, padded to `slice_length`: (the array a worker
        takes, one row per sample, and that length)."""
        pieces = _pieces(requests, offset, rows)
        length = self._longest(requests, pieces)
        padded = [self._padded(request, low, high, length) for request, low, high in pieces]
        return (padded[0] if len(padded) == 1 else np.concatenate(padded)), length

    def slice_length(self, requests: list[Request], offset: int, rows: int) -> int:
        """The length rows [offset, offset + rows) of a batch of `requests` are padded to: the longest of them (in
        the mode PAD_BATCH, the batch's longest)."""
        return self._longest(requests, _pieces(requests, offset, rows))

    def _longest(self, requests: list[Request], pieces: list[tuple[Request, int, int]]) -> int:
        if self.mode == PAD_BATCH:
            return max(request.length for request in requests)
        return max(request.length for request, _, _ in pieces)

    def _padded(self, request: Request, low: int, high: int, length: int) -> np.ndarray:
        spec = self.at(request.length)
        if not spec.records:
            array = np.frombuffer(request.payload, dtype=DTYPES[spec.dtype]).reshape(request.samples, *spec.shape)
            return _pad(array[low:high], spec.named_inputs()[0], length)
        records = np.frombuffer(request.payload, dtype=np.uint8).reshape(request.samples, -1)[low:high]
        arrays = unpack_records(records, [(t.dtype, t.shape) for t in spec.inputs])
        return pack_records([_pad(array, tensor, length) for array, tensor in zip(arrays, spec.inputs, strict=True)])

    # -- out of a slice --------------------------------------------------------------------------------------
    def cut(self, output: np.ndarray, length: int, request_length: int) -> np.ndarray:
        """A request's rows of a slice's `output`, answered at the slice's `length`, at its own length."""
        outputs = self.spec.outputs
        if length == request_length or not any(t.free_axis is not None for t in outputs):
            return output
        if not self.spec.output_records:
            return _cut(output, outputs[0], request_length)
        arrays = unpack_records(output, [(t.dtype, t.shape) for t in self.at(length).outputs])
        pieces = [_cut(array, tensor, request_length) for array, tensor in zip(arrays, outputs, strict=True)]
        return pack_records(pieces)


def _pieces(requests: list[Request], offset: int, rows: int) -> list[tuple[Request, int, int]]:
    """Each request with rows in [offset, offset + rows) of the batch, and its own rows there (low, high)."""
    pieces: list[tuple[Request, int, int]] = []
    start = 0
    for request in requests:
        end = start + request.samples
        low, high = max(offset, start), min(offset + rows, end)
        if low < high:
            pieces.append((request, low - start, high - start))
        start = end
    return pieces


def _pad(array: np.ndarray, tensor: TensorSpec, length: int) -> np.ndarray:
    """`array` (samples first) padded with zeros along `tensor`'s free axis to `length`."""
    if tensor.free_axis is None:
        return array
    axis = 1 + tensor.free_axis
    missing = length - array.shape[axis]
    if missing <= 0:
        return array
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, missing)
    return np.pad(array, widths)


def _cut(array: np.ndarray, tensor: TensorSpec, length: int) -> np.ndarray:
    """`array` (samples first) cut along `tensor`'s free axis to `length`."""
    if tensor.free_axis is None:
        return array
    index: list[slice] = [slice(None)] * array.ndim
    index[1 + tensor.free_axis] = slice(0, length)
    return np.ascontiguousarray(array[tuple(index)])

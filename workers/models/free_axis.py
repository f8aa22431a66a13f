"""A free axis on the workers' side (a text model's sequence, `TensorSpec.free_axis`): which outputs follow the
input's length, found by a second sample run at a shorter length, and the record layout of a batch padded to a
length. Numpy only, like `workers.models.spec`, so the daemon's side may read it too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from workers.models.spec import InputSpec, TensorSpec


def with_free_outputs(outputs: Sequence[TensorSpec], shorter: Sequence[tuple[int, ...]]) -> list[TensorSpec]:
    """`outputs` (found by a sample run at the longest length) with the axis that followed the input's length marked
    free: `shorter` holds their per-sample shapes from a run at a shorter length (a per-token output's sequence axis
    shrinks; a pooled one's does not)."""
    marked = []
    for tensor, shape in zip(outputs, shorter, strict=True):
        moved = [axis for axis, (long, short) in enumerate(zip(tensor.shape, shape, strict=True)) if long != short]
        marked.append(dataclasses.replace(tensor, free_axis=moved[0]) if len(moved) == 1 else tensor)
    return marked


def shorter_length(spec: InputSpec) -> int:
    """A length for the second sample run that tells a per-token output's axis (`with_free_outputs`)."""
    return max(spec.named_inputs()[0].min_length, spec.max_length // 2) if spec.max_length > 1 else 1


class LayoutsByLength:
    """A model's record layout of its inputs at each length a batch comes padded to (a worker's side of a free axis:
    the records' width tells the length, `InputSpec.length_of`), remembered."""

    def __init__(self, spec: InputSpec) -> None:
        self.spec = spec
        self.fixed = [(tensor.dtype, tensor.shape) for tensor in spec.inputs]
        self._by_length: dict[int, list[tuple[str, tuple[int, ...]]]] = {}

    def of(self, record_width: int) -> list[tuple[str, tuple[int, ...]]]:
        if not self.spec.ragged:
            return self.fixed
        length = self.spec.length_of((record_width,))
        layout = self._by_length.get(length)
        if layout is None:
            layout = [(tensor.dtype, tensor.shape) for tensor in self.spec.at_length(length).inputs]
            self._by_length[length] = layout
        return layout

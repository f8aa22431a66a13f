"""Requests and answers of named tensors (protocol version 2) on the daemon's side of the request path.

A model of several inputs is batched as records (`workers.models.spec.InputSpec`): each request's tensors are
checked by name against the model's and packed into one row of bytes per sample (the wire codec's
`pack_records`), so that the batcher, the splitter, shared memory and the gather move rows as they do for one
tensor. A model of several outputs answers records too, unpacked here into one frame per named output. A
version-1 request (one unnamed tensor) to a model of one input takes none of this: the frontend checks and
answers it as it always has, and a version-1 request to a model of several outputs is answered its first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packrat_daemon.requests.jobs import Completed
from packrat_daemon.wire.codec import DTYPES, pack_records, unpack_records
from packrat_daemon.wire.model_checks import check_against_model, check_named_input, check_tensors_against_model
from packrat_daemon.wire.server_replies import encode_tensors_result, encode_timed_result
from packrat_daemon.wire.server_side import InferRequest, ModelTensor, Tensor
from workers.messages import numpy_name
from workers.models.spec import DEFAULT_OUTPUT_NAME, InputSpec


def _shape(shape: tuple[int, ...], free_axis: int | None) -> list[int]:
    """A per-sample shape as `info` gives it: -1 along a free axis (its longest is the tensor's `max_length`)."""
    return [-1 if axis == free_axis else size for axis, size in enumerate(shape)]


class ModelTensors:
    """A model's named inputs and outputs, as the frontend checks requests against them and answers them."""

    def __init__(self, spec: InputSpec) -> None:
        self.inputs = [
            ModelTensor(t.name, t.dtype, t.shape, t.high, t.free_axis, t.min_length) for t in spec.named_inputs()
        ]
        self.spec = spec
        self.ragged = spec.ragged  # requests vary in length along a free axis (requests.ragged batches them)
        self.records = spec.records
        self.output_records = spec.output_records
        self.output_names = [t.name for t in spec.outputs] or [DEFAULT_OUTPUT_NAME]
        self.output_layout = [(t.dtype, t.shape) for t in spec.outputs]

    def describe(self) -> dict[str, Any]:
        """The `info` reply's `inputs` and `outputs` (an output's shape only where a sample run found it)."""
        inputs = [{"name": t.name, "dtype": t.dtype, "shape": _shape(t.shape, t.free_axis), "high": t.high}
                  for t in self.inputs]  # fmt: skip
        if self.ragged:
            for described_input, t in zip(inputs, self.inputs, strict=True):
                if t.free_axis is not None:
                    described_input["max_length"], described_input["min_length"] = t.shape[t.free_axis], t.min_length
        free = {t.name: t.free_axis for t in self.spec.outputs}
        outputs: list[dict[str, Any]] = [
            {"name": name, "dtype": dtype, "shape": _shape(shape, free.get(name))}
            for name, (dtype, shape) in zip(self.output_names, self.output_layout, strict=False)
        ] or [{"name": name} for name in self.output_names]
        described: dict[str, Any] = {"inputs": inputs, "outputs": outputs}
        if self.records:  # `input` is version 1's one tensor; a model of several takes none such: their first
            described["input"] = {key: inputs[0][key] for key in ("dtype", "shape", "high")}
        return described

    def checked(self, request: InferRequest, max_samples: int) -> InferRequest:
        """`request` checked against the model (ProtocolError, naming what to fix, if it does not fit): for a model
        of several inputs, with its tensors packed into records."""
        if not self.records:
            check_named_input(request, self.inputs[0].name)
            one = self.inputs[0]
            check_against_model(request, one.dtype, one.shape, max_samples, one.high, "", one.free_axis, one.min_length)
            return request
        payloads = check_tensors_against_model(request, self.inputs, max_samples)
        samples = request.shape[0]
        given = {tensor.name: tensor.shape for tensor in request.tensors or ()}
        arrays = [
            np.frombuffer(payload, dtype=DTYPES[t.dtype]).reshape(samples, *given[t.name][1:])
            for payload, t in zip(payloads, self.inputs, strict=True)
        ]
        packed = pack_records(arrays)
        return InferRequest(request.request_id, "uint8", packed.shape, packed.reshape(-1).data, request.timeout_ms)

    def length_of(self, request: InferRequest) -> int:
        """A checked request's length along the free axis (0: the model has none), from its (packed) shape."""
        return self.spec.length_of(request.shape[1:]) if self.ragged else 0

    def reply(self, done: Completed, named: bool, total_ms: float) -> list[Any]:
        """The reply frames for an answered request: every output by name (version 2), or the first alone."""
        request = done.request
        output = done.output
        layout = self.output_layout
        if request.length and self.output_records:  # records at its own length (requests.ragged cut them so)
            layout = [(t.dtype, t.shape) for t in self.spec.at_length(request.length).outputs]
        arrays = unpack_records(output, layout) if self.output_records else [output]
        if not named:
            first = arrays[0]
            return encode_timed_result(request.request_id, numpy_name(first.dtype), first.shape, first,
                                       done.queue_ms, done.compute_ms, total_ms, done.instances)  # fmt: skip
        outputs = [
            Tensor(name, numpy_name(array.dtype), array.shape, array.reshape(-1).view(np.uint8).data)
            for name, array in zip(self.output_names, arrays, strict=False)
        ]
        return encode_tensors_result(
            request.request_id, outputs, done.queue_ms, done.compute_ms, total_ms, done.instances
        )

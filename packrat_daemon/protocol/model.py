"""The model the gateway serves, as the data plane describes it (`ModelSpec`, `TensorSpec`), an inference's inputs
and result, and the checks of a request's tensors against the model: the transports ask `check_tensor` before they
decode a tensor, and the data plane `sendable_inputs` before it sends them to the daemon.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from packrat_daemon.protocol.errors import OipError, Status

VERSION = "1"  # the one version of the one model a daemon serves


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # the OIP name
    shape: tuple[int, ...]  # one sample's, without the batch axis; -1 along a free axis (a sequence)
    max_length: int = 0  # the longest along the free axis (0: none)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": [-1, *self.shape]}

    def longest(self) -> tuple[int, ...]:
        """The per-sample shape at its longest (the free axis at `max_length`)."""
        return tuple(self.max_length if size == -1 else size for size in self.shape)

    def fits(self, sample_shape: tuple[int, ...]) -> bool:
        """Whether a sample of this shape fits: every fixed size equal, the free axis at most its longest."""
        if len(sample_shape) != len(self.shape):
            return False
        return all(want == got or (want == -1 and got <= self.max_length)
                   for want, got in zip(self.shape, sample_shape, strict=True))  # fmt: skip


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model: str  # the daemon's model spec
    runtime: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch: int
    max_message_bytes: int  # the daemon's limit on one request (info.limits)
    instances: int
    named: bool = False  # several inputs or outputs: sent to the daemon by name (its protocol version 2)
    max_delay_ms: float | None = None  # the daemon's batching delay (info.max_delay_ms, live): the config says it

    @property
    def input(self) -> TensorSpec:
        return self.inputs[0]

    @property
    def output(self) -> TensorSpec:
        return self.outputs[0]

    def input_named(self, name: str) -> TensorSpec | None:
        return next((tensor for tensor in self.inputs if tensor.name == name), None)


@dataclass(frozen=True)
class InferInput:
    name: str
    datatype: str
    array: np.ndarray


@dataclass(frozen=True)
class InferResult:
    model: ModelSpec
    request_id: str
    array: np.ndarray  # the first output answered
    started_ns: int
    queue_ns: int
    compute_ns: int
    input_ns: int
    outputs: tuple[tuple[TensorSpec, np.ndarray], ...] = ()  # every output answered, in the model's order

    def answered(self) -> tuple[tuple[TensorSpec, np.ndarray], ...]:
        return self.outputs or ((self.model.output, self.array),)


def default_model_name(spec: str) -> str:
    """The name a model is served as: builtin:resnet50 → resnet50, /mnt/models/model.pt2 → model,
    pkg.module:factory → factory."""
    tail = spec.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    return tail.split(".", 1)[0] if "." in tail and "/" in spec else tail


def sendable_inputs(
    spec: ModelSpec, inputs: list[InferInput], outputs: list[str] | None
) -> tuple[np.ndarray | dict[str, np.ndarray], str | None]:
    """What is sent to the daemon for `inputs`: one array (and "bfloat16" for a BF16 input), or for a model of
    several tensors an array per input name; INVALID_ARGUMENT or TOO_LARGE unless the inputs, and the outputs asked
    for, fit the model."""
    names = ", ".join(f"'{tensor.name}'" for tensor in spec.inputs)
    for output in outputs or ():
        if output not in {tensor.name for tensor in spec.outputs}:
            listed = ", ".join(f"'{tensor.name}'" for tensor in spec.outputs)
            raise OipError(Status.INVALID_ARGUMENT, f"unknown output '{output}'; the model's outputs are {listed}")
    if not spec.named:
        if len(inputs) != 1:
            raise OipError(Status.INVALID_ARGUMENT, f"the model takes one input, {names}; got {len(inputs)}")
        given = inputs[0]
        check_tensor(spec, given.name, given.datatype, given.array.shape)
        return given.array, "bfloat16" if given.datatype == "BF16" else None
    arrays: dict[str, np.ndarray] = {}
    for given in inputs:
        check_tensor(spec, given.name, given.datatype, given.array.shape)
        if given.name in arrays:
            raise OipError(Status.INVALID_ARGUMENT, f"input '{given.name}' is given twice")
        if given.datatype == "BF16":
            raise OipError(Status.INVALID_ARGUMENT, "bfloat16 inputs are served to models of one input only")
        arrays[given.name] = given.array
    missing = [tensor.name for tensor in spec.inputs if tensor.name not in arrays]
    if missing:
        raise OipError(Status.INVALID_ARGUMENT, f"input '{missing[0]}' is missing; the model takes {names}")
    counts = {array.shape[0] for array in arrays.values()}
    if len(counts) > 1:
        listed = ", ".join(f"{name} {array.shape[0]}" for name, array in arrays.items())
        raise OipError(
            Status.INVALID_ARGUMENT,
            f"the inputs have different numbers of samples ({listed}); each input's first axis counts the same",
        )
    return arrays, None


def check_tensor(spec: ModelSpec, name: str, datatype: str, shape: tuple[int, ...]) -> None:
    """INVALID_ARGUMENT or TOO_LARGE unless an input of this name, datatype and shape fits the model. The
    transports ask it before they decode a tensor, so no request makes them decode more than the largest
    one the model takes."""
    model_input = spec.input_named(name)
    if model_input is None:
        if len(spec.inputs) == 1:
            raise OipError(Status.INVALID_ARGUMENT, f"unknown input '{name}'; the model's input is '{spec.input.name}'")
        listed = ", ".join(f"'{tensor.name}'" for tensor in spec.inputs)
        raise OipError(Status.INVALID_ARGUMENT, f"unknown input '{name}'; the model's inputs are {listed}")
    if datatype != model_input.datatype:
        raise OipError(
            Status.INVALID_ARGUMENT,
            f"input '{name}' is {datatype}, but the model takes {model_input.datatype}; cast it",
        )
    if not model_input.fits(tuple(shape[1:])):
        free = f"; -1: any length up to {model_input.max_length}" if model_input.max_length else ""
        raise OipError(
            Status.INVALID_ARGUMENT,
            f"input '{name}' has shape {list(shape)}, but the model takes "
            f"[N, {', '.join(map(str, model_input.shape))}] (N samples{free})",
        )
    if shape[0] > spec.max_batch:
        raise OipError(
            Status.TOO_LARGE,
            f"input '{name}' has {shape[0]} samples; this server takes at most {spec.max_batch} a request: send fewer",
        )


def triton_config(spec: ModelSpec) -> dict[str, Any]:
    """Triton's model configuration (its JSON form) of `spec`: what `perf_analyzer` reads before it starts."""
    batching: dict[str, Any] = {}
    if spec.max_delay_ms is not None:
        batching["max_queue_delay_microseconds"] = round(spec.max_delay_ms * 1000)
    return {
        "name": spec.name,
        "platform": f"packrat_{spec.runtime}",
        "backend": "packrat",
        "max_batch_size": spec.max_batch,
        "input": [_config_tensor(tensor, "FORMAT_NONE") for tensor in spec.inputs],
        "output": [_config_tensor(tensor, None) for tensor in spec.outputs],
        # Packrat always batches across requests: present (even empty), it tells perf_analyzer so.
        "dynamic_batching": batching,
        "instance_group": [{"name": spec.name, "kind": "KIND_CPU", "count": spec.instances}],
        "parameters": {"packrat_model": {"string_value": spec.model}},
    }


def _config_tensor(tensor: TensorSpec, layout: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": tensor.name, "data_type": f"TYPE_{tensor.datatype}", "dims": list(tensor.shape)}
    if layout is not None:
        entry["format"] = layout
    return entry

"""What a model takes and what a runtime needs, known without importing torch or any runtime.

The daemon imports this module (to make sample inputs for its measurements and to list the installed
runtimes), and the daemon must stay light: numpy is the only third-party package imported here.
The workers use the same definitions, so the daemon and a worker can never disagree on a sample
input or on whether a runtime can start.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packrat_daemon.wire.codec import pack_records, record_bytes
from packrat_daemon.wire.errors import ConfigError, ModelSpecError
from workers.runtimes.registry import BY_NAME, RECORDS, RuntimeRecord, either
from workers.runtimes.registry import EMULATED as EMULATED  # the daemon's modules read it here

# The element types a model may declare (the wire protocol's dtypes; bfloat16 travels as its raw bits).
INPUT_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")


# The numeric precisions a model can be served at; "auto" lets the daemon choose among them by measurement,
# under the accuracy guard (packrat_daemon.measure.accuracy).
PRECISIONS = ("fp32", "bf16")
# Served only when asked for, never by "auto": int8 is post-training quantization, whose error depends on
# how well the calibration inputs stand for the real ones, which random samples cannot tell (docs/precision.md).
OPT_IN_PRECISIONS = ("int8",)
PRECISION_CHOICES = (*PRECISIONS, *OPT_IN_PRECISIONS, "auto")


# What a model spec names (workers.models.loading builds or loads each kind).
BUILTIN, ONNX_FILE, EXPORTED, TORCHSCRIPT, HUGGING_FACE, FUNCTION = (
    "builtin", "onnx", "exported", "torchscript", "huggingface", "function"
)  # fmt: skip
HF_PREFIX = "hf:"
SPEC_KINDS = (
    "builtin:NAME, a .pt2, .pt or .onnx file, a Hugging Face save_pretrained folder (hf:DIR or DIR), or module:function"
)


def model_kind(spec: str) -> str:
    """What `spec` names; ModelSpecError, listing the kinds, when it is none of them.

    A folder is a Hugging Face model when it holds the config.json `save_pretrained` writes: checked here, in
    the daemon, so that a folder that is not one is refused before any process starts.
    """
    if spec.startswith("builtin:"):
        return BUILTIN
    if spec.startswith(HF_PREFIX) or (Path(spec).is_dir() and (Path(spec) / "config.json").is_file()):
        return HUGGING_FACE
    if spec.endswith(".onnx"):
        return ONNX_FILE
    if spec.endswith(".pt2"):
        return EXPORTED
    if spec.endswith((".pt", ".ts", ".torchscript")):
        return TORCHSCRIPT
    if ":" in spec and not Path(spec).exists():
        return FUNCTION
    if Path(spec).is_dir():
        raise ModelSpecError(
            f"{spec} is a folder without a config.json, so not a Hugging Face save_pretrained folder; give {SPEC_KINDS}"
        )
    raise ModelSpecError(f"cannot tell what model {spec!r} is; give {SPEC_KINDS}")


def hf_folder(spec: str) -> Path:
    """The folder of a Hugging Face spec (`hf:DIR` or `DIR`)."""
    return Path(spec.removeprefix(HF_PREFIX))


# The names a tensor gets when the model gives it none: a model of one input and one output (protocol version 1's
# one unnamed tensor each way), and the positions of a tuple a model returns ("output_0", "output_1", ...).
DEFAULT_INPUT_NAME, DEFAULT_OUTPUT_NAME = "input", "output"
# How a batch of requests of several lengths is sliced (packrat_daemon.requests.ragged): sorted by length, cut by
# predicted cost, each slice padded to its own longest ("by-cost", the default); or as a server that does not plan
# by tokens would, in arrival order, cut by count and padded to the batch's longest ("pad-batch", the baseline).
RAGGED_MODES = ("by-cost", "pad-batch")
# The input that marks a sequence's real tokens (1) from its padding (0): Hugging Face's name for it.
MASK_INPUT = "attention_mask"


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor a model takes or returns: its dtype and per-sample shape.

    A free axis (a text model's sequence) varies from request to request: `shape` holds its largest size there, and
    every free axis of a model's inputs and outputs takes the one length a request has (`InputSpec.at_length`)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    high: int | None = None  # exclusive upper bound for integer inputs (token ids); None for outputs
    free_axis: int | None = None  # the per-sample axis whose size varies (up to shape[free_axis]); None: fixed
    min_length: int = 1  # the least size of the free axis

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorSpec:
        free = data.get("free_axis")
        return cls(str(data["name"]), data["dtype"], tuple(data["shape"]), data.get("high"),
                   None if free is None else int(free), int(data.get("min_length", 1)))  # fmt: skip

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "high": self.high}
        if self.free_axis is not None:
            data["free_axis"], data["min_length"] = self.free_axis, self.min_length
        return data

    def at_length(self, length: int) -> TensorSpec:
        """This tensor with its free axis (if any) at `length`."""
        if self.free_axis is None:
            return self
        shape = list(self.shape)
        shape[self.free_axis] = length
        return dataclasses.replace(self, shape=tuple(shape))

    def describe_shape(self) -> str:
        """The per-sample shape as `--input` writes it: `128`, `1..128`, `3x224x224`."""
        dims = [str(d) for d in self.shape]
        if self.free_axis is not None:
            dims[self.free_axis] = f"{self.min_length}..{self.shape[self.free_axis]}"
        return "x".join(dims)


@dataclass(frozen=True)
class InputSpec:
    """What a model takes, and, where a sample run found them, what it returns.

    `dtype`, `shape` and `high` are the one tensor each request row holds: the model's input when it takes one,
    else the record of its several `inputs` (uint8 bytes: each sample's bytes of every input in turn, the wire
    codec's `pack_records`), so that the daemon batches, splits and gathers rows of either the same way. A model
    of several `outputs` answers records of them too; one of a single output answers it as it is.
    """

    dtype: str  # protocol dtype name, e.g. "float32", "int64"
    shape: tuple[int, ...]  # per sample (at the longest, for a model of a free axis)
    high: int | None = None  # exclusive upper bound for integer inputs (token ids)
    inputs: tuple[TensorSpec, ...] = ()  # the named inputs (empty: one input, named DEFAULT_INPUT_NAME)
    outputs: tuple[TensorSpec, ...] = ()  # the named outputs (empty: one output, named DEFAULT_OUTPUT_NAME)
    free_axis: int | None = None  # one input's free axis (TensorSpec.free_axis); records carry theirs in `inputs`
    min_length: int = 1

    @classmethod
    def of(cls, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec] = ()) -> InputSpec:
        """The spec of a model taking `inputs` (one or several, named) and returning `outputs`."""
        if not inputs:
            raise ModelSpecError("a model takes at least one input")
        names = [tensor.name for tensor in inputs]
        if len(set(names)) != len(names):
            raise ModelSpecError(f"the model's inputs must have distinct names, got {', '.join(names)}")
        for tensor in inputs:
            if tensor.free_axis is not None and tensor.min_length != inputs[0].min_length:
                raise ModelSpecError("a model's free axes vary together: give them one least length")
        if len(inputs) == 1:
            one = inputs[0]
            return cls(one.dtype, one.shape, one.high, tuple(inputs), tuple(outputs), one.free_axis, one.min_length)
        layout = [(tensor.dtype, tensor.shape) for tensor in inputs]
        return cls("uint8", (record_bytes(layout),), None, tuple(inputs), tuple(outputs))

    @property
    def records(self) -> bool:
        """Whether a request row is a record of several inputs."""
        return len(self.inputs) > 1

    @property
    def output_records(self) -> bool:
        """Whether a worker answers records of several outputs."""
        return len(self.outputs) > 1

    def named_inputs(self) -> tuple[TensorSpec, ...]:
        return self.inputs or (
            TensorSpec(DEFAULT_INPUT_NAME, self.dtype, self.shape, self.high, self.free_axis, self.min_length),
        )

    def with_outputs(self, outputs: Sequence[TensorSpec]) -> InputSpec:
        return dataclasses.replace(self, outputs=tuple(outputs))

    # -- a free axis: requests of any length up to the longest --------------------------------------------------
    @property
    def ragged(self) -> bool:
        """Whether requests vary in length along a free axis (a text model's sequence)."""
        return any(tensor.free_axis is not None for tensor in self.named_inputs())

    @property
    def max_length(self) -> int:
        """The longest a request may be along the free axis (0: the model has none)."""
        free = [t.shape[t.free_axis] for t in self.named_inputs() if t.free_axis is not None]
        return free[0] if free else 0

    @property
    def masked(self) -> bool:
        """Whether the model takes an attention mask: padding a sequence (zeros in the mask too) then leaves its
        answer as it was; a model without one answers a padded sequence differently, so only requests of one
        length share a batch."""
        return any(tensor.name == MASK_INPUT for tensor in self.named_inputs())

    def at_length(self, length: int) -> InputSpec:
        """The spec of a batch whose free axes are `length` long: fixed-shape, for a sample or a record layout."""
        if not self.ragged:
            return self
        inputs = [tensor.at_length(length) for tensor in self.named_inputs()]
        outputs = [tensor.at_length(length) for tensor in self.outputs]
        if not self.records:
            one = inputs[0]
            named = tuple(inputs) if self.inputs else ()
            return dataclasses.replace(self, shape=one.shape, inputs=named, outputs=tuple(outputs))
        return InputSpec.of(inputs, outputs)

    def length_of(self, sample_shape: Sequence[int]) -> int:
        """The free axis's length in a batch of per-sample shape `sample_shape` (a record's bytes, for records)."""
        if not self.records:
            axis = self.named_inputs()[0].free_axis
            return 0 if axis is None else int(sample_shape[axis])
        fixed = record_bytes([(t.dtype, t.at_length(0).shape if t.free_axis is not None else t.shape)
                              for t in self.inputs])  # fmt: skip
        per_step = record_bytes([(t.dtype, t.at_length(1).shape) for t in self.inputs if t.free_axis is not None])
        if per_step == 0:
            return 0
        return (int(sample_shape[0]) - fixed) // per_step

    @classmethod
    def parse(cls, text: str) -> InputSpec:
        """`DTYPE:D1xD2...`, a free axis written `LOW..HIGH` (e.g. `int64:1..512`: any length up to 512)."""
        dtype, _, dims = text.partition(":")
        free_axis, min_length = None, 1
        shape_list = []
        try:
            for axis, dim in enumerate(dims.split("x") if dims else ()):
                if ".." in dim:
                    if free_axis is not None:
                        raise ValueError
                    low, _, high = dim.partition("..")
                    free_axis, min_length = axis, int(low)
                    dim = high
                shape_list.append(int(dim))
        except ValueError:
            raise ModelSpecError(
                f"cannot read input {text!r}; write DTYPE:D1xD2..., e.g. float32:3x224x224, with at most one free "
                "axis written LOW..HIGH, e.g. int64:1..512"
            ) from None
        shape = tuple(shape_list)
        if dtype not in INPUT_DTYPES or any(d < 1 for d in shape) or not 1 <= min_length <= max(shape or (1,)):
            raise ModelSpecError(
                f"cannot read input {text!r}; dtype must be one of {', '.join(INPUT_DTYPES)} and dims >= 1 "
                "(a free axis LOW..HIGH with 1 <= LOW <= HIGH)"
            )
        return cls(dtype, shape, free_axis=free_axis, min_length=min_length)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputSpec:
        inputs = tuple(TensorSpec.from_json(item) for item in data.get("inputs") or ())
        outputs = tuple(TensorSpec.from_json(item) for item in data.get("outputs") or ())
        free = data.get("free_axis")
        return cls(data["dtype"], tuple(data["shape"]), data.get("high"), inputs, outputs,
                   None if free is None else int(free), int(data.get("min_length", 1)))  # fmt: skip

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {"dtype": self.dtype, "shape": list(self.shape), "high": self.high}
        if self.inputs:
            data["inputs"] = [tensor.to_json() for tensor in self.inputs]
        if self.outputs:
            data["outputs"] = [tensor.to_json() for tensor in self.outputs]
        if self.free_axis is not None:
            data["free_axis"], data["min_length"] = self.free_axis, self.min_length
        return data


def sample_input(spec: InputSpec, batch: int, seed: int = 0) -> np.ndarray:
    """A random batch that matches the model's declared input (for warm-up and measurements): for a model of
    several inputs, the records of a sample of each.

    The values do not change a dense model's compute time; a fixed seed makes them reproducible.
    """
    if spec.records:
        return pack_records([_sample(tensor.dtype, tensor.shape, tensor.high, batch, seed + k)
                             for k, tensor in enumerate(spec.inputs)])  # fmt: skip
    return _sample(spec.dtype, spec.shape, spec.high, batch, seed)


def _sample(dtype: str, sample_shape: tuple[int, ...], high: int | None, batch: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (batch, *sample_shape)
    if dtype == "bfloat16":
        # numpy has no bfloat16: the protocol carries its raw bits as uint16 (the top half of a float32).
        return (rng.standard_normal(shape, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if dtype.startswith("float"):
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, high or 100, shape).astype(dtype)


# Every runtime's facts are its record in the registry (workers.runtimes.registry); the tables below are read from
# it. RUNTIME_REQUIREMENTS: the packages each needs, its pyproject extra and whether it computes, torch first.
RUNTIME_REQUIREMENTS: dict[str, RuntimeRecord] = dict(BY_NAME)
# The precisions each runtime can run (fp32 everywhere), and why a runtime refuses bf16.
RUNTIME_PRECISIONS: dict[str, tuple[str, ...]] = {record.name: record.precisions for record in RECORDS}
PRECISION_REFUSALS: dict[str, str] = {r.name: r.precision_refusal for r in RECORDS if r.precision_refusal is not None}
_INT8 = [record for record in RECORDS if "int8" in record.precisions]
INT8_REFUSAL = (
    f"int8 is served by --runtime {either([r.name for r in _INT8])}, quantized with NNCF on your --calibration "
    f"inputs ({either([r.install for r in _INT8])})"
)


def runtime_precisions(runtime: str) -> tuple[str, ...]:
    """The precisions `runtime` can serve at (a runtime not in the table serves fp32 only)."""
    return RUNTIME_PRECISIONS.get(runtime, ("fp32",))


def check_precision(runtime: str, precision: str) -> None:
    """Raise ConfigError, saying what to do, unless `runtime` can serve at `precision`."""
    if precision not in (*PRECISIONS, *OPT_IN_PRECISIONS):
        raise ConfigError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISION_CHOICES)}")
    if precision not in runtime_precisions(runtime):
        why = INT8_REFUSAL if precision == "int8" else PRECISION_REFUSALS.get(runtime)
        why = why or f"runtime {runtime} serves {', '.join(runtime_precisions(runtime))}"
        raise ConfigError(f"runtime {runtime} cannot serve {precision}: {why}; or serve --precision fp32")


def installed(package: str) -> bool:
    """Whether `package` can be imported, without importing it."""
    # find_spec instead of import: importing onnxruntime, openvino or NNCF starts threads or loads torch, and
    # this runs in the template before it forks and in the daemon, which has no use for them.
    # sys.modules[name] = None (how tests hide a package) counts as missing.
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def missing_package(runtime: str) -> str | None:
    """The first package `runtime` needs that is not installed; None when it can start."""
    return next((package for package in RUNTIME_REQUIREMENTS[runtime].packages if not installed(package)), None)


def available_runtimes() -> list[str]:
    """The runtimes that compute and whose packages are all installed, torch first."""
    return [
        name for name, needs in RUNTIME_REQUIREMENTS.items() if not needs.emulated and missing_package(name) is None
    ]


# The runtimes that can load each kind of model when it is not all of them: an ONNX file needs no PyTorch model,
# and PyTorch cannot run one.
KIND_RUNTIMES: dict[str, tuple[str, ...]] = {ONNX_FILE: tuple(r.name for r in RECORDS if r.onnx_files)}


def model_runtimes(spec: str, runtimes: list[str]) -> list[str]:
    """Those of `runtimes` that can load `spec`, in their order."""
    able = KIND_RUNTIMES.get(model_kind(spec))
    return runtimes if able is None else [name for name in runtimes if name in able]


def check_model_runtime(spec: str, runtime: str) -> None:
    """Raise ConfigError, saying which runtimes to use, unless `runtime` can load `spec` (`auto`: unless none of
    those that can is installed)."""
    able = KIND_RUNTIMES.get(model_kind(spec))
    if able is None:
        return
    computing = [name for name in able if not RUNTIME_REQUIREMENTS[name].emulated]
    if runtime == "auto" and not model_runtimes(spec, available_runtimes()):
        installs = " or ".join(RUNTIME_REQUIREMENTS[name].install for name in computing)
        raise ConfigError(f"{spec} is served by {' or '.join(computing)}, and neither is installed: {installs}")
    if runtime != "auto" and runtime.partition(":")[0] not in able:
        raise ConfigError(
            f"runtime {runtime} cannot load {spec}: it is served by {' or '.join(computing)}; "
            f"give --runtime {', '.join(computing)} or auto"
        )


def check_runtime(name: str) -> None:
    """Raise ConfigError, saying what to install, unless runtime `name` exists and its packages are installed."""
    requirements = RUNTIME_REQUIREMENTS.get(name)
    if requirements is None:
        raise ConfigError(f"unknown runtime {name!r}; available: {', '.join(RUNTIME_REQUIREMENTS)}")
    missing = missing_package(name)
    if missing is not None:
        raise ConfigError(f"runtime {name} needs the {missing} package: {requirements.install}")

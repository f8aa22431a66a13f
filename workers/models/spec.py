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


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor a model takes or returns: its dtype and per-sample shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    high: int | None = None  # exclusive upper bound for integer inputs (token ids); None for outputs

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorSpec:
        return cls(str(data["name"]), data["dtype"], tuple(data["shape"]), data.get("high"))

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "high": self.high}


@dataclass(frozen=True)
class InputSpec:
    """What a model takes, and, where a sample run found them, what it returns.

    `dtype`, `shape` and `high` are the one tensor each request row holds: the model's input when it takes one,
    else the record of its several `inputs` (uint8 bytes: each sample's bytes of every input in turn, the wire
    codec's `pack_records`), so that the daemon batches, splits and gathers rows of either the same way. A model
    of several `outputs` answers records of them too; one of a single output answers it as it is.
    """

    dtype: str  # protocol dtype name, e.g. "float32", "int64"
    shape: tuple[int, ...]  # per sample
    high: int | None = None  # exclusive upper bound for integer inputs (token ids)
    inputs: tuple[TensorSpec, ...] = ()  # the named inputs (empty: one input, named DEFAULT_INPUT_NAME)
    outputs: tuple[TensorSpec, ...] = ()  # the named outputs (empty: one output, named DEFAULT_OUTPUT_NAME)

    @classmethod
    def of(cls, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec] = ()) -> InputSpec:
        """The spec of a model taking `inputs` (one or several, named) and returning `outputs`."""
        if not inputs:
            raise ModelSpecError("a model takes at least one input")
        names = [tensor.name for tensor in inputs]
        if len(set(names)) != len(names):
            raise ModelSpecError(f"the model's inputs must have distinct names, got {', '.join(names)}")
        if len(inputs) == 1:
            one = inputs[0]
            return cls(one.dtype, one.shape, one.high, tuple(inputs), tuple(outputs))
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
        return self.inputs or (TensorSpec(DEFAULT_INPUT_NAME, self.dtype, self.shape, self.high),)

    def with_outputs(self, outputs: Sequence[TensorSpec]) -> InputSpec:
        return dataclasses.replace(self, outputs=tuple(outputs))

    @classmethod
    def parse(cls, text: str) -> InputSpec:
        dtype, _, dims = text.partition(":")
        try:
            shape = tuple(int(d) for d in dims.split("x")) if dims else ()
        except ValueError:
            raise ModelSpecError(f"cannot read input {text!r}; write DTYPE:D1xD2..., e.g. float32:3x224x224") from None
        if dtype not in INPUT_DTYPES or any(d < 1 for d in shape):
            raise ModelSpecError(
                f"cannot read input {text!r}; dtype must be one of {', '.join(INPUT_DTYPES)} and dims >= 1"
            )
        return cls(dtype, shape)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputSpec:
        inputs = tuple(TensorSpec.from_json(item) for item in data.get("inputs") or ())
        outputs = tuple(TensorSpec.from_json(item) for item in data.get("outputs") or ())
        return cls(data["dtype"], tuple(data["shape"]), data.get("high"), inputs, outputs)

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {"dtype": self.dtype, "shape": list(self.shape), "high": self.high}
        if self.inputs:
            data["inputs"] = [tensor.to_json() for tensor in self.inputs]
        if self.outputs:
            data["outputs"] = [tensor.to_json() for tensor in self.outputs]
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

"""Every runtime a worker can run a model through, one record each: every fact about a runtime that the rest of
Packrat reads, in one place (torch, onnxruntime, openvino and emulated, each in `RECORDS` below).

The tables the rest of Packrat reads are derived from `RECORDS`, never written beside it: the packages to check
and the install hint (`workers.models.spec.RUNTIME_REQUIREMENTS`), the precisions and why one is refused
(`spec.runtime_precisions`, `spec.check_precision`), the model files it loads (`spec.KIND_RUNTIMES`), the file a
conversion writes for it (`workers.models.cache.ARTIFACTS`), the libraries whose versions a saved profile holds
for (`packrat_daemon.ops.state_identity.LIBRARIES`), the class `make_runtime` builds (`workers.runtimes`) and the
runtimes the `runtime` setting names. `workers.runtimes.testing.RuntimeContract` checks each record against its
runtime. A new runtime is its module, its record here and its contract test (docs/architecture.md, "A new
runtime").

This module imports nothing of Packrat and no runtime's package, so that every module may read it: the class is
named, and imported only when a runtime is made.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

EMULATED = "emulated"


@dataclass(frozen=True)
class RuntimeRecord:
    """One runtime: what it is, what it needs, what it serves and what it reads."""

    name: str  # --runtime NAME, the `name` of its class, its rows' label in a profile
    runtime: str  # its class, MODULE:CLASS (a `workers.runtimes.base.Runtime`), imported when one is made
    summary: str  # what it is, in a few words
    packages: tuple[str, ...]  # every package it imports, in order; the first one missing is named in the error
    extra: str | None = None  # the pyproject extra that installs them (None: a core dependency)
    # The libraries whose version changes what it measures: a saved profile is served again only on the same
    # versions (packrat_daemon.ops.state_identity). The ONNX and OpenVINO runtimes run models torch exported.
    libraries: tuple[str, ...] = ()
    artifact: str | None = None  # the file a conversion writes for it in the model cache (None: it loads the spec)
    precisions: tuple[str, ...] = ("fp32",)  # what it can serve at (workers.models.spec.PRECISION_CHOICES)
    precision_refusal: str | None = None  # why it serves no bf16, said to a user who asks for it
    onnx_files: bool = True  # it can serve an ONNX file (--model m.onnx); PyTorch cannot run one
    emulated: bool = False  # computes nothing (a measuring instrument): never a candidate of --runtime auto

    @property
    def install(self) -> str:
        return f"pip install -e '.[{self.extra}]'" if self.extra else "pip install -e ."

    def runtime_class(self) -> Any:
        """Its class (the runtime's module imported now; none imports its package before a runtime is made)."""
        module, _, name = self.runtime.partition(":")
        return getattr(importlib.import_module(module), name)


# Torch first: it is always installed, and `workers.models.spec.available_runtimes` keeps this order.
RECORDS: tuple[RuntimeRecord, ...] = (
    RuntimeRecord(
        "torch",
        "workers.runtimes.torch_runtime:TorchRuntime",
        "PyTorch eager (the default); re-threads in place",
        packages=("torch",),
        libraries=("torch",),
        precisions=("fp32", "bf16"),
        onnx_files=False,
    ),
    # The model is exported to ONNX (onnx, onnxscript) before either of the next two can load it.
    RuntimeRecord(
        "onnxruntime",
        "workers.runtimes.onnx_runtime:OnnxRuntime",
        "ONNX Runtime on the model exported to ONNX",
        packages=("onnxruntime", "onnx", "onnxscript"),
        extra="onnx",
        libraries=("torch", "onnxruntime"),
        artifact="model.onnx",
        # ONNX Runtime's CPU provider runs a float32 model in float32 on x86: its bfloat16 fast-math GEMM is for
        # Arm only, so it has no path to the matrix units.
        precision_refusal="ONNX Runtime's CPU provider runs float32 models in float32 on x86 (its bfloat16 GEMM is "
        "for Arm only), so it cannot use the matrix units; serve bf16 with --runtime torch or openvino",
    ),
    RuntimeRecord(
        "openvino",
        "workers.runtimes.openvino_runtime:OpenVinoRuntime",
        "OpenVINO on the model converted to its IR",
        packages=("openvino", "onnx", "onnxscript"),
        extra="openvino",
        libraries=("torch", "openvino"),
        artifact="model.xml",
        # int8 is NNCF's post-training quantization of the OpenVINO model (workers.models.quantize).
        precisions=("fp32", "bf16", "int8"),
    ),
    # Workers that wait the profile's latencies instead of computing (workers.runtimes.emulated): needs nothing,
    # and its identity is the profile it waits, not a library's version.
    RuntimeRecord(
        EMULATED,
        "workers.runtimes.emulated:EmulatedRuntime",
        "workers that compute nothing (a measuring instrument)",
        packages=(),
        emulated=True,
    ),
)
BY_NAME: dict[str, RuntimeRecord] = {record.name: record for record in RECORDS}


def computing() -> tuple[str, ...]:
    """The runtimes that compute (every one but the emulated), torch first."""
    return tuple(record.name for record in RECORDS if not record.emulated)


def either(names: tuple[str, ...] | list[str]) -> str:
    """`a, b or c`: names as a sentence says them."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"

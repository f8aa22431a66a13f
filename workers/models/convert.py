"""Convert one model for ONNX Runtime or OpenVINO and check it against PyTorch.

    python -m workers.models.convert --model SPEC --runtime onnxruntime|openvino --out PATH [--input DTYPE:DIMS]

Writes PATH (model.onnx, or model.xml + model.bin) and meta.json beside it. Run by `workers.models.cache`
in a subprocess, never in the template: exporting and checking a model runs it, which starts thread pools.

The ONNX export uses torch.onnx.export's dynamo exporter (the default in torch 2.13) with a dynamic batch
axis; models it cannot capture (TorchScript files, some data-dependent code) fall back to the TorchScript
exporter with dynamic_axes. Both were checked on the built-in ResNet-50 and BERT-base wrappers. A model of
several inputs or outputs is exported with each under its name (the runtimes feed and read them by name). The
export is made once for both runtimes and kept in the cache (`workers.models.cache.ensure_exported`): ONNX
Runtime serves that file, OpenVINO's IR is converted from it, so both serve the same graph, and whichever
runtime is converted second skips the export. Every conversion is run at two batch sizes other than the
export's example and compared with PyTorch before it is accepted.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from packrat_daemon.wire.codec import unpack_records
from workers.models.cache import (
    ATOL,
    CHECK_BATCHES,
    EXPORT_OPSETS,
    RTOL,
    ConversionError,
    converter_main,
    ensure_exported,
)
from workers.models.loading import LoadedModel, load_model
from workers.models.outputs import Served, output_keys
from workers.models.spec import sample_input
from workers.runtimes import make_runtime
from workers.runtimes.base import SessionRuntime

EXAMPLE_BATCH = 2  # not one of CHECK_BATCHES (the agreement check's, in workers.models.cache)


def main(argv: Sequence[str] | None = None) -> int:
    help_model, help_input = "model spec, as for packrat serve", "input override, e.g. float32:3x224x224"
    return converter_main(argv, "workers.models.convert", __doc__ or "", convert, help_model, help_input)


def convert(spec: str, input_override: str | None, runtime: str, out: Path) -> dict:
    model = load_model(spec, input_override)
    if model.input.dtype == "bfloat16":
        raise ConversionError(
            f"runtime {runtime} cannot serve {spec}: its input is bfloat16, which numpy (and so this runtime's"
            " Python API) has no type for; serve it with --runtime torch"
        )
    out.parent.mkdir(parents=True, exist_ok=True)

    def export(path: Path) -> dict:
        exporter = export_onnx(model, path)
        return {"model": spec, "input_override": input_override, "input": model.input.to_json(),
                "exporter": exporter, "torch": torch.__version__}  # fmt: skip

    exported = ensure_exported(spec, input_override, export)  # the other runtime's conversion may have made it
    if runtime == "onnxruntime":
        share_export(exported.path, out)
    else:
        onnx_to_openvino(exported.path, out)
    errors = check_against_torch(model, runtime, out)
    return {
        "model": spec,
        "input_override": input_override,
        "runtime": runtime,
        "input": model.input.to_json(),
        "notes": list(model.notes),
        "exporter": exported.meta["exporter"],
        "onnx_export": exported.path.parent.name,
        "max_abs_error": errors,
        "tolerance": {"rtol": RTOL, "atol": ATOL},
        "torch": torch.__version__,
    }


def share_export(source: Path, out: Path) -> None:
    """The export's files (model.onnx as `out`, its external data under its own name, which model.onnx refers
    to) into ONNX Runtime's entry: hard links, since neither entry is written again once in place, so the
    weights are on disk once; copies where the file system cannot link them."""
    for path in sorted(source.parent.iterdir()):
        if path.name == "meta.json" or not path.is_file():
            continue
        target = out if path == source else out.parent / path.name
        try:
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)


class _Named(torch.nn.Module):
    """A model of several inputs or outputs as ONNX takes it: each input a tensor of its own, in the spec's
    order, each output one of a tuple (the records a worker answers are PyTorch's side only)."""

    def __init__(self, served: Served) -> None:
        super().__init__()
        self.served = served

    def forward(self, *inputs: torch.Tensor) -> Any:
        served = self.served
        names = served.names
        output = served.model(**dict(zip(names, inputs, strict=True))) if served.by_name else served.model(*inputs)
        keys = served.keys
        if isinstance(output, torch.Tensor):
            return output
        return tuple(output[key] for key in keys) if keys else output[output_keys(output)[0]]


def export_onnx(model: LoadedModel, path: Path) -> str:
    """Export with a dynamic batch axis on every input, each input and output under its name; returns which
    exporter succeeded."""
    module = model.module
    if not isinstance(module, torch.nn.Module):
        raise ConversionError(f"{model.name}: only a torch.nn.Module exports to ONNX, not a {type(module).__name__}")
    spec = model.input
    if isinstance(module, Served):
        module = _Named(module)
        inputs = [tensor.name for tensor in spec.named_inputs()]
        samples = [sample_input(dataclasses.replace(spec, inputs=(), outputs=(), dtype=t.dtype, shape=t.shape,
                                                    high=t.high), EXAMPLE_BATCH, seed=k)
                   for k, t in enumerate(spec.named_inputs())]  # fmt: skip
        example = tuple(torch.from_numpy(sample) for sample in samples)
    else:
        inputs = ["input"]
        example = (torch.from_numpy(sample_input(spec, EXAMPLE_BATCH)),)
    outputs = [tensor.name for tensor in spec.outputs] or ["output"]
    batch = torch.export.Dim("batch", min=1)
    dynamic: Any = ({0: batch},) if not isinstance(module, _Named) else {"inputs": tuple({0: batch} for _ in inputs)}
    try:
        torch.onnx.export(
            module,
            example,
            str(path),
            dynamo=True,
            dynamic_shapes=dynamic,
            opset_version=EXPORT_OPSETS["dynamo"],
            input_names=inputs,
            output_names=outputs,
        )
        return "dynamo"
    except Exception as exc:  # any capture failure: try the older exporter before giving up
        print(f"dynamo export failed ({type(exc).__name__}: {exc}); trying the TorchScript exporter", file=sys.stderr)
    for stale in path.parent.glob(path.name + "*"):
        stale.unlink()
    axes = {name: {0: "batch"} for name in (*inputs, *outputs)}
    torch.onnx.export(
        module,
        example,
        str(path),
        dynamo=False,
        dynamic_axes=axes,
        opset_version=EXPORT_OPSETS["torchscript"],
        input_names=inputs,
        output_names=outputs,
    )
    return "torchscript"


def onnx_to_openvino(onnx_path: Path, out: Path) -> None:
    import openvino as ov

    # compress_to_fp16 would halve the file but round the weights: keep float32 to agree with PyTorch.
    ov.save_model(ov.convert_model(str(onnx_path)), str(out), compress_to_fp16=False)


def check_against_torch(model: LoadedModel, runtime: str, path: Path) -> dict[str, float]:
    """Run the converted model beside PyTorch; refuse it if they disagree beyond the tolerance."""
    converted = make_runtime(runtime)
    assert isinstance(converted, SessionRuntime), f"{runtime} converts nothing"
    converted.use_file(path, model.input)
    converted.set_threads(1)
    errors: dict[str, float] = {}
    layout = [(tensor.dtype, tensor.shape) for tensor in model.input.outputs]
    for batch in CHECK_BATCHES:
        data = sample_input(model.input, batch, seed=batch)
        with torch.inference_mode():
            expected_all = model.module(torch.from_numpy(data)).numpy()
        got_all = converted.run(data)
        if got_all.shape != expected_all.shape:
            raise ConversionError(
                f"{runtime} gives shape {got_all.shape} at batch {batch}; PyTorch gives {expected_all.shape}"
            )
        pairs = [(got_all, expected_all)]
        if model.input.output_records:  # every output, each on its own scale
            pairs = list(zip(unpack_records(got_all, layout), unpack_records(expected_all, layout), strict=True))
        for got, expected in pairs:
            error = float(np.max(np.abs(got.astype(np.float64) - expected))) if expected.size else 0.0
            errors[str(batch)] = max(error, errors.get(str(batch), 0.0))
            bound = ATOL + RTOL * float(np.max(np.abs(expected))) if expected.size else ATOL
            if not error <= bound:
                raise ConversionError(
                    f"{runtime} disagrees with PyTorch at batch {batch}: max abs error {error:.3g} > {bound:.3g}"
                    f" (rtol {RTOL} of the output's scale + atol {ATOL})"
                )
    return errors


if __name__ == "__main__":
    sys.exit(main())

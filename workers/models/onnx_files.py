"""ONNX files (`--model m.onnx`), served by ONNX Runtime and OpenVINO with no PyTorch model behind them.

    python -m workers.models.onnx_files --model PATH.onnx --runtime onnxruntime|openvino --out PATH [--input ...]

Run by `workers.models.cache` in a subprocess, like `workers.models.convert` (checking a model runs it, and
the template must not start a thread pool before it forks). It reads the input and outputs from the graph,
writes the model for the runtime into the cache entry (the file itself for ONNX Runtime, its external data
included, so that a file rewritten while the daemon serves never reaches a worker; OpenVINO's IR converted
from it for OpenVINO), runs it at two batch sizes, and writes meta.json. OpenVINO's IR is compared with ONNX
Runtime on the same file (the reference, at fp32) where ONNX Runtime is installed, within the converter's
tolerance; ONNX Runtime's copy is the file itself, so it is only checked to run with a free batch axis.

The graph's inputs are its inputs that are not initializers, each served under its name. Each one's first
axis is the batch and must be free (a name or unknown); the others are read from the graph, or from `--input`
where they are free too (for several inputs, `--input` gives the shape they share). An integer input that
indexes an embedding table (a Gather on an initializer) is declared below the table's size, so that sample
inputs are valid token ids. Every output is served, named, its per-sample shape learned by running the model
once; one whose first axis is not the batch is left out, and the log says so.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packrat_daemon.wire.codec import ITEMSIZE
from packrat_daemon.wire.errors import ModelSpecError
from workers.models.cache import ATOL, CHECK_BATCHES, RTOL, ConversionError, converter_main
from workers.models.free_axis import shorter_length, with_free_outputs
from workers.models.spec import INPUT_DTYPES, InputSpec, TensorSpec, installed, sample_input

EXTERNAL_DATA = "model.onnx.data"


def read_graph(path: Path) -> Any:
    """The graph, without its weights (a header read: external data is not loaded)."""
    import onnx

    if not path.is_file():
        raise ModelSpecError(f"model file {path} does not exist")
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and others: say what was expected
        raise ModelSpecError(f"{path} is not an ONNX model ({type(exc).__name__}: {exc})") from exc


def graph_input(model: Any, spec: str, override: InputSpec | None) -> tuple[str, InputSpec]:
    """The graph's first input's name, and what a sample of every input is (checked against `override`)."""
    tensors = graph_inputs(model, spec, override)
    return tensors[0].name, InputSpec.of(tensors)


def graph_inputs(model: Any, spec: str, override: InputSpec | None) -> list[TensorSpec]:
    """The graph's inputs, each named, in the graph's order (checked against `override`, if given)."""
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    if not inputs:
        raise ModelSpecError(f"{spec} takes no inputs (every graph input is an initializer)")
    return [_graph_tensor(model, spec, value, override, initializers) for value in inputs]


def _graph_tensor(
    model: Any, spec: str, value: Any, override: InputSpec | None, initializers: dict[str, Any]
) -> TensorSpec:
    from onnx import helper

    tensor = value.type.tensor_type
    try:
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    except (KeyError, ValueError):
        dtype = f"ONNX element type {tensor.elem_type}"
    if dtype not in INPUT_DTYPES or dtype == "bfloat16":
        raise ModelSpecError(f"{spec}'s input {value.name!r} is {dtype}, which this runtime cannot take")
    dims = [dim.dim_value if dim.HasField("dim_value") else None for dim in tensor.shape.dim]
    if not dims:
        raise ModelSpecError(f"{spec}'s input {value.name!r} has no batch axis (it is a scalar)")
    if dims[0] is not None:
        raise ModelSpecError(
            f"{spec}'s input {value.name!r} has a fixed batch size {dims[0]}; Packrat batches requests, so export "
            f"it with a free batch axis: torch.onnx.export(..., dynamo=True, dynamic_shapes=({{0: "
            f'torch.export.Dim("batch")}},)) or dynamic_axes={{"{value.name}": {{0: "batch"}}}}'
        )
    sample = dims[1:]
    if override is not None:
        fits = len(override.shape) == len(sample) and all(
            d in (None, o) and (d is None or axis != override.free_axis)
            for axis, (d, o) in enumerate(zip(sample, override.shape, strict=True))
        )
        if override.dtype != dtype or not fits:
            raise ModelSpecError(
                f"--input {override.dtype}:{override.named_inputs()[0].describe_shape()} does not fit {spec}'s input "
                f"{value.name!r}, {dtype} of per-sample shape {_axes(sample)}"
            )
        shape = override.shape
        free = override.free_axis, override.min_length
    elif None in sample:
        example = "x".join("1..512" if d is None else str(d) for d in sample)
        raise ModelSpecError(
            f"{spec}'s input {value.name!r} ({dtype}, per-sample shape {_axes(sample)}) has free axes; pass "
            f"--input {dtype}:{'x'.join('N' if d is None else str(d) for d in sample)} with their sizes, or one "
            f"axis left free up to its longest, e.g. --input {dtype}:{example} (a sequence)"
        )
    else:
        shape = tuple(d for d in sample if d is not None)  # every one is: checked above
        free = None, 1
    high = _embedding_rows(model, value.name, initializers)
    return TensorSpec(value.name, dtype, tuple(shape), high, *free)


def output_names(model: Any) -> list[str]:
    return [value.name for value in model.graph.output]


def _embedding_rows(model: Any, name: str, initializers: dict[str, Any]) -> int | None:
    """The rows of the table an integer input indexes (a Gather of an initializer's rows by it), else None."""
    for node in model.graph.node:
        axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), 0)
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == name and axis == 0:
            table = initializers.get(node.input[0])
            if table is not None and table.dims:
                return int(table.dims[0])
    return None


def _axes(dims: Sequence[int | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def prepare(spec: str, input_override: str | None, runtime: str, out: Path) -> dict[str, Any]:
    """Write the model for `runtime` at `out` and check it; the entry's meta."""
    source = Path(spec)
    model = read_graph(source)
    name, input_spec = graph_input(model, spec, InputSpec.parse(input_override) if input_override else None)
    outputs = output_names(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    if runtime == "onnxruntime":
        _copy_model(source, model, out)
    else:
        import openvino as ov

        # compress_to_fp16 would round the weights: keep float32, to agree with the file.
        ov.save_model(ov.convert_model(str(source)), str(out), compress_to_fp16=False)
    served, left_out = learn_outputs(runtime, out, input_spec, outputs)
    input_spec = input_spec.with_outputs(served)
    reference = source if runtime == "openvino" and installed("onnxruntime") else None
    errors = check(runtime, out, input_spec, reference)
    notes = []
    if left_out:
        notes.append(
            f"{spec} has {len(outputs)} outputs ({', '.join(outputs)}); {', '.join(left_out)} left out (the batch "
            f"is not its first axis); serving {', '.join(tensor.name for tensor in served)}"
        )
    return {
        "model": spec,
        "input_override": input_override,
        "runtime": runtime,
        "input": input_spec.to_json(),
        "input_name": name,
        "outputs": outputs,
        "exporter": "none: an ONNX file",
        "checked_against": "onnxruntime on the ONNX file" if reference else "nothing (the batch axis only)",
        "max_abs_error": errors,
        "tolerance": {"rtol": RTOL, "atol": ATOL},
        "notes": notes,
    }


def _copy_model(source: Path, model: Any, out: Path) -> None:
    """The file into the entry; a model with external data is saved again with its data beside it."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    if not any(uses_external_data(tensor) for tensor in model.graph.initializer):
        shutil.copyfile(source, out)
        return
    whole = onnx.load(str(source))  # the weights too, from beside the source file
    onnx.save_model(whole, str(out), save_as_external_data=True, all_tensors_to_one_file=True, location=EXTERNAL_DATA)


def _session(runtime: str, path: Path, input_spec: InputSpec) -> Any:
    from workers.runtimes import make_runtime
    from workers.runtimes.base import SessionRuntime

    served = make_runtime(runtime)
    assert isinstance(served, SessionRuntime), f"{runtime} runs no files"
    served.use_file(path, input_spec)
    served.set_threads(1)
    return served


def learn_outputs(
    runtime: str, path: Path, input_spec: InputSpec, names: list[str]
) -> tuple[list[TensorSpec], list[str]]:
    """Each output's dtype and per-sample shape, from one run of two samples; and the outputs left out (their
    first axis is not the batch). Refuses a model none of whose outputs can be served, or one of a dtype the
    protocol cannot carry."""
    rows = 2
    placeholders = [TensorSpec(name, "float32", ()) for name in names]  # names only: run_all reads them by name
    session = _session(runtime, path, input_spec.with_outputs(placeholders))
    try:
        arrays = session.run_all(sample_input(input_spec, rows, seed=rows))
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConversionError(f"{runtime} cannot run {path.name} on a batch of {rows} ({first_line})") from exc
    served, left_out = [], []
    for name, array in zip(names, arrays, strict=True):
        if array.ndim == 0 or array.shape[0] != rows:
            left_out.append(name)
            continue
        if array.dtype.name not in ITEMSIZE:
            raise ModelSpecError(f"output {name!r} of {path.name} is {array.dtype}, which the protocol cannot carry")
        served.append(TensorSpec(name, array.dtype.name, tuple(int(d) for d in array.shape[1:])))
    if not served:
        raise ConversionError(
            f"{runtime} gives outputs of shapes {[list(array.shape) for array in arrays]} for a batch of {rows}: "
            "Packrat needs an output's first axis to be the batch"
        )
    if input_spec.ragged:  # which outputs follow the sequence's length: a second run, shorter
        shorter = input_spec.at_length(shorter_length(input_spec))
        runs = dict(zip(names, session.run_all(sample_input(shorter, rows, seed=rows)), strict=True))
        served = with_free_outputs(served, [tuple(int(d) for d in runs[t.name].shape[1:]) for t in served])
    return served, left_out


def check(runtime: str, path: Path, input_spec: InputSpec, reference: Path | None) -> dict[str, float]:
    """Run the model at CHECK_BATCHES; refuse it if a batch's output has another batch size or, against
    `reference` (the ONNX file on ONNX Runtime), differs beyond the tolerance. The errors per batch."""
    served = _session(runtime, path, input_spec)
    expected_by = None if reference is None else _session("onnxruntime", reference, input_spec)
    errors: dict[str, float] = {}
    for batch in CHECK_BATCHES:
        data = sample_input(input_spec, batch, seed=batch)
        try:
            got_all = served.run_all(data)
        except Exception as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConversionError(
                f"{runtime} cannot run {path.name} on a batch of {batch} ({first_line}); Packrat batches requests, "
                "so the model must take any batch size on its first axis"
            ) from exc
        for got in got_all:
            if got.ndim == 0 or got.shape[0] != batch:
                raise ConversionError(
                    f"{runtime} gives an output of shape {list(got.shape)} for a batch of {batch}: Packrat needs the "
                    "output's first axis to be the batch"
                )
        if expected_by is None:
            continue
        for got, expected_one in zip(got_all, expected_by.run_all(data), strict=True):
            expected = expected_one.astype(np.float64)
            error = float(np.max(np.abs(got.astype(np.float64) - expected))) if expected.size else 0.0
            errors[str(batch)] = max(error, errors.get(str(batch), 0.0))
            bound = ATOL + RTOL * float(np.max(np.abs(expected))) if expected.size else ATOL
            if got.shape != expected.shape or not error <= bound:
                raise ConversionError(
                    f"{runtime} disagrees with ONNX Runtime on the ONNX file at batch {batch}: max abs error "
                    f"{error:.3g} > {bound:.3g} (rtol {RTOL} of the output's scale + atol {ATOL})"
                )
    return errors


def main(argv: Sequence[str] | None = None) -> int:
    help_input = "input override, e.g. int64:128 for a free sequence axis"
    return converter_main(argv, "workers.models.onnx_files", __doc__ or "", prepare, "the ONNX file", help_input)


if __name__ == "__main__":
    sys.exit(main())

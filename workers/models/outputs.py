"""How a worker calls a model and what it answers: every input by name, every output named.

A model may take several inputs (a Hugging Face text model's input_ids, attention_mask, token_type_ids; a
module:function model's `packrat_inputs`), and return a tensor, a Hugging Face model-output object, a dict or a
tuple. `Served` wraps it so that a runtime still runs one tensor in, one tensor out per batch: the batch is
the records of the several inputs (`workers.models.spec.InputSpec`), unpacked here and passed by name (or in
order, for an exported program), and a model of several outputs answers the records of all of them, which the
daemon unpacks into its reply. A model of one input and one output is called and answered as it is.

The outputs are named after what the model returns: a dict's keys, a model-output object's fields that are set,
a tuple's positions ("output_0", "output_1", ...); a lone tensor is "output". They are learned by running one
sample of two rows when the model loads (in the template, with torch at one thread), which also checks that
each output's first axis is the batch: one that is not (a scalar, a loss) or is not a tensor is left out, and
the log says so. `packrat_output = NAME` on the module serves that one output only. A model that fails on the
sample is served its first output, chosen per call, and the log says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from packrat_daemon.wire.codec import ITEMSIZE
from packrat_daemon.wire.errors import ModelSpecError
from workers.models.free_axis import shorter_length, with_free_outputs
from workers.models.spec import DEFAULT_OUTPUT_NAME, InputSpec, TensorSpec, sample_input

SAMPLE_ROWS = 2  # a sample run of two rows tells an output's batch axis from a fixed one of size 1

# Every dtype a tensor may declare has a torch dtype of the same name.
_TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in ITEMSIZE}
_DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in _TORCH_DTYPES.items()}


class Served(nn.Module):
    """`model`, called with every input of `spec` and answering what the worker sends back: its one output as it
    is, or the records of the outputs `keys` names (a mapping's keys or a sequence's indices).

    `by_name`: the inputs are passed as keywords (Hugging Face, module:function models), else in order. `keys`
    None: the model's first output, whatever it returns (a model whose sample run failed at load)."""

    def __init__(self, model: Any, spec: InputSpec, by_name: bool, keys: Sequence[str | int] | None) -> None:
        super().__init__()
        self.model = model
        self.names = [tensor.name for tensor in spec.named_inputs()]
        self.spec = spec
        self.layout = self._layout(spec)
        self._layouts: dict[int, list[tuple[torch.dtype, tuple[int, ...], int]]] = {}
        self.records = spec.records
        self.by_name = by_name and bool(spec.inputs)  # a model's one unnamed input goes first, in order
        self.keys = None if keys is None else list(keys)
        self.output_dtypes = [_TORCH_DTYPES[t.dtype] for t in spec.outputs]
        # Follows the model's float dtype: runtimes.torch_runtime casts the whole module to bfloat16 for bf16, and
        # float inputs unpacked from records must then be cast like the one float input it casts itself.
        self.register_buffer("float_dtype", torch.zeros(()), persistent=False)
        self.training = False  # inference only; the model's own mode is as loading set it (an export refuses .eval())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self.call(x)
        keys = self.keys
        if keys is None:
            return output if isinstance(output, torch.Tensor) else output[output_keys(output)[0]]
        if len(keys) == 1:
            return output if isinstance(output, torch.Tensor) else output[keys[0]]
        rows = x.shape[0]
        parts = []
        for key, dtype in zip(keys, self.output_dtypes, strict=True):
            part = output[key]
            if part.dtype != dtype:
                part = part.to(dtype)  # a bf16 model's float outputs travel as the float32 the spec declares
            parts.append(part.contiguous().reshape(rows, -1).view(torch.uint8))
        return torch.cat(parts, dim=1)

    def call(self, x: torch.Tensor) -> Any:
        """The model's own output for batch `x`."""
        inputs = self._inputs(x)
        return self.model(**dict(zip(self.names, inputs, strict=True))) if self.by_name else self.model(*inputs)

    @staticmethod
    def _layout(spec: InputSpec) -> list[tuple[torch.dtype, tuple[int, ...], int]]:
        return [(_TORCH_DTYPES[t.dtype], t.shape, ITEMSIZE[t.dtype] * _count(t.shape)) for t in spec.inputs]

    def _layout_of(self, width: int) -> list[tuple[torch.dtype, tuple[int, ...], int]]:
        """The records' layout at the length a batch of records `width` bytes wide is padded to (a free axis)."""
        if not self.spec.ragged:
            return self.layout
        layout = self._layouts.get(width)
        if layout is None:
            layout = self._layouts[width] = self._layout(self.spec.at_length(self.spec.length_of((width,))))
        return layout

    def _inputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        if not self.records:
            return [x]
        rows, start, tensors = x.shape[0], 0, []
        float_dtype: torch.dtype = self.float_dtype.dtype  # type: ignore[assignment]  # a buffer: a Tensor
        for dtype, shape, size in self._layout_of(x.shape[1]):
            tensor = x[:, start : start + size].contiguous().view(dtype).reshape(rows, *shape)
            if tensor.is_floating_point() and dtype != float_dtype:
                tensor = tensor.to(float_dtype)
            tensors.append(tensor)
            start += size
        return tensors


def _count(shape: Sequence[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def output_keys(output: Any) -> list[str | int]:
    """The keys of a structured output's parts: a mapping's keys (a model-output object's set fields), a
    tuple's indices; [] for a tensor."""
    if isinstance(output, torch.Tensor):
        return []
    if isinstance(output, Mapping):  # transformers' ModelOutput is an OrderedDict of the fields that are set
        return list(output.keys())
    if isinstance(output, (tuple, list)):
        return list(range(len(output)))
    raise ModelSpecError(
        f"the model returns a {type(output).__name__}; a model must return a tensor, a dict or tuple of them, or a "
        "Hugging Face model-output object"
    )


def output_name(key: str | int) -> str:
    """The name an output goes by: a key as it is, a tuple's position as output_N."""
    return key if isinstance(key, str) else f"output_{key}"


def serve_outputs(
    spec: str, module: Any, input_spec: InputSpec, by_name: bool = False
) -> tuple[Any, InputSpec, str | None]:
    """`module` wrapped to take `input_spec`'s inputs and answer every output; the spec with its outputs named;
    and a note for the log (outputs left out, or a failed sample run), else None.

    A model that fails on the sample is not refused here (it may refuse only some batch sizes): it is served its
    first output, whatever it returns, and its workers report the failure if it is the model's; the note says so.
    """
    probe = Served(module, input_spec, by_name, None)
    sample = torch.from_numpy(sample_input(input_spec, SAMPLE_ROWS))
    if input_spec.dtype == "bfloat16":
        sample = sample.view(torch.bfloat16)
    try:
        with torch.inference_mode():
            output = probe.call(sample)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        inputs = ", ".join(f"{t.name} {t.dtype}:{'x'.join(map(str, t.shape))}" for t in input_spec.named_inputs())
        return (
            probe,
            input_spec,
            (
                f"{spec} failed on a sample input ({inputs}) of {SAMPLE_ROWS} samples ({type(exc).__name__}: "
                f"{first_line}); if that is not what it takes, pass --input DTYPE:D1xD2..."
            ),
        )
    keys = output_keys(output)
    declared = getattr(module, "packrat_output", None)
    if declared is not None:
        if declared not in keys:
            raise ModelSpecError(f"{spec} declares packrat_output = {declared!r}, but it returns {_listed(keys)}")
        keys = [declared]
    if not keys:  # one tensor
        if not isinstance(output, torch.Tensor) or output.dim() == 0 or output.shape[0] != SAMPLE_ROWS:
            raise ModelSpecError(f"{spec} returns a tensor whose first axis is not the batch; Packrat batches requests")
        # Its one output: "output", as version 1 always had it; its dtype and shape declared (one the protocol can
        # carry), and along which axis it follows a free input axis, if it does.
        named = _follow_length(probe, input_spec.with_outputs([_tensor_spec(DEFAULT_OUTPUT_NAME, output)]), None)
        if not input_spec.records and not probe.by_name:
            return module, named, None  # one tensor in, one out: called as it is, nothing in between
        return probe, named, None
    served, left_out = [], []
    for key in keys:
        part = output[key]
        if isinstance(part, torch.Tensor) and part.dim() > 0 and part.shape[0] == SAMPLE_ROWS:
            served.append((key, part))
        else:
            left_out.append(key)
    if not served:
        raise ModelSpecError(
            f"{spec} returns {_listed(keys)}, none of them a tensor with the batch on its first axis; Packrat "
            "serves tensors of one row per sample"
        )
    specs = [_tensor_spec(output_name(key), part) for key, part in served]
    note = None
    if left_out:
        note = (
            f"{spec} returns {len(keys)} outputs; {_listed(left_out)} are left out (not a tensor with the batch on "
            f"its first axis); serving {', '.join(spec.name for spec in specs)}"
        )
    named = _follow_length(probe, input_spec.with_outputs(specs), [key for key, _ in served])
    return Served(module, named, by_name, [key for key, _ in served]), named, note


def _follow_length(probe: Served, spec: InputSpec, keys: list[str | int] | None) -> InputSpec:
    """`spec` with each output's axis that follows a free input axis marked (a second sample run, shorter)."""
    if not spec.ragged:
        return spec
    shorter = spec.at_length(shorter_length(spec))
    sample = torch.from_numpy(sample_input(shorter, SAMPLE_ROWS))
    with torch.inference_mode():
        output = probe.call(sample)
    parts = [output] if keys is None else [output[key] for key in keys]
    shapes = [tuple(int(d) for d in part.shape[1:]) for part in parts]
    return spec.with_outputs(with_free_outputs(spec.outputs, shapes))


def _tensor_spec(name: str, tensor: torch.Tensor) -> TensorSpec:
    dtype = _DTYPE_NAMES.get(tensor.dtype)
    if dtype is None:
        raise ModelSpecError(f"output {name!r} is {tensor.dtype}, which the protocol cannot carry")
    return TensorSpec(name, dtype, tuple(int(d) for d in tensor.shape[1:]))


def _listed(names: Sequence[str | int]) -> str:
    return ", ".join(repr(name) for name in names)

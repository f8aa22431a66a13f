"""Model specs: what a worker serves, and how it is built or loaded.

A spec string is one of:
  builtin:NAME          resnet50, bert-base, gpt2 (architectures from transformers configs, random
                        weights from a fixed seed, never downloaded), tiny-mlp, tiny-cnn (for tests)
  PATH.pt2              a torch.export program (torch.export.save)
  PATH.pt / PATH.ts     a TorchScript file (torch.jit.save)
  hf:DIR / DIR          a Hugging Face save_pretrained folder (workers.models.huggingface)
  module:function       a function returning an nn.Module
  PATH.onnx             an ONNX file: served by ONNX Runtime and OpenVINO only (workers.models.onnx_files)

Every model declares its inputs (name, dtype and per-sample shape of each). Files and functions that cannot
tell take one from `input` ("float32:3x224x224"), or from a `packrat_input` attribute on the module, or
several, by name, from `packrat_inputs` ({"x": "float32:16", "mask": "int64:16"}, in the forward's order). A
model of several inputs is called with all of them, and every output it returns is served, named
(workers.models.outputs).
This module imports torch: only the template process and tests import it (the torch-free
`workers.models.spec` holds what the daemon needs to know about a model's input).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from packrat_daemon.wire.errors import ModelSpecError
from workers.models.outputs import Served, serve_outputs
from workers.models.spec import (
    BUILTIN,
    EXPORTED,
    FUNCTION,
    HUGGING_FACE,
    INPUT_DTYPES,
    ONNX_FILE,
    TORCHSCRIPT,
    InputSpec,
    TensorSpec,
    model_kind,
)

SEED = 20231130


@dataclass
class LoadedModel:
    name: str
    module: Callable[[torch.Tensor], torch.Tensor]
    input: InputSpec
    channels_last: bool = False
    notes: tuple[str, ...] = ()  # what the log should say about how it is served (an output or input left out)


# Every dtype an input may declare has a torch dtype of the same name.
_DTYPE_NAMES: dict[torch.dtype, str] = {getattr(torch, name): name for name in INPUT_DTYPES}


class _Logits(nn.Module):
    """Hugging Face models return dataclasses; a worker's model must map tensor → tensor."""

    def __init__(self, model: nn.Module, field: str, last_token: bool = False) -> None:
        super().__init__()
        self.model = model
        self.field = field
        self.last_token = last_token

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = getattr(self.model(x), self.field)
        return out[:, -1] if self.last_token else out


def _resnet50() -> tuple[nn.Module, InputSpec, bool]:
    from transformers import ResNetConfig, ResNetForImageClassification

    # num_labels is PretrainedConfig's keyword, passed on through ResNetConfig's **kwargs (not in its stub).
    config = ResNetConfig(num_labels=1000)  # type: ignore[call-arg]
    model = ResNetForImageClassification(config)  # the 25.6 M-parameter ResNet-50
    return _Logits(model, "logits"), InputSpec("float32", (3, 224, 224)), True


def _bert_base() -> tuple[nn.Module, InputSpec, bool]:
    from transformers import BertConfig, BertModel

    config = BertConfig()  # bert-base-uncased's shape: 12 layers, hidden 768, vocab 30522
    model = BertModel(config, add_pooling_layer=True)
    return _Logits(model, "pooler_output"), InputSpec("int64", (128,), high=config.vocab_size), False


class _Pooled(nn.Module):
    """BERT called with its three inputs by name, answering its pooled output (what bert-base answers)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).pooler_output


def _bert_base_masked() -> tuple[nn.Module, InputSpec, bool]:
    """bert-base with every input a client sends after its tokenizer: padded sequences run as BERT runs them."""
    from transformers import BertConfig, BertModel

    config = BertConfig()
    model = BertModel(config, add_pooling_layer=True)
    length = (128,)  # the longest: the sequence axis is free (requests.ragged pads each slice to its own longest)
    inputs = [
        TensorSpec("input_ids", "int64", length, config.vocab_size, free_axis=0),
        TensorSpec("attention_mask", "int64", length, 2, free_axis=0),
        TensorSpec("token_type_ids", "int64", length, config.type_vocab_size, free_axis=0),
    ]
    return _Pooled(model), InputSpec.of(inputs), False


def _gpt2() -> tuple[nn.Module, InputSpec, bool]:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config()  # 124 M parameters
    return (
        _Logits(GPT2Model(config), "last_hidden_state", last_token=True),
        InputSpec("int64", (64,), high=config.vocab_size),
        False,
    )


def _tiny_mlp() -> tuple[nn.Module, InputSpec, bool]:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), InputSpec("float32", (16,)), False


def _tiny_cnn() -> tuple[nn.Module, InputSpec, bool]:
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )
    return model, InputSpec("float32", (3, 16, 16)), True


BUILTINS: dict[str, Callable[[], tuple[nn.Module, InputSpec, bool]]] = {
    "resnet50": _resnet50,
    "bert-base": _bert_base,
    "bert-base-masked": _bert_base_masked,
    "gpt2": _gpt2,
    "tiny-mlp": _tiny_mlp,
    "tiny-cnn": _tiny_cnn,
}


def load_model(spec: str, input_override: str | None = None) -> LoadedModel:
    """Build or load the model and give it the standard CPU inference treatment.

    Every policy is served the same treated model (eval mode, no autograd, channels_last where it
    helps), so comparisons between policies stay fair.
    """
    torch.manual_seed(SEED)
    override = InputSpec.parse(input_override) if input_override else None
    notes: list[str | None] = []
    kind = model_kind(spec)  # ModelSpecError, listing the kinds, for none of them
    module, input_spec, channels_last = _build(spec, kind)
    input_spec = _with_override(spec, input_spec, override)
    if input_spec is None:
        raise ModelSpecError(f"model {spec!r} does not declare its input; pass --input DTYPE:D1xD2..., e.g. float32:16")
    if isinstance(module, nn.Module):
        # An exported program's train/eval behaviour was fixed at export time; it refuses .eval().
        if kind != EXPORTED:
            module.eval()
        for parameter in module.parameters():
            parameter.requires_grad_(False)
        if channels_last:
            module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # not in the stub
    if kind == EXPORTED:
        _check_batch_sizes(spec, module, input_spec)
    if kind != BUILTIN:  # the built-ins return one tensor; anything else may return several outputs
        module, input_spec, note = serve_outputs(spec, module, input_spec, by_name=kind in (HUGGING_FACE, FUNCTION))
        notes.append(note)
    elif input_spec.records:
        module = Served(module, input_spec, True, None)
    return LoadedModel(spec, module, input_spec, channels_last, tuple(note for note in notes if note))


def _build(spec: str, kind: str) -> tuple[nn.Module, InputSpec | None, bool]:
    """The model of `kind` built or loaded, as it is: (module, the input it declares, whether channels_last helps)."""
    if kind == BUILTIN:
        name = spec.removeprefix("builtin:")
        if name not in BUILTINS:
            raise ModelSpecError(f"unknown built-in model {name!r}; choose one of: {', '.join(BUILTINS)}")
        return BUILTINS[name]()
    if kind == ONNX_FILE:
        raise ModelSpecError(
            f"PyTorch cannot run the ONNX file {spec}: serve it with --runtime onnxruntime, openvino or auto"
        )
    if kind == EXPORTED:
        return (*_load_exported(spec), False)
    if kind == TORCHSCRIPT:
        return (*_load_torchscript(spec), False)
    if kind == HUGGING_FACE:
        from workers.models.huggingface import load_folder

        return (*load_folder(spec), False)
    return (*_load_function(spec), False)


def _with_override(spec: str, input_spec: InputSpec | None, override: InputSpec | None) -> InputSpec | None:
    """The input served: the model's own, or --input's in its place (keeping the model's input name, and its ids'
    range for a longer sequence of the same ids)."""
    if override is not None and input_spec is not None and input_spec.records:
        return _override_all(spec, input_spec, override)
    same_ids = override is not None and input_spec is not None and override.dtype == input_spec.dtype
    if override is not None and input_spec is not None and override.high is None and same_ids:
        override = dataclasses.replace(override, high=input_spec.high)  # a longer sequence of the same ids
    if override is not None and input_spec is not None and input_spec.inputs:  # keep the input's name
        named = TensorSpec(input_spec.inputs[0].name, override.dtype, override.shape, override.high,
                           override.free_axis, override.min_length)  # fmt: skip
        override = InputSpec.of([named])
    return override or input_spec


def _override_all(spec: str, input_spec: InputSpec, override: InputSpec) -> InputSpec:
    """`--input` for a model of several inputs: the per-sample shape of each (a text model's inputs share their
    length), given in the dtype of its first."""
    first = input_spec.inputs[0]
    if override.dtype != first.dtype or any(len(t.shape) != len(override.shape) for t in input_spec.inputs):
        names = ", ".join(f"{t.name} {t.dtype}:{'x'.join(map(str, t.shape))}" for t in input_spec.inputs)
        raise ModelSpecError(
            f"{spec} takes several inputs ({names}); --input gives the shape they share, as {first.dtype}:D1x..."
        )
    inputs = [dataclasses.replace(t, shape=override.shape, free_axis=override.free_axis,
                                  min_length=override.min_length) for t in input_spec.inputs]  # fmt: skip
    return InputSpec.of(inputs, input_spec.outputs)


def _declared_input(module: object) -> InputSpec | None:
    several = getattr(module, "packrat_inputs", None)
    if several is not None:
        if not isinstance(several, Mapping) or not several:
            raise ModelSpecError(
                "packrat_inputs must be a dict of input name to 'DTYPE:D1xD2...', in the forward's order, e.g. "
                "{'x': 'float32:16', 'mask': 'int64:16'}"
            )
        tensors = []
        for name, declared_one in several.items():
            one = declared_one if isinstance(declared_one, InputSpec) else InputSpec.parse(str(declared_one))
            tensors.append(TensorSpec(str(name), one.dtype, one.shape, one.high, one.free_axis, one.min_length))
        return InputSpec.of(tensors)
    declared = getattr(module, "packrat_input", None)
    if declared is None:
        return None
    if isinstance(declared, InputSpec):
        return declared
    if isinstance(declared, str):
        return InputSpec.parse(declared)
    dtype, shape = declared
    return InputSpec(str(dtype), tuple(int(d) for d in shape))


def _load_exported(spec: str) -> tuple[nn.Module, InputSpec | None]:
    path = Path(spec)
    if not path.is_file():
        raise ModelSpecError(f"model file {spec} does not exist")
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise ModelSpecError(f"{spec} is not a torch.export program (torch.export.save): {exc}") from exc
    placeholders = [node for node in program.graph.nodes if node.op == "placeholder"]
    user_inputs = [n for n in placeholders if n.name in program.graph_signature.user_inputs]
    tensors = []
    for node in user_inputs:
        value = node.meta.get("val")
        if value is None or value.dtype not in _DTYPE_NAMES or not all(isinstance(d, int) for d in value.shape[1:]):
            return program.module(), None  # a shape the graph cannot tell: --input says it
        tensors.append(TensorSpec(node.name, _DTYPE_NAMES[value.dtype], tuple(int(d) for d in value.shape[1:])))
    return program.module(), InputSpec.of(tensors) if tensors else None


def _check_batch_sizes(spec: str, module: nn.Module, input_spec: InputSpec) -> None:
    """Run batch sizes 1 and 2 once, so a fixed-batch export is refused here rather than in every worker.

    torch.export fixes the batch size unless dynamic_shapes says otherwise; such a program fails a guard
    on any other batch, and workers forked from it would die on their first request, over and over.
    """
    graph = getattr(module, "graph", None)  # an exported program's module has one; its placeholders name the input
    placeholders = [n.name for n in graph.nodes if n.op == "placeholder"] if graph is not None else []
    name = placeholders[0] if placeholders else "x"
    for batch in (1, 2):
        try:
            with torch.no_grad():
                module(
                    *[torch.zeros((batch, *t.shape), dtype=getattr(torch, t.dtype)) for t in input_spec.named_inputs()]
                )
        except Exception as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelSpecError(
                f"{spec} does not run on batch size {batch} ({first_line}); Packrat batches requests, so export "
                f"with a dynamic batch: torch.export.export(model, (example,), "
                f'dynamic_shapes={{"{name}": {{0: torch.export.Dim("batch")}}}})'
            ) from exc


def _load_torchscript(spec: str) -> tuple[nn.Module, InputSpec | None]:
    path = Path(spec)
    if not path.is_file():
        raise ModelSpecError(f"model file {spec} does not exist")
    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:
        raise ModelSpecError(f"{spec} is not a TorchScript file (torch.jit.save): {exc}") from exc
    return module, None


def _load_function(spec: str) -> tuple[nn.Module, InputSpec | None]:
    module_name, _, function_name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        raise ModelSpecError(
            f"cannot import {spec}: {exc}; the module is looked up on the daemon's import path (sys.path, the "
            f"current directory and PYTHONPATH): run from the module's directory or set PYTHONPATH=DIR"
        ) from exc
    module = factory()
    if not isinstance(module, nn.Module):
        raise ModelSpecError(f"{spec} returned {type(module).__name__}, not a torch.nn.Module")
    return module, _declared_input(module)

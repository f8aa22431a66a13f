"""Hugging Face models from a local `save_pretrained` folder (`hf:DIR`, or `DIR` itself), never downloaded.

The class is the one the folder's config.json names (`architectures`, e.g. BertForSequenceClassification),
else `AutoModel`, loaded with `local_files_only=True` (the daemon also sets HF_HUB_OFFLINE for its templates).
Weights are served in float32; `--precision` decides any reduced precision.

One input is served (several named inputs are not served yet: docs/serving.md, *Inputs and outputs*): the
model's `main_input_name`. For `input_ids` the others take the model's defaults, so `attention_mask` is all
ones (every token attended: send unpadded sequences of the served length) and `token_type_ids` zeros. The
input is declared from the config: `int64:128` token ids below `vocab_size` (at most the model's position
count), or `float32:CxHxW` pixel values of `num_channels` × `image_size` (224 where the config has none);
`--input` overrides it, e.g. `--input int64:384` for longer sequences. The output served is the first the
model returns (`logits` for a task head): `workers.models.outputs`.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from packrat_daemon.wire.errors import ModelSpecError
from workers.models.spec import InputSpec, hf_folder

DEFAULT_SEQUENCE = 128
DEFAULT_IMAGE_SIZE = 224
# The inputs besides the main one that a model's forward may take and that are left to its defaults.
DEFAULTED = {
    "attention_mask": "all ones: every token attended",
    "token_type_ids": "zeros: one segment",
    "pixel_mask": "all ones",
}


class MainInput(nn.Module):
    """A Hugging Face model called with its main input by name (models differ in their first positional one)."""

    def __init__(self, model: nn.Module, name: str) -> None:
        super().__init__()
        self.model = model
        self.name = name

    def forward(self, x: torch.Tensor) -> Any:
        return self.model(**{self.name: x})


def load_folder(spec: str) -> tuple[nn.Module, InputSpec | None, str | None]:
    """The folder's model, called with its main input; the input its config implies (None: unknown); and a
    note for the log naming the inputs left to their defaults."""
    import transformers

    transformers.utils.logging.disable_progress_bar()  # a bar per load, drawn into the daemon's log
    folder = hf_folder(spec)
    if not folder.is_dir():
        raise ModelSpecError(f"model folder {folder} does not exist")
    if not (folder / "config.json").is_file():
        raise ModelSpecError(f"{folder} has no config.json: give a folder written by save_pretrained")
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
        model_class = _model_class(transformers, config)
        model = model_class.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelSpecError(f"cannot load the Hugging Face model in {folder}: {first_line}") from exc
    model = model.float()
    name = getattr(model, "main_input_name", "input_ids")
    defaulted = [f"{other} ({why})" for other, why in DEFAULTED.items() if other in _parameters(model)]
    note = None
    if defaulted:
        note = (
            f"{folder} ({type(model).__name__}) is served its {name} only; {', '.join(defaulted)} take the model's "
            "defaults: several inputs are not served yet (docs/serving.md, 'Inputs and outputs')"
        )
    return MainInput(model, name), _declared_input(config, name), note


def _model_class(transformers: Any, config: Any) -> Any:
    for architecture in getattr(config, "architectures", None) or []:
        found = getattr(transformers, architecture, None)
        if found is not None:
            return found
    return transformers.AutoModel


def _parameters(model: nn.Module) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _declared_input(config: Any, name: str) -> InputSpec | None:
    if name == "input_ids" and getattr(config, "vocab_size", None):
        positions = getattr(config, "max_position_embeddings", None) or DEFAULT_SEQUENCE
        return InputSpec("int64", (min(DEFAULT_SEQUENCE, int(positions)),), high=int(config.vocab_size))
    if name == "pixel_values":
        size = getattr(config, "image_size", None) or DEFAULT_IMAGE_SIZE
        height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        return InputSpec("float32", (int(getattr(config, "num_channels", 3) or 3), height, width))
    return None

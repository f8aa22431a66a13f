"""Hugging Face models from a local `save_pretrained` folder (`hf:DIR`, or `DIR` itself), never downloaded.

The class is the one the folder's config.json names (`architectures`, e.g. BertForSequenceClassification),
else `AutoModel`, loaded with `local_files_only=True` (the daemon also sets HF_HUB_OFFLINE for its templates).
Weights are served in float32; `--precision` decides any reduced precision.

The inputs are the tokenizer-free ones the model's forward takes, passed by name: for a text model
`input_ids` (int64 token ids below `vocab_size`, at most 128 of them or the model's position count if fewer),
`attention_mask` (0 or 1) and `token_type_ids` (below `type_vocab_size`) where its forward accepts them, all of
one length, any length up to the longest (the sequence axis is free: `int64:1..128`); for a vision model
`pixel_values` (`float32:CxHxW` of `num_channels` × `image_size`, 224 where the config has none). `--input`
raises the longest (`--input int64:1..384`), fixes one length (`int64:384`), or gives the image's shape. Every
output the model returns is served, named by its fields (`logits` for a task head; `last_hidden_state` and
`pooler_output` for a bare encoder): `workers.models.outputs`.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from packrat_daemon.wire.errors import ModelSpecError
from workers.models.spec import InputSpec, TensorSpec, hf_folder

DEFAULT_SEQUENCE = 128
DEFAULT_IMAGE_SIZE = 224
# The inputs besides input_ids a text model's forward may take that a client can send without a tokenizer, each
# with the exclusive bound of its values (None: read from the config).
TEXT_INPUTS: dict[str, str | None] = {"attention_mask": None, "token_type_ids": "type_vocab_size"}


def load_folder(spec: str) -> tuple[nn.Module, InputSpec | None]:
    """The folder's model (to be called with its inputs by name) and the inputs its config implies (None:
    unknown)."""
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
    return model, _declared_inputs(config, name, _parameters(model))


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


def _declared_inputs(config: Any, name: str, parameters: set[str]) -> InputSpec | None:
    if name == "input_ids" and getattr(config, "vocab_size", None):
        positions = getattr(config, "max_position_embeddings", None) or DEFAULT_SEQUENCE
        length = (min(DEFAULT_SEQUENCE, int(positions)),)
        # The sequence axis is free: a request of any length up to it (requests.ragged pads a slice to its longest).
        inputs = [TensorSpec("input_ids", "int64", length, int(config.vocab_size), free_axis=0)]
        for other, bound in TEXT_INPUTS.items():
            if other in parameters:
                high = int(getattr(config, bound, None) or 2) if bound else 2
                inputs.append(TensorSpec(other, "int64", length, high, free_axis=0))
        return InputSpec.of(inputs)
    if name == "pixel_values":
        size = getattr(config, "image_size", None) or DEFAULT_IMAGE_SIZE
        height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        channels = int(getattr(config, "num_channels", 3) or 3)
        return InputSpec.of([TensorSpec("pixel_values", "float32", (channels, height, width))])
    return None

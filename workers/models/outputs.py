"""Models whose forward returns several outputs (a Hugging Face model-output object, a dict, a tuple): one of
them is served, since a worker answers one tensor per request for now (several named outputs are not served
yet: docs/serving.md, *Inputs and outputs*).

The output served is the one the module names in `packrat_output` (a key, a field name or a tuple index),
else the first: a Hugging Face model's first field that is set (`logits` for the task heads, which compute no
`loss` without labels; `last_hidden_state` for a bare encoder), a dict's first key, a tuple's first element.
Which one it is, and what else the model returns, is learned by running one sample when the model loads, and
said in the daemon's log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from packrat_daemon.wire.errors import ModelSpecError
from workers.models.spec import InputSpec, sample_input


class OneOutput(nn.Module):
    """`model`, answering only its output `key` (a mapping's key or a sequence's index)."""

    def __init__(self, model: Any, key: str | int) -> None:
        super().__init__()
        self.model = model
        self.key = key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)[self.key]


def output_names(output: Any) -> list[str | int]:
    """The names of a structured output's parts: a mapping's keys (a model-output object's set fields), a
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


def serve_one_output(spec: str, module: Any, input_spec: InputSpec) -> tuple[Any, str | None]:
    """`module` as it is if it returns a tensor; else wrapped to return the one output it serves, and a note
    saying which for the log.

    Runs the model once on one sample: in the template, with torch at one thread, as the .pt2 batch check does.
    """
    sample = torch.from_numpy(sample_input(input_spec, 1))
    if input_spec.dtype == "bfloat16":
        sample = sample.view(torch.bfloat16)
    try:
        with torch.inference_mode():
            output = module(sample)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelSpecError(
            f"{spec} fails on a sample input {input_spec.dtype}:{'x'.join(map(str, input_spec.shape))} "
            f"({type(exc).__name__}: {first_line}); if that is not what it takes, pass --input DTYPE:D1xD2..."
        ) from exc
    names = output_names(output)
    if not names:
        return module, None
    declared = getattr(module, "packrat_output", None)
    if declared is not None and declared not in names:
        raise ModelSpecError(f"{spec} declares packrat_output = {declared!r}, but it returns {_listed(names)}")
    key = names[0] if declared is None else declared
    if not isinstance(output[key], torch.Tensor):
        raise ModelSpecError(
            f"output {key!r} of {spec} is a {type(output[key]).__name__}, not a tensor; name the output to serve "
            f"with packrat_output = NAME on the module (it returns {_listed(names)})"
        )
    note = None
    if len(names) > 1:
        note = (
            f"{spec} returns {len(names)} outputs ({_listed(names)}); serving {key!r} only: several outputs are "
            "not served yet (docs/serving.md, 'Inputs and outputs')"
        )
    return OneOutput(module, key), note


def _listed(names: list[str | int]) -> str:
    return ", ".join(repr(name) for name in names)

"""Models whose forward returns several outputs (a Hugging Face model-output object, a dict, a tuple): one of
them is served, since a worker answers one tensor per request for now (several named outputs are not served
yet: docs/serving.md, *Inputs and outputs*).

The output served is the one the module names in `packrat_output` (a key, a field name or a tuple index),
else the first: a Hugging Face model's first field that is set (`logits` for the task heads, which compute no
`loss` without labels; `last_hidden_state` for a bare encoder), a dict's first key, a tuple's first element.
Which one it is, and what else the model returns, is learned by running one sample when the model loads, and
said in the daemon's log; a model that fails on that sample is served its first output, chosen per call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from packrat_daemon.wire.errors import ModelSpecError
from workers.models.spec import InputSpec, sample_input


class OneOutput(nn.Module):
    """`model`, answering only its output `key` (a mapping's key or a sequence's index); with no key, the first
    output of whatever it returns (a model whose sample run failed at load: see `serve_one_output`)."""

    def __init__(self, model: Any, key: str | int | None) -> None:
        super().__init__()
        self.model = model
        self.key = key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self.model(x)
        if self.key is not None:
            return output[self.key]
        if isinstance(output, torch.Tensor):
            return output
        return output[output_names(output)[0]]


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
    A model that fails on it is not refused here (it may refuse only some batch sizes): it is served its first
    output, whatever it returns, and its workers report the failure if it is the model's; the note says so.
    """
    sample = torch.from_numpy(sample_input(input_spec, 1))
    if input_spec.dtype == "bfloat16":
        sample = sample.view(torch.bfloat16)
    try:
        with torch.inference_mode():
            output = module(sample)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return OneOutput(module, getattr(module, "packrat_output", None)), (
            f"{spec} failed on a sample input {input_spec.dtype}:{'x'.join(map(str, input_spec.shape))} of one "
            f"sample ({type(exc).__name__}: {first_line}); if that is not what it takes, pass --input DTYPE:D1xD2..."
        )
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

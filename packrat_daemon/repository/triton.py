"""One model folder in Triton's layout, `NAME/config.pbtxt` (optional) and `NAME/VERSION/MODEL`, as what Packrat
serves: the model file or Hugging Face folder of the newest version, and the settings config.pbtxt gives
(`max_batch_size`, the batching delay, a TorchScript model's input), with a note for every field read and for
every field left out, saying why (docs/repository.md, "Triton's layout").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packrat_daemon.repository import pbtxt
from packrat_daemon.repository.errors import RepositoryError
from packrat_daemon.wire.errors import ModelSpecError
from workers.models.folder import resolve_model
from workers.models.spec import TORCHSCRIPT, model_kind

CONFIG_FILE = "config.pbtxt"
# Triton's tensor types, as Packrat's `--input` names them (the types a model file can take).
DTYPES = {
    "TYPE_BOOL": "bool",
    "TYPE_UINT8": "uint8",
    "TYPE_INT8": "int8",
    "TYPE_INT16": "int16",
    "TYPE_INT32": "int32",
    "TYPE_INT64": "int64",
    "TYPE_FP16": "float16",
    "TYPE_FP32": "float32",
    "TYPE_FP64": "float64",
    "TYPE_BF16": "bfloat16",
}
# Fields read elsewhere or said nothing about: what config.pbtxt always holds.
_READ = {"name", "max_batch_size", "input", "output", "dynamic_batching"}
# Why each field Packrat does not use is left out.
IGNORED = {
    "instance_group": "Packrat plans its instances and their threads itself, from measured profiles, within the "
    "cores the joint plan gives the model",
    "platform": "the model file's kind decides the runtime (--runtime, auto by default, measures each)",
    "backend": "the model file's kind decides the runtime (--runtime, auto by default, measures each)",
    "version_policy": "Packrat serves the newest version only",
    "optimization": "Packrat measures runtimes and precisions itself (--runtime, --precision)",
    "default_model_filename": "the version folder's one model is served, whatever its name",
    "parameters": "per-model Packrat settings go in repository.toml's [models.NAME]",
    "model_warmup": "every daemon warms its workers up before it is ready",
    "response_cache": "Packrat keeps no response cache",
}
REFUSED = {
    "ensemble_scheduling": "an ensemble chains models inside the server; Packrat serves each model on its own: "
    "call them in turn from the client",
    "sequence_batching": "Packrat's batcher has no sequence (stateful) batching; serve a stateless model",
}


@dataclass(frozen=True)
class TritonModel:
    """What one Triton model folder gives: its name, version, model spec and Packrat settings, and the notes."""

    name: str
    version: str
    model: str
    settings: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def is_triton_model(folder: Path) -> bool:
    """Whether `folder` looks like a Triton model folder: a config.pbtxt, or a version folder (digits)."""
    return (folder / CONFIG_FILE).is_file() or any(p.is_dir() and p.name.isdigit() for p in folder.iterdir())


def read_triton_model(folder: Path) -> TritonModel:
    """The model of the Triton folder `folder`; RepositoryError saying what to change where it cannot be served."""
    config = _config(folder)
    name = str(pbtxt.first(config, "name", folder.name))
    notes: list[str] = []
    if name != folder.name:
        notes.append(f"served as {name!r}, config.pbtxt's name (its folder is {folder.name!r})")
    for key, why in REFUSED.items():
        if key in config:
            raise RepositoryError(f"{folder / CONFIG_FILE}: {key} is not served: {why}")
    versions = sorted((p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    if not versions:
        raise RepositoryError(
            f"{folder} has no version folder; put the model in {folder}/1/ (model.onnx, model.pt2, model.pt, or a "
            "Hugging Face folder), as Triton's layout has it"
        )
    newest = versions[-1]
    if len(versions) > 1:
        notes.append(
            f"version {newest.name} served; versions {', '.join(p.name for p in versions[:-1])} left out: "
            f"{IGNORED['version_policy']}"
        )
    try:
        model = resolve_model(str(newest))
        kind = model_kind(model)
    except ModelSpecError as exc:
        raise RepositoryError(f"{name}: {exc}") from None
    settings = _settings(config, kind, notes)
    for key in sorted(set(config) - _READ):
        why = IGNORED.get(key, "Packrat does not use it")
        notes.append(f"{CONFIG_FILE}'s {key} left out: {why}")
    return TritonModel(name, newest.name, model, settings, tuple(notes))


def _config(folder: Path) -> pbtxt.Message:
    path = folder / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RepositoryError(f"cannot read {path}: {exc}") from None
    return pbtxt.parse(text, str(path))


def _settings(config: pbtxt.Message, kind: str, notes: list[str]) -> dict[str, Any]:
    """The Packrat settings config.pbtxt gives: max_batch, max_delay_ms, and a TorchScript model's input."""
    settings: dict[str, Any] = {}
    max_batch = pbtxt.first(config, "max_batch_size")
    if isinstance(max_batch, int) and max_batch > 0:
        settings["max_batch"] = max_batch
        notes.append(f"max_batch_size {max_batch} read as max_batch")
    elif max_batch == 0:
        settings["max_batch"] = 1
        notes.append("max_batch_size 0 read as max_batch 1 (no batching); Packrat batches along the first axis")
    batching = pbtxt.first(config, "dynamic_batching")
    if isinstance(batching, dict):
        delay = pbtxt.first(batching, "max_queue_delay_microseconds")
        if isinstance(delay, int) and delay > 0:
            settings["max_delay_ms"] = delay / 1000.0
            notes.append(f"dynamic_batching's max_queue_delay_microseconds {delay} read as max_delay_ms")
        if "preferred_batch_size" in batching:
            notes.append(
                "dynamic_batching's preferred_batch_size left out: Packrat plans its batch sizes from the live traffic"
            )
    inputs = [entry for entry in config.get("input", []) if isinstance(entry, dict)]
    outputs = [entry for entry in config.get("output", []) if isinstance(entry, dict)]
    if inputs or outputs:
        declared = ", ".join(str(pbtxt.first(entry, "name", "?")) for entry in inputs + outputs)
        given = _torchscript_input(inputs) if kind == TORCHSCRIPT else None
        if given is not None:
            settings["input"] = given
            notes.append(f"input read as --input {given} (a TorchScript file does not declare it)")
        else:
            notes.append(
                f"inputs and outputs ({declared}) read; the model file declares them, and they are "
                "served under the model's own names"
            )
    return settings


def _torchscript_input(inputs: list[pbtxt.Message]) -> str | None:
    """`--input` for a TorchScript model of one input of fixed dims, e.g. float32:3x224x224; None otherwise."""
    if len(inputs) != 1:
        return None
    dtype = DTYPES.get(str(pbtxt.first(inputs[0], "data_type", "")))
    dims = inputs[0].get("dims", [])
    if dtype is None or not dims or not all(isinstance(d, int) and d > 0 for d in dims):
        return None
    return f"{dtype}:{'x'.join(str(d) for d in dims)}"

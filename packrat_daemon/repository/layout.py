"""The model repository on disk: a folder of models in Triton's layout (`repository.triton`), a TOML file listing
models with their own settings, or both (`DIR/repository.toml` beside the folders); `--repository` names the
folder or the TOML file. Every model setting is one of `packrat serve`'s (docs/configuration.md), checked here
against the same table, before any daemon starts (docs/repository.md).

repository.toml:

    [defaults]                 # every model's settings (the command line's flags win over these)
    runtime = "torch"
    [models.bert]              # a model of its own (`model` relative to the file) or settings for a folder's
    model = "bert-folder"
    max_batch = 8
    load = false               # listed, not loaded at start (load it with the repository extension)
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packrat_daemon.config import BY_NAME
from packrat_daemon.repository.errors import RepositoryError
from packrat_daemon.repository.triton import is_triton_model, read_triton_model
from packrat_daemon.settings import unknown_hint

REPOSITORY_TOML = "repository.toml"
# The one gateway's settings: the repository's (its command line or --config), never a model's.
GATEWAY = (
    "http_port",
    "grpc_port",
    "oip_address",
    "oip_model_name",
    "oip_tls_cert",
    "oip_tls_key",
    "oip_limits",
    "oip_metrics_port",
)
_SHARED = "the repository's one gateway serves every model: give it to `packrat serve --repository` itself"
# What a model may not set, and why.
OWNED = {
    "repository": "a repository does not nest",
    "run_dir": "each model's run dir is RUN_DIR/models/NAME, below the repository's --run-dir",
    "control": "each model's control socket is in its own run dir, where the joint plan reaches it",
    "cpus": "the joint plan gives each model its CPUs; the repository's --cpus names those it shares",
    **{name: _SHARED for name in GATEWAY},
}
LOAD = "load"  # not a serve setting: whether the model is loaded at start
# What each model needs a value of its own for: given for every model ([defaults], the flags), refused.
OWN_ONLY = {
    "endpoint": "each model's daemon binds its own ZeroMQ endpoint (default ipc://RUN_DIR/models/NAME/front.ipc)",
    "metrics_port": "each model's daemon would bind the same port; the repository's one metrics endpoint is the "
    "gateway's (/metrics on --http-port, or --oip-metrics-port)",
}
STATE_DIR = "state_dir"  # given for every model: a parent folder, each model's below it (STATE_DIR/NAME)


@dataclass(frozen=True)
class ModelEntry:
    """One model of the repository: its name, what is served, and the settings it brings."""

    name: str
    model: str  # the model spec a daemon serves
    version: str
    source: str  # where it was found
    given: dict[str, Any] = field(default_factory=dict)  # from config.pbtxt
    own: dict[str, Any] = field(default_factory=dict)  # from repository.toml's [models.NAME]
    load: bool = True
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Repository:
    root: Path
    models: dict[str, ModelEntry]
    defaults: dict[str, Any] = field(default_factory=dict)  # repository.toml's [defaults]

    def settings(self, name: str, flags: Mapping[str, Any]) -> dict[str, Any]:
        """The serve settings of model `name`: [defaults], then the flags typed, then config.pbtxt's, then the
        model's own (each wins over those before it), less those the repository owns."""
        entry = self.models[name]
        shared = {**self.defaults, **{k: v for k, v in flags.items() if k not in OWNED}}
        check_shared(shared, "the flags typed or [defaults]")
        if shared.get(STATE_DIR) is not None:
            shared[STATE_DIR] = str(Path(shared[STATE_DIR]) / name)
        merged = {**shared, **entry.given, **entry.own}
        merged["model"] = entry.model
        return merged


def check_shared(values: Mapping[str, Any], where: str) -> None:
    """RepositoryError for a setting given to every model that each model needs a value of its own for."""
    for key in values:
        if key in OWN_ONLY:
            raise RepositoryError(f"{where} give {key} to every model: {OWN_ONLY[key]}; set it in [models.NAME]")


def read_repository(path: str) -> Repository:
    """The repository at `path` (a folder, or a TOML file); RepositoryError saying what to change."""
    given = Path(path).expanduser()
    if given.is_file():
        root, toml = given.parent, given
    elif given.is_dir():
        root, toml = given, given / REPOSITORY_TOML
    else:
        raise RepositoryError(
            f"--repository {path}: no such folder or file; give a folder of models (Triton's "
            f"layout: NAME/1/model.onnx) or a TOML file listing them ({REPOSITORY_TOML})"
        )
    table = _read_toml(toml) if toml.is_file() else {}
    defaults = _checked(table.get("defaults", {}), toml, "[defaults]")
    check_shared(defaults, f"{toml}: [defaults] would")
    listed = _models_table(table, toml)
    models: dict[str, ModelEntry] = {}
    folders = {p.name: p for p in sorted(root.iterdir()) if _model_folder(p)}
    for folder in folders.values():
        triton = read_triton_model(folder)
        own = listed.pop(folder.name, listed.pop(triton.name, {}))
        if "model" in own:
            raise RepositoryError(
                f"{toml}: [models.{folder.name}] gives a model, and {folder} holds one; leave "
                "`model` out to set the folder's settings, or name the entry otherwise"
            )
        _add(
            models,
            ModelEntry(
                triton.name,
                triton.model,
                triton.version,
                str(folder),
                triton.settings,
                *_own(own, toml, triton.name),
                notes=triton.notes,
            ),
        )
    for name, own in listed.items():
        if "model" not in own:
            raise RepositoryError(
                f"{toml}: [models.{name}] has no `model` and {root} has no folder {name}/; give "
                'model = "PATH" (a .onnx, .pt2 or .pt file, or a Hugging Face folder)'
            )
        spec = str(own.pop("model"))
        model = (
            spec
            if spec.startswith(("builtin:", "hf:")) or ":" in spec and not (root / spec).exists()
            else str((root / spec).resolve())
        )
        _add(models, ModelEntry(name, model, "1", str(toml), {}, *_own(own, toml, name)))
    if not models:
        raise RepositoryError(
            f"{given} holds no model; put each in a folder of its own (NAME/1/model.onnx, as "
            f"Triton's layout has it) or list them in {REPOSITORY_TOML} ([models.NAME])"
        )
    return Repository(root, models, defaults)


def _model_folder(path: Path) -> bool:
    return path.is_dir() and not path.name.startswith(".") and is_triton_model(path)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            table = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise RepositoryError(f"{path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise RepositoryError(f"cannot read {path}: {exc.strerror}") from None
    unknown = set(table) - {"defaults", "models"}
    if unknown:
        raise RepositoryError(
            f"{path}: unknown table(s) {', '.join(sorted(unknown))}; a repository file has "
            "[defaults] (every model's settings) and [models.NAME] (one model's)"
        )
    return table


def _models_table(table: dict[str, Any], toml: Path) -> dict[str, dict[str, Any]]:
    models = table.get("models", {})
    if not isinstance(models, dict) or not all(isinstance(v, dict) for v in models.values()):
        raise RepositoryError(f"{toml}: write each model as a table of its own, [models.NAME]")
    return {name: dict(values) for name, values in models.items()}


def _own(values: dict[str, Any], toml: Path, name: str) -> tuple[dict[str, Any], bool]:
    """(the model's own settings, checked; whether it loads at start)."""
    load = values.pop(LOAD, True)
    if not isinstance(load, bool):
        raise RepositoryError(f"{toml}: [models.{name}] load = {load!r}; write true or false")
    return _checked(values, toml, f"[models.{name}]"), load


def _checked(values: Mapping[str, Any], toml: Path, where: str) -> dict[str, Any]:
    """Each value checked against `packrat serve`'s settings table, as a --config file's are."""
    checked = {}
    for key, value in values.items():
        if key in OWNED:
            raise RepositoryError(
                f"{toml}: {where} sets {key}, which a model of a repository does not set: {OWNED[key]}"
            )
        if key == "model" and where.startswith("[models."):
            checked[key] = value
            continue
        setting = BY_NAME.get(key)
        if setting is None:
            raise RepositoryError(f"{toml}: {where}: unknown option {key!r}; {unknown_hint(key, BY_NAME)}")
        checked[key] = setting.kind.parse_toml(key, value, f"{toml} {where}")
    return checked


def _add(models: dict[str, ModelEntry], entry: ModelEntry) -> None:
    if entry.name in models:
        raise RepositoryError(
            f"two models are named {entry.name!r} ({models[entry.name].source} and "
            f"{entry.source}); give each its own name"
        )
    if not entry.name or "/" in entry.name:
        raise RepositoryError(
            f"{entry.source}: the model name {entry.name!r} cannot be served; use letters, digits, '-', '_' or '.'"
        )
    models[entry.name] = entry

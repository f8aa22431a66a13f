"""A folder given as the model: the one model it holds, whatever its name.

KServe's storage initializer copies an InferenceService's storageUri into /mnt/models under the names it had
there, so a serving runtime cannot know the file's name in advance: `serve --model /mnt/models` serves the one
model file (.onnx, .pt2, .pt, .ts) or Hugging Face folder found in it. A folder that holds config.json is a
Hugging Face folder itself (`model_kind`) and is served as it is.
"""

from __future__ import annotations

from pathlib import Path

from packrat_daemon.wire.errors import ModelSpecError
from workers.models.spec import EXPORTED, HF_PREFIX, ONNX_FILE, TORCHSCRIPT, model_kind

FILE_KINDS = (ONNX_FILE, EXPORTED, TORCHSCRIPT)


def models_in(folder: Path) -> list[Path]:
    """The models directly in `folder`, by name: its model files and its subfolders holding a config.json
    (hidden entries, such as a storage tool's bookkeeping, and other files, such as an ONNX file's external
    data or a README, are not models)."""
    found = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir() and (entry / "config.json").is_file() or entry.is_file() and _file_kind(entry) in FILE_KINDS:
            found.append(entry)
    return found


def _file_kind(path: Path) -> str | None:
    try:
        return model_kind(str(path))
    except ModelSpecError:
        return None


def resolve_model(spec: str) -> str:
    """`spec`, or, when it names a folder that is not a Hugging Face folder, the path of the one model in it.

    ModelSpecError, naming what was found, when such a folder holds no model or several.
    """
    folder = Path(spec)
    if spec.startswith(HF_PREFIX) or not folder.is_dir() or (folder / "config.json").is_file():
        return spec
    found = models_in(folder)
    if len(found) == 1:
        return str(found[0])
    kinds = "a .onnx, .pt2, .pt or .ts file, or a Hugging Face folder (one holding config.json)"
    if not found:
        listed = ", ".join(entry.name for entry in sorted(folder.iterdir())[:10]) or "nothing"
        raise ModelSpecError(f"{spec} holds no model (it holds {listed}); give a folder holding one {kinds}")
    names = ", ".join(entry.name for entry in found)
    raise ModelSpecError(f"{spec} holds {len(found)} models ({names}); name the one to serve, e.g. {found[0]}")

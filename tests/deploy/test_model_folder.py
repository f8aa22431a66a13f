"""`serve --model DIR`: the one model in a folder, whatever its name, as KServe's storage initializer leaves it in
/mnt/models (deploy/kserve); a Hugging Face folder stays itself, and a folder of none or several is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from packrat_daemon.cli import build_parser, main
from packrat_daemon.commands.serve import config_loader
from packrat_daemon.wire.errors import ModelSpecError
from workers.models.folder import resolve_model


def loaded(*argv: str) -> str:
    """The model `packrat serve ARGV` serves, as its config loader resolves it (at start and on each reload)."""
    return config_loader(build_parser().parse_args(["serve", *argv]))().model


def hf_folder(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path


@pytest.mark.parametrize("name", ["resnet50-final.pt2", "model.onnx", "weights.pt", "scripted.ts"])
def test_the_one_model_file_is_served_whatever_its_name(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"")
    assert loaded("--model", str(tmp_path)) == str(tmp_path / name)


def test_what_is_not_a_model_beside_it_is_left_alone(tmp_path: Path) -> None:
    """An ONNX file's external data, a README, a Triton config and a storage tool's hidden files are no models."""
    for name in ("classifier.onnx", "classifier.onnx.weights", "README.md", "config.pbtxt", ".lock"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / ".cache").mkdir()
    assert resolve_model(str(tmp_path)) == str(tmp_path / "classifier.onnx")


def test_a_hugging_face_folder_is_itself_or_the_one_inside(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "bert")
    (folder / "model.onnx").write_bytes(b"")  # an export beside the weights: the folder is still the model
    assert resolve_model(str(folder)) == str(folder)
    assert resolve_model(str(tmp_path)) == str(folder)
    assert resolve_model(f"hf:{folder}") == f"hf:{folder}"


def test_anything_but_a_folder_is_left_as_given(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    model.write_bytes(b"")
    for spec in ("builtin:tiny-mlp", str(model), str(tmp_path / "missing"), "pkg.module:build"):
        assert resolve_model(spec) == spec


def test_the_toml_files_model_is_resolved_too(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "net.pt2").write_bytes(b"")
    config = tmp_path / "packrat.toml"
    config.write_text(f'model = "{models}"\n')
    assert loaded("--config", str(config)) == str(models / "net.pt2")


def test_a_folder_of_several_models_is_refused_naming_them(tmp_path: Path) -> None:
    (tmp_path / "a.onnx").write_bytes(b"")
    (tmp_path / "b.pt2").write_bytes(b"")
    hf_folder(tmp_path / "bert")
    with pytest.raises(ModelSpecError, match=r"holds 3 models \(a.onnx, b.pt2, bert\); name the one"):
        resolve_model(str(tmp_path))


def test_a_folder_of_no_model_stops_serve_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("")
    assert main(["serve", "--model", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert f"{tmp_path} holds no model (it holds notes.txt)" in error
    assert "Traceback" not in error

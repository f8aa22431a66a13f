"""The torch-free model input and runtime requirements: InputSpec, sample inputs, which runtimes can start."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.wire.errors import ConfigError, ModelSpecError
from workers.models.spec import (
    BUILTIN,
    EXPORTED,
    FUNCTION,
    HUGGING_FACE,
    INPUT_DTYPES,
    ONNX_FILE,
    RUNTIME_REQUIREMENTS,
    TORCHSCRIPT,
    InputSpec,
    available_runtimes,
    check_model_runtime,
    check_runtime,
    missing_package,
    model_kind,
    model_runtimes,
    sample_input,
)


def test_importing_the_spec_module_imports_no_torch() -> None:
    # The daemon imports this module; torch would cost it seconds at start-up and hundreds of MB.
    code = "import sys, workers.models.spec; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


# -- InputSpec -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("float32:3x224x224", InputSpec("float32", (3, 224, 224))),
        ("int64:128", InputSpec("int64", (128,))),
        ("uint8:1x1", InputSpec("uint8", (1, 1))),
        ("bool", InputSpec("bool", ())),
        ("float16:", InputSpec("float16", ())),
        ("bfloat16:8", InputSpec("bfloat16", (8,))),
    ],
)
def test_input_spec_parses_dtype_and_per_sample_shape(text: str, expected: InputSpec) -> None:
    assert InputSpec.parse(text) == expected


@pytest.mark.parametrize(
    "text", ["float32:3xa", "float32:3x", "float32:3,4", "complex64:3", "float:3", "float32:0x3", "int64:-1", ""]
)
def test_bad_input_strings_show_the_syntax(text: str) -> None:
    with pytest.raises(ModelSpecError, match=r"cannot read input .*float32"):
        InputSpec.parse(text)


def test_input_spec_round_trips_through_json() -> None:
    spec = InputSpec("int64", (128,), high=30522)
    assert spec.to_json() == {"dtype": "int64", "shape": [128], "high": 30522}
    assert InputSpec.from_json(spec.to_json()) == spec
    assert InputSpec.from_json({"dtype": "float32", "shape": [3]}) == InputSpec("float32", (3,))


# -- sample inputs -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [d for d in INPUT_DTYPES if d != "bfloat16"])
def test_sample_input_has_the_declared_dtype_and_shape(dtype: str) -> None:
    batch = sample_input(InputSpec(dtype, (3, 2)), 4)
    assert batch.dtype == np.dtype(dtype)
    assert batch.shape == (4, 3, 2)


def test_sample_input_of_bfloat16_is_its_raw_bits() -> None:
    # numpy has no bfloat16: the wire carries the top 16 bits of each float32, as uint16.
    batch = sample_input(InputSpec("bfloat16", (4,)), 2)
    assert batch.dtype == np.uint16 and batch.shape == (2, 4)
    as_float = (batch.astype(np.uint32) << 16).view(np.float32)
    assert np.all(np.isfinite(as_float)) and 0.1 < float(np.std(as_float)) < 10


def test_sample_input_token_ids_stay_below_high() -> None:
    batch = sample_input(InputSpec("int64", (128,), high=7), 8)
    assert batch.min() >= 0 and batch.max() < 7
    assert len(np.unique(batch)) == 7


def test_sample_input_integers_default_below_100() -> None:
    batch = sample_input(InputSpec("int32", (64,)), 8)
    assert batch.min() >= 0 and batch.max() < 100


def test_sample_input_is_reproducible_by_seed() -> None:
    spec = InputSpec("float32", (16,))
    np.testing.assert_array_equal(sample_input(spec, 2, seed=3), sample_input(spec, 2, seed=3))
    assert not np.array_equal(sample_input(spec, 2, seed=3), sample_input(spec, 2, seed=4))


def test_sample_input_of_scalar_samples_is_one_dimensional() -> None:
    assert sample_input(InputSpec("float32", ()), 5).shape == (5,)


# -- runtime requirements ------------------------------------------------------------------------
def test_every_runtime_has_its_requirements_and_torch_comes_first() -> None:
    from workers.runtimes.registry import RECORDS

    assert list(RUNTIME_REQUIREMENTS) == [record.name for record in RECORDS]
    assert available_runtimes()[0] == "torch"


def test_each_runtimes_packages_are_what_its_pyproject_extra_installs() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())["project"]
    for name, needs in RUNTIME_REQUIREMENTS.items():
        declared = pyproject["optional-dependencies"][needs.extra] if needs.extra else pyproject["dependencies"]
        names = {re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0] for requirement in declared}
        assert set(needs.packages) <= names, f"{name} needs {needs.packages}; {needs.install} installs {names}"


def test_available_runtimes_are_those_with_every_package_installed() -> None:
    installed = [
        name
        for name, needs in RUNTIME_REQUIREMENTS.items()
        if not needs.emulated and all(importlib.util.find_spec(package) is not None for package in needs.packages)
    ]
    assert available_runtimes() == installed


@pytest.mark.parametrize(("runtime", "hidden"), [("onnxruntime", "onnx"), ("openvino", "onnxscript")])
def test_a_runtime_missing_its_exporter_is_not_available(
    runtime: str, hidden: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression: the daemon's own list checked only the runtime's top-level package, so `--runtime auto`
    # picked ONNX Runtime without onnx installed and its template then failed to convert the model.
    if importlib.util.find_spec(runtime) is None:
        pytest.skip(f"{runtime} is not installed")
    monkeypatch.setitem(sys.modules, hidden, None)  # what an uninstalled package looks like to find_spec
    assert missing_package(runtime) == hidden
    assert runtime not in available_runtimes()
    with pytest.raises(ConfigError, match=rf"runtime {runtime} needs the {hidden} package: pip install"):
        check_runtime(runtime)


def test_an_unknown_runtime_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown runtime 'onnx'; available: torch, onnxruntime, openvino"):
        check_runtime("onnx")


# -- model kinds and the runtimes that load them ----------------------------------------------------
def test_each_spec_names_its_kind(tmp_path: Path) -> None:
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    kinds = {
        "builtin:resnet50": BUILTIN, "m.onnx": ONNX_FILE, "m.pt2": EXPORTED, "m.pt": TORCHSCRIPT, "m.ts": TORCHSCRIPT,
        f"hf:{folder}": HUGGING_FACE, str(folder): HUGGING_FACE, "hf:./not-there-yet": HUGGING_FACE,
        "pkg.module:factory": FUNCTION,
    }  # fmt: skip
    assert {spec: model_kind(spec) for spec in kinds} == kinds


def test_a_folder_without_config_json_or_an_unknown_spec_lists_the_kinds(tmp_path: Path) -> None:
    with pytest.raises(ModelSpecError, match="without a config.json, so not a Hugging Face save_pretrained folder"):
        model_kind(str(tmp_path))
    with pytest.raises(ModelSpecError, match=r"cannot tell what model 'model\.bin' is; give builtin:NAME, a \.pt2"):
        model_kind("model.bin")


def test_an_onnx_file_is_loaded_by_onnx_runtime_and_openvino_only() -> None:
    every = ["torch", "onnxruntime", "openvino"]
    assert model_runtimes("m.onnx", every) == ["onnxruntime", "openvino"]
    assert model_runtimes("builtin:tiny-mlp", every) == every
    for runtime in ("onnxruntime", "openvino", "emulated", "emulated:/run/numbers.json"):
        check_model_runtime("m.onnx", runtime)
    check_model_runtime("builtin:tiny-mlp", "torch")
    with pytest.raises(ConfigError, match="runtime torch cannot load m.onnx: it is served by onnxruntime or openvino"):
        check_model_runtime("m.onnx", "torch")


def test_auto_on_an_onnx_file_without_its_runtimes_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(ConfigError, match=r"neither is installed: pip install -e '\.\[onnx\]' or pip install"):
        check_model_runtime("m.onnx", "auto")
    check_model_runtime("builtin:tiny-mlp", "auto")  # torch serves it

"""The runtime registry: `make_runtime` builds each runtime by name, at a precision, or says what to install."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from packrat_daemon.wire.errors import ConfigError
from workers.models.spec import EMULATED, available_runtimes
from workers.runtimes import make_runtime, runtime_class
from workers.runtimes.emulated import EmulatedRuntime
from workers.runtimes.onnx_runtime import OnnxRuntime
from workers.runtimes.openvino_runtime import OpenVinoRuntime
from workers.runtimes.registry import BY_NAME
from workers.runtimes.torch_runtime import TorchRuntime


def test_make_runtime_builds_the_torch_runtime() -> None:
    assert isinstance(make_runtime("torch"), TorchRuntime)


@pytest.mark.parametrize(("name", "kind"), [("onnxruntime", OnnxRuntime), ("openvino", OpenVinoRuntime)])
def test_make_runtime_builds_the_session_runtimes(name: str, kind: type) -> None:
    pytest.importorskip(name)
    runtime = make_runtime(name)
    assert isinstance(runtime, kind) and runtime.name == name and not runtime.rethreads_in_place


def test_every_registered_name_is_the_runtimes_own() -> None:
    assert sorted(BY_NAME) == sorted(["torch", "onnxruntime", "openvino", EMULATED])
    for name in BY_NAME:
        assert runtime_class(name).name == name
    assert runtime_class("torch") is TorchRuntime and runtime_class(EMULATED) is EmulatedRuntime


def test_importing_the_registry_imports_no_runtime() -> None:
    """The daemon reads the registry (the installed runtimes, their precisions): no runtime module, no package."""
    import subprocess

    code = (
        "import sys, workers.models.spec, workers.runtimes; "
        "print(sorted(m for m in sys.modules if m.startswith('workers.runtimes.') or m in ('torch', 'onnxruntime')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['workers.runtimes.registry']"


def test_an_emulated_template_is_told_its_numbers_inside_the_name(tmp_path: Path) -> None:
    runtime = make_runtime(f"{EMULATED}:{tmp_path / 'numbers.json'}")
    assert isinstance(runtime, EmulatedRuntime) and runtime.numbers_file == str(tmp_path / "numbers.json")


def test_make_runtime_applies_the_precision_and_the_calibration_file(tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    runtime = make_runtime("openvino", f"int8:{tmp_path / 'calibration.npy'}")
    assert (runtime.precision, runtime.calibration) == ("int8", str(tmp_path / "calibration.npy"))
    assert make_runtime("torch", "bf16").precision == "bf16"


def test_make_runtime_refuses_a_precision_the_runtime_cannot_serve() -> None:
    with pytest.raises(ConfigError, match="runtime torch cannot serve int8"):
        make_runtime("torch", "int8")


def test_make_runtime_unknown_lists_the_available_runtimes() -> None:
    with pytest.raises(ConfigError, match="unknown runtime 'onnx'; available: torch"):
        make_runtime("onnx")


@pytest.mark.parametrize(
    ("name", "package", "extra"), [("onnxruntime", "onnxruntime", "onnx"), ("openvino", "openvino", "openvino")]
)
def test_a_missing_package_gives_an_install_hint(
    name: str, package: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # what an uninstalled package looks like to find_spec
    with pytest.raises(
        ConfigError, match=rf"runtime {name} needs the {package} package: pip install -e '\.\[{extra}\]'"
    ):
        make_runtime(name)
    assert name not in available_runtimes()
    assert available_runtimes()[0] == "torch"

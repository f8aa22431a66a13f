"""The PyTorch → ONNX export made once for both runtimes: whichever of ONNX Runtime and OpenVINO is converted
second reads the first one's export from the cache instead of exporting again, and serves exactly what a
conversion from a fresh export serves.

Each direction gets a fresh cache folder (this is a test of the cache), with builtin:tiny-mlp converted first
for one runtime as `packrat serve` converts it; the second runtime's converter then runs in a child process
whose exporter fails the test if it is called. Comparing the two folders compares a conversion from a fresh
export (the first runtime's in one folder) with one from the kept export (the same runtime's in the other).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.models import cache as conversion

pytest.importorskip("onnxruntime")
pytest.importorskip("openvino")

MODEL = "builtin:tiny-mlp"
REPO = Path(__file__).resolve().parents[3]
# The converter as `workers.models.cache.run_step` runs it, with the exporter replaced by one that fails.
WITHOUT_THE_EXPORTER = """\
import sys
import workers.models.convert as convert

def exporter_called(*args, **kwargs):
    raise AssertionError("the converter exported the model again; the cache holds its export")

convert.export_onnx = exporter_called
sys.exit(convert.main(sys.argv[1:]))
"""


def convert_without_the_exporter(spec: str, input_override: str | None, runtime: str, out: Path) -> None:
    """`run_converter`'s stand-in: the same converter, in a child process as always, unable to export."""
    assert input_override is None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-c", WITHOUT_THE_EXPORTER, "--model", spec, "--runtime", runtime, "--out", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def first_converted(tmp_path_factory: pytest.TempPathFactory, runtime: str) -> Iterator[Path]:
    """A fresh cache folder where MODEL was converted for `runtime` alone, exporting it."""
    folder = tmp_path_factory.mktemp(f"{runtime}-first")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PACKRAT_CACHE_DIR", str(folder))  # the converter subprocesses inherit it
        conversion.ensure_converted(MODEL, None, runtime)
        yield folder


@pytest.fixture(scope="module")
def onnxruntime_first(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from first_converted(tmp_path_factory, "onnxruntime")


@pytest.fixture(scope="module")
def openvino_first(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from first_converted(tmp_path_factory, "openvino")


def converted_second(folder: Path, runtime: str, monkeypatch: pytest.MonkeyPatch) -> conversion.Converted:
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(folder))
    monkeypatch.setattr(conversion, "run_converter", convert_without_the_exporter)
    return conversion.ensure_converted(MODEL, None, runtime)


def the_export(folder: Path) -> Path:
    (export,) = [path for path in folder.iterdir() if path.is_dir() and path.name.startswith(conversion.EXPORT)]
    return export


@pytest.mark.slow
def test_openvino_is_converted_from_onnx_runtime_s_export_to_the_same_ir_as_from_a_fresh_one(
    onnxruntime_first: Path, openvino_first: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export = the_export(onnxruntime_first)
    before = {path.name: path.stat().st_mtime_ns for path in export.iterdir()}
    reused = converted_second(onnxruntime_first, "openvino", monkeypatch)
    assert reused.meta["onnx_export"] == export.name and reused.meta["exporter"] == "dynamo"
    assert {path.name: path.stat().st_mtime_ns for path in export.iterdir()} == before  # read, not rewritten
    assert the_export(onnxruntime_first) == export  # one export for both runtimes
    fresh = conversion.read_entry(openvino_first / conversion.entry_dir(MODEL, None, "openvino").name, "model.xml")
    assert fresh is not None  # converted from the export its own conversion made
    for name in ("model.xml", "model.bin"):
        assert (reused.path.parent / name).read_bytes() == (fresh.path.parent / name).read_bytes(), name
    assert reused.input == fresh.input and reused.meta["max_abs_error"] == fresh.meta["max_abs_error"]


@pytest.mark.slow
def test_onnx_runtime_serves_the_export_openvino_s_conversion_made(
    openvino_first: Path, onnxruntime_first: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export = the_export(openvino_first)
    reused = converted_second(openvino_first, "onnxruntime", monkeypatch)
    assert reused.meta["onnx_export"] == export.name and reused.path.parent.parent == openvino_first
    files = sorted(path.name for path in export.iterdir() if path.name != "meta.json")
    assert files == ["model.onnx", "model.onnx.data"]  # the graph and its weights, which the graph names
    for name in files:
        assert os.path.samefile(reused.path.parent / name, export / name), name  # on disk once
        fresh = onnxruntime_first / conversion.entry_dir(MODEL, None, "onnxruntime").name / name
        assert (export / name).read_bytes() == fresh.read_bytes(), name  # what a fresh export gives
    kept = conversion.read_entry(export, conversion.EXPORT_ARTIFACT)
    assert kept is not None and reused.input == kept.input

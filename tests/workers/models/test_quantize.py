"""int8: NNCF's post-training quantization of the OpenVINO model, its cache, and who may serve it."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.wire.errors import ConfigError
from workers.models import cache as conversion
from workers.models.precision import cpu_units, run_both
from workers.models.spec import PRECISION_CHOICES, InputSpec, check_precision, runtime_precisions

NEEDS_NNCF = pytest.mark.skipif(
    importlib.util.find_spec("nncf") is None or importlib.util.find_spec("openvino") is None,
    reason="int8 needs OpenVINO and NNCF (pip install -e '.[openvino]')",
)


def test_int8_is_offered_but_only_openvino_serves_it() -> None:
    assert "int8" in PRECISION_CHOICES and "int8" in runtime_precisions("openvino")
    for runtime in ("torch", "onnxruntime"):
        with pytest.raises(ConfigError, match="int8 is served by --runtime openvino"):
            check_precision(runtime, "int8")
    check_precision("openvino", "int8")


def test_int8_units() -> None:
    assert cpu_units("int8", frozenset({"avx512_vnni", "avx512f"})) == ["avx512_vnni"]
    assert cpu_units("int8", frozenset({"avx2"})) == []


def seed_with_the_fp32_conversion(shared: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point $PACKRAT_CACHE_DIR at `cache`, a fresh folder holding only a copy of builtin:tiny-mlp's OpenVINO fp32
    conversion (int8's source), made once per session in the `shared` cache (test_session_runtimes uses it too):
    what is tested here is quantizing and its own cache entries, and this cache starts with none of them."""
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(shared))
    source = conversion.ensure_converted("builtin:tiny-mlp", None, "openvino")
    shutil.copytree(source.path.parent, cache / source.path.parent.name)
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(cache))


@NEEDS_NNCF
@pytest.mark.slow
def test_int8_is_quantized_once_per_calibration_and_stays_close_to_fp32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_conversion_cache: Path
) -> None:
    seed_with_the_fp32_conversion(shared_conversion_cache, tmp_path / "cache", monkeypatch)
    mine = tmp_path / "mine.npy"
    np.save(mine, np.random.default_rng(3).standard_normal((12, 16), dtype=np.float32))
    inputs = np.random.default_rng(4).standard_normal((6, 16), dtype=np.float32)
    ran = run_both("builtin:tiny-mlp", None, "openvino", "int8", inputs, str(mine))
    assert ran["quantization"]["calibration"] == f"12 inputs of --calibration {mine.resolve()}"
    assert ran["quantization"]["scheme"] == "default" and ran["runtime_has_units"] in (True, False)
    reference, reduced = ran["reference"], ran["reduced"]
    assert not np.array_equal(reference, reduced)  # it did run quantized
    assert np.abs(reduced - reference).max() <= 0.5 * np.abs(reference).max()
    entries = sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir() and "int8" in p.name)
    assert len(entries) == 1
    conversion.ensure_quantized("builtin:tiny-mlp", None, str(mine))  # cached: no new entry
    samples = conversion.ensure_quantized("builtin:tiny-mlp", None, None)  # other inputs, another entry
    assert samples.meta["quantization"]["calibration"].startswith(f"{conversion.QUANTIZE_SAMPLES} random sample")
    assert len([p for p in (tmp_path / "cache").iterdir() if p.is_dir() and "int8" in p.name]) == 2


def test_each_calibration_gets_its_own_entry_and_each_caller_is_told_its_own_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The int8 cache's key, with the quantizer replaced (the slow test above quantizes for real): the same inputs'
    bytes find the same entry without quantizing, even from another file, which the entry found then names."""
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(conversion, "installed", lambda package: True)
    source = tmp_path / "cache" / "openvino-fp32" / "model.xml"
    source.parent.mkdir(parents=True)
    source.write_text("fp32")
    spec = InputSpec("float32", (16,))
    fp32 = conversion.Converted(source, spec, {"input": spec.to_json(), "notes": []})
    monkeypatch.setattr(conversion, "ensure_converted", lambda *args: fp32)
    quantized: list[np.ndarray] = []

    def quantize(module: str, args: list[str], what: str) -> None:
        given = dict(zip(args[::2], args[1::2], strict=True))
        quantized.append(np.load(given["--inputs"]))
        Path(given["--out"]).write_text("int8")
        Path(given["--report"]).write_text(json.dumps({"scheme": "default", "nncf": "test"}))

    monkeypatch.setattr(conversion, "run_step", quantize)
    mine = tmp_path / "mine.npy"
    np.save(mine, np.random.default_rng(3).standard_normal((12, 16), dtype=np.float32))
    first = conversion.ensure_quantized("builtin:tiny-mlp", None, str(mine))
    assert len(quantized) == 1 and np.array_equal(quantized[0], np.load(mine))
    copy = tmp_path / "copy.npy"
    shutil.copyfile(mine, copy)
    again = conversion.ensure_quantized("builtin:tiny-mlp", None, str(copy))  # the same bytes: the same entry
    assert len(quantized) == 1 and again.path == first.path
    assert again.meta["quantization"]["calibration"] == f"12 inputs of --calibration {copy}"
    samples = conversion.ensure_quantized("builtin:tiny-mlp", None, None)  # other inputs, another entry
    assert len(quantized) == 2 and samples.path != first.path and len(quantized[1]) == conversion.QUANTIZE_SAMPLES
    assert samples.meta["quantization"]["calibration"].startswith(f"{conversion.QUANTIZE_SAMPLES} random sample")
    assert samples.meta["precision"] == "int8" and samples.path.read_text() == "int8"


def test_int8_without_nncf_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nncf", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[openvino\]'"):
        conversion.ensure_quantized("builtin:tiny-mlp", None, None)


@NEEDS_NNCF
@pytest.mark.slow
def test_int8_refuses_a_model_of_several_inputs_saying_what_to_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers import onnx_models

    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(tmp_path / "cache"))
    path = onnx_models.two_inputs(tmp_path / "two-inputs.onnx")
    with pytest.raises(ConfigError, match=r"takes several \(a, b\): serve --precision fp32 or bf16"):
        conversion.ensure_quantized(str(path), None, None)

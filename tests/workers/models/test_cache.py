"""The conversion cache, without real conversions: one conversion per entry however many ask at once, no
half-written entry, and the key that decides when a conversion is made again."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from workers.models import cache as conversion
from workers.models.spec import InputSpec


def _fake_converter(calls: list[str], delay_s: float = 0.0) -> Callable[[str, str | None, str, Path], None]:
    def convert(spec: str, input_override: str | None, runtime: str, out: Path) -> None:
        calls.append(spec)
        time.sleep(delay_s)
        out.write_text("model")
        (out.parent / "meta.json").write_text('{"input": {"dtype": "float32", "shape": [4], "high": null}}')

    return convert


def test_concurrent_conversions_run_the_converter_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(tmp_path))
    calls: list[str] = []
    monkeypatch.setattr(conversion, "run_converter", _fake_converter(calls, delay_s=0.3))
    results: list[conversion.Converted] = []
    workers = [
        threading.Thread(target=lambda: results.append(conversion.ensure_converted("builtin:x", None, "onnxruntime")))
        for _ in range(3)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(10)
    assert calls == ["builtin:x"]
    assert len({r.path for r in results}) == 1 and len(results) == 3
    assert results[0].input == InputSpec("float32", (4,))
    # Only the entry, its lock file and nothing half-written are left.
    assert sorted(p.name.endswith(".lock") for p in tmp_path.iterdir()) == [False, True]


def test_a_failed_conversion_leaves_no_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(tmp_path))

    def fail(*args: object) -> None:
        raise conversion.ConversionError("the exporter failed")

    monkeypatch.setattr(conversion, "run_converter", fail)
    with pytest.raises(conversion.ConversionError, match="exporter failed"):
        conversion.ensure_converted("builtin:x", None, "openvino")
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_cache_key_depends_on_model_input_runtime_and_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    key = conversion.cache_key("builtin:tiny-mlp", None, "onnxruntime")
    assert key == conversion.cache_key("builtin:tiny-mlp", None, "onnxruntime")
    assert key != conversion.cache_key("builtin:tiny-cnn", None, "onnxruntime")
    assert key != conversion.cache_key("builtin:tiny-mlp", "float32:16", "onnxruntime")
    assert key != conversion.cache_key("builtin:tiny-mlp", None, "openvino")
    monkeypatch.setattr(conversion, "_version", lambda package: "99.0" if package == "onnxruntime" else "1.0")
    assert key != conversion.cache_key("builtin:tiny-mlp", None, "onnxruntime")


def test_cache_key_changes_when_the_model_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "model.pt2"
    path.write_bytes(b"one")
    key = conversion.cache_key(str(path), None, "onnxruntime")
    path.write_bytes(b"other bytes")
    os.utime(path, ns=(1, 1))
    assert key != conversion.cache_key(str(path), None, "onnxruntime")


def test_cache_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(tmp_path))
    assert conversion.cache_dir() == tmp_path
    monkeypatch.delenv("PACKRAT_CACHE_DIR")
    assert conversion.cache_dir() == Path.home() / ".cache" / "packrat"


def test_both_runtimes_keys_cover_the_export_s_and_the_export_s_no_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    def keys() -> tuple[str, str, str]:
        export = conversion.export_key("builtin:tiny-mlp", None)
        return export, *(conversion.cache_key("builtin:tiny-mlp", None, runtime) for runtime in conversion.ARTIFACTS)

    export, onnxruntime, openvino = keys()
    assert export != conversion.export_key("builtin:tiny-cnn", None)
    assert export != conversion.export_key("builtin:tiny-mlp", "float32:16")
    real = conversion._version
    with monkeypatch.context() as patch:  # a new exporter: a new export, and both runtimes converted from it again
        patch.setattr(conversion, "_version", lambda package: "99.0" if package == "onnx-ir" else real(package))
        assert all(new != old for new, old in zip(keys(), (export, onnxruntime, openvino), strict=True))
    with monkeypatch.context() as patch:  # another opset asked for: the same
        patch.setitem(conversion.EXPORT_OPSETS, "dynamo", conversion.EXPORT_OPSETS["dynamo"] + 1)
        assert all(new != old for new, old in zip(keys(), (export, onnxruntime, openvino), strict=True))
    with monkeypatch.context() as patch:  # a new ONNX Runtime: its own entry only, from the same export
        patch.setattr(conversion, "_version", lambda package: "99.0" if package == "onnxruntime" else real(package))
        assert keys() == (export, keys()[1], openvino) and keys()[1] != onnxruntime


def test_the_export_is_made_once_and_read_back_from_its_own_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(tmp_path))
    calls: list[Path] = []

    def export(path: Path) -> dict:
        calls.append(path)
        path.write_text("graph")
        return {"input": {"dtype": "float32", "shape": [4], "high": None}, "exporter": "dynamo"}

    made = conversion.ensure_exported("builtin:x", None, export)
    again = conversion.ensure_exported("builtin:x", None, export)
    assert len(calls) == 1 and made == again
    assert made.path == conversion.export_dir("builtin:x", None) / "model.onnx" and made.path.read_text() == "graph"
    assert made.input == InputSpec("float32", (4,)) and made.meta["exporter"] == "dynamo"
    assert made.path.parent.name.startswith(f"{conversion.EXPORT}-")

"""Reduced precision on the workers' side: CPU units, which runtime serves which precision, bf16 runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.wire.errors import ConfigError
from workers.models.precision import cpu_flags, cpu_units, run_both
from workers.models.spec import check_precision, runtime_precisions
from workers.runtimes import make_runtime

NEEDS_BF16_UNITS = pytest.mark.skipif(
    not cpu_units("bf16"), reason="this CPU has no bf16 units (neither amx_bf16 nor avx512_bf16 in /proc/cpuinfo)"
)


def test_cpu_flags_come_from_the_first_processor(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx512_bf16 amx_tile\n\nprocessor\t: 1\nflags\t: fpu\n")
    flags = cpu_flags(str(cpuinfo))
    assert flags == {"fpu", "sse", "avx512_bf16", "amx_tile"}
    assert cpu_units("bf16", flags) == ["avx512_bf16"]
    assert cpu_units("bf16", frozenset({"avx2"})) == [] and cpu_units("fp32", flags) == []
    assert cpu_flags(str(tmp_path / "absent")) == frozenset()


def test_onnxruntime_refuses_bf16_and_says_where_to_get_it() -> None:
    assert runtime_precisions("onnxruntime") == ("fp32",)
    with pytest.raises(ConfigError, match="runtime torch or openvino"):
        check_precision("onnxruntime", "bf16")
    with pytest.raises(ConfigError, match="unknown precision 'fp8'"):
        check_precision("torch", "fp8")
    assert runtime_precisions("an-emulated-one") == ("fp32",)  # a runtime not in the table serves fp32


def test_torch_at_bf16_answers_float32_close_to_fp32() -> None:
    runtime = make_runtime("torch", "bf16")
    assert runtime.precision == "bf16"
    runtime.load("builtin:tiny-mlp")
    runtime.set_threads(1)
    batch = np.random.default_rng(0).standard_normal((4, 16), dtype=np.float32)
    out = runtime.run(batch)
    reference = make_runtime("torch")
    reference.load("builtin:tiny-mlp")
    expected = reference.run(batch)
    assert out.dtype == np.float32 and out.shape == expected.shape
    assert not np.array_equal(out, expected)  # it did run in bf16
    assert np.abs(out - expected).max() <= 0.05 * np.abs(expected).max()


@pytest.mark.slow  # 7-9 s: both runtimes compile a model
@NEEDS_BF16_UNITS
def test_both_runtimes_report_their_bf16_units_here() -> None:
    pytest.importorskip("openvino")
    inputs = np.zeros((2, 16), dtype=np.float32)
    for runtime in ("torch", "openvino"):
        assert run_both("builtin:tiny-mlp", None, runtime, "bf16", inputs)["runtime_has_units"] is True

"""Contract tests every runtime must pass against its record in the registry (as `policies.testing` is for policies).

Use it from a test module, one class per runtime::

    from workers.runtimes.testing import RuntimeContract

    class TestMyRuntime(RuntimeContract):
        name = "myruntime"  # its record's name in workers.runtimes.registry

The fast tests check the record against the runtime and against every table derived from it: its class and
name, the packages it needs and what says so, the precisions it serves and refuses, the model files it loads and
the file a conversion writes for it. `test_serves_a_model` (slow) loads a small model and runs a batch through it;
override the `made` fixture for a runtime that `make_runtime(name)` cannot build alone (the emulated one needs the
daemon's numbers). `test_it_is_made_by_name_at_each_of_its_precisions` is slow too: making one imports its package.
Tests of a runtime whose packages are not installed skip, saying which.

This module imports pytest, so the daemon and the workers never import it.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from packrat_daemon.wire.errors import ConfigError
from workers.models.cache import ARTIFACTS
from workers.models.spec import (
    OPT_IN_PRECISIONS,
    PRECISIONS,
    available_runtimes,
    check_model_runtime,
    check_precision,
    missing_package,
    model_runtimes,
    runtime_precisions,
    sample_input,
)
from workers.runtimes import make_runtime
from workers.runtimes.base import Runtime, SessionRuntime
from workers.runtimes.registry import BY_NAME, RuntimeRecord

SMALL_MODEL = "builtin:tiny-mlp"


class RuntimeContract:
    """Pytest tests that every runtime and its `RuntimeRecord` must pass. Subclasses set `name`."""

    name: ClassVar[str] = ""

    # -- fixtures ------------------------------------------------------------------------------
    @pytest.fixture
    def record(self) -> RuntimeRecord:
        assert self.name in BY_NAME, f"runtime {self.name!r} has no record in workers.runtimes.registry"
        return BY_NAME[self.name]

    @pytest.fixture
    def installed(self, record: RuntimeRecord) -> RuntimeRecord:
        missing = missing_package(record.name)
        if missing is not None:
            pytest.skip(f"runtime {record.name} needs the {missing} package: {record.install}")
        return record

    @pytest.fixture
    def made(self, installed: RuntimeRecord) -> Runtime:
        """The runtime as a template makes it, at fp32."""
        return make_runtime(installed.name)

    # -- the record and its runtime ------------------------------------------------------------
    def test_its_class_is_a_runtime_of_its_name(self, record: RuntimeRecord) -> None:
        runtime = record.runtime_class()
        assert isinstance(runtime, type) and issubclass(runtime, Runtime), f"{record.runtime} is not a Runtime"
        assert runtime.name == record.name, f"{record.runtime}.name is {runtime.name!r}, its record's {record.name!r}"
        assert record.runtime.startswith("workers.runtimes."), "a runtime's module lies in workers/runtimes/"
        assert record.summary and not record.summary.endswith("."), "a few words, as a table's cell"

    def test_its_packages_say_what_to_install(self, record: RuntimeRecord) -> None:
        assert len(set(record.packages)) == len(record.packages)
        assert record.packages or record.emulated, "a runtime that computes imports the package that does"
        assert record.install.startswith("pip install -e ")
        computes_here = not record.emulated and missing_package(record.name) is None
        assert (record.name in available_runtimes()) is computes_here, "a candidate of auto: installed, computing"

    def test_its_libraries_are_versioned_packages(self, record: RuntimeRecord) -> None:
        # What a saved profile holds for: a computing runtime's results change with its libraries' versions.
        assert bool(record.libraries) is not record.emulated
        assert set(record.libraries) <= {"torch", *record.packages}, "torch (the exporter) or its own packages"

    def test_it_serves_its_precisions_and_refuses_the_others_saying_why(self, record: RuntimeRecord) -> None:
        assert "fp32" in record.precisions and set(record.precisions) <= {*PRECISIONS, *OPT_IN_PRECISIONS}
        assert runtime_precisions(record.name) == record.precisions
        for precision in record.precisions:
            check_precision(record.name, precision)
        for precision in {*PRECISIONS, *OPT_IN_PRECISIONS} - set(record.precisions):
            with pytest.raises(ConfigError, match=f"runtime {record.name} cannot serve {precision}") as refused:
                check_precision(record.name, precision)
            if precision == "bf16" and record.precision_refusal is not None:
                assert record.precision_refusal in str(refused.value)
        assert record.precision_refusal is None or "bf16" not in record.precisions, "a refusal of what it serves"

    def test_it_loads_an_onnx_file_only_if_its_record_says_so(self, record: RuntimeRecord) -> None:
        assert model_runtimes("model.onnx", [record.name]) == ([record.name] if record.onnx_files else [])
        if record.onnx_files:
            check_model_runtime("model.onnx", record.name)
        else:
            with pytest.raises(ConfigError, match=f"runtime {record.name} cannot load model.onnx"):
                check_model_runtime("model.onnx", record.name)

    def test_a_converted_runtime_opens_the_file_its_record_names(self, record: RuntimeRecord) -> None:
        assert ARTIFACTS.get(record.name) == record.artifact
        if record.artifact is not None:
            assert "/" not in record.artifact, "a file of the runtime's cache entry"
            # It opens the converted file and builds a session per thread count on it (workers.runtimes.base).
            assert issubclass(record.runtime_class(), SessionRuntime)

    @pytest.mark.slow  # making one imports its package (torch: seconds)
    def test_it_is_made_by_name_at_each_of_its_precisions(self, installed: RuntimeRecord) -> None:
        for precision in installed.precisions:
            runtime = make_runtime(installed.name, precision)
            assert (runtime.name, runtime.precision) == (installed.name, precision)

    # -- serving -------------------------------------------------------------------------------
    @pytest.mark.slow
    def test_serves_a_model(self, made: Runtime) -> None:
        """Loaded once (as a template does), at one thread and then two, a batch in gives a row out per input."""
        spec = made.load(SMALL_MODEL)
        made.set_threads(1)  # a worker's first, after the fork
        first = made.run(sample_input(spec, 3))
        made.prepare_threads(2)()  # a re-plan's: built beside the serving one, then swapped in
        again = made.run(sample_input(spec, 3))
        for out in (first, again):
            assert isinstance(out, np.ndarray) and out.shape[0] == 3, f"{made.name} answered {out.shape}"
        assert first.shape == again.shape and first.dtype == again.dtype

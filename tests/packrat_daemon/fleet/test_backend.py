"""The internal channel: allocator preloading, template start-up errors, the model's input."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zmq

from packrat_daemon.fleet.backend import GLIBC_MALLOC_TUNING, Backend, ModelInfo, TemplateError, allocator_library
from packrat_daemon.wire.client import Client
from packrat_daemon.wire.errors import ConfigError
from tests.helpers.daemons import running_daemon
from workers.models.spec import InputSpec, sample_input


def test_unknown_allocator_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="system, jemalloc or tcmalloc"):
        allocator_library("hoard")


def test_system_allocator_preloads_nothing() -> None:
    assert allocator_library("system") is None


@pytest.mark.slow
def test_template_that_cannot_load_the_model_says_why(tmp_path: Path) -> None:
    context = zmq.Context()
    backend = Backend(context, str(tmp_path / "run"))
    try:
        backend.start_template("builtin:no-such-model")
        with pytest.raises(TemplateError, match="unknown built-in model 'no-such-model'"):
            backend.wait_template(timeout=120)
    finally:
        backend.close()
        context.term()


@pytest.mark.slow
@pytest.mark.parametrize("allocator", ["jemalloc", "tcmalloc"])
def test_allocator_is_preloaded_into_every_worker(tmp_path: Path, allocator: str) -> None:
    try:
        library = allocator_library(allocator)
    except ConfigError as exc:
        pytest.skip(str(exc))
    args = ["--model", "builtin:tiny-mlp", "--policy", "single", "--max-batch", "2", "--allocator", allocator]
    with running_daemon(tmp_path, *args) as (endpoint, _), Client(endpoint, timeout=30) as client:
        pids = [w["pid"] for w in client.info()["workers"]]
        for pid in pids:
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert os.path.basename(library) in maps


@pytest.mark.slow
def test_workers_run_with_the_glibc_tuning_and_the_users_own_setting_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")
    monkeypatch.delenv("MALLOC_MMAP_MAX_", raising=False)
    args = ["--model", "builtin:tiny-mlp", "--policy", "single", "--max-batch", "2"]
    with running_daemon(tmp_path, *args) as (endpoint, _), Client(endpoint, timeout=30) as client:
        pids = [w["pid"] for w in client.info()["workers"]]
        assert pids
        for pid in pids:
            environment = dict(
                entry.split("=", 1) for entry in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in entry
            )
            assert environment["MALLOC_MMAP_MAX_"] == GLIBC_MALLOC_TUNING["MALLOC_MMAP_MAX_"]
            assert environment["MALLOC_TRIM_THRESHOLD_"] == "12345"


def test_model_info_gives_the_input_spec_the_workers_sample_from() -> None:
    # The daemon's measurements make their inputs from this spec with the workers' own function, so a
    # bfloat16 model (no numpy dtype) gets its raw bits as uint16, as the wire carries them.
    info = ModelInfo("builtin:x", "torch", "bfloat16", (8,), None, template_pid=1)
    assert info.input == InputSpec("bfloat16", (8,))
    batch = sample_input(info.input, 2, seed=2)
    assert batch.dtype == np.uint16 and batch.shape == (2, 8)

"""ONNX Runtime and OpenVINO on a model of several outputs: exported with each output under its name, fed and
read by name, and answering the records of all of them, as PyTorch does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from packrat_daemon.wire.codec import unpack_records
from tests.helpers.daemons import daemon_env
from tests.model_factories import TwoOutputs


@pytest.fixture(scope="module")
def cache(shared_conversion_cache: Path) -> Iterator[Path]:
    """The session's shared cache: what is tested is what each runtime answers, not the conversion, and the
    second runtime reads the first one's ONNX export."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PACKRAT_CACHE_DIR", str(shared_conversion_cache))
        patch.setenv("PYTHONPATH", daemon_env()["PYTHONPATH"])  # the converter's subprocess imports the factory
        yield shared_conversion_cache


@pytest.mark.slow
@pytest.mark.usefixtures("cache")
@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_a_dict_of_two_outputs_is_answered_both_by_name(runtime: str) -> None:
    pytest.importorskip(runtime)
    from workers.runtimes import make_runtime

    instance = make_runtime(runtime)
    spec = instance.load("tests.model_factories:two_outputs")
    assert [t.name for t in spec.outputs] == ["scores", "probabilities"]
    instance.set_threads(1)
    x = np.random.default_rng(3).standard_normal((5, 16), dtype=np.float32)
    scores, probabilities = unpack_records(instance.run(x), [(t.dtype, t.shape) for t in spec.outputs])
    with torch.inference_mode():
        expected = TwoOutputs()(torch.from_numpy(x))
    np.testing.assert_allclose(scores, expected["scores"].numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(probabilities, expected["probabilities"].numpy(), rtol=1e-4, atol=1e-5)

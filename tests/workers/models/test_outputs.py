"""Models of several inputs or outputs: every input passed by name, every output served and named (records of
them for the worker to answer), and what cannot be served refused or left out at load, saying what to do."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from packrat_daemon.wire.codec import pack_records, unpack_records
from packrat_daemon.wire.errors import ModelSpecError
from tests.model_factories import TwoOutputs
from workers.models.loading import load_model
from workers.models.outputs import Served, serve_outputs
from workers.models.spec import InputSpec, TensorSpec

FLOAT16 = InputSpec("float32", (16,))


def expected(x: torch.Tensor) -> dict[str, torch.Tensor]:
    with torch.inference_mode():
        return TwoOutputs()(x)


def answered(loaded_module: object, spec: InputSpec, x: torch.Tensor) -> list[np.ndarray]:
    with torch.inference_mode():
        out = loaded_module(x)  # type: ignore[operator]
    assert isinstance(out, torch.Tensor) and out.dtype == torch.uint8
    return unpack_records(out.numpy(), [(t.dtype, t.shape) for t in spec.outputs])


@pytest.mark.parametrize(
    ("factory", "names", "keys"),
    [
        ("two_outputs", ["scores", "probabilities"], ["scores", "probabilities"]),
        ("pair_output", ["output_0", "output_1"], ["scores", "probabilities"]),
    ],
)
def test_a_dict_or_tuple_serves_every_output_named(factory: str, names: list[str], keys: list[str]) -> None:
    loaded = load_model(f"tests.model_factories:{factory}")
    assert [t.name for t in loaded.input.outputs] == names
    assert [(t.dtype, t.shape) for t in loaded.input.outputs] == [("float32", (4,))] * 2
    x = torch.randn(3, 16)
    for got, key in zip(answered(loaded.module, loaded.input, x), keys, strict=True):
        np.testing.assert_allclose(got, expected(x)[key].numpy(), rtol=1e-6)
    assert loaded.notes == ()


def test_a_declared_output_is_served_alone_as_it_is() -> None:
    loaded = load_model("tests.model_factories:two_outputs_serving_probabilities")
    assert [t.name for t in loaded.input.outputs] == ["probabilities"]
    x = torch.randn(3, 16)
    with torch.inference_mode():
        torch.testing.assert_close(loaded.module(x), expected(x)["probabilities"])


def test_a_model_output_object_serves_its_fields_by_name() -> None:
    pytest.importorskip("transformers")
    loaded = load_model("tests.model_factories:tiny_bert_model")
    assert [(t.name, t.shape) for t in loaded.input.outputs] == [
        ("last_hidden_state", (12, 32)),
        ("pooler_output", (32,)),
    ]
    ids = torch.randint(0, 100, (2, 12))
    hidden, pooled = answered(loaded.module, loaded.input, ids)
    with torch.inference_mode():
        reference = loaded.module.model(ids)  # type: ignore[union-attr]  # the BertModel itself
    np.testing.assert_allclose(hidden, reference.last_hidden_state.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pooled, reference.pooler_output.numpy(), rtol=1e-5, atol=1e-6)


class _TwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"masked": x * mask, "count": mask.sum(dim=1, keepdim=True)}


def test_several_inputs_are_unpacked_from_records_and_passed_by_name() -> None:
    spec = InputSpec.of([TensorSpec("x", "float32", (5,)), TensorSpec("mask", "int64", (5,), high=2)])
    assert (spec.dtype, spec.shape, spec.records) == ("uint8", (5 * 4 + 5 * 8,), True)
    served, named, note = serve_outputs("m", _TwoInputs(), spec, by_name=True)
    assert note is None and [t.name for t in named.outputs] == ["masked", "count"]
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    mask = np.array([[1, 0, 1, 0, 1]] * 3, dtype=np.int64)
    masked, count = answered(served, named, torch.from_numpy(pack_records([x, mask])))
    np.testing.assert_array_equal(masked, x * mask)
    np.testing.assert_array_equal(count, [[3]] * 3)


def test_outputs_without_a_batch_axis_are_left_out_and_noted() -> None:
    class WithLoss(nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": x.sum(), "scores": x * 2}

    served, named, note = serve_outputs("m", WithLoss(), FLOAT16)
    assert [t.name for t in named.outputs] == ["scores"]
    assert note is not None and "'loss' are left out (not a tensor with the batch on its first axis)" in note
    x = torch.randn(3, 16)
    with torch.inference_mode():
        torch.testing.assert_close(served(x), x * 2)


def test_a_model_returning_a_tensor_is_served_as_it_is() -> None:
    model = nn.Linear(16, 4)
    served, named, note = serve_outputs("m", model, FLOAT16)
    assert note is None and named == FLOAT16.with_outputs([TensorSpec("output", "float32", (4,))])  # unnamed
    x = torch.randn(2, 16)
    with torch.inference_mode():
        torch.testing.assert_close(served(x), model(x))


class _Returns(nn.Module):
    def __init__(self, output: object, declared: str | None = None) -> None:
        super().__init__()
        self.output = output
        if declared is not None:
            self.packrat_output = declared

    def forward(self, x: torch.Tensor) -> object:
        return self.output


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (_Returns("text"), "returns a str; a model must return a tensor, a dict or tuple of them"),
        (_Returns({"a": torch.zeros(2)}, declared="b"), r"declares packrat_output = 'b', but it returns 'a'"),
        (
            _Returns(
                ({"nested": 1}, torch.zeros(())),
            ),
            r"none of them a tensor with the batch on its first axis",
        ),
    ],
)
def test_an_output_that_cannot_be_served_is_refused_at_load(module: nn.Module, message: str) -> None:
    with pytest.raises(ModelSpecError, match=message):
        serve_outputs("m", module, FLOAT16)


def test_a_model_that_fails_on_the_sample_is_noted_and_served_its_first_output_per_call() -> None:
    # Not refused: a model may refuse only some batch sizes, which its workers then report.
    class RefusesPairs(nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            if x.shape[0] == 2:
                raise ValueError("no pairs")
            return {"double": x * 2, "triple": x * 3}

    served, named, note = serve_outputs("m", RefusesPairs(), FLOAT16)
    assert note is not None and note.startswith(
        "m failed on a sample input (input float32:16) of 2 samples (ValueError"
    )
    assert named.outputs == ()
    x = torch.randn(3, 16)
    with torch.inference_mode():
        torch.testing.assert_close(served(x), x * 2)
    assert isinstance(served, Served) and served.keys is None

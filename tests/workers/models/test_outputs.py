"""Models that return several outputs: one is served (the declared one, else the first), the log says which,
and what cannot be served is refused at load with what to do, not in every worker."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from packrat_daemon.wire.errors import ModelSpecError
from tests.model_factories import TwoOutputs
from workers.models.loading import load_model
from workers.models.outputs import OneOutput, serve_one_output
from workers.models.spec import InputSpec

FLOAT16 = InputSpec("float32", (16,))


def expected(x: torch.Tensor) -> dict[str, torch.Tensor]:
    with torch.inference_mode():
        return TwoOutputs()(x)


@pytest.mark.parametrize(
    ("factory", "served", "names"),
    [
        ("two_outputs", "scores", "'scores', 'probabilities'"),
        ("two_outputs_serving_probabilities", "probabilities", "'scores', 'probabilities'"),
        ("pair_output", "scores", "0, 1"),
    ],
)
def test_a_dict_or_tuple_serves_the_declared_output_else_the_first(factory: str, served: str, names: str) -> None:
    spec = f"tests.model_factories:{factory}"
    loaded = load_model(spec)
    x = torch.randn(3, 16)
    with torch.inference_mode():
        out = loaded.module(x)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, expected(x)[served])
    key = repr(served) if factory != "pair_output" else "0"
    assert loaded.notes == (
        f"{spec} returns 2 outputs ({names}); serving {key} only: several outputs are not served yet "
        "(docs/serving.md, 'Inputs and outputs')",
    )


def test_a_model_output_object_serves_its_first_field() -> None:
    pytest.importorskip("transformers")
    loaded = load_model("tests.model_factories:tiny_bert_model")
    ids = torch.randint(0, 100, (2, 12))
    with torch.inference_mode():
        out = loaded.module(ids)
        reference = loaded.module.model(ids)  # the BertModel itself
    torch.testing.assert_close(out, reference.last_hidden_state)
    assert "returns 2 outputs ('last_hidden_state', 'pooler_output'); serving 'last_hidden_state'" in loaded.notes[0]


def test_a_model_returning_a_tensor_is_served_as_it_is() -> None:
    model = nn.Linear(16, 4)
    assert serve_one_output("m", model, FLOAT16) == (model, None)


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
        (_Returns({"a": torch.zeros(1)}, declared="b"), r"declares packrat_output = 'b', but it returns 'a'"),
        (_Returns(({"nested": 1}, torch.zeros(1))), r"output 0 of m is a dict, not a tensor; .*packrat_output = NAME"),
    ],
)
def test_an_output_that_cannot_be_served_is_refused_at_load(module: nn.Module, message: str) -> None:
    with pytest.raises(ModelSpecError, match=message):
        serve_one_output("m", module, FLOAT16)


def test_a_model_that_fails_on_the_sample_is_noted_and_served_its_first_output_per_call() -> None:
    # Not refused: a model may refuse only some batch sizes (one input, here), which its workers then report.
    from tests.model_factories import RefusesSingleInputs

    model = RefusesSingleInputs()
    served, note = serve_one_output("m", model, FLOAT16)
    assert note is not None and note.startswith("m failed on a sample input float32:16 of one sample (ValueError: ")
    x = torch.randn(2, 16)
    with torch.inference_mode():
        torch.testing.assert_close(served(x), model(x))
        assert served.key is None  # type: ignore[union-attr]
        torch.testing.assert_close(OneOutput(TwoOutputs(), None)(x), TwoOutputs()(x)["scores"])

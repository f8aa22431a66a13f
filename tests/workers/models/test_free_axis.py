"""A free axis in a model's spec: `int64:1..512`, the spec at a length, the length a batch's row tells, which
outputs follow it, and the record layout at each length."""

from __future__ import annotations

import pytest

from packrat_daemon.wire.codec import record_bytes
from packrat_daemon.wire.errors import ModelSpecError
from workers.models.free_axis import LayoutsByLength, shorter_length, with_free_outputs
from workers.models.spec import InputSpec, TensorSpec

TEXT = InputSpec.of([
    TensorSpec("input_ids", "int64", (128,), 30522, free_axis=0),
    TensorSpec("attention_mask", "int64", (128,), 2, free_axis=0),
    TensorSpec("scale", "float32", (4,)),
])  # fmt: skip


def test_an_input_declares_one_free_axis_with_its_least_and_longest() -> None:
    spec = InputSpec.parse("int64:1..512")
    assert (spec.shape, spec.free_axis, spec.min_length, spec.max_length, spec.ragged) == ((512,), 0, 1, 512, True)
    image = InputSpec.parse("float32:3x8..224")
    assert (image.shape, image.free_axis, image.min_length) == ((3, 224), 1, 8)
    assert not InputSpec.parse("int64:128").ragged
    assert InputSpec.from_json(spec.to_json()) == spec
    assert spec.named_inputs()[0].describe_shape() == "1..512"
    for bad in ("int64:1..2x1..3", "int64:0..8", "int64:9..8", "int64:a..8"):
        with pytest.raises(ModelSpecError, match="cannot read input"):
            InputSpec.parse(bad)


def test_at_a_length_every_free_axis_takes_it_and_a_records_width_tells_it_back() -> None:
    at_20 = TEXT.at_length(20)
    assert [t.shape for t in at_20.inputs] == [(20,), (20,), (4,)]
    width = record_bytes([(t.dtype, t.shape) for t in at_20.inputs])
    assert width == 2 * 20 * 8 + 4 * 4 and TEXT.length_of((width,)) == 20
    assert TEXT.masked and TEXT.max_length == 128
    assert InputSpec.parse("int64:1..64").length_of((37,)) == 37
    assert [layout for layout in LayoutsByLength(TEXT).of(width)] == [("int64", (20,)), ("int64", (20,)),
                                                                      ("float32", (4,))]  # fmt: skip


def test_an_output_that_shrank_with_the_input_is_marked_free_and_a_pooled_one_is_not() -> None:
    outputs = [TensorSpec("hidden", "float32", (128, 768)), TensorSpec("pooled", "float32", (768,))]
    marked = with_free_outputs(outputs, [(64, 768), (768,)])
    assert [t.free_axis for t in marked] == [0, None]
    assert shorter_length(TEXT) == 64 and shorter_length(InputSpec.parse("int64:100..128")) == 100

"""Model specs: built-ins, TorchScript and torch.export files, module:function factories, and their errors."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from packrat_daemon.wire.errors import ModelSpecError
from workers.models.loading import BUILTINS, load_model
from workers.models.spec import InputSpec, TensorSpec


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def assert_inference_ready(module: nn.Module) -> None:
    assert not module.training
    assert all(not p.requires_grad for p in module.parameters())


# -- built-ins -----------------------------------------------------------------------------------
def test_tiny_mlp_declares_its_input_and_is_ready_for_inference() -> None:
    loaded = load_model("builtin:tiny-mlp")
    assert loaded.name == "builtin:tiny-mlp"
    assert loaded.input == InputSpec("float32", (16,))
    assert not loaded.channels_last
    assert_inference_ready(loaded.module)
    assert loaded.module(torch.zeros(3, 16)).shape == (3, 4)


def test_tiny_cnn_declares_its_input_and_is_channels_last() -> None:
    loaded = load_model("builtin:tiny-cnn")
    assert loaded.input == InputSpec("float32", (3, 16, 16))
    assert loaded.channels_last
    assert_inference_ready(loaded.module)
    conv = loaded.module[0]
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert loaded.module(torch.zeros(2, 3, 16, 16)).shape == (2, 10)


@pytest.mark.parametrize("name", ["tiny-mlp", "tiny-cnn"])
def test_same_seed_gives_identical_models_and_outputs(name: str) -> None:
    first, second = load_model(f"builtin:{name}"), load_model(f"builtin:{name}")
    x = torch.randn(4, *first.input.shape)
    assert torch.equal(first.module(x), second.module(x))


def test_input_override_replaces_the_declared_input() -> None:
    assert load_model("builtin:tiny-mlp", "float32:16").input == InputSpec("float32", (16,))


def test_unknown_builtin_lists_the_builtins() -> None:
    with pytest.raises(ModelSpecError, match="unknown built-in model 'resnet18'; choose one of: resnet50") as caught:
        load_model("builtin:resnet18")
    for name in BUILTINS:
        assert name in str(caught.value)


@pytest.mark.slow
def test_resnet50_has_the_standard_25_6m_parameters() -> None:
    # The one heavy test here: importing transformers and building ResNet-50 take a few seconds.
    loaded = load_model("builtin:resnet50")
    assert loaded.input == InputSpec("float32", (3, 224, 224))
    assert loaded.channels_last
    assert_inference_ready(loaded.module)
    parameters = sum(p.numel() for p in loaded.module.parameters())
    assert 25_500_000 < parameters < 25_600_000
    with torch.inference_mode():
        x = torch.randn(1, 3, 224, 224).contiguous(memory_format=torch.channels_last)
        assert loaded.module(x).shape == (1, 1000)  # a tensor, not Hugging Face's output dataclass


# -- TorchScript files ---------------------------------------------------------------------------
@pytest.fixture
def traced_mlp(tmp_path: Path) -> tuple[Path, nn.Module]:
    torch.manual_seed(1)
    module = TinyMLP().eval()
    path = tmp_path / "mlp.pt"
    torch.jit.save(torch.jit.trace(module, torch.randn(2, 16)), str(path))
    return path, module


def test_torchscript_file_needs_an_input_override(traced_mlp: tuple[Path, nn.Module]) -> None:
    path, _ = traced_mlp
    with pytest.raises(ModelSpecError, match=r"does not declare its input; pass --input DTYPE:D1xD2"):
        load_model(str(path))


def test_traced_torchscript_file_loads_with_its_input(traced_mlp: tuple[Path, nn.Module]) -> None:
    path, module = traced_mlp
    loaded = load_model(str(path), "float32:16")
    assert loaded.input == InputSpec("float32", (16,)).with_outputs([TensorSpec("output", "float32", (4,))])
    assert_inference_ready(loaded.module)
    x = torch.randn(5, 16)
    assert torch.allclose(loaded.module(x), module(x))


def test_scripted_torchscript_file_loads_from_a_ts_path(tmp_path: Path) -> None:
    module = TinyMLP().eval()
    path = tmp_path / "mlp.ts"
    torch.jit.save(torch.jit.script(module), str(path))
    loaded = load_model(str(path), "float32:16")
    x = torch.randn(3, 16)
    assert torch.allclose(loaded.module(x), module(x))


# -- torch.export files --------------------------------------------------------------------------
@pytest.mark.slow
def test_exported_program_loads_with_its_inferred_input(tmp_path: Path) -> None:
    torch.manual_seed(2)
    module = TinyMLP().eval()
    batch = torch.export.Dim("batch")
    program = torch.export.export(module, (torch.randn(4, 16),), dynamic_shapes={"x": {0: batch}})
    path = tmp_path / "mlp.pt2"
    torch.export.save(program, str(path))
    loaded = load_model(str(path))
    assert (loaded.input.dtype, loaded.input.shape, [t.name for t in loaded.input.inputs]) == ("float32", (16,), ["x"])
    x = torch.randn(3, 16)
    assert torch.allclose(loaded.module(x), module(x))


@pytest.mark.slow
def test_fixed_batch_export_is_refused_with_the_dynamic_shapes_fix(tmp_path: Path) -> None:
    # torch.export's defaults fix the batch size: this is the file a user gets without dynamic_shapes.
    program = torch.export.export(TinyMLP().eval(), (torch.randn(2, 16),))
    path = tmp_path / "fixed.pt2"
    torch.export.save(program, str(path))
    with pytest.raises(ModelSpecError) as caught:
        load_model(str(path))
    message = str(caught.value)
    assert "\n" not in message
    assert "batch size 1" in message
    assert 'dynamic_shapes={"x": {0: torch.export.Dim("batch")}}' in message


# -- module:function factories -------------------------------------------------------------------
FACTORY_MODULE = "packrat_test_model_factories"

FACTORY_SOURCE = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Doubler(nn.Module):
        packrat_input = "float32:4"

        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            return x * self.scale


    def doubler():
        return Doubler()


    def declared_as_tuple():
        module = nn.Linear(4, 2)
        module.packrat_input = ("int64", [7])
        return module


    def undeclared():
        return nn.Linear(4, 2)


    def not_a_module():
        return 42
    """
)


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / f"{FACTORY_MODULE}.py").write_text(FACTORY_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield FACTORY_MODULE
    sys.modules.pop(FACTORY_MODULE, None)


def test_module_function_builds_the_model_with_its_declared_input(factories: str) -> None:
    loaded = load_model(f"{factories}:doubler")
    # the one output is declared too, as a sample run found it
    assert loaded.input == InputSpec("float32", (4,)).with_outputs([TensorSpec("output", "float32", (4,))])
    assert_inference_ready(loaded.module)
    assert torch.equal(loaded.module(torch.ones(2, 4)), torch.full((2, 4), 2.0))


def test_module_function_input_may_be_declared_as_a_tuple(factories: str) -> None:
    assert load_model(f"{factories}:declared_as_tuple").input == InputSpec("int64", (7,))


def test_module_function_without_declared_input_needs_an_override(factories: str) -> None:
    with pytest.raises(ModelSpecError, match="--input"):
        load_model(f"{factories}:undeclared")
    overridden = load_model(f"{factories}:undeclared", "float32:4").input
    assert overridden == InputSpec("float32", (4,)).with_outputs([TensorSpec("output", "float32", (2,))])


def test_module_function_must_return_a_module(factories: str) -> None:
    with pytest.raises(ModelSpecError, match=r"not_a_module returned int, not a torch\.nn\.Module"):
        load_model(f"{factories}:not_a_module")


@pytest.mark.parametrize("spec", ["packrat_no_such_module_anywhere:make", f"{FACTORY_MODULE}:no_such_function"])
def test_unimportable_factory_is_a_spec_error(factories: str, spec: str) -> None:
    with pytest.raises(ModelSpecError, match=f"cannot import {spec}") as caught:
        load_model(spec)
    assert "PYTHONPATH" in str(caught.value)
    assert "\n" not in str(caught.value)


# -- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["absent.pt", "absent.ts", "absent.pt2"])
def test_missing_model_file_is_named(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    with pytest.raises(ModelSpecError, match=f"model file {path} does not exist"):
        load_model(str(path), "float32:4")


@pytest.mark.parametrize(
    ("name", "message"),
    [("garbage.pt", "is not a TorchScript file"), ("garbage.pt2", r"is not a torch\.export program")],
)
def test_garbage_model_file_says_what_was_expected(tmp_path: Path, name: str, message: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"this is not a model\x00\x01")
    with pytest.raises(ModelSpecError, match=message):
        load_model(str(path), "float32:4")


def test_spec_of_no_known_kind_lists_the_kinds() -> None:
    with pytest.raises(ModelSpecError, match=r"give builtin:NAME, a \.pt2, \.pt or \.onnx file, a Hugging Face"):
        load_model("resnet50")


def test_bad_input_override_is_a_spec_error() -> None:
    with pytest.raises(ModelSpecError, match="cannot read input 'float32:16xq'"):
        load_model("builtin:tiny-mlp", "float32:16xq")


@pytest.mark.slow
def test_bert_base_masked_takes_its_three_inputs_by_name() -> None:
    from packrat_daemon.wire.codec import pack_records

    loaded = load_model("builtin:bert-base-masked")
    names = [t.name for t in loaded.input.inputs]
    assert names == ["input_ids", "attention_mask", "token_type_ids"] and loaded.input.records
    ids = torch.randint(0, 30522, (2, 128))
    mask = torch.ones(2, 128, dtype=torch.int64)
    mask[1, 64:] = 0  # the second sentence is padded
    segments = torch.zeros(2, 128, dtype=torch.int64)
    records = torch.from_numpy(pack_records([ids.numpy(), mask.numpy(), segments.numpy()]))
    with torch.inference_mode():
        got = loaded.module(records)
        bert = loaded.module.model.model  # type: ignore[union-attr]  # Served → _Pooled → BertModel
        expected = bert(input_ids=ids, attention_mask=mask, token_type_ids=segments).pooler_output
        unmasked = bert(input_ids=ids).pooler_output
    torch.testing.assert_close(got, expected)
    assert not torch.allclose(got[1], unmasked[1], atol=1e-4)  # the mask reached the model

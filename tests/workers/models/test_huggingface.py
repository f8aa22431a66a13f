"""Hugging Face save_pretrained folders: loaded offline with the class their config names, their three text
inputs (input_ids, attention_mask, token_type_ids) declared from the config, the same outputs as transformers'
own, on PyTorch and (converted) ONNX Runtime and OpenVINO.
The models are tiny, with random weights, saved into tmp folders: nothing is downloaded."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from packrat_daemon.wire.codec import pack_records, unpack_records
from packrat_daemon.wire.errors import ModelSpecError
from workers.models import cache as conversion
from workers.models.loading import load_model
from workers.models.spec import InputSpec, TensorSpec, sample_input

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", autouse=True)
def _transformers_classes_imported() -> None:
    """transformers imports its model classes on first use: here, in the module's setup, not inside whichever test
    touches them first (the fast suite's time guard counts a test's call, tests/helpers/timing_guard.py)."""
    for name in ("AutoConfig", "AutoModel", "BertConfig", "BertModel", "BertForSequenceClassification", "ViTConfig",
                 "ViTForImageClassification"):  # fmt: skip
        getattr(transformers, name)
    from workers.models import huggingface  # noqa: F401 - the loader's own imports too


VOCAB, POSITIONS, LABELS = 120, 64, 3


def tiny_bert_config() -> object:
    return transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=POSITIONS, num_labels=LABELS,
    )  # fmt: skip


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("models") / "tiny-bert"
    transformers.BertForSequenceClassification(tiny_bert_config()).eval().save_pretrained(folder)
    return folder


def text_inputs(samples: int, length: int = POSITIONS, seed: int = 4) -> dict[str, np.ndarray]:
    """Padded pairs of segments, as a tokenizer gives them: the mask and the segment ids matter."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (samples, length)).astype(np.int64)
    mask = np.ones((samples, length), dtype=np.int64)
    for k in range(samples):
        mask[k, length - 1 - 3 * k :] = 0  # a shorter sentence in each row, padded
    segments = np.zeros((samples, length), dtype=np.int64)
    segments[:, length // 2 :] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments}


def transformers_logits(folder: Path, inputs: dict[str, np.ndarray]) -> np.ndarray:
    model = transformers.BertForSequenceClassification.from_pretrained(folder, local_files_only=True).eval()
    with torch.inference_mode():
        return model(**{name: torch.from_numpy(array) for name, array in inputs.items()}).logits.numpy()


def three_inputs(length: int, free: bool = True) -> InputSpec:
    """BERT's three inputs up to `length` tokens: the sequence axis free (a folder's default) or fixed (`--input`)."""
    axis = 0 if free else None
    return InputSpec.of([
        TensorSpec("input_ids", "int64", (length,), VOCAB, free_axis=axis),
        TensorSpec("attention_mask", "int64", (length,), 2, free_axis=axis),
        TensorSpec("token_type_ids", "int64", (length,), 2, free_axis=axis),
    ])  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["hf:", ""])
def test_a_folder_serves_what_transformers_computes_on_its_three_inputs(bert_folder: Path, prefix: str) -> None:
    loaded = load_model(f"{prefix}{bert_folder}")
    assert loaded.input == three_inputs(POSITIONS).with_outputs([TensorSpec("logits", "float32", (LABELS,))])
    inputs = text_inputs(3)
    with torch.inference_mode():
        out = loaded.module(torch.from_numpy(pack_records(list(inputs.values())))).numpy()
    np.testing.assert_allclose(out, transformers_logits(bert_folder, inputs), rtol=1e-5, atol=1e-6)
    without_mask = transformers_logits(bert_folder, {"input_ids": inputs["input_ids"]})
    assert not np.allclose(out, without_mask, atol=1e-4)  # the mask and segments were used
    assert loaded.notes == ()


@pytest.mark.slow
def test_a_longer_sequence_keeps_the_token_ids_below_the_vocabulary(bert_folder: Path) -> None:
    assert load_model(str(bert_folder), "int64:16").input.inputs == three_inputs(16, free=False).inputs


@pytest.mark.slow  # 3-4 s: builds and loads a model folder
def test_without_architectures_the_auto_model_is_loaded_and_every_output_served(
    bert_folder: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "bare"
    shutil.copytree(bert_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["architectures"]
    (folder / "config.json").write_text(json.dumps(config))
    loaded = load_model(str(folder))
    assert [(t.name, t.shape) for t in loaded.input.outputs] == [
        ("last_hidden_state", (POSITIONS, 32)),  # BertModel's
        ("pooler_output", (32,)),
    ]
    with torch.inference_mode():
        out = loaded.module(torch.from_numpy(sample_input(loaded.input, 2))).numpy()
    hidden, pooled = unpack_records(out, [(t.dtype, t.shape) for t in loaded.input.outputs])
    assert hidden.shape == (2, POSITIONS, 32) and pooled.shape == (2, 32)


@pytest.mark.slow  # ~3 s: transformers imports its ViT classes, then builds, saves and loads one
def test_an_image_model_declares_its_pixel_values_from_the_config(tmp_path: Path) -> None:
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=64, num_labels=LABELS)  # fmt: skip
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    loaded = load_model(f"hf:{tmp_path / 'vit'}")
    assert loaded.input.inputs == (TensorSpec("pixel_values", "float32", (3, 32, 32)),)
    assert (loaded.input.dtype, loaded.input.shape) == ("float32", (3, 32, 32))
    with torch.inference_mode():
        assert loaded.module(torch.zeros(2, 3, 32, 32)).shape == (2, LABELS)


def test_a_missing_or_broken_folder_says_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ModelSpecError, match="model folder .*absent does not exist"):
        load_model(f"hf:{tmp_path / 'absent'}")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text('{"model_type": "bert"}')  # no weights beside it
    with pytest.raises(ModelSpecError, match="cannot load the Hugging Face model in .*broken"):
        load_model(str(tmp_path / "broken"))


def test_a_conversion_of_a_folder_is_redone_when_a_file_in_it_changes(bert_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(bert_folder, folder)
    before = conversion.cache_key(str(folder), None, "onnxruntime")
    with open(folder / "config.json", "a") as handle:
        handle.write("\n")
    assert conversion.cache_key(str(folder), None, "onnxruntime") != before


@pytest.fixture(scope="module")
def cache(shared_conversion_cache: Path) -> Iterator[Path]:
    """The session's shared cache (this module's folder is its own, so no earlier run's conversion is found):
    what is tested is what each runtime serves, and the second runtime reads the first one's ONNX export."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PACKRAT_CACHE_DIR", str(shared_conversion_cache))  # the converter subprocesses inherit it
        yield shared_conversion_cache


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_onnx_runtime_and_openvino_serve_the_folder_as_transformers_computes_it(
    bert_folder: Path, cache: Path, runtime: str
) -> None:
    pytest.importorskip(runtime)
    from workers.runtimes import make_runtime

    instance = make_runtime(runtime)
    instance.load(f"hf:{bert_folder}")
    instance.set_threads(1)
    inputs = text_inputs(5)
    got = instance.run(pack_records(list(inputs.values())))
    np.testing.assert_allclose(got, transformers_logits(bert_folder, inputs), rtol=1e-4, atol=1e-5)

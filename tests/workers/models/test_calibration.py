"""How a template is told its precision and int8's calibration file, and reading the user's calibration inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.wire.errors import ConfigError
from workers.models.calibration import read_calibration, split_precision, template_precision
from workers.models.spec import InputSpec


def test_the_template_is_told_int8_calibration_inside_its_precision(tmp_path: Path) -> None:
    calibration = tmp_path / "mine.npy"
    told = template_precision("int8", str(calibration))
    assert split_precision(told) == ("int8", str(calibration.resolve()))
    assert template_precision("int8", None) == "int8" and split_precision("int8") == ("int8", None)
    assert template_precision("bf16", str(calibration)) == "bf16"  # only int8 is quantized on it


def test_calibration_inputs_are_read_in_the_models_dtype(tmp_path: Path) -> None:
    path = tmp_path / "inputs.npy"
    np.save(path, np.arange(12, dtype=np.float64).reshape(3, 4))
    inputs = read_calibration(str(path), InputSpec("float32", (4,)))
    assert inputs.dtype == np.float32 and inputs.shape == (3, 4)
    np.testing.assert_array_equal(inputs, np.arange(12).reshape(3, 4))


@pytest.mark.parametrize("stored", [np.zeros((3, 5)), np.zeros((0, 4)), np.float32(1.0)])
def test_calibration_inputs_of_another_shape_name_the_models_input(tmp_path: Path, stored: np.ndarray) -> None:
    path = tmp_path / "inputs.npy"
    np.save(path, stored)
    with pytest.raises(ConfigError, match=r"the model takes N x 4 inputs of float32"):
        read_calibration(str(path), InputSpec("float32", (4,)))


def test_a_calibration_file_that_is_not_npy_says_how_to_write_one(tmp_path: Path) -> None:
    path = tmp_path / "inputs.npy"
    path.write_text("not numpy")
    with pytest.raises(ConfigError, match=r"cannot read --calibration .*numpy\.save"):
        read_calibration(str(path), InputSpec("float32", (4,)))

"""How a template is told its precision, and int8's calibration inputs.

int8 is quantized on calibration inputs where it is loaded (`workers.models.quantize`, from the template's
load): the template is told them inside its precision, `int8:FILE` (`template_precision`), as an emulated
template is told its numbers inside its runtime, `emulated:FILE`. Torch-free, and below the runtimes and the
conversion cache that read it: the accuracy guard's runs (`workers.models.precision`) build on the runtimes.
"""

from __future__ import annotations

import os

import numpy as np

from packrat_daemon.wire.errors import ConfigError
from workers.models.spec import InputSpec, sample_input


def template_precision(precision: str, calibration: str | None) -> str:
    """The precision as a template (or the guard's runs) is told it: int8 carries its calibration file."""
    if precision == "int8" and calibration:
        return f"int8:{os.path.abspath(calibration)}"
    return precision


def split_precision(text: str) -> tuple[str, str | None]:
    """(precision, calibration file or None) of what `template_precision` wrote."""
    precision, _, calibration = text.partition(":")
    return precision, calibration or None


def read_calibration(path: str, spec: InputSpec) -> np.ndarray:
    """The user's calibration inputs, checked against the model's input; ConfigError saying what is wrong."""
    try:
        user = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read --calibration {path}: {exc}; give a .npy file (numpy.save)") from None
    if user.ndim < 1 or tuple(user.shape[1:]) != spec.shape or len(user) == 0:
        raise ConfigError(
            f"--calibration {path} holds an array of shape {list(user.shape)}; the model takes "
            f"N x {'x'.join(map(str, spec.shape))} inputs of {spec.dtype}"
        )
    return user.astype(sample_input(spec, 1).dtype, copy=False)

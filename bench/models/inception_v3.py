"""Inception-v3 (torchvision's architecture, random weights) as a `module:function` model spec, for
bench/interference.py's check against the one real side-by-side table, which is of Inception-v3.

torchvision is not a dependency of Packrat. Its source is read from $TORCHVISION_SOURCE, a folder made by

    .venv/bin/pip install --target DIR --no-deps torchvision==0.28.0

without its compiled extension (a wheel built for another torch may not load): the packages are registered
by path and their __init__ modules skipped, since the architecture needs none of the compiled operators.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

from torch import nn


def build() -> nn.Module:
    root = Path(os.environ.get("TORCHVISION_SOURCE", "")) / "torchvision"
    if not (root / "models" / "inception.py").is_file():
        raise ImportError(
            f"no torchvision source at {root}: install it with `pip install --target DIR --no-deps "
            "torchvision==0.28.0` and set TORCHVISION_SOURCE=DIR"
        )
    for name, path in [("torchvision", root), ("torchvision.models", root / "models"),
                       ("torchvision.transforms", root / "transforms")]:  # fmt: skip
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        sys.modules.setdefault(name, package)
    presets = types.ModuleType("torchvision.transforms._presets")  # weights' preprocessing: unused here
    presets.ImageClassification = object  # type: ignore[attr-defined]
    sys.modules.setdefault(presets.__name__, presets)
    from torchvision.models.inception import Inception3

    model = Inception3(num_classes=1000, aux_logits=False, transform_input=False, init_weights=False)
    model.packrat_input = "float32:3x299x299"
    return model

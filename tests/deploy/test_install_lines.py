"""Every install line of the deployment docs installs the runtimes the README's quick start installs: a daemon
deployed from them can choose the same runtimes (`--runtime auto`) as the one a user tried first."""

from __future__ import annotations

import re

from tests.helpers.daemons import REPO

# The extras that are runtimes (the README also installs `test`, which a deployment does not need).
RUNTIME_EXTRAS = {"onnx", "openvino"}


def extras(text: str) -> list[set[str]]:
    """The extras of each `pip install` of this checkout in `text` (an empty set for a bare `.`)."""
    found = re.findall(r"pip install (?:-e )?'?\.(?:\[([a-z,]+)\])?'?", text)
    return [set(group.split(",")) if group else set() for group in found]


def test_the_readme_installs_the_runtimes() -> None:
    (quick_start, *_) = extras((REPO / "README.md").read_text())
    assert quick_start >= RUNTIME_EXTRAS


def test_the_deployment_docs_install_the_same_runtimes() -> None:
    for path in (REPO / "docs" / "deploy.md",):  # the image's install: tests/deploy/test_image.py
        lines = extras(path.read_text())
        assert lines, f"{path}: no install line found"
        assert all(line >= RUNTIME_EXTRAS for line in lines), f"{path}: an install line without {RUNTIME_EXTRAS}"

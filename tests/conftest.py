"""Fixtures shared by every test package; the helpers they use live in `tests.helpers`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def daemon_log(tmp_path: Path) -> Callable[[], str]:
    return lambda: (tmp_path / "daemon.log").read_text()

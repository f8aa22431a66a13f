"""Running a `workers` module in a child process: conversion and the accuracy guard both run the model
there, so that the caller (often the daemon, which never imports torch) stays light."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]


def run_module(module: str, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`python -m module args`, output captured; raises subprocess.TimeoutExpired past `timeout_s`.

    The child imports workers.* from this tree, and `module:function` model specs resolve there as they
    do for the caller (its own import path is kept after the repository).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", module, *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)

"""`packrat demo`, the README's main job, end to end on a tiny model: two real daemons, real requests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_demo_serves_both_policies_and_prints_the_comparison() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "packrat_daemon", "demo", "--model", "builtin:tiny-mlp", "--batch", "4",
         "--requests", "3"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "model: builtin:tiny-mlp, batch 4, 3 requests each (interleaved)"
    assert lines[1].startswith("packrat plan: ")
    assert any(line.startswith("  why: ") for line in lines)
    speedup = next(line for line in lines if line.startswith("speed-up of packrat over single: "))
    assert float(speedup.split(": ")[1].rstrip("×")) > 0
    assert "starting the `single` baseline" in done.stderr
    assert "packrat serves torch at fp32" in lines and "single serves torch at fp32" in lines  # the default precision

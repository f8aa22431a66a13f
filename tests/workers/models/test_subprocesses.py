"""`run_module` on real child processes: this tree's `workers` comes first on the child's path, the caller's
PYTHONPATH is kept after it, the output is captured, and a child past its timeout is stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import workers
from workers.models.subprocesses import run_module

REPO = Path(workers.__file__).resolve().parents[1]

REPORTER = textwrap.dedent(
    """
    import json, os, sys
    import workers
    print(json.dumps({"args": sys.argv[1:], "workers": workers.__file__, "pythonpath": os.environ["PYTHONPATH"],
                      "executable": sys.executable}))
    print("and a word on stderr", file=sys.stderr)
    sys.exit(3)
    """
)


def test_the_child_imports_this_tree_keeps_the_callers_path_and_its_output_is_captured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "packrat_test_reporter.py").write_text(REPORTER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    done = run_module("packrat_test_reporter", ["--model", "m:f"], timeout_s=60)
    assert done.returncode == 3  # not raised: the caller reads the status and the output
    assert done.stderr == "and a word on stderr\n"
    seen = json.loads(done.stdout)
    assert seen["args"] == ["--model", "m:f"]
    assert Path(seen["workers"]).resolve() == REPO / "workers" / "__init__.py"
    assert seen["pythonpath"].split(os.pathsep) == [str(REPO), str(tmp_path)]
    assert seen["executable"] == sys.executable


def test_a_child_past_its_timeout_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "packrat_test_sleeper.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(subprocess.TimeoutExpired):
        run_module("packrat_test_sleeper", [], timeout_s=0.3)

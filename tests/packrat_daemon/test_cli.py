"""The `packrat` command line as a shell uses it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from packrat_daemon.cli import BROKEN_PIPE_EXIT
from tests.helpers.daemons import REPO, daemon_env


@pytest.mark.slow
def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    # `packrat status | head`: the reader closes the pipe before the command has written; every command prints
    # through the same main, so `solve` (which needs no daemon) stands for them all.
    profile = REPO / "bench" / "profiles" / "inception3-cloudlab16.csv"
    command = [sys.executable, "-m", "packrat_daemon", "solve", "--profile", str(profile), "--cores", "16"]
    command += ["--batch", "8"]
    process = subprocess.Popen(command, env=daemon_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    errors = process.stderr.read().decode()
    assert process.wait(60) == BROKEN_PIPE_EXIT
    assert errors == ""

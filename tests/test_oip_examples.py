"""docs/oip.md's examples run: its `packrat serve` command starts a real daemon with the gateway, and every
`bash` and `python` block in it (curl, tritonclient) runs against it and succeeds."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.daemons import REPO, daemon_env, pinned, stop_process
from tests.packrat_daemon.protocol.test_tritonclient import free_port

DOC = REPO / "docs" / "oip.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)
# What the doc's command gets besides: a private endpoint and a fixed plan on a given profile, so that it
# starts in seconds instead of measuring its profile.
FAST = ["--policy", "fixed", "--plan", "1*1x4", "--max-batch", "4"]


def blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(DOC.read_text()) if lang == language]


def test_the_doc_has_examples_to_run() -> None:
    assert blocks("bash") and blocks("python")
    assert any(line.startswith("packrat serve ") for block in blocks("text") for line in block.splitlines())


@pytest.mark.slow
def test_the_examples_run_against_the_docs_command(tmp_path: Path) -> None:
    pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed (pip install -e '.[test]')")
    if shutil.which("curl") is None:
        pytest.skip("the doc's examples use curl, which is not installed")
    serve = next(line for block in blocks("text") for line in block.splitlines() if line.startswith("packrat serve "))
    ports = {"8000": str(free_port()), "8001": str(free_port())}
    args = [ports.get(word, word) for word in shlex.split(serve)[2:]]
    profile = tmp_path / "profile.csv"
    profile.write_text("threads,batch,latency_ms\n1,1,0.2\n1,2,0.3\n1,4,0.4\n")
    extra = ["--endpoint", f"ipc://{tmp_path}/front.ipc", *FAST, "--profile", str(profile)]
    command = [sys.executable, "-m", "packrat_daemon", "serve", *args, *extra, *pinned(args)]
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=daemon_env(), stdout=out, stderr=out)
    try:
        ready = f"http://localhost:{ports['8000']}/v2/health/ready"
        deadline = time.monotonic() + 180
        while subprocess.run(["curl", "-sf", "-o", "/dev/null", ready], check=False).returncode != 0:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
        for language, body in [("bash", b) for b in blocks("bash")] + [("python", b) for b in blocks("python")]:
            for port, free in ports.items():
                body = body.replace(f"localhost:{port}", f"localhost:{free}")
            runner = ["bash", "-euo", "pipefail", "-c"] if language == "bash" else [sys.executable, "-c"]
            done = subprocess.run([*runner, body], env=daemon_env(), capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"{language} example failed:\n{body}\n{done.stdout}\n{done.stderr}"
            if '"inputs"' in body:
                assert '"outputs"' in done.stdout and '"id":"r1"' in done.stdout, done.stdout
            if language == "python":
                assert done.stdout.split() == ["(4,", "4)", "(4,", "4)", "4"], done.stdout
    finally:
        stop_process(process, 30)

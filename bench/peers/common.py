"""What the peer scripts share on the harness side: paths, the peers' environments, ports, processes, HTTP waits.

Runs in Packrat's own environment (.venv); each peer runs from its own (bench/peers/.venv-*), installed by its
script, never by the README's install.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RESULTS = REPO / "bench" / "results"

VENVS = {
    "torchserve": HERE / ".venv-torchserve",
    "triton": HERE / ".venv-triton",
    "loadgen": HERE / ".venv-loadgen",
}
INSTALLERS = {
    "torchserve": "bench/peers/install_torchserve.sh",
    "triton": "bench/peers/install_triton.sh",
    "loadgen": "bench/peers/install_loadgen.sh",
}
# What each environment must hold; checked before anything starts.
_PROBES = {
    "torchserve": ("bin/torchserve", "bin/torch-model-archiver"),
    "triton": ("bin/python",),
    "loadgen": ("bin/python",),
}
_IMPORTS = {"triton": "import pytriton, torch, transformers", "loadgen": "import mlperf_loadgen, numpy, zmq"}


class PeerMissing(RuntimeError):
    """A peer's environment is not installed: the message names the script that installs it."""


def require(peer: str) -> Path:
    """The peer's environment, or PeerMissing saying which install script to run."""
    venv = VENVS[peer]
    missing = [name for name in _PROBES[peer] if not (venv / name).exists()]
    if not missing and peer in _IMPORTS:
        probe = subprocess.run([str(venv / "bin/python"), "-c", _IMPORTS[peer]], capture_output=True, text=True)
        if probe.returncode != 0:
            missing = [probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "an import failed"]
    if peer == "torchserve" and not missing and subprocess.run(["which", "java"], capture_output=True).returncode:
        missing = ["java (Debian's openjdk-17-jre-headless)"]
    if missing:
        raise PeerMissing(
            f"{peer} is not installed ({', '.join(missing)} missing under {venv}); run: bash {INSTALLERS[peer]}"
        )
    return venv


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(command: list[str], log_path: Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> Any:
    """A peer's server in a session of its own (so that stop() reaches every process it starts), its output in
    `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd or REPO, env=env, start_new_session=True
        )


def stop(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the process group `process` leads, then SIGKILL what is left after `grace_s`."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # stragglers of the group (TorchServe's workers, tritonserver)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)


def http(
    method: str, url: str, body: bytes | None = None, timeout: float = 10.0, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    if body is not None and not headers:
        headers = {"Content-Type": "application/octet-stream"}  # urllib would say a form
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def wait_http(
    url: str, process: subprocess.Popen, log_path: Path, timeout_s: float, ok: tuple[int, ...] = (200,)
) -> None:
    """Until GET `url` answers one of `ok`; RuntimeError with the log's tail if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({process.returncode}): {tail(log_path)}")
        with contextlib.suppress(OSError):
            if http("GET", url, timeout=2.0)[0] in ok:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{url}: not ready within {timeout_s:.0f} s: {tail(log_path)}")


def tail(path: Path, chars: int = 2500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=False)

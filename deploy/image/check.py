"""The checks deploy/image/build.sh runs against the image, from the client's side, with tritonclient from a venv
of its own (never the README's install): run as `python check.py COMMAND ...` with the checkout on PYTHONPATH
(it uses tests/helpers' ONNX model and closed-loop clients). Each command fails with a message, or writes what it
saw as JSON.

  model DIR          an ONNX file of an arbitrary name, with its external data, in DIR (to mount at /mnt/models)
  infer ...          ready; the container's user; REST and gRPC inference, answers compared with numpy's
  restart ...        a second start on the same state volume: ready, and the log says what it read back
  drain ...          SIGTERM under REST and gRPC load: exit 0, every request answered or refused, none lost
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from tests.helpers.oip_clients import LOST, NOT_CONNECTED, OK, REFUSED, closed_loops
from tests.helpers.onnx_models import scores, two_outputs

MODEL_FILE = "classifier-2024-06.onnx"  # no name the server could guess
READY_TIMEOUT_S = 900  # a first start measures its candidates on the container's CPUs


def podman(*args: str, check: bool = True) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise SystemExit(f"podman {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def logs(container: str) -> str:
    done = subprocess.run(["podman", "logs", container], capture_output=True, text=True, check=False)
    return done.stdout + done.stderr


def status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def wait_ready(container: str, http: str, model: str) -> float:
    """Seconds until the model is ready; fails, with the log's tail, if the container stops first."""
    started = time.monotonic()
    while status(f"http://{http}/v2/models/{model}/ready") != 200:
        if podman("inspect", "--format", "{{.State.Running}}", container) != "true":
            raise SystemExit(f"{container} stopped before it was ready:\n{logs(container)[-4000:]}")
        if time.monotonic() - started > READY_TIMEOUT_S:
            raise SystemExit(f"{container} not ready after {READY_TIMEOUT_S} s:\n{logs(container)[-4000:]}")
        time.sleep(1)
    return time.monotonic() - started


def wait_log(container: str, pattern: str, timeout_s: float) -> str:
    """The first line of the container's log matching `pattern`, waited for."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = re.search(f"^.*{pattern}.*$", logs(container), re.MULTILINE)
        if found:
            return found.group(0)
        if time.monotonic() > deadline:
            raise SystemExit(f"no log line of {container} matches {pattern!r}:\n{logs(container)[-4000:]}")
        time.sleep(2)


def softmax(x: np.ndarray) -> np.ndarray:
    exp = np.exp(x - x.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def infer(args: argparse.Namespace) -> dict[str, Any]:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    ready_s = wait_ready(args.container, args.http, args.model)
    sample = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    expected = {"scores": scores(sample), "probabilities": softmax(scores(sample))}
    answers = {}
    for protocol, module, url in (("rest", httpclient, args.http), ("grpc", grpcclient, args.grpc)):
        client = module.InferenceServerClient(url)
        try:
            assert client.is_server_live() and client.is_server_ready(), protocol
            assert client.is_model_ready(args.model), protocol
            tensor = module.InferInput("x", list(sample.shape), "FP32")
            tensor.set_data_from_numpy(sample)
            result = client.infer(args.model, [tensor])
        finally:
            client.close()
        for name, want in expected.items():
            np.testing.assert_allclose(result.as_numpy(name), want, rtol=1e-4, atol=1e-5, err_msg=protocol)
        answers[protocol] = result.as_numpy("scores")[0].round(4).tolist()
    chosen = wait_log(args.container, args.wait_log, READY_TIMEOUT_S)  # what the state volume then holds
    return {
        "ready_s": round(ready_s, 1),
        "user": podman("exec", args.container, "id", "-u"),
        "model_loaded": wait_log(args.container, re.escape(MODEL_FILE), 5),
        "first_row_scores": answers,
        "chosen": chosen,
    }


def restart(args: argparse.Namespace) -> dict[str, Any]:
    ready_s = wait_ready(args.container, args.http, args.model)
    return {"ready_s": round(ready_s, 1), "read_back": wait_log(args.container, args.expect_log, 5)}


def drain(args: argparse.Namespace) -> dict[str, Any]:
    wait_ready(args.container, args.http, args.model)
    host, http_port = args.http.rsplit(":", 1)
    grpc_port = int(args.grpc.rsplit(":", 1)[1])
    clients = 4
    sample = np.ones((1, 16), np.float32)
    rest, rpc, stop, threads = closed_loops(host, int(http_port), grpc_port, args.model, sample, clients, clients)
    time.sleep(3)
    before = {"rest": rest.counts[OK], "grpc": rpc.counts[OK]}
    signalled = time.monotonic()
    podman("kill", "--signal", "TERM", args.container)
    exit_code = int(podman("wait", args.container))
    stopped_s = time.monotonic() - signalled
    stop.set()
    for thread in threads:
        thread.join(30)
    seen = {"rest": rest.to_json(), "grpc": rpc.to_json()}
    for name, outcomes in (("rest", rest), ("grpc", rpc)):
        assert before[name] > 0, f"{name}: no request answered before SIGTERM: {seen}"
        assert outcomes.counts[LOST] == 0, f"{name}: requests lost: {seen}"
        # Every client stopped on a refusal, or found nothing listening: no request was taken and dropped.
        assert outcomes.counts[REFUSED] + outcomes.counts[NOT_CONNECTED] == clients, seen
    assert exit_code == 0, f"exit {exit_code}:\n{logs(args.container)[-4000:]}"
    return {"exit_code": exit_code, "stopped_s": round(stopped_s, 2), "answered_before_sigterm": before, **seen}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("model").add_argument("dir", type=Path)
    for name in ("infer", "restart", "drain"):
        command = commands.add_parser(name)
        command.add_argument("--container", required=True)
        command.add_argument("--http", required=True, help="HOST:PORT of REST")
        command.add_argument("--grpc", default="", help="HOST:PORT of gRPC")
        command.add_argument("--model", required=True, help="the name the model is served under")
        command.add_argument("--out", type=Path, help="write what was seen here, as JSON")
        if name == "infer":
            command.add_argument("--wait-log", required=True, help="then wait for a log line matching this")
        if name == "restart":
            command.add_argument("--expect-log", required=True, help="a log line matching this must be there")
    args = parser.parse_args()
    if args.command == "model":
        path = two_outputs(args.dir / MODEL_FILE, external_data=True)
        print(f"{path} and its external data written")
        return 0
    seen = {"infer": infer, "restart": restart, "drain": drain}[args.command](args)
    text = json.dumps(seen, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

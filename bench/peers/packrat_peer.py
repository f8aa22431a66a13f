"""Packrat as a peer: `packrat serve` at its defaults on a loopback ZeroMQ endpoint, and `packrat oip` beside it
for the Open Inference Protocol over REST (the same gateway `serve --http-port` starts). Harness side (.venv).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import REPO, free_port, start, stop, tail, wait_http

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from packrat_daemon.wire.client import Client, ClientTimeout  # noqa: E402

START_TIMEOUT_S = 900.0


@dataclass
class PackratServer:
    name: str
    spec: str  # builtin:resnet50
    folder: Path
    serve_args: list[str] = field(default_factory=list)  # empty: Packrat's defaults
    env: dict[str, str] | None = None  # the daemon's environment (None: this process's)
    zmq_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    serve: Any = None
    gateway: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    first_answer_s: float = 0.0  # process start to the first answered request
    started_s: float = 0.0  # process start to serving its choice with nothing left to measure: "no configuration"

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.zmq_port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        python = sys.executable
        serve_log = self.folder / f"{self.name}.log"
        self.serve = start(
            [
                python,
                "-m",
                "packrat_daemon",
                "serve",
                "--model",
                self.spec,
                "--endpoint",
                self.endpoint,
                *self.serve_args,
            ],
            serve_log,
            env=self.env,
        )
        client = Client(self.endpoint, timeout=5.0)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                self._check_alive(serve_log, deadline)
                try:
                    self.info = client.info(timeout=2.0)
                    break
                except ClientTimeout:
                    continue
            self.first_answer_s = time.monotonic() - began
            # At its defaults a first start answers at once and measures the other candidates behind it: the peers
            # start only once that is over, so that no server is measured while Packrat still measures itself.
            while True:
                self._check_alive(serve_log, deadline)
                try:
                    choice = client.status(timeout=2.0).get("runtime_choice") or {}
                except ClientTimeout:
                    continue
                measuring = [c for c in choice.get("candidates", []) if c.get("verdict") == "measuring"]
                if not measuring and not choice.get("switching"):
                    break
                time.sleep(1.0)
            self.info = client.info(timeout=5.0)
        finally:
            client.close()
        self.started_s = time.monotonic() - began
        gateway_log = self.folder / f"{self.name}-oip.log"
        self.gateway = start(
            [python, "-m", "packrat_daemon", "oip", "--connect", self.endpoint, "--http-port", str(self.http_port)],
            gateway_log,
        )
        wait_http(f"{self.url}/v2/health/ready", self.gateway, gateway_log, 120.0)

    def _check_alive(self, serve_log: Path, deadline: float) -> None:
        if self.serve.poll() is not None:
            raise RuntimeError(f"packrat serve exited: {tail(serve_log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"packrat serve not settled in {START_TIMEOUT_S:.0f} s: {tail(serve_log)}")

    def describe(self) -> dict[str, Any]:
        keep = ("model", "runtime", "max_batch", "plan", "policy", "precision")
        return {
            "server": f"Packrat (packrat serve{' ' + ' '.join(self.serve_args) if self.serve_args else ', defaults'})",
            "args": self.serve_args,
            "start_to_first_answer_s": round(self.first_answer_s, 1),
            "start_to_serving_s": round(self.started_s, 1),
            **{key: self.info.get(key) for key in keep if key in self.info},
        }

    def plan_now(self) -> Any:
        client = Client(self.endpoint, timeout=10.0)
        try:
            return client.info().get("plan")
        finally:
            client.close()

    def oip_target(self, model_name: str) -> dict[str, Any]:
        return {"kind": "oip", "url": f"{self.url}/v2/models/{model_name}/infer"}

    def zmq_target(self) -> dict[str, Any]:
        return {"kind": "zmq", "endpoint": self.endpoint}

    def close(self) -> None:
        for process in (self.gateway, self.serve):
            if process is not None:
                stop(process, 60)
        self.gateway = self.serve = None

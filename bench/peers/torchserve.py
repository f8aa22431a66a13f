"""TorchServe 0.12 as a peer: the model archive, config.properties, start on loopback, register, stop.

Two servers: one at TorchServe's defaults (the model loaded at start with `default_workers_per_model`, one worker
per core, each with torch's default threads) and one with the documented CPU tuning (`cpu_launcher_enable=true`:
each worker is started by `torch.backends.xeon.run_cpu --ninstances N --rank i`, pinned to its share of the cores
with OMP_NUM_THREADS set to it), where the sweep registers one model per worker count and batch size through the
management API. Both speak TorchServe's REST inference API: POST /predictions/NAME with the raw tensor.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import HERE, REPO, free_port, http, require, start, stop, tail, wait_http
from payload import MODELS

HANDLER = HERE / "torchserve_handler.py"
START_TIMEOUT_S = 600.0


def build_archive(model: str, store: Path) -> Path:
    """`store/NAME.mar` for Packrat's built-in `model`: the handler and a peer.json naming the repository."""
    venv = require("torchserve")
    store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        extra = Path(scratch) / "peer.json"
        extra.write_text(json.dumps({"repo": str(REPO), "model": MODELS[model]["spec"]}))
        subprocess.run(
            [
                str(venv / "bin/torch-model-archiver"),
                "--model-name",
                model,
                "--version",
                "1.0",
                "--handler",
                str(HANDLER),
                "--extra-files",
                str(extra),
                "--export-path",
                str(store),
                "--force",
            ],
            check=True,
            capture_output=True,
        )
    return store / f"{model}.mar"


@dataclass
class TorchServe:
    """One TorchServe server on loopback; `launcher` turns on the CPU launcher."""

    name: str
    model: str
    folder: Path
    launcher: bool = False
    preload: bool = True  # load the model at start at the defaults (default_workers_per_model workers)
    inference_port: int = field(default_factory=free_port)
    management_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    worker_port: int = field(default_factory=free_port)
    process: Any = None
    registered: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.inference_port}"

    @property
    def management(self) -> str:
        return f"http://127.0.0.1:{self.management_port}"

    @property
    def log_path(self) -> Path:
        return self.folder / f"{self.name}.log"

    def config(self) -> dict[str, str]:
        """config.properties: loopback ports, no token (a benchmark on loopback), room for batch-8 bodies."""
        properties = {
            "inference_address": self.url,
            "management_address": self.management,
            "metrics_address": f"http://127.0.0.1:{self.metrics_port}",
            # Workers talk to the frontend over unix sockets named /tmp/.ts.sock.PORT: each server its own ports.
            "initial_worker_port": str(self.worker_port),
            "disable_token_authorization": "true",
            "enable_model_api": "true",
            "max_request_size": str(64 << 20),
            "max_response_size": str(64 << 20),
            "default_response_timeout": "300",
            "disable_system_metrics": "true",  # its collector starts a Python process every minute: noise here
        }
        if self.launcher:
            properties["cpu_launcher_enable"] = "true"
            properties["cpu_launcher_args"] = "--use_logical_core"  # 1 thread per core here: logical = physical
        return properties

    def start(self, store: Path) -> None:
        venv = require("torchserve")
        home = self.folder / self.name
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        properties = home / "config.properties"
        (home / "tmp").mkdir()
        config = {**self.config(), "vmargs": f"-Djava.io.tmpdir={home / 'tmp'}"}
        properties.write_text("".join(f"{key}={value}\n" for key, value in config.items()))
        command = [
            str(venv / "bin/torchserve"),
            "--start",
            "--foreground",
            "--ncs",
            "--model-store",
            str(store),
            "--ts-config",
            str(properties),
        ]
        if self.preload:
            command += ["--models", f"{self.model}={self.model}.mar"]
        # TorchServe keeps its pid file in the temporary folder and refuses a second server that shares it.
        tmp = home / "tmp"
        env = dict(
            os.environ, PATH=f"{venv / 'bin'}:{os.environ['PATH']}", LOG_LOCATION=str(home / "logs"), TMPDIR=str(tmp)
        )
        env.pop("PYTHONPATH", None)
        self.process = start(command, self.log_path, cwd=home, env=env)
        wait_http(f"{self.url}/ping", self.process, self.log_path, START_TIMEOUT_S)
        if self.preload:
            self.registered[self.model] = {"workers": -1, "batch_size": 1}
            self.wait_workers(self.model)

    def register(self, name: str, workers: int, batch_size: int, max_batch_delay_ms: int) -> None:
        """The model again under `name` with `workers` workers and TorchServe's batching of `batch_size` requests."""
        query = urllib.parse.urlencode(
            {
                "url": f"{self.model}.mar",
                "model_name": name,
                "initial_workers": workers,
                "batch_size": batch_size,
                "max_batch_delay": max_batch_delay_ms,
                "synchronous": "true",
                "response_timeout": 300,
            }
        )
        status, body = http("POST", f"{self.management}/models?{query}", timeout=START_TIMEOUT_S)
        if status != 200:
            raise RuntimeError(f"TorchServe would not register {name}: {status} {body[:300]!r}: {tail(self.log_path)}")
        self.registered[name] = {"workers": workers, "batch_size": batch_size, "max_batch_delay_ms": max_batch_delay_ms}
        self.wait_workers(name)

    def unregister(self, name: str) -> None:
        http("DELETE", f"{self.management}/models/{name}", timeout=60)
        self.registered.pop(name, None)

    def wait_workers(self, name: str) -> list[dict[str, Any]]:
        """Every worker of `name` READY; their description (TorchServe's own)."""
        import time

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            status, body = http("GET", f"{self.management}/models/{name}", timeout=10)
            if status == 200:
                described = json.loads(body)[0]
                workers = described.get("workers", [])
                if workers and all(worker.get("status") == "READY" for worker in workers):
                    if self.registered.get(name, {}).get("workers") == -1:
                        self.registered[name]["workers"] = len(workers)
                        self.registered[name]["batch_size"] = described.get("batchSize", 1)
                    return workers
            if self.process.poll() is not None:
                raise RuntimeError(f"TorchServe exited: {tail(self.log_path)}")
            time.sleep(1.0)
        raise RuntimeError(f"TorchServe's workers of {name} not ready: {tail(self.log_path)}")

    def describe(self, name: str) -> dict[str, Any]:
        entry = {"server": "TorchServe 0.12", "cpu_launcher": self.launcher, **self.registered.get(name, {})}
        launcher_line = [line for line in tail(self.log_path, 200_000).splitlines() if "OMP_NUM_THREADS" in line]
        if launcher_line:
            entry["launcher_log"] = launcher_line[-1][-200:]
        return entry

    def target(self, name: str) -> dict[str, Any]:
        return {"kind": "torchserve", "url": f"{self.url}/predictions/{name}"}

    def close(self) -> None:
        if self.process is not None:
            stop(self.process, 60)
            self.process = None

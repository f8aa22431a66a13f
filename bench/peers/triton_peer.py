"""Triton Inference Server as a peer (harness side): the configurations, start on loopback, wait, stop.

The server itself is bench/peers/triton_server.py in bench/peers/.venv-triton. Its clients speak the Open
Inference Protocol over REST (binary-data extension), as they do to Packrat's gateway.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import HERE, free_port, http, require, start, stop, tail, wait_http

SERVER = HERE / "triton_server.py"
START_TIMEOUT_S = 900.0
LIBDIR = "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"


def config_name(instances: int, dynamic_batching: bool, max_batch_size: int) -> str:
    return f"triton_i{instances}_{'db' if dynamic_batching else 'nodb'}_mb{max_batch_size}"


def default_config(cores: int) -> dict[str, Any]:
    """pytriton's defaults (one instance, the dynamic batcher with no queue delay, torch's own threads), but
    max_batch_size 16 (its default of 4 refuses a request of 8 samples)."""
    return {
        "name": "triton_default",
        "instances": 1,
        "threads": 0,
        "dynamic_batching": True,
        "max_batch_size": 16,
        "max_queue_delay_us": 0,
    }


def search_space(cores: int, max_batch_sizes: list[int], queue_delay_us: int) -> list[dict[str, Any]]:
    """What Model Analyzer's brute-force search walks for a Python-backend model: instance counts 1…cores ×
    dynamic batching on/off × max batch size; each instance gets cores ÷ instances threads."""
    space = []
    for instances, dynamic, max_batch in itertools.product(range(1, cores + 1), (True, False), max_batch_sizes):
        space.append(
            {
                "name": config_name(instances, dynamic, max_batch),
                "instances": instances,
                "threads": max(1, cores // instances),
                "dynamic_batching": dynamic,
                "max_batch_size": max_batch,
                "max_queue_delay_us": queue_delay_us if dynamic else 0,
            }
        )
    return space


@dataclass
class TritonServer:
    name: str
    model: str
    folder: Path
    configs: list[dict[str, Any]]
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    process: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def log_path(self) -> Path:
        return self.folder / f"{self.name}.log"

    def start(self) -> None:
        venv = require("triton")
        self.folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.folder / f"{self.name}-workspace", ignore_errors=True)  # pytriton makes it anew
        configs = self.folder / f"{self.name}-configs.json"
        configs.write_text(json.dumps(self.configs, indent=1))
        command = [
            str(venv / "bin/python"),
            str(SERVER),
            "--model",
            self.model,
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            str(self.grpc_port),
            "--metrics-port",
            str(self.metrics_port),
            "--configs",
            str(configs),
            "--workspace",
            str(self.folder / f"{self.name}-workspace"),
        ]
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        # pytriton's Python-backend stub links "libpython3.11.so.1.0": the one of the environment's own Python, not
        # the system's (a different 3.11 patch release whose stdlib would not match the one the stub then reads).
        libdir = subprocess.run(
            [str(venv / "bin/python"), "-c", LIBDIR], capture_output=True, text=True, check=True
        ).stdout.strip()
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [libdir, env.get("LD_LIBRARY_PATH")]))
        self.process = start(command, self.log_path, env=env)
        wait_http(f"{self.url}/v2/health/ready", self.process, self.log_path, START_TIMEOUT_S)
        for config in self.configs:
            wait_http(f"{self.url}/v2/models/{config['name']}/ready", self.process, self.log_path, START_TIMEOUT_S)

    def describe(self, name: str) -> dict[str, Any]:
        config = next(config for config in self.configs if config["name"] == name)
        entry: dict[str, Any] = {"server": "Triton 2.51 (nvidia-pytriton 0.7, Python backend)", **config}
        status, body = http("GET", f"{self.url}/v2/models/{name}/config")
        if status == 200:
            served = json.loads(body)
            entry["served_config"] = {
                key: served.get(key) for key in ("max_batch_size", "instance_group", "dynamic_batching")
            }
        return entry

    def target(self, name: str) -> dict[str, Any]:
        return {"kind": "oip", "url": f"{self.url}/v2/models/{name}/infer"}

    def close(self) -> None:
        if self.process is not None:
            stop(self.process, 60)
            self.process = None

    def log_tail(self) -> str:
        return tail(self.log_path)

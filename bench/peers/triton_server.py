"""Triton Inference Server (nvidia-pytriton 0.7's tritonserver 2.51, Python backend) serving Packrat's built-in
model, one Triton model per configuration. Runs in bench/peers/.venv-triton (numpy < 2), started by triton_peer.py:

    .venv-triton/bin/python bench/peers/triton_server.py --model resnet50 --http-port P --configs FILE.json

FILE.json lists configurations: {"name", "instances", "threads", "dynamic_batching", "max_batch_size",
"max_queue_delay_us"}. Each becomes a Triton model with `instances` model instances (instance_group count, KIND_CPU),
each running Packrat's model (`workers.models.loading.load_model`: the same random weights and treatment) with
`threads` intra-op threads (0: torch's default), `max_batch_size`, and Triton's dynamic batcher on or off. Inputs
and outputs are named as Packrat's gateway names them ("input", "output"), so the same request body reaches both.
Prints "READY" once every model is loaded, then serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from payload import INPUT_NAME, MODELS, OUTPUT_NAME  # noqa: E402
from pytriton.decorators import batch  # noqa: E402
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor  # noqa: E402
from pytriton.triton import Triton, TritonConfig  # noqa: E402

from workers.models.loading import load_model  # noqa: E402


def make_infer(spec: str, threads: int) -> Any:
    """One model instance: its own copy of the model, `threads` intra-op threads on the thread that calls it."""
    loaded = load_model(spec)
    module, channels_last = loaded.module, loaded.channels_last

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        if threads:
            torch.set_num_threads(threads)  # per calling thread: each instance runs on its own handler thread
        x = torch.from_numpy(np.ascontiguousarray(inputs[INPUT_NAME]))
        if channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            return {OUTPUT_NAME: module(x).float().numpy()}

    return infer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--configs", required=True, help="JSON file: the configurations to serve")
    parser.add_argument("--workspace", help="pytriton's workspace folder (default: a temporary one)")
    args = parser.parse_args()
    model = MODELS[args.model]
    configs = json.loads(Path(args.configs).read_text())
    triton_config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.http_port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        metrics_address="127.0.0.1",
        metrics_port=args.metrics_port,
        exit_on_error=True,
    )
    dtype = np.dtype(model["dtype"]).type
    with Triton(config=triton_config, workspace=args.workspace) as triton:
        for config in configs:
            batcher = (
                DynamicBatcher(max_queue_delay_microseconds=int(config.get("max_queue_delay_us", 0)))
                if config["dynamic_batching"]
                else None  # no dynamic_batching section: Triton runs each request alone
            )
            triton.bind(
                model_name=config["name"],
                infer_func=[make_infer(model["spec"], int(config["threads"])) for _ in range(config["instances"])],
                inputs=[Tensor(name=INPUT_NAME, dtype=dtype, shape=tuple(model["shape"]))],
                outputs=[Tensor(name=OUTPUT_NAME, dtype=np.float32, shape=(model["out"],))],
                config=ModelConfig(batching=True, max_batch_size=int(config["max_batch_size"]), batcher=batcher),
                strict=False,
            )
        triton.run()
        print("READY", flush=True)
        stopped = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stopped.set())
        stopped.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())

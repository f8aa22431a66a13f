"""Where the daemon's overhead goes: one worker, the same runtime in-process, side by side.

    .venv/bin/python bench/overhead.py [--model builtin:resnet50] [--runtime openvino] [--threads 2]
                                       [--batches 1,4,16] [--calls 16]

Starts `packrat serve --policy fixed` with one worker of --threads threads, and an in-process runner
of the same runtime and threads (spawned, pinned to the same cores). Calls alternate between the two.
Per batch size it prints the medians of:
  - round_trip_ms   the client's time for one infer call through the daemon;
  - server_ms       the daemon's own total (receipt of the request to sending the reply);
  - compute_ms      the worker's compute time for the batch;
  - in_process_ms   the same runtime's compute time in-process;
and the ratios: in-process over round trip (what bench/runtimes.py compares), worker compute over
in-process (is the worker itself slower?), and the milliseconds spent between client and daemon and
between daemon and worker.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import DaemonProcess, serve_batches, use_packrat_malloc_tuning  # noqa: E402  (bench/ is on sys.path)

SETTLE_S = 0.02


def _runner(conn: Any, runtime_name: str, model: str, threads: int, cores: list[int]) -> None:
    from workers.models.spec import sample_input
    from workers.runtimes import make_runtime

    os.sched_setaffinity(0, cores)
    runtime = make_runtime(runtime_name)
    spec = runtime.load(model)
    runtime.set_threads(threads)
    serve_batches(conn, lambda batch: sample_input(spec, batch), lambda x: runtime.timed_run(x)[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="builtin:resnet50")
    parser.add_argument("--runtime", default="openvino")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--calls", type=int, default=16)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    import numpy as np
    import zmq

    from packrat_daemon.wire.client_side import decode_reply, encode_infer_request
    from workers.models.spec import InputSpec, sample_input

    cores = sorted(os.sched_getaffinity(0))[: args.threads]
    use_packrat_malloc_tuning()  # the in-process runner gets the worker's malloc settings
    context = mp.get_context("spawn")
    conn, child = context.Pipe()
    runner = context.Process(target=_runner, args=(child, args.runtime, args.model, args.threads, cores), daemon=True)
    runner.start()
    conn.recv()  # ready
    with tempfile.TemporaryDirectory(prefix="packrat-overhead-") as folder:
        plan = f"{args.threads}x{max(batches)}"
        daemon = DaemonProcess(
            "overhead", Path(folder), ["--model", args.model, "--runtime", args.runtime, "--policy", "fixed",
                                       "--plan", plan, "--max-batch", str(max(batches)), "--max-delay-ms", "0"],
        )  # fmt: skip
        info = daemon.wait()
        spec = InputSpec(info["input"]["dtype"], tuple(info["input"]["shape"]), info["input"].get("high"))
        socket = zmq.Context.instance().socket(zmq.DEALER)
        socket.connect(daemon.endpoint)
        result: dict[str, Any] = {"model": args.model, "runtime": args.runtime, "threads": args.threads, "by_batch": {}}
        for batch in batches:
            x = sample_input(spec, batch)
            rows: dict[str, list[float]] = {"round_trip_ms": [], "server_ms": [], "compute_ms": [], "in_process_ms": []}
            for call in range(args.calls + 2):  # two warm-up calls each
                time.sleep(SETTLE_S)
                start = time.perf_counter()
                socket.send_multipart(encode_infer_request(call, x), copy=False)
                header, _ = decode_reply(socket.recv_multipart())
                round_trip = (time.perf_counter() - start) * 1000.0
                time.sleep(SETTLE_S)
                conn.send(batch)
                in_process = conn.recv()
                if call >= 2:
                    rows["round_trip_ms"].append(round_trip)
                    rows["server_ms"].append(header["timing"]["total_ms"])
                    rows["compute_ms"].append(header["timing"]["compute_ms"])
                    rows["in_process_ms"].append(in_process)
            m = {name: round(statistics.median(values), 3) for name, values in rows.items()}
            m["in_process_over_round_trip"] = round(m["in_process_ms"] / m["round_trip_ms"], 4)
            m["worker_compute_over_in_process"] = round(m["compute_ms"] / m["in_process_ms"], 4)
            m["client_to_daemon_ms"] = round(m["round_trip_ms"] - m["server_ms"], 3)
            m["daemon_to_worker_ms"] = round(m["server_ms"] - m["compute_ms"], 3)
            m["input_mb"] = round(np.asarray(x).nbytes / 2**20, 2)
            result["by_batch"][batch] = m
            print(f"batch {batch} done", file=sys.stderr)
        socket.close(0)
        daemon.close()
    conn.send(None)
    runner.join(20)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

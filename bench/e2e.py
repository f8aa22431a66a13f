"""End-to-end latency: direct PyTorch, the side-by-side ceiling, and the daemon under three policies.

    .venv/bin/python bench/e2e.py [--rounds 12] [--batches 2,4,8,16] [--skip-tiny] [--skip-memory]

Everything runs at once and the measurements are interleaved round by round (in a shuffled order),
so drift on a shared, noisy machine hits every configuration alike. Prints one JSON object:
  - resnet50: median latency per batch size of
      direct      in-process inference with all cores' threads (2 here), no daemon
      ceiling     two pinned processes, 1 thread and B/2 inputs each, no daemon (the side-by-side ideal)
      single / torchserve / packrat   the daemon's round trip through the client library; `packrat` is
                  planned for the B measured, `packrat_mixed` plans one pool for all the B at once
      single_again    a second `single` daemon: two identical daemons differ by this run's noise floor
    and the ratios the targets are stated in;
  - tiny: the daemon's batch-1 round trip against a bare two-hop pyzmq relay
    (client → relay → worker → relay → client, no batching) on the same tiny model, through the
    client library and through a bare socket like the relay's;
  - memory: PSS of two forked workers (with their template) against two independently loaded models.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import zmq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import DaemonProcess as Daemon  # noqa: E402  (bench/ is on sys.path when this script runs)
from harness import serve_batches, use_packrat_malloc_tuning  # noqa: E402

from packrat_daemon.wire.client_side import encode_infer_request  # noqa: E402

MODEL = "builtin:resnet50"
SETTLE_S = 0.02


# -- in-process runners (spawned: each loads its own model, as an independent server would) --------
def _runner(conn: Any, spec: str, threads: int, cores: list[int] | None) -> None:
    import torch

    from workers.models.loading import load_model
    from workers.models.spec import sample_input

    if cores is not None:
        os.sched_setaffinity(0, cores)
    torch.set_num_threads(threads)
    model = load_model(spec)

    def make_input(batch: int) -> Any:
        x = torch.from_numpy(sample_input(model.input, batch))
        return x.contiguous(memory_format=torch.channels_last) if model.channels_last else x

    def run(x: Any) -> tuple[float, float]:
        with torch.inference_mode():
            start = time.perf_counter()
            model.module(x)
            return start, time.perf_counter()

    serve_batches(conn, make_input, run)


class Runner:
    def __init__(self, spec: str, threads: int, cores: list[int] | None) -> None:
        context = mp.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_runner, args=(child, spec, threads, cores), daemon=True)
        self.process.start()
        _, self.pid = self.conn.recv()

    def start(self, batch: int) -> None:
        self.conn.send(batch)

    def finish(self) -> tuple[float, float]:
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(10)


# -- daemons --------------------------------------------------------------------------------------
def pss(pids: list[int]) -> int:
    return sum(psutil.Process(pid).memory_full_info().pss for pid in pids)


# -- the ResNet-50 comparison ---------------------------------------------------------------------
def _start_daemons(
    args: argparse.Namespace, folder: Path, common: list[str]
) -> tuple[dict[str, Daemon], dict[int, Daemon]]:
    """The daemons compared, by name, and the `packrat` daemon planned for each batch size; all serving."""
    profile = folder / "resnet50.csv"
    plan_for = ["--batches", ",".join(map(str, args.batches))]
    print("starting the packrat daemon (it profiles what it needs first) ...", file=sys.stderr)
    # "packrat_mixed" plans one pool for the whole set of batch sizes (each batch split exactly on it);
    # "packrat" is the policy planned for the batch size being measured (one daemon per B, same profile).
    mixed = Daemon("packrat_mixed", folder, [*common, *plan_for, "--policy", "packrat", "--save-profile", str(profile)])
    mixed.wait()
    daemons = {
        "single": Daemon("single", folder, [*common, "--policy", "single"]),
        # The same configuration twice: how far two identical daemons differ is this run's noise floor.
        "single_again": Daemon("single_again", folder, [*common, "--policy", "single"]),
        "torchserve": Daemon("torchserve", folder, [*common, "--policy", "torchserve"]),
        "packrat_mixed": mixed,
    }
    per_batch = {
        b: Daemon(
            f"packrat{b}", folder, [*common, "--batches", str(b), "--policy", "packrat", "--profile", str(profile)]
        )
        for b in args.batches
    }
    for allocator in args.allocators:
        # Same plan as the mixed packrat daemon (same saved profile), only the malloc differs.
        name = f"packrat+{allocator}"
        daemons[name] = Daemon(name, folder, [*common, *plan_for, "--policy", "packrat", "--profile", str(profile),
                                              "--allocator", allocator])  # fmt: skip
    for daemon in [*daemons.values(), *per_batch.values()]:
        daemon.wait()
    return daemons, per_batch


def _interleaved(
    args: argparse.Namespace, names: list[str], measure: Callable[[str, int], float]
) -> dict[str, dict[int, list[float]]]:
    """Each configuration's latencies (ms) per batch size: warm-up rounds, then rounds in a shuffled order."""
    samples: dict[str, dict[int, list[float]]] = {name: {b: [] for b in args.batches} for name in names}
    names = list(names)
    for _ in range(args.warmup):
        for batch in args.batches:
            for name in names:
                measure(name, batch)
    rng = random.Random(0)
    for round_index in range(args.rounds):
        for batch in args.batches:
            rng.shuffle(names)
            for name in names:
                time.sleep(SETTLE_S)  # the previous configuration's spinning pool threads park first
                samples[name][batch].append(measure(name, batch) * 1000.0)
        print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr)
    return samples


def _ratios(args: argparse.Namespace, medians: dict[str, dict[int, float]]) -> dict[int, dict[str, float]]:
    """Per batch size, the ratios the targets are stated in."""
    ratios = {}
    for b in args.batches:
        ceiling_speedup = medians["direct"][b] / medians["ceiling"][b]
        packrat_speedup = medians["single"][b] / medians["packrat"][b]
        ratios[b] = {
            "ceiling_speedup_over_direct": ceiling_speedup,
            "packrat_speedup_over_single": packrat_speedup,
            "packrat_speedup_vs_ceiling_speedup": packrat_speedup / ceiling_speedup,
            "single_daemon_overhead_over_direct": medians["single"][b] / medians["direct"][b] - 1.0,
            "torchserve_over_single": medians["torchserve"][b] / medians["single"][b],
            "packrat_mixed_speedup_over_single": medians["single"][b] / medians["packrat_mixed"][b],
            "noise_single_again_over_single": medians["single_again"][b] / medians["single"][b],
        }
        for allocator in args.allocators:
            ratios[b][f"packrat_{allocator}_over_packrat_system"] = (
                medians[f"packrat+{allocator}"][b] / medians["packrat_mixed"][b]
            )
    return ratios


def _memory(folder: Path, common: list[str], batch: Any, ceiling: list[Runner]) -> dict[str, Any]:
    """PSS of two forked workers (with their template) against the two independently loaded ceiling runners."""
    # Two forked workers whatever the plans above chose: a fixed 2×1 pool, measured after the runs
    # (each worker has run the model, so its activations and allocator state are in the numbers).
    pair = Daemon("memory", folder, [*common, "--policy", "fixed", "--plan", "2*1x8"])
    pair_info = pair.wait()
    pair.client.infer(batch)
    forked = [w["pid"] for w in pair_info["workers"]]
    template = pair_info.get("template_pid")
    independent = [runner.pid for runner in ceiling]
    parameter_bytes = 25_557_032 * 4
    forked_total = pss(forked + ([template] if template else []))
    independent_total = pss(independent)
    memory = {
        "forked_workers": len(forked),
        "pss_forked_workers_mb": pss(forked) / 2**20,
        "pss_forked_workers_plus_template_mb": forked_total / 2**20,
        "pss_independent_mb": independent_total / 2**20,
        "parameter_mb_per_copy": parameter_bytes / 2**20,
        "saved_fraction_of_duplicate_parameters": (independent_total - forked_total)
        / ((len(forked) - 1) * parameter_bytes)
        if len(forked) > 1
        else None,
    }
    pair.close()
    return memory


def resnet(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    cores = sorted(os.sched_getaffinity(0))
    common = ["--model", MODEL, "--max-batch", str(max(args.batches)), "--max-delay-ms", "0"]
    daemons, per_batch = _start_daemons(args, folder, common)
    print("starting direct and ceiling runners ...", file=sys.stderr)
    direct = Runner(MODEL, len(cores), None)
    ceiling = [Runner(MODEL, 1, [core]) for core in cores[:2]]
    inputs = {b: np.random.default_rng(b).standard_normal((b, 3, 224, 224), dtype=np.float32) for b in args.batches}

    def measure(name: str, batch: int) -> float:
        if name == "direct":
            direct.start(batch)
            start, end = direct.finish()
            return end - start
        if name == "ceiling":
            halves = [batch // 2, batch - batch // 2]
            for runner, half in zip(ceiling, halves, strict=True):
                runner.start(half)
            spans = [runner.finish() for runner in ceiling]
            return max(e for _, e in spans) - min(s for s, _ in spans)
        client = per_batch[batch].client if name == "packrat" else daemons[name].client
        start = time.perf_counter()
        client.infer(inputs[batch])
        return time.perf_counter() - start

    samples = _interleaved(args, ["direct", "ceiling", "packrat", *daemons], measure)
    medians = {name: {b: statistics.median(v) for b, v in per.items()} for name, per in samples.items()}
    ratios = _ratios(args, medians)
    memory = {} if args.skip_memory else _memory(folder, common, inputs[max(args.batches)], ceiling)
    direct.close()
    for runner in ceiling:
        runner.close()
    named = {**daemons, **{f"packrat@{b}": d for b, d in per_batch.items()}}
    plans = {name: d.client.info()["plan"] for name, d in named.items()}
    plan_logs = {name: d.plan_log() for name, d in named.items()}
    for daemon in [*daemons.values(), *per_batch.values()]:
        daemon.close()
    return {
        "model": MODEL,
        "cores": cores,
        "rounds": args.rounds,
        "median_ms": medians,
        "ratios": ratios,
        "plans": {
            name: {
                "instances": p["instances"],
                "spare_layouts": p["alternatives"],
                "predicted_ms": p["predicted_latency_ms"],
                "reason": p["reason"],
                "log": plan_logs[name],
            }
            for name, p in plans.items()
        },
        "memory": memory,
    }


# -- tiny model: daemon vs bare relay -------------------------------------------------------------
def _relay(front: str, back: str) -> None:
    context = zmq.Context()
    frontend, backend = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    frontend.bind(front)
    backend.bind(back)
    zmq.proxy(frontend, backend)


def _relay_worker(back: str, cores: list[int]) -> None:
    import torch

    from workers.models.loading import load_model

    os.sched_setaffinity(0, cores)
    torch.set_num_threads(1)
    model = load_model("builtin:tiny-mlp")
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.connect(back)
    while True:
        identity, header, payload = socket.recv_multipart(copy=False)
        x = torch.from_numpy(np.frombuffer(payload.buffer, dtype=np.float32).reshape(-1, 16).copy())
        with torch.inference_mode():
            y = model.module(x).numpy()
        socket.send_multipart([identity, header.bytes, y.tobytes()])


def tiny(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    front, back = f"ipc://{folder}/relay-front.ipc", f"ipc://{folder}/relay-back.ipc"
    context = mp.get_context("spawn")
    relay = context.Process(target=_relay, args=(front, back), daemon=True)
    worker = context.Process(target=_relay_worker, args=(back, [sorted(os.sched_getaffinity(0))[0]]), daemon=True)
    relay.start()
    worker.start()
    daemon = Daemon(
        "tiny", folder, ["--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "1x1", "--max-batch", "1",
                         "--max-delay-ms", "0"]
    )  # fmt: skip
    daemon.wait()
    zcontext = zmq.Context()
    relay_socket = zcontext.socket(zmq.DEALER)
    relay_socket.connect(front)
    x = np.random.default_rng(0).standard_normal((1, 16), dtype=np.float32)
    header = json.dumps({"v": 1, "id": 1}).encode()

    def relay_call() -> float:
        start = time.perf_counter()
        relay_socket.send_multipart([header, x])
        relay_socket.recv_multipart()
        return time.perf_counter() - start

    def daemon_call() -> float:
        start = time.perf_counter()
        daemon.client.infer(x)
        return time.perf_counter() - start

    # The same daemon through a bare socket, as the relay is measured: a protocol header encoded once,
    # the reply received but not decoded. The difference to daemon_call is the client library's cost.
    raw_socket = zcontext.socket(zmq.DEALER)
    raw_socket.connect(daemon.endpoint)
    raw_header = encode_infer_request(1, x)[0]

    def daemon_raw_call() -> float:
        start = time.perf_counter()
        raw_socket.send_multipart([raw_header, x])
        raw_socket.recv_multipart()
        return time.perf_counter() - start

    calls = (relay_call, daemon_call, daemon_raw_call)
    for _ in range(200):
        for call in calls:
            call()
    relay_times, daemon_times, raw_times = [], [], []
    for _ in range(args.tiny_blocks):
        for call, times in zip(calls, (relay_times, daemon_times, raw_times), strict=True):
            times += [call() for _ in range(100)]
    daemon.close()
    relay_socket.close(0)
    raw_socket.close(0)
    zcontext.term()
    relay.terminate()
    worker.terminate()
    relay_ms, daemon_ms = statistics.median(relay_times) * 1000, statistics.median(daemon_times) * 1000
    raw_ms = statistics.median(raw_times) * 1000
    return {
        "model": "builtin:tiny-mlp",
        "batch": 1,
        "calls_each": len(relay_times),
        "bare_relay_p50_ms": relay_ms,
        "daemon_p50_ms": daemon_ms,  # through packrat_daemon.wire.client.Client
        "daemon_over_relay": daemon_ms / relay_ms,
        "daemon_bare_socket_p50_ms": raw_ms,  # the client side as bare as the relay's
        "daemon_bare_socket_over_relay": raw_ms / relay_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="2,4,8,16")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--tiny-blocks", type=int, default=20)
    for part in ("tiny", "resnet", "memory"):
        parser.add_argument(f"--skip-{part}", action="store_true", help=f"do not run the {part} comparison")
    parser.add_argument("--allocators", default="", help="also run packrat with these mallocs, e.g. jemalloc,tcmalloc")
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    args.allocators = [a for a in args.allocators.split(",") if a]
    use_packrat_malloc_tuning()  # the direct and ceiling runners get the workers' malloc settings
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="packrat-bench-") as folder:
        if not args.skip_tiny:
            result["tiny"] = tiny(args, Path(folder))
        if not args.skip_resnet:
            result["resnet50"] = resnet(args, Path(folder))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

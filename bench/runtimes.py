"""Runtimes side by side: PyTorch, ONNX Runtime and OpenVINO in-process, OpenVINO's own 2-stream answer,
and the Packrat daemon with --runtime auto, on ResNet-50 and BERT-base.

    .venv/bin/python bench/runtimes.py [--models builtin:resnet50,builtin:bert-base] [--batches 1,4,8,16]
                                       [--rounds 5] [--budget-s 150] [--skip-daemon]
    .venv/bin/python bench/runtimes.py --ort-spinning     # only: ONNX Runtime's spinning on/off, 2 threads

Every configuration runs in its own spawned process (each loads its own model, as a separate server
would), pinned: 1 thread on the first core, 2 threads on the first two. Calls are interleaved round by
round in a shuffled order, so drift on a shared machine hits every configuration alike; medians are
printed with ratios. The 1-thread runners take part in the first 2 rounds only: no target is judged
against them, so the budget goes to the daemon and the configurations it is compared with. In-process
times are the runtime's compute time; the daemon's are client round trips (transport and batching
included, 1-4 ms: bench/overhead.py). Prints one JSON object:
  - per model, per batch size B: median ms of torch/onnxruntime/openvino at 1 and 2 threads,
    ov_throughput (OpenVINO's THROUGHPUT hint, NUM_STREAMS=2: B split in two asynchronous infer requests,
    OpenVINO pinning as it ships), and daemon_auto;
  - ratios: each runtime's speed-up over torch at the same threads; the daemon's speed-up over the best
    single in-process configuration, and over ov_throughput at B >= 8 (> 1: the daemon is faster).
Conversions come from the cache (~/.cache/packrat or $PACKRAT_CACHE_DIR); a first run converts first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import DaemonProcess, SpawnedRunner, ready_runners, serve_batches, use_packrat_malloc_tuning  # noqa: E402  (bench/ is on sys.path)

RUNTIMES = ("torch", "onnxruntime", "openvino")
# A pause before each configuration's turn: the previous one's pool threads (ONNX Runtime and libgomp
# spin for a while after a run) must not eat into the next one's first call.
SETTLE_S = 0.02


# -- in-process runners ----------------------------------------------------------------------------
def _open_runtime(kind: str, spec: str, threads: int) -> tuple[Any, Any]:
    """(run(batch) -> ms, input spec) for one configuration; imports happen here, in the spawned child."""
    from workers.runtimes import make_runtime

    if kind == "ov_throughput":
        return _open_ov_throughput(spec, threads)
    runtime = make_runtime(kind)
    input_spec = runtime.load(spec)
    runtime.set_threads(threads)

    def run(batch: np.ndarray) -> float:
        return runtime.timed_run(batch)[1]

    return run, input_spec


def _open_ov_throughput(spec: str, threads: int) -> tuple[Any, Any]:
    """OpenVINO's own answer to multi-core throughput: 2 streams, a batch split across 2 async requests."""
    import openvino as ov

    from workers.models.cache import ensure_converted

    converted = ensure_converted(spec, None, "openvino")
    config = {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2, "INFERENCE_NUM_THREADS": threads}
    config["INFERENCE_PRECISION_HINT"] = "f32"  # as the other runtimes: float32 like PyTorch
    compiled = ov.Core().compile_model(str(converted.path), "CPU", config)
    requests = [compiled.create_infer_request() for _ in range(2)]

    def run(batch: np.ndarray) -> float:
        parts = [part for part in np.array_split(batch, 2) if len(part)]
        start = time.perf_counter()
        for request, part in zip(requests, parts, strict=False):
            request.start_async({0: part})
        for request in requests[: len(parts)]:
            request.wait()
        return (time.perf_counter() - start) * 1000.0

    return run, converted.input


def _runner(conn: Any, kind: str, spec: str, threads: int, cores: list[int], env: dict[str, str]) -> None:
    os.environ.update(env)
    os.sched_setaffinity(0, cores)  # before any import: pools started later inherit it
    from workers.models.spec import sample_input

    try:
        run, input_spec = _open_runtime(kind, spec, threads)
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    serve_batches(conn, lambda batch: sample_input(input_spec, batch), run)


class Runner(SpawnedRunner):
    def __init__(self, kind: str, spec: str, threads: int, cores: list[int], env: dict[str, str] | None = None):
        super().__init__(_runner, kind, spec, threads, cores, env or {})

    def measure(self, batch: int) -> float:
        self.conn.send(batch)
        return self.conn.recv()


# -- the daemon ------------------------------------------------------------------------------------
class Daemon(DaemonProcess):
    def __init__(self, spec: str, folder: Path, batches: list[int], runtime: str = "auto") -> None:
        args = [
            "--model", spec, "--runtime", runtime, "--max-batch", str(max(batches)),
            "--batches", ",".join(map(str, batches)), "--max-delay-ms", "0",
        ]  # fmt: skip
        super().__init__("daemon", folder, args)
        self.inputs: dict[int, np.ndarray] = {}
        self.input_spec: Any = None

    def measure(self, batch: int) -> float:
        from workers.models.spec import InputSpec, sample_input

        if batch not in self.inputs:
            if self.input_spec is None:
                declared = self.client.info()["input"]
                self.input_spec = InputSpec(declared["dtype"], tuple(declared["shape"]), declared.get("high"))
            self.inputs[batch] = sample_input(self.input_spec, batch)
        start = time.perf_counter()
        self.client.infer(self.inputs[batch])
        return (time.perf_counter() - start) * 1000.0

    def instances_used(self, batch: int) -> int:
        """How many workers shared a batch of this size (from the reply's timing, which Client.infer drops)."""
        import zmq

        from packrat_daemon.wire.client_side import decode_reply, encode_infer_request

        self.measure(batch)  # makes the input
        with zmq.Context() as context, context.socket(zmq.DEALER) as socket:
            socket.connect(self.endpoint)
            socket.send_multipart(encode_infer_request(1, self.inputs[batch]))
            header, _ = decode_reply(socket.recv_multipart())
        return int(header["timing"]["instances"])

    def describe(self, info: dict[str, Any]) -> dict[str, Any]:
        """The runtime it chose (from its log: `info` does not say) and its plan."""
        chosen = re.search(
            r"runtime auto: chose (\S+) \(predicted: ([^)]*)\)", self.log_path.read_text(errors="replace")
        )
        plan = info.get("plan") or {}
        return {
            "runtime": info.get("runtime") or (chosen.group(1) if chosen else None),
            "predicted_by_runtime": chosen.group(2) if chosen else None,
            "instances": plan.get("instances"),
            "spare_layouts": plan.get("alternatives"),
            "predicted_ms": plan.get("predicted_latency_ms"),
            "log": self.plan_log(),
        }


# -- measuring -------------------------------------------------------------------------------------
def calls_per_round(batch: int) -> int:
    # Small batches are short and noisy: more calls per round at the same cost in seconds.
    return max(1, 8 // batch)


def interleave(
    targets: dict[str, Any],
    batches: list[int],
    rounds: int,
    budget_s: float,
    errors: dict[str, str],
    seed: int = 0,
    side: frozenset[str] = frozenset(),
    side_rounds: int = 2,
) -> tuple[dict[str, dict[int, list[float]]], int]:
    """Warm every target at every batch, then shuffled rounds until `rounds` or the budget (at least 2).

    Targets in `side` (those no target is judged against) take part in the first `side_rounds` rounds
    only, so that the budget buys more rounds of the ones that are. A target that fails is dropped (its
    error reported); the others go on.
    """
    samples: dict[str, dict[int, list[float]]] = {name: {b: [] for b in batches} for name in targets}
    live = dict(targets)

    def measure(name: str, batch: int) -> float | None:
        try:
            return live[name].measure(batch)
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
            del live[name]
            return None

    for batch in batches:
        for name in list(live):
            measure(name, batch)
    rng = random.Random(seed)
    start = time.monotonic()
    done = 0
    while done < rounds and (done < 2 or time.monotonic() - start < budget_s):
        if done == side_rounds:
            for name in side & live.keys():
                del live[name]
        for batch in batches:
            names = list(live)
            rng.shuffle(names)
            for name in names:
                time.sleep(SETTLE_S)
                for _ in range(calls_per_round(batch)):
                    if name not in live or (elapsed := measure(name, batch)) is None:
                        break
                    samples[name][batch].append(elapsed)
        done += 1
        print(f"  round {done} done ({time.monotonic() - start:.0f} s)", file=sys.stderr)
    return samples, done


def medians(samples: dict[str, dict[int, list[float]]]) -> dict[str, dict[int, float]]:
    return {name: {b: round(statistics.median(v), 2) for b, v in per.items() if v} for name, per in samples.items()}


def start_runners(spec: str, configs: dict[str, tuple], errors: dict[str, str]) -> dict[str, Runner]:
    """Start all, then wait for all (they load in parallel); a configuration that fails is reported."""
    return ready_runners({name: Runner(*config) for name, config in configs.items()}, errors)


def in_process_configs(spec: str, cores: list[int]) -> dict[str, tuple]:
    configs: dict[str, tuple] = {}
    for runtime in RUNTIMES:
        for threads in (1, 2):
            configs[f"{runtime}_{threads}t"] = (runtime, spec, threads, cores[:threads])
    configs["ov_throughput"] = ("ov_throughput", spec, 2, cores[:2])
    return configs


def ratios(spec_medians: dict[str, dict[int, float]], batches: list[int]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    singles = [f"{runtime}_{threads}t" for runtime in RUNTIMES for threads in (1, 2)]
    for b in batches:
        row: dict[str, Any] = {}
        for runtime in RUNTIMES[1:]:
            for threads in (1, 2):
                torch_ms = spec_medians.get(f"torch_{threads}t", {}).get(b)
                other_ms = spec_medians.get(f"{runtime}_{threads}t", {}).get(b)
                if torch_ms and other_ms:
                    row[f"{runtime}_{threads}t_speedup_over_torch"] = round(torch_ms / other_ms, 3)
        present = {name: spec_medians[name][b] for name in singles if b in spec_medians.get(name, {})}
        if present:
            best = min(present, key=present.__getitem__)
            row["best_single"] = best
        daemon_ms = spec_medians.get("daemon_auto", {}).get(b)
        if daemon_ms and present:
            row["daemon_speedup_over_best_single"] = round(present[best] / daemon_ms, 3)
        throughput_ms = spec_medians.get("ov_throughput", {}).get(b)
        if daemon_ms and throughput_ms and b >= 8:
            row["daemon_speedup_over_ov_throughput"] = round(throughput_ms / daemon_ms, 3)
        out[b] = row
    return out


def bench_model(spec: str, args: argparse.Namespace, cores: list[int], folder: Path) -> dict[str, Any]:
    errors: dict[str, str] = {}
    targets: dict[str, Any] = {}
    daemon: Daemon | None = None
    plan: Any = None
    if not args.skip_daemon:
        # First, alone: the daemon profiles what it needs at start, on an otherwise idle machine.
        print(f"{spec}: starting the daemon with --runtime auto ...", file=sys.stderr)
        daemon = Daemon(spec, folder, args.batches)
        try:
            info = daemon.wait(args.daemon_timeout_s)
            plan = daemon.describe(info)
            targets["daemon_auto"] = daemon
        except Exception as exc:
            errors["daemon_auto"] = f"{type(exc).__name__}: {exc}"
            daemon.close()
            daemon = None
    print(f"{spec}: starting the in-process runners ...", file=sys.stderr)
    runners = start_runners(spec, in_process_configs(spec, cores), errors)
    targets.update(runners)
    try:
        # The 1-thread runners only show each runtime's scaling; the targets compare the daemon with the
        # 2-thread runners and OpenVINO's 2 streams, so those get the rounds the budget allows.
        side = frozenset(name for name in runners if name.endswith("_1t"))
        samples, rounds = interleave(targets, args.batches, args.rounds, args.budget_s, errors, side=side)
        if daemon is not None and plan is not None and "daemon_auto" in targets:
            plan["workers_per_batch"] = {b: daemon.instances_used(b) for b in args.batches}
            # The daemon adapts online: its plan at the end, and how it got there, may differ from the start's.
            final = daemon.client.info()["plan"]
            plan["final_plan"] = {"instances": final["instances"], "spare_layouts": final["alternatives"]}
            plan["log"] = daemon.plan_log()
    finally:
        for runner in runners.values():
            runner.close()
        if daemon is not None:
            daemon.close()
    spec_medians = medians(samples)
    return {
        "rounds": rounds,
        "samples": {name: {b: len(v) for b, v in per.items()} for name, per in samples.items()},
        "median_ms": spec_medians,
        "ratios": ratios(spec_medians, args.batches),
        "daemon": plan,
        "errors": errors,
    }


def ort_spinning(args: argparse.Namespace, cores: list[int]) -> dict[str, Any]:
    """ONNX Runtime at 2 threads with its intra-op threads spinning or not, side by side."""
    result: dict[str, Any] = {}
    batches = [1, 8]
    for spec in args.models:
        print(f"{spec}: ORT spinning on/off ...", file=sys.stderr)
        errors: dict[str, str] = {}
        configs = {
            f"spin_{flag}": ("onnxruntime", spec, 2, cores[:2], {"PACKRAT_ORT_SPINNING": flag}) for flag in ("0", "1")
        }
        runners = start_runners(spec, configs, errors)
        try:
            samples, rounds = interleave(runners, batches, args.rounds, args.budget_s, errors)
        finally:
            for runner in runners.values():
                runner.close()
        spec_medians = medians(samples)
        speedup = {
            b: round(spec_medians["spin_0"][b] / spec_medians["spin_1"][b], 3)
            for b in batches
            if "spin_0" in spec_medians and "spin_1" in spec_medians
        }
        result[spec] = {"rounds": rounds, "median_ms": spec_medians, "spinning_speedup": speedup, "errors": errors}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="builtin:resnet50,builtin:bert-base")
    parser.add_argument("--batches", default="1,4,8,16")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per model (at most)")
    parser.add_argument("--budget-s", type=float, default=150.0, help="seconds of measuring per model (>= 2 rounds)")
    parser.add_argument("--daemon-timeout-s", type=float, default=300.0, help="how long the daemon may take to start")
    parser.add_argument("--skip-daemon", action="store_true")
    parser.add_argument("--ort-spinning", action="store_true", help="only compare ORT spinning on/off")
    args = parser.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    args.batches = [int(b) for b in args.batches.split(",")]
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        print("this bench needs at least 2 cores", file=sys.stderr)
        return 1
    use_packrat_malloc_tuning()  # in-process runners get the daemon's workers' malloc settings
    started = time.monotonic()
    if args.ort_spinning:
        report: dict[str, Any] = {"ort_spinning": ort_spinning(args, cores)}
    else:
        report = {"cores": cores[:2], "batches": args.batches, "models": {}}
        with tempfile.TemporaryDirectory(prefix="packrat-bench-") as folder:
            for spec in args.models:
                report["models"][spec] = bench_model(spec, args, cores, Path(folder))
    report["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

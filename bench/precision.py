"""Precision side by side: the daemon on its defaults (no flags), at fp32 and at `--precision auto --runtime
auto` against in-process OpenVINO at its defaults (LATENCY, and THROUGHPUT with 2 streams) and in-process
PyTorch bf16, on ResNet-50 and BERT-base, with each configuration's error against fp32; and int8 (OpenVINO
quantized by NNCF on the sample inputs), in the daemon and in-process.

    .venv/bin/python bench/precision.py [--models builtin:resnet50,builtin:bert-base] [--batches 1,4,16]
                                        [--rounds 3] [--budget-s 120] [--no-int8]

Kept short for a shared 2-core machine: few rounds (3 by default), interleaved in a shuffled order with
bench/runtimes.py's `interleave`, so drift hits every configuration alike; medians are reported. The default
daemon starts first, alone, then the daemon with auto/auto, alone (each screens every (runtime, precision)
candidate, and guards and profiles those near the fastest), then the daemon at fp32 (its own fp32 candidates).
All run with --no-adapt, so each is measured on one plan. In-process times are the runtime's compute time; the
daemon's are client round trips (transport and batching included). "OpenVINO at its defaults" sets no precision
hint: on a CPU with bf16 units OpenVINO then runs bf16. Every configuration's error is measured the guard's way
(packrat_daemon.measure.accuracy.compare) on the same sample inputs (a batch of the largest B) against in-
process PyTorch fp32; the daemon's own guard report (what it checked before serving) is in `daemon_auto.guard`.

int8 rows are reported but are no peer of the targets: `--precision auto` never serves int8, whose error
depends on its calibration inputs. The int8 daemon runs `--max-rel-error` at `--int8-tolerance`, so its
guard reports what it measured instead of stopping it.

Where the daemon's time goes: each daemon reply carries the daemon's own timing (queue wait, the workers'
compute, the daemon's total), so `gap` splits each daemon's round trip into client-to-daemon transport,
time inside the daemon other than compute (batching wait, the hop to the workers, gathering), and the
workers' compute, next to the best in-process peer at that batch size.

`daemon_default` is `packrat serve --model M` with no other flag but where it binds (tcp loopback, as
its default endpoint): runtime and precision auto, max_batch 16, its default state folder (a fresh one under a
temporary $XDG_STATE_HOME). `hop` is one bare ZeroMQ round trip over the same tcp loopback with the same bytes
(the request's frames out, an output-sized reply back) to an echo process, so that "the best in-process peer
plus one hop" is what a client of any server would pay at least; its target: daemon_default within 5% of that
at the largest B.

Prints one JSON object: per model, median ms per configuration and batch, the errors, the daemon's
choice, where its time went, and the targets: daemon_auto within 10% of the best in-process peer at every
B, and equal or faster at the largest B; daemon_default within 5% of the best peer plus the hop at the largest B.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import DaemonProcess, SpawnedRunner, ready_runners, use_packrat_malloc_tuning  # noqa: E402  (bench/ is on sys.path)
from runtimes import interleave, medians  # noqa: E402

PEERS = ("torch_fp32", "torch_bf16", "ov_latency", "ov_throughput")
INT8_PEERS = ("ov_int8",)  # reported, not a peer of the targets (auto never serves int8)


# -- in-process configurations (each in its own spawned process, as a separate server would be) ---------
def _open(kind: str, spec: str, threads: int) -> tuple[Any, Any]:
    """(run(batch) -> (output, ms), input spec); imports happen here, in the spawned child."""
    if kind.startswith("ov_"):
        return _open_openvino(kind, spec)
    from workers.runtimes import make_runtime

    runtime = make_runtime("torch", kind.removeprefix("torch_"))
    input_spec = runtime.load(spec)
    runtime.set_threads(threads)
    return runtime.timed_run, input_spec


def _open_openvino(kind: str, spec: str) -> tuple[Any, Any]:
    """OpenVINO as it ships: no precision hint (bf16 where the CPU has the units), its own threads and pinning.
    ov_int8: the same on the model NNCF quantized on the sample inputs (the int8 daemon's cache entry)."""
    import openvino as ov

    from workers.models.cache import ensure_converted, ensure_quantized

    converted = ensure_quantized(spec, None, None) if kind == "ov_int8" else ensure_converted(spec, None, "openvino")
    if kind in ("ov_latency", "ov_int8"):
        compiled = ov.Core().compile_model(str(converted.path), "CPU", {"PERFORMANCE_HINT": "LATENCY"})
        request = compiled.create_infer_request()

        def run_latency(batch: np.ndarray) -> tuple[np.ndarray, float]:
            start = time.perf_counter()
            request.infer({0: batch})
            elapsed = (time.perf_counter() - start) * 1000.0
            return request.get_output_tensor(0).data.copy(), elapsed

        return run_latency, converted.input
    config = {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2}
    compiled = ov.Core().compile_model(str(converted.path), "CPU", config)
    requests = [compiled.create_infer_request() for _ in range(2)]

    def run_throughput(batch: np.ndarray) -> tuple[np.ndarray, float]:
        parts = [part for part in np.array_split(batch, 2) if len(part)]  # B split across the 2 streams
        start = time.perf_counter()
        for request, part in zip(requests, parts, strict=False):
            request.start_async({0: part})
        for request in requests[: len(parts)]:
            request.wait()
        elapsed = (time.perf_counter() - start) * 1000.0
        return np.concatenate([r.get_output_tensor(0).data.copy() for r in requests[: len(parts)]]), elapsed

    return run_throughput, converted.input


def _child(conn: Any, kind: str, spec: str, threads: int) -> None:
    from workers.models.spec import sample_input

    try:
        run, input_spec = _open(kind, spec, threads)
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    inputs: dict[int, np.ndarray] = {}
    while (asked := conn.recv()) is not None:
        what, batch = asked
        if batch not in inputs:
            inputs[batch] = sample_input(input_spec, batch)
        output, elapsed = run(inputs[batch])
        conn.send(np.asarray(output, dtype=np.float32) if what == "output" else elapsed)


class Peer(SpawnedRunner):
    def __init__(self, kind: str, spec: str, threads: int) -> None:
        super().__init__(_child, kind, spec, threads)

    def measure(self, batch: int) -> float:
        self.conn.send(("time", batch))
        return self.conn.recv()

    def output(self, batch: int) -> np.ndarray:
        self.conn.send(("output", batch))
        return self.conn.recv()


# -- one bare hop: the transport a client of any server pays ----------------------------------------------
def _echo(conn: Any, endpoint: str) -> None:
    """A ROUTER on `endpoint` that answers each [size, *frames] with `size` bytes, as a server's reply would be."""
    import zmq

    socket = zmq.Context.instance().socket(zmq.ROUTER)
    socket.bind(endpoint)
    conn.send(("ready", os.getpid()))
    replies: dict[int, bytes] = {}
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    while not conn.poll(0):
        if not poller.poll(100):
            continue
        identity, size, *_ = socket.recv_multipart(copy=False)
        n = int(size.bytes)
        socket.send_multipart([identity, b"{}", replies.setdefault(n, bytes(n))], copy=False)
    socket.close(linger=0)


class Hop(SpawnedRunner):
    """One round trip of `request(batch)`'s frames to an echo process over tcp loopback, `reply_bytes(batch)` back."""

    def __init__(self, request: Any, reply_bytes: Any) -> None:
        from harness import free_port

        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        super().__init__(_echo, self.endpoint)
        self.request, self.reply_bytes = request, reply_bytes
        self._socket: Any = None

    def measure(self, batch: int) -> float:
        import zmq

        if self._socket is None:
            self._socket = zmq.Context.instance().socket(zmq.DEALER)
            self._socket.connect(self.endpoint)
        frames = [str(self.reply_bytes(batch)).encode(), *self.request(batch)]
        start = time.perf_counter()
        self._socket.send_multipart(frames, copy=False)
        self._socket.recv_multipart()
        return (time.perf_counter() - start) * 1000.0

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
        super().close()


# -- the daemon --------------------------------------------------------------------------------------
class Daemon(DaemonProcess):
    def __init__(
        self, name: str, spec: str, folder: Path, batches: list[int], extra: list[str], bare: bool = False
    ) -> None:
        """`bare`: `packrat serve --model SPEC` and `extra` only, on tcp loopback (the default endpoint's kind)."""
        from harness import free_port

        from packrat_daemon.wire.client import Client

        args = [
            "--model", spec, "--runtime", "auto", "--max-batch", str(max(batches)), "--no-adapt",
            "--batches", ",".join(map(str, batches)), "--max-delay-ms", "0", "--state-dir", "none",
            "--first-answer", "off", *extra,
        ]  # fmt: skip
        tcp = f"tcp://127.0.0.1:{free_port()}"
        super().__init__(name, folder, ["--model", spec, "--endpoint", tcp, *extra] if bare else args)
        if bare:  # the later --endpoint wins
            self.client.close()
            self.endpoint = tcp
            self.client = Client(tcp, timeout=5.0)
        self.inputs: dict[int, np.ndarray] = {}
        self.info: dict[str, Any] = {}
        self.timings: dict[int, list[dict[str, float]]] = {}  # per batch: the round trip and the reply's timing
        self._socket: Any = None

    def ready(self, timeout: float) -> None:
        """Wait until the daemon serves what it chose: a first start on the defaults answers on a first candidate
        while it measures the others, and what is timed here is the choice."""
        deadline = time.monotonic() + timeout
        self.info = self.wait(timeout)
        from packrat_daemon.wire.client import ClientTimeout

        while time.monotonic() < deadline:
            try:
                choice = self.client.status().get("runtime_choice") or {}
            except ClientTimeout:  # busy measuring on every core
                continue
            measuring = [c["candidate"] for c in choice.get("candidates", []) if c["verdict"] == "measuring"]
            if not measuring and not choice.get("switching"):
                self.info = self.client.info()
                return
            time.sleep(1.0)
        raise RuntimeError(f"{self.log_path.stem} still measuring after {timeout:.0f} s")

    def _input(self, batch: int) -> np.ndarray:
        from workers.models.spec import InputSpec, sample_input

        if batch not in self.inputs:
            declared = self.info["input"]
            spec = InputSpec(declared["dtype"], tuple(declared["shape"]), declared.get("high"))
            self.inputs[batch] = sample_input(spec, batch)  # seed 0: the peers' inputs
        return self.inputs[batch]

    def measure(self, batch: int) -> float:
        """One round trip on a bare socket (as a client library's, less its checks), keeping the reply's timing,
        which Client.infer drops."""
        import zmq

        from packrat_daemon.wire.client_side import decode_reply, encode_infer_request

        inputs = self._input(batch)
        if self._socket is None:
            self._socket = zmq.Context.instance().socket(zmq.DEALER)
            self._socket.connect(self.endpoint)
        request_id = sum(len(t) for t in self.timings.values()) + 1
        start = time.perf_counter()
        self._socket.send_multipart(encode_infer_request(request_id, inputs), copy=False)
        header, _ = decode_reply(self._socket.recv_multipart())
        round_trip = (time.perf_counter() - start) * 1000.0
        if "timing" not in header:
            raise RuntimeError(f"{self.log_path.stem} answered {header}")
        self.timings.setdefault(batch, []).append({"round_trip_ms": round_trip, **header["timing"]})
        return round_trip

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
        super().close()

    def output(self, batch: int) -> np.ndarray:
        return np.asarray(self.client.infer(self._input(batch)), dtype=np.float32)

    def request_frames(self, batch: int) -> list[Any]:
        from packrat_daemon.wire.client_side import encode_infer_request

        return list(encode_infer_request(1, self._input(batch)))

    def describe(self) -> dict[str, Any]:
        log = self.log_path.read_text(errors="replace").splitlines()
        chosen = [line.split(": ", 1)[-1] for line in log if "runtime auto: chose" in line or "accuracy guard" in line]
        plan = self.info.get("plan") or {}
        return {
            "verdicts": [line.split("packrat.daemon: ", 1)[-1] for line in log if "packrat.daemon: candidate " in line],
            "runtime": self.info.get("runtime"),
            "precision": self.info.get("precision"),
            "guard": self.info.get("accuracy_guard"),
            "instances": plan.get("instances"),
            "choice_log": chosen,
            "plan_log": self.plan_log(),
        }


# -- one model ---------------------------------------------------------------------------------------
def errors_against_fp32(
    targets: dict[str, Any], reference: Any, batch: int, errors: dict[str, str]
) -> dict[str, dict[str, float | None]]:
    """Each target's error on the same `batch` sample inputs against `reference` (PyTorch fp32); a target
    that fails is reported in `errors` and left out of the rounds."""
    from packrat_daemon.measure.accuracy import compare

    expected = reference.output(batch)
    out: dict[str, dict[str, float | None]] = {}
    for name, target in list(targets.items()):
        try:
            rel, top1 = compare(expected, target.output(batch))
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
            del targets[name]
            continue
        out[name] = {"max_rel_error": rel, "top1_agreement": top1}
    return out


def targets_met(spec_medians: dict[str, dict[int, float]], batches: list[int]) -> dict[str, Any]:
    rows: dict[int, Any] = {}
    for b in batches:
        daemon = spec_medians.get("daemon_auto", {}).get(b)
        peers = {name: spec_medians[name][b] for name in PEERS if b in spec_medians.get(name, {})}
        if daemon is None or not peers:
            continue
        best = min(peers, key=peers.__getitem__)
        rows[b] = {"best_peer": best, "daemon_auto_over_best_peer": round(daemon / peers[best], 3)}
    largest = max(batches)
    default = spec_medians.get("daemon_default", {}).get(largest)
    peers = {name: spec_medians[name][largest] for name in PEERS if largest in spec_medians.get(name, {})}
    hop = spec_medians.get("hop", {}).get(largest)
    bound = None
    if default is not None and peers and hop is not None:
        best = min(peers, key=peers.__getitem__)
        bound = {"best_peer": best, "best_peer_ms": peers[best], "hop_ms": hop,
                 "daemon_default_over_peer_plus_hop": round(default / (peers[best] + hop), 3)}  # fmt: skip
    return {
        "daemon_default_at_largest_batch": bound,
        "daemon_default_within_5pct_of_peer_plus_hop": bound is not None
        and bound["daemon_default_over_peer_plus_hop"] <= 1.05,
        "per_batch": rows,
        "within_10pct_everywhere": bool(rows) and all(r["daemon_auto_over_best_peer"] <= 1.10 for r in rows.values()),
        "equal_or_faster_at_largest_batch": largest in rows and rows[largest]["daemon_auto_over_best_peer"] <= 1.0,
    }


def gap(daemon: Daemon, spec_medians: dict[str, dict[int, float]], batches: list[int]) -> dict[int, Any]:
    """Where the daemon's round trip went at each batch size (medians over the rounds, warm-up call left out),
    next to the best in-process peer there."""
    import statistics

    rows: dict[int, Any] = {}
    for b in batches:
        calls = daemon.timings.get(b, [])[1:]
        if not calls:
            continue
        m = {key: statistics.median(call[key] for call in calls) for key in calls[0]}
        peers = {name: spec_medians[name][b] for name in PEERS if b in spec_medians.get(name, {})}
        best = min(peers, key=peers.__getitem__) if peers else None
        rows[b] = {
            "round_trip_ms": round(m["round_trip_ms"], 2),
            "client_to_daemon_ms": round(m["round_trip_ms"] - m["total_ms"], 2),
            "queue_ms": round(m["queue_ms"], 2),
            "daemon_other_ms": round(m["total_ms"] - m["queue_ms"] - m["compute_ms"], 2),  # hop, split, gather
            "compute_ms": round(m["compute_ms"], 2),
            "instances": int(m["instances"]),
            "best_peer": best,
            "compute_over_best_peer": round(m["compute_ms"] / peers[best], 3) if best else None,
        }
    return rows


def bench_model(spec: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    errors: dict[str, str] = {}
    targets: dict[str, Any] = {}
    daemons: list[Daemon] = []
    peers: dict[str, Peer] = {}
    hops: dict[str, Hop] = {}
    start_s: dict[str, float] = {}  # each daemon's start, to its first answer of `info`
    saved = folder / f"{spec.replace(':', '_')}.csv"
    try:
        print(
            f"{spec}: the daemon with --precision auto --runtime auto (profiles every candidate) ...", file=sys.stderr
        )
        more = args.daemon_args.split()
        # Each daemon starts alone, the default one first: its first start measures the candidates too.
        configs = [
            ("daemon_default", []),
            ("daemon_auto", ["--precision", "auto", "--save-profile", str(saved)]),
            # Its own profile: the auto daemon's screening profiles only the candidates near the fastest.
            ("daemon_fp32", ["--precision", "fp32"]),
        ]
        if args.int8:
            int8 = ["--runtime", "openvino", "--precision", "int8", "--max-rel-error", str(args.int8_tolerance)]
            configs.append(("daemon_int8", int8))
        for name, flags in configs:
            if name == "daemon_fp32":
                print(f"{spec}: the daemon at fp32, planning from the same profile ...", file=sys.stderr)
            started = time.monotonic()
            daemon = Daemon(name, spec, folder, args.batches, [*flags, *more], bare=name == "daemon_default")
            daemons.append(daemon)
            daemon.ready(args.daemon_timeout_s)
            start_s[name] = round(time.monotonic() - started, 1)
            targets[name] = daemon
        default = targets["daemon_default"]
        per_sample = default.output(1).nbytes  # the reply's bytes per input, for the hop
        hop = Hop(default.request_frames, lambda batch: per_sample * batch)
        peers_started: dict[str, Any] = {"hop": hop}
        print(f"{spec}: the in-process peers ...", file=sys.stderr)
        kinds = PEERS + (INT8_PEERS if args.int8 else ())
        peers.update(ready_runners({kind: Peer(kind, spec, args.threads) for kind in kinds}, errors))
        hops.update(ready_runners(peers_started, errors))
        targets.update(peers)
        error = errors_against_fp32(targets, peers["torch_fp32"], max(args.batches), errors)
        targets.update(hops)  # after the error check: a hop computes nothing
        samples, rounds = interleave(targets, args.batches, args.rounds, args.budget_s, errors)
        described = {d.log_path.stem: d.describe() for d in daemons}
        spec_medians = medians(samples)
        gaps = {d.log_path.stem: gap(d, spec_medians, args.batches) for d in daemons}
    finally:
        for peer in [*peers.values(), *hops.values()]:
            peer.close()
        for daemon in daemons:
            daemon.close()
            if args.keep_logs:  # the daemons' logs go with the temporary folder otherwise
                Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
                name = f"{spec.replace(':', '_')}-{daemon.log_path.name}"
                (Path(args.keep_logs) / name).write_text(daemon.log_path.read_text(errors="replace"))
    return {
        "rounds": rounds,
        "samples": {name: {b: len(v) for b, v in per.items()} for name, per in samples.items()},
        "median_ms": spec_medians,
        "error_vs_torch_fp32": error,
        "daemons": described,
        "daemon_start_s": start_s,
        "gap": gaps,
        "targets": targets_met(spec_medians, args.batches),
        "errors": errors,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="builtin:resnet50,builtin:bert-base")
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=120.0, help="interleaved rounds stop after this (>= 2)")
    parser.add_argument("--daemon-timeout-s", type=float, default=1800.0)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="PyTorch peers' threads")
    parser.add_argument("--daemon-args", default="", help="more `serve` flags for both daemons, e.g. on a busy machine")
    parser.add_argument("--keep-logs", help="copy the daemons' logs into this folder")
    parser.add_argument("--no-int8", dest="int8", action="store_false", help="leave out the int8 rows")
    parser.add_argument("--int8-tolerance", type=float, default=1.0, help="the int8 daemon's --max-rel-error")
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    use_packrat_malloc_tuning()
    from workers.models.precision import cpu_flags, cpu_units

    result: dict[str, Any] = {
        "command": "bench/precision.py " + " ".join(sys.argv[1:]),
        "cores": len(os.sched_getaffinity(0)),
        "bf16_units": cpu_units("bf16"),
        "int8_units": cpu_units("int8"),
        "amx": sorted(flag for flag in cpu_flags() if flag.startswith("amx")),
        "batches": args.batches,
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="packrat-precision-") as tmp:
        # daemon_default keeps its state in its default folder: a fresh one here, never the user's.
        os.environ["XDG_STATE_HOME"] = str(Path(tmp) / "state-home")
        os.environ.pop("STATE_DIRECTORY", None)
        for spec in args.models.split(","):
            result["models"][spec] = bench_model(spec, args, Path(tmp))
            print(json.dumps({spec: result["models"][spec]}), file=sys.stderr)  # kept if a later model fails
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

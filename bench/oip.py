"""What the Open Inference Protocol costs over Packrat's own protocol, side by side in one run.

    .venv/bin/python bench/oip.py [--model builtin:resnet50] [--batch 16] [--rounds 10] [--requests 10]
                                  [--variants process,thread] [--paths zmq,grpc,http] [--plan 1*2x16]

One daemon per variant, each with the gateway (REST and gRPC) beside it:

- process: `packrat serve --http-port --grpc-port`, the gateway in a child process (what serve does);
- thread: the same gateway in a thread of the daemon's own process (started before `serve` by this script),
  to measure whether the GIL it shares with the serving loop costs more than the process's extra hops save;
- aio: `packrat serve` and beside it `packrat oip --grpc-server aio`, the gateway's gRPC on grpc.aio in its event
  loop instead of grpcio's threaded server (the default), each inference through the loop's one connection.

Each round visits every variant and, on it, every path in a rotating order, sending `--requests` requests of
`--batch` samples one after the other from this process: `zmq` through Packrat's client library straight
to the daemon, `grpc` through tritonclient's gRPC client (raw tensors), `http` through tritonclient's HTTP
client with the binary-data extension, `json` (only if asked) with JSON tensors. A path's figure is the
median latency; each round's ratio and difference to `zmq` on the same daemon pair them, and the reported
ratio and difference are the medians over rounds. JSON on stdout (`--out FILE` also writes it there).

`--floor` (on by default) adds the `floor` variant: no Packrat in it, a child process answering tritonclient's
gRPC `ModelInfer` from a bare grpcio threaded server (`grpc`, as the gateway serves by default) and a bare
grpc.aio server (`grpc_aio`), each bytes in and a reply serialized once, as the gateway registers it, and a bare
ZeroMQ ROUTER echoing, each with a reply of the model's output size. Its `grpc` minus `zmq` is what one gRPC hop
costs over one ZeroMQ hop on this machine, whatever the gateway does: the least the gateway's figure can be.

`--breakdown` (on by default) splits the gRPC path's time on the first variant after the rounds: tritonclient
building and serializing the request and parsing the reply (timed alone in this process), the gateway's parse
of the same bytes (timed alone in a child process: hand split, and for reference protobuf's parse as the
generated deserializer does it), and from the statistics extension over `--requests` gRPC requests the
gateway's own time (decode, encode, the hop to the daemon and back) and the daemon's queue and compute. What
is left of the client's median is gRPC's transport: both ways over TCP, grpcio's framing and its Python layers.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# The thread variant: the gateway in a daemon thread of the daemon's process, then `packrat serve` itself.
THREAD_LAUNCH = """
import asyncio, sys, threading
from packrat_daemon.protocol.gateway import GatewayOptions, serve_gateway
options = GatewayOptions(connect=sys.argv[1], http_port=int(sys.argv[2]), grpc_port=int(sys.argv[3]))
threading.Thread(target=lambda: asyncio.run(serve_gateway(options, install_signals=False)), daemon=True).start()
from packrat_daemon.cli import main
sys.exit(main(["serve", *sys.argv[4:]]))
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Served:
    """One daemon with its gateway, started as `variant` says."""

    def __init__(self, variant: str, serve_args: list[str], folder: Path) -> None:
        self.variant = variant
        self.endpoint = f"ipc://{folder}/{variant}.ipc"
        self.http_port, self.grpc_port = free_port(), free_port()
        args = ["--endpoint", self.endpoint, *serve_args]
        self.gateway: subprocess.Popen[bytes] | None = None
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.log = folder / f"{variant}.log"
        if variant == "process":
            command = [sys.executable, "-m", "packrat_daemon", "serve", *args]
            command += ["--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)]
        elif variant == "aio":
            command = [sys.executable, "-m", "packrat_daemon", "serve", *args]
            gateway = [sys.executable, "-m", "packrat_daemon", "oip", "--connect", self.endpoint]
            gateway += ["--grpc-server", "aio", "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)]
            with open(folder / "aio-gateway.log", "wb") as out:
                self.gateway = subprocess.Popen(gateway, env=env, stdout=out, stderr=out)
        else:
            command = [sys.executable, "-c", THREAD_LAUNCH, self.endpoint, str(self.http_port), str(self.grpc_port)]
            command += args
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(command, env=env, stdout=out, stderr=out)

    def wait_ready(self, timeout_s: float) -> None:
        import tritonclient.http as httpclient

        deadline = time.monotonic() + timeout_s
        client = httpclient.InferenceServerClient(f"127.0.0.1:{self.http_port}")
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"the {self.variant} daemon exited:\n{self.log.read_text()[-3000:]}")
            try:
                if client.is_server_ready():
                    break
            except Exception:
                pass  # the gateway is not listening yet
            if time.monotonic() > deadline:
                raise SystemExit(f"the {self.variant} daemon is not ready after {timeout_s:.0f} s")
            time.sleep(0.5)
        # The one model the gateway serves is the one its statistics name (Packrat has no repository index).
        self.model = client.get_inference_statistics()["model_stats"][0]["name"]
        client.close()

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.terminate()
            self.gateway.wait(30)
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


# The floor variant's servers: a bare threaded and a bare grpc.aio ModelInfer and a bare ZeroMQ echo, replies of the
# output's size.
# ModelInfer takes and returns bytes, as the gateway's does (protocol/grpc/wire.py): no parse, a reply made once.
FLOOR_LAUNCH = """
import asyncio, sys, threading
from concurrent import futures
import grpc, zmq
from packrat_daemon.protocol.grpc import inference_pb2 as pb
endpoint, port, reply, threaded_port = sys.argv[1], int(sys.argv[2]), bytes(int(sys.argv[3])), int(sys.argv[4])
def echo():
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.bind(endpoint)
    while True:
        identity, *_ = router.recv_multipart(copy=False)
        router.send_multipart([identity, reply])
threading.Thread(target=echo, daemon=True).start()
response = pb.ModelInferResponse(model_name="floor", model_version="1")
response.outputs.add(name="output", datatype="FP32", shape=[len(reply) // 4])
response.raw_output_contents.append(reply)
answer = response.SerializeToString()
async def model_infer(request, context):
    return answer
def threaded_infer(request, context):
    return answer
threaded = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[("grpc.max_receive_message_length", -1)])
handlers = {"ModelInfer": grpc.unary_unary_rpc_method_handler(threaded_infer)}
threaded.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", handlers),))
threaded.add_insecure_port(f"127.0.0.1:{threaded_port}")
threaded.start()
async def main():
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1)])
    handler = grpc.unary_unary_rpc_method_handler(model_infer)
    service = grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": handler})
    server.add_generic_rpc_handlers((service,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()
asyncio.run(main())
"""


# The breakdown's server parse, in a child process (Packrat's stubs and tritonclient's share protobuf names).
PARSE_TIMING = """
import json, statistics, sys, time
import numpy as np
from packrat_daemon.protocol.grpc import inference_pb2 as pb
from packrat_daemon.protocol.grpc.wire import split_infer_request
data, repeat = open(sys.argv[1], "rb").read(), int(sys.argv[2])
def hand():
    request, raw = split_infer_request(data)
    return [np.frombuffer(view, np.uint8) for view in raw]
def generated():
    return [np.frombuffer(raw, np.uint8) for raw in pb.ModelInferRequest.FromString(data).raw_input_contents]
def timed(call):
    spent = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        spent.append((time.perf_counter() - started) * 1000.0)
    return round(statistics.median(spent), 4)
print(json.dumps({"hand_ms": timed(hand), "protobuf_ms": timed(generated)}))
"""


def _median_ms(call: Any, repeat: int) -> float:
    spent = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        spent.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(spent)


def breakdown(served: Served, paths: Paths, batch: np.ndarray, requests: int, folder: Path) -> dict[str, Any]:
    """Where the gRPC path's time goes, against the ZeroMQ client's, on one daemon (see the module's docstring)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2
    from tritonclient.grpc._utils import _get_inference_request

    tensor = grpcclient.InferInput("input", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)

    def build() -> Any:  # what InferenceServerClient.infer does before it hands the message to grpcio
        return _get_inference_request(served.model, [tensor], "", "", None, 0, False, False, 0, None, None)

    data = build().SerializeToString()
    serialize_ms = _median_ms(lambda: build().SerializeToString(), requests)
    output = paths.zmq.infer(batch)
    reply = service_pb2.ModelInferResponse(model_name=served.model, model_version="1")
    reply.outputs.add(name="output", datatype="FP32", shape=output.shape)
    reply.raw_output_contents.append(output.tobytes())
    reply_bytes = reply.SerializeToString()
    parse_ms = _median_ms(
        lambda: grpcclient.InferResult(service_pb2.ModelInferResponse.FromString(reply_bytes)).as_numpy("output"),
        requests,
    )
    request_file = folder / "request.bin"
    request_file.write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-c", PARSE_TIMING, str(request_file), str(requests)],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    server_parse = json.loads(done.stdout)

    def stats() -> dict[str, Any]:
        entry = paths.http.get_inference_statistics(served.model)["model_stats"][0]
        return {
            key: (int(value.get("count", 0)), int(value.get("ns", 0)))
            for key, value in entry["inference_stats"].items()
        }

    # Request by request, the statistics read after each: medians of each part, as the paths' figures are.
    grpc_spent, per_request = [], []
    for _ in range(requests):
        before = stats()
        grpc_spent += paths.timed("grpc", 1)
        after = stats()
        per_request.append({key: (after[key][1] - before[key][1]) / 1e6 for key in after})
    grpc_ms = statistics.median(grpc_spent)
    zmq_ms = statistics.median(paths.timed("zmq", requests))
    names = ("success", "compute_input", "compute_output", "queue", "compute_infer")
    gateway = {key: statistics.median(entry[key] for entry in per_request) for key in names}
    hop = statistics.median(
        entry["success"] - entry["compute_input"] - entry["compute_output"] - entry["queue"] - entry["compute_infer"]
        for entry in per_request
    )
    parts = {
        "client_serialize_ms": serialize_ms,
        "client_parse_ms": parse_ms,
        "gateway_decode_ms": gateway["compute_input"],
        "gateway_upstream_hop_ms": hop,
        "gateway_encode_ms": gateway["compute_output"],
        "daemon_queue_ms": gateway["queue"],
        "daemon_compute_ms": gateway["compute_infer"],
    }
    # What the gateway's statistics do not see: both ways over TCP, grpcio's framing and its Python layers.
    parts["grpc_transport_ms"] = grpc_ms - serialize_ms - parse_ms - gateway["success"]
    return {
        "grpc_median_ms": round(grpc_ms, 3),
        "zmq_median_ms": round(zmq_ms, 3),
        **{key: round(value, 3) for key, value in parts.items()},
        "server_parse_alone": server_parse,
    }


class Timed:
    """A set of paths, each a function that sends one request and waits for its answer."""

    send: dict[str, Any]

    def timed(self, path: str, requests: int) -> list[float]:
        send, latencies = self.send[path], []
        for _ in range(requests):
            started = time.perf_counter()
            send()
            latencies.append((time.perf_counter() - started) * 1000.0)
        return latencies


class Floor(Timed):
    """The floor variant's child process and its two bare clients (a ZeroMQ DEALER and tritonclient's gRPC)."""

    variant = "floor"

    def __init__(self, folder: Path, reply_bytes: int, batch: np.ndarray) -> None:
        import tritonclient.grpc as grpcclient
        import zmq

        endpoint, port, threaded_port = f"ipc://{folder}/floor.ipc", free_port(), free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-c", FLOOR_LAUNCH, endpoint, str(port), str(reply_bytes), str(threaded_port)], cwd=REPO
        )
        self.dealer = zmq.Context.instance().socket(zmq.DEALER)
        self.dealer.connect(endpoint)
        self.grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        grpc_input = grpcclient.InferInput("input", list(batch.shape), "FP32")
        grpc_input.set_data_from_numpy(batch)
        payload = batch.tobytes()

        def zmq_round_trip() -> None:
            self.dealer.send_multipart([b"{}", payload], copy=False)
            self.dealer.recv_multipart(copy=False)

        self.threaded = grpcclient.InferenceServerClient(f"127.0.0.1:{threaded_port}")
        self.send = {
            "zmq": zmq_round_trip,
            "grpc": lambda: self.threaded.infer("floor", [grpc_input]),
            "grpc_aio": lambda: self.grpc.infer("floor", [grpc_input]),
        }
        deadline = time.monotonic() + 60
        while True:
            try:
                self.send["grpc"]()
                self.send["grpc_aio"]()
                break
            except Exception:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        self.grpc.close()
        self.threaded.close()
        self.dealer.close(linger=0)
        self.process.kill()
        self.process.wait()


class Paths(Timed):
    """The clients of one daemon, one per path, each a function that sends a batch and waits for the result."""

    def __init__(self, served: Served, batch: np.ndarray) -> None:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        from packrat_daemon.wire.client import Client

        self.zmq = Client(served.endpoint, timeout=120)
        self.grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
        self.http = httpclient.InferenceServerClient(f"127.0.0.1:{served.http_port}", network_timeout=120)
        name, shape = served.model, list(batch.shape)
        grpc_input = grpcclient.InferInput("input", shape, "FP32")
        grpc_input.set_data_from_numpy(batch)
        binary_input = httpclient.InferInput("input", shape, "FP32")
        binary_input.set_data_from_numpy(batch, binary_data=True)
        json_input = httpclient.InferInput("input", shape, "FP32")
        json_input.set_data_from_numpy(batch, binary_data=False)
        binary_output = [httpclient.InferRequestedOutput("output", binary_data=True)]
        json_output = [httpclient.InferRequestedOutput("output", binary_data=False)]
        self.send = {
            "zmq": lambda: self.zmq.infer(batch),
            "grpc": lambda: self.grpc.infer(name, [grpc_input]).as_numpy("output"),
            "http": lambda: self.http.infer(name, [binary_input], outputs=binary_output).as_numpy("output"),
            "json": lambda: self.http.infer(name, [json_input], outputs=json_output).as_numpy("output"),
        }

    def close(self) -> None:
        self.zmq.close()
        self.grpc.close()
        self.http.close()


def summary(latencies: dict[str, list[float]], rounds: list[dict[str, float]], paths: list[str]) -> dict[str, Any]:
    """Per path: median and p90 of every request, and the medians over rounds of its ratio and difference to zmq."""
    report: dict[str, Any] = {}
    for path in paths:
        values = sorted(latencies[path])
        entry: dict[str, Any] = {
            "median_ms": round(statistics.median(values), 3),
            "p90_ms": round(values[int(0.9 * (len(values) - 1))], 3),
        }
        if path != "zmq":
            entry["ratio_to_zmq"] = round(statistics.median(r[path] / r["zmq"] for r in rounds), 4)
            entry["minus_zmq_ms"] = round(statistics.median(r[path] - r["zmq"] for r in rounds), 3)
        report[path] = entry
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:resnet50")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--plan", default=None, help="a fixed plan (default: 1 instance of every core, --batch)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=10, help="per path and round")
    parser.add_argument("--warmup", type=int, default=3, help="requests per path before the rounds")
    parser.add_argument("--variants", default="process,thread")
    parser.add_argument("--paths", default="zmq,grpc,http", help="of zmq, grpc, http, json")
    parser.add_argument(
        "--floor", action=argparse.BooleanOptionalAction, default=True,
        help="also time a bare gRPC server and a bare ZeroMQ echo (no Packrat): one gRPC hop's cost here",
    )  # fmt: skip
    parser.add_argument(
        "--breakdown", action=argparse.BooleanOptionalAction, default=True,
        help="after the rounds, split the gRPC path's time on the first variant (client, transport, gateway, daemon)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    args = parser.parse_args()
    variants, paths = args.variants.split(","), args.paths.split(",")
    cores = len(os.sched_getaffinity(0))
    plan = args.plan or f"1*{cores}x{args.batch}"
    serve_args = ["--model", args.model, "--policy", "fixed", "--plan", plan, "--max-batch", str(args.batch)]
    # Pinned to one runtime and no state: this measures the transports, and every variant must serve alike.
    serve_args += ["--max-delay-ms", "0", "--no-adapt"]
    serve_args += ["--runtime", "torch", "--precision", "fp32", "--state-dir", "none"]

    from packrat_daemon.wire.client import Client

    with tempfile.TemporaryDirectory(prefix="packrat-oip-") as folder:
        daemons = [Served(variant, serve_args, Path(folder)) for variant in variants]
        clients: dict[str, Paths] = {}
        try:
            for served in daemons:
                served.wait_ready(900)
            with Client(daemons[0].endpoint, timeout=30) as probe:
                info = probe.info()
            batch = np.random.default_rng(0).standard_normal((args.batch, *info["input"]["shape"])).astype(np.float32)
            clients: dict[str, Any] = {served.variant: Paths(served, batch) for served in daemons}
            visits = {variant: paths for variant in variants}
            if args.floor:
                with Client(daemons[0].endpoint, timeout=120) as probe:
                    reply_bytes = probe.infer(batch).nbytes
                clients["floor"] = Floor(Path(folder), reply_bytes, batch)
                visits["floor"] = [path for path in ("zmq", "grpc", "grpc_aio") if path[:4] in paths or path == "zmq"]
            for variant, client in clients.items():
                for path in visits[variant]:
                    client.timed(path, args.warmup)
            everyone = list(visits)
            latencies = {variant: {path: [] for path in visits[variant]} for variant in everyone}
            per_round: dict[str, list[dict[str, float]]] = {variant: [] for variant in everyone}
            for index in range(args.rounds):
                for variant in everyone[index % len(everyone) :] + everyone[: index % len(everyone)]:
                    mine = visits[variant]
                    order = mine[index % len(mine) :] + mine[: index % len(mine)]  # rotate who goes first
                    medians = {}
                    for path in order:
                        measured = clients[variant].timed(path, args.requests)
                        latencies[variant][path] += measured
                        medians[path] = statistics.median(measured)
                    per_round[variant].append(medians)
            if args.breakdown and "grpc" in paths:
                split = breakdown(daemons[0], clients[daemons[0].variant], batch, args.requests, Path(folder))
        finally:
            for client in clients.values():
                client.close()
            for served in daemons:
                served.stop()
    report = {
        "bench": "oip",
        "model": args.model,
        "batch": args.batch,
        "plan": plan,
        "cores": cores,
        "rounds": args.rounds,
        "requests_per_round": args.requests,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "variants": {variant: summary(latencies[variant], per_round[variant], paths) for variant in variants},
    }
    if args.breakdown and "grpc" in paths:
        report["grpc_breakdown"] = {"variant": daemons[0].variant, **split}
    if args.floor:
        report["floor"] = summary(latencies["floor"], per_round["floor"], visits["floor"])
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

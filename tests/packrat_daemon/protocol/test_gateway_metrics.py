"""The gateway's own metrics (`protocol.gateway_metrics`) and its model description following the daemon, on real
sockets: a real `RestApp` under uvicorn and real gRPC servers (threaded and grpc.aio) over a `DataPlane`, in front of
a stand-in daemon (a ZeroMQ ROUTER in a thread that answers `status` and echoes each inference, or holds it, or
refuses it as a daemon shutting down). Each test reads the counters through `/metrics` before and after."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from packrat_daemon.protocol.errors import Status
from packrat_daemon.protocol.gateway_metrics import (
    DRAINING,
    GRPC_ENDPOINTS,
    REASONS,
    UNKNOWN,
    GatewayMetrics,
    rest_endpoint,
    serve_metrics,
)
from packrat_daemon.wire.codec import ErrorCode
from packrat_daemon.wire.server_replies import encode_error, encode_info, encode_result
from packrat_daemon.wire.server_side import InfoRequest, parse_request
from tests.helpers.daemons import REPO, daemon_env

pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed (pip install -e '.[test]')")
# tritonclient's messages, not Packrat's: the two cannot share a process (gateway_child), and they are the same on
# the wire (test_grpc_stubs checks every method and field number).
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402

MODEL = "tiny"  # the stand-in serves builtin:tiny, a model of 4 float32 features in and out


class StandIn:
    """A daemon's ZeroMQ frontend in a thread: `status` and `info` describe a model served by `runtime`; an infer
    request is echoed, or kept unanswered while `hold` is set (answered when it is cleared), or refused
    SHUTTING_DOWN while `shutting_down` is set."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.runtime = "torch"
        self.hold = threading.Event()
        self.shutting_down = False
        self.infers = 0
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._bound.wait(10)

    def describe(self) -> dict[str, Any]:
        return {
            "model": "builtin:tiny",
            "input": {"dtype": "float32", "shape": [4], "high": None},
            "runtime": self.runtime,
            "max_batch": 4,
            "limits": {"max_message_bytes": 1 << 20},
            "plan": {"instances": [{"threads": 1}]},
            "queue": {"accepting": True},
        }

    def _serve(self) -> None:
        router = zmq.Context.instance().socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(self.endpoint)
        self._bound.set()
        held: list[tuple[bytes, list[Any]]] = []
        try:
            while not self._stop.is_set():
                if held and not self.hold.is_set():
                    for identity, frames in held:
                        router.send_multipart([identity, *frames])
                    held.clear()
                if not router.poll(10):
                    continue
                identity, *frames = router.recv_multipart(copy=False)
                _, request = parse_request(frames, max_message_bytes=1 << 20)
                if isinstance(request, InfoRequest):
                    router.send_multipart([identity.bytes, *encode_info(request.request_id, self.describe())])
                    continue
                assert request is not None
                self.infers += 1
                if self.shutting_down:
                    reply = encode_error(request.request_id, ErrorCode.SHUTTING_DOWN, "the daemon is shutting down")
                else:
                    payload = bytes(request.payload)  # type: ignore[union-attr]
                    reply = encode_result(request.request_id, request.dtype, request.shape, payload, {})  # type: ignore[union-attr,arg-type]
                if self.hold.is_set():
                    held.append((identity.bytes, reply))
                else:
                    router.send_multipart([identity.bytes, *reply])
        finally:
            router.close(linger=0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class Gateway:
    """The gateway of `gateway_child` (REST under uvicorn, gRPC threaded or grpc.aio, the metrics port of their own),
    in a process of its own: see there why."""

    def __init__(self, endpoint: str, rest: bool, rpc: str, metrics_port: int = 0) -> None:
        command = [sys.executable, "-m", "tests.packrat_daemon.protocol.gateway_child", endpoint, str(int(rest)), rpc]
        self.process = subprocess.Popen(
            [*command, str(metrics_port)], cwd=REPO, env=daemon_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        ports = json.loads(self._line())
        self.http_port, self.grpc_port = ports["http"], ports["grpc"]

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"the gateway exited ({self.process.wait(10)})"
        return line.strip()

    def ask(self, command: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._line()

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("stop\n")
        self.process.stdin.close()
        assert self.process.wait(10) == 0


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    daemon = StandIn(f"ipc://{tmp_path_factory.mktemp('standin')}/daemon.ipc")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def gateway(stand_in: StandIn) -> Iterator[Gateway]:
    served = Gateway(stand_in.endpoint, rest=True, rpc="threads")
    yield served
    served.stop()


@pytest.fixture
def fresh(stand_in: StandIn) -> Iterator[StandIn]:
    """The stand-in as each test expects to find it, whatever the test before it did."""
    yield stand_in
    stand_in.hold.clear()
    stand_in.shutting_down = False
    stand_in.runtime = "torch"


# -- clients -----------------------------------------------------------------------------------------------
def fetch(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body=body, headers={"content-type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def infer_body(samples: int = 1, timeout_us: int | None = None) -> bytes:
    request: dict[str, Any] = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [samples, 4],
                                           "data": [0.5] * (4 * samples)}]}  # fmt: skip
    if timeout_us is not None:
        request["parameters"] = {"timeout": timeout_us}
    return json.dumps(request).encode()


def grpc_stub(port: int) -> tuple[grpc.Channel, service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def grpc_infer(stub: Any, samples: int = 1, model: str = MODEL) -> grpc.StatusCode:
    tensor = pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[samples, 4])
    request = pb.ModelInferRequest(model_name=model, inputs=[tensor])
    request.raw_input_contents.append(np.full((samples, 4), 0.5, np.float32).tobytes())
    try:
        stub.ModelInfer(request, timeout=10)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample on /metrics at `port`: (name, sorted labels) → value."""
    status, body = fetch(port, "GET", "/metrics")
    assert status == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)  # type: ignore[no-any-return]


def moved(port: int, action: Callable[[], object]) -> Callable[..., float]:
    """Run `action`; the returned function gives a sample's growth across it."""
    before = scrape(port)
    action()
    after = scrape(port)
    return lambda name, **labels: sample(after, name, **labels) - sample(before, name, **labels)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


# -- the names ---------------------------------------------------------------------------------------------
def test_every_route_and_call_has_its_endpoint_and_every_status_a_reason() -> None:
    routes = {
        "/v2": "server_metadata", "/v2/": "server_metadata", "/v2/health/live": "live", "/v2/health/ready": "ready",
        "/v2/models/stats": "statistics", "/v2/models/m": "model_metadata", "/v2/models/m/versions/1": "model_metadata",
        "/v2/models/m/ready": "model_ready", "/v2/models/m/versions/1/config": "model_config",
        "/v2/models/m/stats": "statistics", "/v2/models/m/versions/1/infer": "infer", "/metrics": "metrics",
        "/": UNKNOWN, "/v1/models": UNKNOWN, "/v2/models/m/explain": UNKNOWN, "/v2/models/m/a/b": UNKNOWN,
        "/v2/health": UNKNOWN, "/v2/models": UNKNOWN, "/wp-login.php": UNKNOWN,
    }  # fmt: skip
    assert {path: rest_endpoint(path) for path in routes} == routes
    proto = (REPO / "packrat_daemon" / "protocol" / "grpc" / "inference.proto").read_text()
    assert set(re.findall(r"^\s*rpc (\w+)\(", proto, re.M)) == set(GRPC_ENDPOINTS)
    assert set(GRPC_ENDPOINTS.values()) <= set(routes.values())  # one vocabulary for both protocols
    assert set(REASONS) == set(Status) and DRAINING not in REASONS.values()


def test_refusal_series_exist_at_zero_before_any_request() -> None:
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(GatewayMetrics().exposition().decode())
        for s in family.samples
    }
    for protocol in ("rest", "grpc"):
        for reason in {*REASONS.values(), DRAINING}:
            assert sample(samples, "packrat_gateway_refusals_total", protocol=protocol, reason=reason) == 0.0
        assert sample(samples, "packrat_gateway_in_flight_requests", protocol=protocol) == 0.0
    assert any(name == "packrat_gateway_process_resident_memory_bytes" for name, _ in samples)


# -- REST and gRPC, counted ----------------------------------------------------------------------------------
def test_rest_requests_are_counted_by_endpoint_and_status(gateway: Gateway, fresh: StandIn) -> None:
    port = gateway.http_port

    def requests() -> None:
        assert fetch(port, "GET", "/v2/health/live")[0] == 200
        assert fetch(port, "GET", f"/v2/models/{MODEL}")[0] == 200
        assert fetch(port, "POST", f"/v2/models/{MODEL}/infer", infer_body())[0] == 200
        assert fetch(port, "POST", f"/v2/models/{MODEL}/infer", b"{not json")[0] == 400
        assert fetch(port, "POST", f"/v2/models/{MODEL}/infer", infer_body(samples=5))[0] == 413  # max_batch 4
        assert fetch(port, "GET", "/v2/models/other")[0] == 404
        assert fetch(port, "GET", "/nothing/here")[0] == 404
        assert fetch(port, "POST", "/v2/health/live")[0] == 405

    growth = moved(port, requests)
    counted = "packrat_gateway_requests_total"
    assert growth(counted, protocol="rest", endpoint="live", status="200") == 1
    assert growth(counted, protocol="rest", endpoint="model_metadata", status="200") == 1
    assert growth(counted, protocol="rest", endpoint="infer", status="200") == 1
    assert growth(counted, protocol="rest", endpoint="infer", status="400") == 1
    assert growth(counted, protocol="rest", endpoint="infer", status="413") == 1
    assert growth(counted, protocol="rest", endpoint="model_metadata", status="404") == 1
    assert growth(counted, protocol="rest", endpoint=UNKNOWN, status="404") == 1
    assert growth(counted, protocol="rest", endpoint="live", status="405") == 1
    assert growth(counted, protocol="rest", endpoint="metrics", status="200") == 1  # the first scrape
    refused = "packrat_gateway_refusals_total"
    assert growth(refused, protocol="rest", reason="bad_request") == 1
    assert growth(refused, protocol="rest", reason="too_large") == 1
    assert growth(refused, protocol="rest", reason="not_found") == 2
    assert growth(refused, protocol="rest", reason="method_not_allowed") == 1
    assert growth(refused, protocol="grpc", reason="bad_request") == 0
    latency = "packrat_gateway_request_latency_seconds"
    assert growth(f"{latency}_count", protocol="rest", endpoint="infer") == 3
    assert growth(f"{latency}_sum", protocol="rest", endpoint="infer") > 0
    assert growth(f"{latency}_bucket", protocol="rest", endpoint="infer", le="60.0") == 3


def test_grpc_calls_are_counted_by_endpoint_and_code(gateway: Gateway, fresh: StandIn) -> None:
    channel, stub = grpc_stub(gateway.grpc_port)

    def calls() -> None:
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
        assert stub.ModelMetadata(pb.ModelMetadataRequest(name=MODEL), timeout=10).name == MODEL
        assert grpc_infer(stub) == grpc.StatusCode.OK
        assert grpc_infer(stub, model="other") == grpc.StatusCode.NOT_FOUND
        assert grpc_infer(stub, samples=5) == grpc.StatusCode.RESOURCE_EXHAUSTED

    try:
        growth = moved(gateway.http_port, calls)
    finally:
        channel.close()
    counted = "packrat_gateway_requests_total"
    assert growth(counted, protocol="grpc", endpoint="live", status="OK") == 1
    assert growth(counted, protocol="grpc", endpoint="model_metadata", status="OK") == 1
    assert growth(counted, protocol="grpc", endpoint="infer", status="OK") == 1
    assert growth(counted, protocol="grpc", endpoint="infer", status="NOT_FOUND") == 1
    assert growth(counted, protocol="grpc", endpoint="infer", status="RESOURCE_EXHAUSTED") == 1
    assert growth("packrat_gateway_refusals_total", protocol="grpc", reason="not_found") == 1
    assert growth("packrat_gateway_refusals_total", protocol="grpc", reason="too_large") == 1
    assert growth("packrat_gateway_request_latency_seconds_count", protocol="grpc", endpoint="infer") == 3
    assert growth(counted, protocol="rest", endpoint="infer", status="200") == 0


def test_requests_waiting_on_the_daemon_are_in_flight(gateway: Gateway, fresh: StandIn) -> None:
    port = gateway.http_port
    channel, stub = grpc_stub(gateway.grpc_port)
    fresh.hold.set()
    answers: list[object] = []
    clients = [
        threading.Thread(target=lambda: answers.append(fetch(port, "POST", f"/v2/models/{MODEL}/infer", infer_body()))),
        threading.Thread(target=lambda: answers.append(grpc_infer(stub))),
    ]
    try:
        for client in clients:
            client.start()

        def both_in_flight() -> bool:
            now = scrape(port)
            flying = "packrat_gateway_in_flight_requests"
            return sample(now, flying, protocol="rest") == 2 and sample(now, flying, protocol="grpc") == 1

        wait_for(both_in_flight, "an inference of each protocol in flight (and the scrape itself, over REST)")
    finally:
        fresh.hold.clear()
        for client in clients:
            client.join(10)
        channel.close()
    assert len(answers) == 2 and grpc.StatusCode.OK in answers
    now = scrape(port)
    assert sample(now, "packrat_gateway_in_flight_requests", protocol="rest") == 1  # this scrape
    assert sample(now, "packrat_gateway_in_flight_requests", protocol="grpc") == 0


def test_draining_and_timeouts_are_refusals_of_their_own(gateway: Gateway, fresh: StandIn) -> None:
    port = gateway.http_port
    channel, stub = grpc_stub(gateway.grpc_port)

    def refused() -> None:
        fresh.shutting_down = True  # the daemon drains: it refuses SHUTTING_DOWN
        assert fetch(port, "POST", f"/v2/models/{MODEL}/infer", infer_body())[0] == 503
        assert grpc_infer(stub) == grpc.StatusCode.UNAVAILABLE
        fresh.shutting_down = False
        assert gateway.ask("draining 1") == "ok"  # the gateway itself drains (its stop signal)
        try:
            assert fetch(port, "POST", f"/v2/models/{MODEL}/infer", infer_body())[0] == 503
        finally:
            assert gateway.ask("draining 0") == "ok"
        fresh.hold.set()  # the daemon holds the inference past its 20 ms timeout
        assert fetch(port, "POST", f"/v2/models/{MODEL}/infer", infer_body(timeout_us=20_000))[0] == 504
        fresh.hold.clear()

    try:
        growth = moved(port, refused)
    finally:
        channel.close()
    assert growth("packrat_gateway_refusals_total", protocol="rest", reason=DRAINING) == 2
    assert growth("packrat_gateway_refusals_total", protocol="grpc", reason=DRAINING) == 1
    assert growth("packrat_gateway_refusals_total", protocol="rest", reason="timeout") == 1
    assert growth("packrat_gateway_refusals_total", protocol="rest", reason="unavailable") == 0
    assert growth("packrat_gateway_requests_total", protocol="rest", endpoint="infer", status="504") == 1


# -- the model's description follows the daemon ----------------------------------------------------------------
def test_metadata_and_config_say_the_runtime_served_now(gateway: Gateway, fresh: StandIn) -> None:
    # The gateway asks the daemon at every question (READY_TTL_S 0 in gateway_child; 0.5 s apart otherwise).
    port = gateway.http_port
    channel, stub = grpc_stub(gateway.grpc_port)
    try:

        def platforms() -> tuple[str, str, str]:
            rest = json.loads(fetch(port, "GET", f"/v2/models/{MODEL}")[1])["platform"]
            config = json.loads(fetch(port, "GET", f"/v2/models/{MODEL}/config")[1])["platform"]
            rpc = stub.ModelMetadata(pb.ModelMetadataRequest(name=MODEL), timeout=10).platform
            return rest, config, rpc

        assert platforms() == ("packrat_torch",) * 3
        probes = fresh.infers
        fresh.runtime = "openvino"  # the background measurement found OpenVINO faster; the daemon switched
        assert platforms() == ("packrat_openvino",) * 3
        config = stub.ModelConfig(pb.ModelConfigRequest(name=MODEL), timeout=10).config
        assert config.platform == "packrat_openvino"
        fresh.runtime = "onnxruntime"
        assert platforms() == ("packrat_onnxruntime",) * 3
        assert fresh.infers == probes  # the same tensors: no new probe of the model's outputs for a switch
    finally:
        channel.close()


# -- the metrics port of their own (a gateway without REST) -------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_grpc_only_gateway_serves_its_metrics_on_a_port_of_their_own(fresh: StandIn) -> None:
    metrics_port = free_port()
    served = Gateway(fresh.endpoint, rest=False, rpc="aio", metrics_port=metrics_port)
    channel, stub = grpc_stub(served.grpc_port)
    try:
        growth = moved(metrics_port, lambda: (grpc_infer(stub), grpc_infer(stub, model="other")))
        assert growth("packrat_gateway_requests_total", protocol="grpc", endpoint="infer", status="OK") == 1
        assert growth("packrat_gateway_refusals_total", protocol="grpc", reason="not_found") == 1
        assert fetch(metrics_port, "GET", "/v2/health/live")[0] == 404  # this port serves the metrics alone
        refused = served.ask(f"serve-metrics {metrics_port}")  # taken: refused, never shared (no SO_REUSEPORT)
        assert re.match(rf"error .*127\.0\.0\.1:{metrics_port}.*choose another --metrics-port", refused), refused
    finally:
        channel.close()
        served.stop()
    with pytest.raises(OSError):  # stopped with the gateway: the port is closed
        fetch(metrics_port, "GET", "/metrics")


def test_no_metrics_port_is_none() -> None:
    async def none() -> object:
        return serve_metrics(GatewayMetrics(), "127.0.0.1", 0, asyncio.Event())

    assert asyncio.run(none()) is None

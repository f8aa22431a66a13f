"""The Open Inference Protocol frontend against Triton's own clients (`tritonclient`, HTTP and gRPC, sync and
asyncio), in front of a real daemon started by `packrat serve --http-port --grpc-port`.

One daemon serves the whole module, in order: its start-up (not ready until it serves), metadata and the
extensions, inference with JSON and binary tensors, every error class, and last its drain (refused).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.daemons import PINNED_ARGS, daemon_env, stop_process
from tests.packrat_daemon.protocol.oip_models import FAIL, SLOW

pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed (pip install -e '.[test]')")
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.grpc.aio as grpcclient_aio  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
import tritonclient.http.aio as httpclient_aio  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.slow

MODEL = "sentinel_mlp"  # named after the spec's factory
MAX_BATCH, MAX_QUEUE = 4, 8


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Served:
    endpoint: str
    http: str
    grpc: str
    process: subprocess.Popen[bytes]
    log: Path
    # While it started: (gateway live, ready over HTTP, ready over gRPC, the daemon answering infers over ZeroMQ).
    start_up: list[tuple[bool, bool, bool, bool]] = field(default_factory=list)


def _serving_over_zeromq(endpoint: str) -> bool:
    from packrat_daemon.wire.client import Client, ClientTimeout, ShuttingDown

    try:
        with Client(endpoint, timeout=0.3) as client:
            client.infer(np.zeros((1, 16), np.float32))
        return True
    except (ClientTimeout, ShuttingDown):
        return False


def _observe(served: Served, http: httpclient.InferenceServerClient, rpc: grpcclient.InferenceServerClient) -> None:
    try:
        live = http.is_server_live()
    except Exception:  # the gateway is not listening yet
        return
    # Readiness first, then the daemon: ready before serving would show as (ready, not serving).
    ready_http, ready_grpc = http.is_server_ready(), rpc.is_server_ready()
    served.start_up.append((live, ready_http, ready_grpc, _serving_over_zeromq(served.endpoint)))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("oip")
    profile = tmp / "profile.csv"
    profile.write_text("threads,batch,latency_ms\n1,1,0.2\n1,2,0.3\n1,4,0.4\n")
    http_port, grpc_port = free_port(), free_port()
    endpoint = f"ipc://{tmp}/front.ipc"
    args = ["--endpoint", endpoint, "--model", "tests.packrat_daemon.protocol.oip_models:sentinel_mlp"]
    args += ["--policy", "fixed", "--plan", "1*1x4", "--max-batch", str(MAX_BATCH), "--max-queue", str(MAX_QUEUE)]
    args += ["--profile", str(profile), "--http-port", str(http_port), "--grpc-port", str(grpc_port), *PINNED_ARGS]
    log = tmp / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "packrat_daemon", "serve", *args], env=daemon_env(), stdout=out, stderr=out
        )
    served = Served(endpoint, f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", process, log)
    http = httpclient.InferenceServerClient(served.http)
    rpc = grpcclient.InferenceServerClient(served.grpc)
    deadline = time.monotonic() + 180
    try:
        while not (served.start_up and all(served.start_up[-1])):
            assert process.poll() is None, f"the daemon exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"not serving in time:\n{log.read_text()}"
            _observe(served, http, rpc)
            time.sleep(0.2)
        yield served
    finally:
        http.close()
        rpc.close()
        stop_process(process, 30)


def _http_input(array: np.ndarray, binary: bool) -> httpclient.InferInput:
    tensor = httpclient.InferInput("input", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def _grpc_input(array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("input", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


def _expected(served: Served, array: np.ndarray) -> np.ndarray:
    from packrat_daemon.wire.client import Client

    with Client(served.endpoint, timeout=30) as client:
        return client.infer(array)


# -- start-up ------------------------------------------------------------------------------------------


def test_live_at_once_but_ready_only_once_the_daemon_serves(served: Served) -> None:
    assert all(live for live, *_ in served.start_up)
    assert all(zeromq for _, http, rpc, zeromq in served.start_up if http or rpc), served.start_up
    # The model takes seconds to build: the gateway was seen up and not ready before it served.
    assert any(not http and not rpc for _, http, rpc, _ in served.start_up), served.start_up


# -- metadata and the extensions ----------------------------------------------------------------------


def test_metadata_over_http_and_grpc(served: Served) -> None:
    with httpclient.InferenceServerClient(served.http) as http:
        assert http.is_model_ready(MODEL) and not http.is_model_ready("another")
        server = http.get_server_metadata()
        assert server["name"] == "packrat" and "model_configuration" in server["extensions"]
        model = http.get_model_metadata(MODEL)
        assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]
        assert model["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 4]}]
        config = http.get_model_config(MODEL)
        assert config["max_batch_size"] == MAX_BATCH and "dynamic_batching" in config
        assert config["input"][0]["dims"] == [16] and config["input"][0]["data_type"] == "TYPE_FP32"
    rpc = grpcclient.InferenceServerClient(served.grpc)
    try:
        assert rpc.is_server_live() and rpc.is_model_ready(MODEL)
        metadata = rpc.get_model_metadata(MODEL, as_json=True)
        assert metadata["outputs"] == [{"name": "output", "datatype": "FP32", "shape": ["-1", "4"]}]
        config = rpc.get_model_config(MODEL, as_json=True)["config"]
        assert config["max_batch_size"] == MAX_BATCH and config["output"][0]["name"] == "output"
        assert rpc.get_server_metadata(as_json=True)["name"] == "packrat"
    finally:
        rpc.close()


def test_statistics_count_what_was_served(served: Served) -> None:
    array = np.ones((3, 16), np.float32)
    with httpclient.InferenceServerClient(served.http) as http:
        before = http.get_inference_statistics(MODEL)["model_stats"][0]
        http.infer(MODEL, [_http_input(array, binary=True)])
        after = http.get_inference_statistics(MODEL)["model_stats"][0]
    assert after["inference_count"] == before["inference_count"] + 3
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    for duration in ("compute_infer", "compute_input", "compute_output"):
        assert after["inference_stats"][duration]["ns"] > before["inference_stats"][duration]["ns"], duration
    assert 3 in {entry["batch_size"] for entry in after["batch_stats"]}
    rpc = grpcclient.InferenceServerClient(served.grpc)
    try:
        stats = rpc.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
        assert int(stats["inference_count"]) >= after["inference_count"]
    finally:
        rpc.close()


# -- inference ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_http_infer_matches_the_zeromq_client(served: Served, binary: bool) -> None:
    array = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    expected = _expected(served, array)
    with httpclient.InferenceServerClient(served.http) as http:
        output = httpclient.InferRequestedOutput("output", binary_data=binary)
        result = http.infer(MODEL, [_http_input(array, binary)], outputs=[output], request_id="r-1")
        assert result.get_response()["id"] == "r-1"
        np.testing.assert_allclose(result.as_numpy("output"), expected, rtol=1e-6)
        compressed = http.infer(MODEL, [_http_input(array, binary)], request_compression_algorithm="gzip")
        np.testing.assert_allclose(compressed.as_numpy("output"), expected, rtol=1e-6)


def test_grpc_infer_matches_the_zeromq_client(served: Served) -> None:
    array = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    rpc = grpcclient.InferenceServerClient(served.grpc)
    try:
        result = rpc.infer(MODEL, [_grpc_input(array)], outputs=[grpcclient.InferRequestedOutput("output")])
        np.testing.assert_allclose(result.as_numpy("output"), _expected(served, array), rtol=1e-6)
        assert result.get_response().model_name == MODEL
    finally:
        rpc.close()


def test_grpc_typed_contents_are_served_and_counted_before_they_are_decoded(served: Served) -> None:
    """KServe's own clients may send `contents` instead of raw bytes (tritonclient never does): built here
    from tritonclient's generated messages, sent on its stub."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    array = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)

    def request(shape: list[int], values: list[float]) -> object:
        message = service_pb2.ModelInferRequest(model_name=MODEL)
        tensor = message.inputs.add(name="input", datatype="FP32", shape=shape)
        tensor.contents.fp32_contents.extend(values)
        return message

    with grpc.insecure_channel(served.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        reply = stub.ModelInfer(request([2, 16], array.reshape(-1).tolist()))
        got = np.frombuffer(reply.raw_output_contents[0], np.float32).reshape(list(reply.outputs[0].shape))
        np.testing.assert_allclose(got, _expected(served, array), rtol=1e-6)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request([2, 16], [0.0] * 31))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "31 values" in caught.value.details()
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request([MAX_BATCH + 1, 16], []))  # refused on its shape, before any value is read
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_grpc_bytes_that_are_no_request_are_invalid_argument(served: Served) -> None:
    """ModelInfer takes its message as bytes (protocol/grpc/wire.py): broken protobuf is INVALID_ARGUMENT,
    raw contents given twice for one input too, and the gateway goes on serving."""
    import grpc
    from tritonclient.grpc import service_pb2

    array = np.random.default_rng(4).standard_normal((1, 16)).astype(np.float32)
    good = service_pb2.ModelInferRequest(model_name=MODEL)
    good.inputs.add(name="input", datatype="FP32", shape=[1, 16])
    good.raw_input_contents.append(array.tobytes())
    with grpc.insecure_channel(served.grpc) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for broken in (b"\x3a\xff\xff\xff\x0f", b"\x0a\x05ab", good.SerializeToString()[:-3]):
            with pytest.raises(grpc.RpcError) as caught:
                infer(broken)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
        twice = good.SerializeToString() + service_pb2.ModelInferRequest(raw_input_contents=[b"x"]).SerializeToString()
        with pytest.raises(grpc.RpcError) as caught:
            infer(twice)
        assert (
            caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "2 raw_input_contents" in caught.value.details()
        )
        reply = service_pb2.ModelInferResponse.FromString(infer(good.SerializeToString()))
        got = np.frombuffer(reply.raw_output_contents[0], np.float32).reshape(list(reply.outputs[0].shape))
        np.testing.assert_allclose(got, _expected(served, array), rtol=1e-6)


def test_asyncio_clients_with_requests_in_flight_together(served: Served) -> None:
    arrays = [np.full((1, 16), i / 10, np.float32) for i in range(MAX_QUEUE)]  # at most a full queue at once
    expected = [_expected(served, array) for array in arrays]

    async def run() -> list[np.ndarray]:
        http = httpclient_aio.InferenceServerClient(served.http)
        rpc = grpcclient_aio.InferenceServerClient(served.grpc)
        try:
            assert await http.is_server_ready() and await rpc.is_server_ready()
            calls = []
            for i, array in enumerate(arrays):
                if i % 2:
                    tensor = httpclient_aio.InferInput("input", list(array.shape), "FP32")
                    tensor.set_data_from_numpy(array, binary_data=i % 4 == 1)
                    calls.append(http.infer(MODEL, [tensor]))
                else:
                    tensor = grpcclient_aio.InferInput("input", list(array.shape), "FP32")
                    tensor.set_data_from_numpy(array)
                    calls.append(rpc.infer(MODEL, [tensor]))
            return [result.as_numpy("output") for result in await asyncio.gather(*calls)]
        finally:
            await http.close()
            await rpc.close()

    for got, want in zip(asyncio.run(run()), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


# -- every error class --------------------------------------------------------------------------------


def _wait_for_queue(served: Served, in_flight: bool, inputs: int) -> None:
    """Until the daemon's `status` shows a batch in flight (or not) and this many inputs queued behind it."""
    from packrat_daemon.wire.client import Client

    deadline = time.monotonic() + 30
    with Client(served.endpoint, timeout=5) as client:
        while True:
            queue = client.status()["queue"]
            if queue["batch_in_flight"] == in_flight and queue["inputs"] == inputs:
                return
            assert time.monotonic() < deadline, f"the queue never showed {inputs} input(s) waiting: {queue}"
            time.sleep(0.02)


def _http_error(served: Served, array: np.ndarray, model: str = MODEL, **kwargs: object) -> tuple[str, str]:
    with httpclient.InferenceServerClient(served.http) as http, pytest.raises(InferenceServerException) as caught:
        http.infer(model, [_http_input(array, binary=True)], **kwargs)
    return str(caught.value.status()), caught.value.message()


def _grpc_error(served: Served, array: np.ndarray, model: str = MODEL, **kwargs: object) -> tuple[str, str]:
    rpc = grpcclient.InferenceServerClient(served.grpc)
    try:
        with pytest.raises(InferenceServerException) as caught:
            rpc.infer(model, [_grpc_input(array)], **kwargs)
    finally:
        rpc.close()
    return str(caught.value.status()), caught.value.message()


def test_bad_input_is_invalid_argument(served: Served) -> None:
    wrong = np.zeros((2, 15), np.float32)
    status, message = _http_error(served, wrong)
    assert status == "400" and "[N, 16]" in message
    status, message = _grpc_error(served, wrong)
    assert status == "StatusCode.INVALID_ARGUMENT" and "[N, 16]" in message


def test_an_unknown_model_is_not_found(served: Served) -> None:
    assert _http_error(served, np.zeros((1, 16), np.float32), model="resnet")[0] == "404"
    assert _grpc_error(served, np.zeros((1, 16), np.float32), model="resnet")[0] == "StatusCode.NOT_FOUND"


def test_too_many_samples_is_too_large(served: Served) -> None:
    many = np.zeros((MAX_BATCH + 1, 16), np.float32)
    status, message = _http_error(served, many)
    assert status == "413" and "send fewer" in message
    assert _grpc_error(served, many)[0] == "StatusCode.RESOURCE_EXHAUSTED"


def test_a_body_over_the_limit_is_refused_before_it_is_read(served: Served) -> None:
    import http.client

    connection = http.client.HTTPConnection(*served.http.split(":"), timeout=10)
    # Announce a body of 1 GiB and send none of it: the answer must come from the Content-Length alone.
    connection.putrequest("POST", f"/v2/models/{MODEL}/infer")
    connection.putheader("Content-Length", str(1 << 30))
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413 and b"at most" in response.read()
    connection.close()


def test_a_model_failure_is_internal(served: Served) -> None:
    failing = np.full((1, 16), FAIL, np.float32)
    status, message = _http_error(served, failing)
    assert status == "500" and "failed" in message
    assert _grpc_error(served, failing)[0] == "StatusCode.INTERNAL"


def test_a_timeout_passed_is_deadline_exceeded(served: Served) -> None:
    slow = np.full((1, 16), SLOW, np.float32)
    assert _http_error(served, slow, timeout=200_000)[0] == "504"  # microseconds, Triton's request parameter
    assert _grpc_error(served, slow, timeout=200_000)[0] == "StatusCode.DEADLINE_EXCEEDED"


def test_a_full_queue_is_overloaded(served: Served) -> None:
    """One slow batch in flight, the queue's MAX_QUEUE inputs waiting behind it: the next is refused."""
    _expected(served, np.zeros((1, 16), np.float32))  # queued behind the slow work of tests before: now idle
    slow = np.full((1, 16), SLOW, np.float32)
    in_flight = threading.Thread(target=_expected, args=(served, slow))
    in_flight.start()
    _wait_for_queue(served, in_flight=True, inputs=0)
    full = np.zeros((MAX_BATCH, 16), np.float32)
    waiting = [threading.Thread(target=_expected, args=(served, full)) for _ in range(MAX_QUEUE // MAX_BATCH)]
    for thread in waiting:
        thread.start()
    _wait_for_queue(served, in_flight=True, inputs=MAX_QUEUE)
    try:
        status, message = _http_error(served, np.zeros((1, 16), np.float32))
        assert status == "429" and "queue is full" in message
        assert _grpc_error(served, np.zeros((1, 16), np.float32))[0] == "StatusCode.UNAVAILABLE"
    finally:
        for thread in [in_flight, *waiting]:
            thread.join()


# -- the drain: last, it stops the daemon -------------------------------------------------------------


def test_refused_and_not_ready_while_draining(served: Served) -> None:
    _expected(served, np.zeros((1, 16), np.float32))  # the worker is idle: nothing but these two below to drain
    slow = np.full((1, 16), SLOW, np.float32)
    # Two slow batches, one after the other: the drain finishes both, about two seconds.
    work = [threading.Thread(target=_expected, args=(served, slow)) for _ in range(2)]
    for queued, thread in enumerate(work):
        thread.start()
        _wait_for_queue(served, in_flight=True, inputs=queued)
    served.process.send_signal(signal.SIGTERM)
    try:
        with httpclient.InferenceServerClient(served.http) as http:
            deadline = time.monotonic() + 1.5
            while http.is_server_ready():
                assert time.monotonic() < deadline, "still ready while draining"
                time.sleep(0.05)
            status, message = _http_error(served, np.zeros((1, 16), np.float32))
            assert status == "503" and "shutting down" in message
        assert _grpc_error(served, np.zeros((1, 16), np.float32))[0] == "StatusCode.UNAVAILABLE"
    finally:
        for thread in work:
            thread.join()
    assert served.process.wait(30) == 0, served.log.read_text()

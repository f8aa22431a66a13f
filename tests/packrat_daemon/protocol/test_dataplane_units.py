"""The transport-free parts of the Open Inference Protocol frontend: datatypes and tensors, the error table,
REST request parsing, names and endpoints, and the refusal of a public bind without TLS."""

from __future__ import annotations

import gzip
import json
import math
import zlib

import numpy as np
import pytest

from packrat_daemon.protocol import tensors
from packrat_daemon.protocol.errors import FROM_PACKRAT, OipError, Status
from packrat_daemon.protocol.gateway import GatewayOptions
from packrat_daemon.protocol.launch import connect_endpoint
from packrat_daemon.protocol.model import default_model_name
from packrat_daemon.protocol.rest import parse_infer_request, split_body
from packrat_daemon.wire.codec import DTYPES, ErrorCode
from packrat_daemon.wire.errors import ConfigError


def test_every_packrat_error_code_has_a_distinct_http_status_and_a_grpc_code() -> None:
    assert set(FROM_PACKRAT) == set(ErrorCode)
    statuses = [FROM_PACKRAT[code].http for code in ErrorCode]
    assert len(set(statuses)) == len(statuses), "an HTTP client can tell every Packrat code apart"
    assert all(FROM_PACKRAT[code].grpc.isupper() for code in ErrorCode)
    assert OipError.from_packrat("A_NEW_CODE", "from a newer daemon").status is Status.INTERNAL


def test_every_packrat_dtype_has_an_oip_datatype_and_back() -> None:
    assert set(tensors.OIP_DATATYPE) == set(DTYPES)
    assert all(tensors.PACKRAT_DTYPE[tensors.OIP_DATATYPE[name]] == name for name in DTYPES)


@pytest.mark.parametrize("datatype", sorted(tensors.PACKRAT_DTYPE))
def test_json_values_and_raw_bytes_give_the_same_tensor(datatype: str) -> None:
    values = [[True, False, True], [False, True, True]] if datatype == "BOOL" else [[1, 2, 3], [4, 5, 6]]
    from_json = tensors.from_values(values, datatype, (2, 3), "x")
    raw = from_json.tobytes()
    assert np.array_equal(tensors.from_bytes(raw, datatype, (2, 3), "x"), from_json)
    if datatype == "BF16":
        assert tensors.to_values(from_json, datatype) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # bits shown as floats
    else:
        assert tensors.to_values(from_json, datatype) == np.asarray(values).reshape(-1).tolist()


def test_bf16_rounds_to_nearest_even_and_keeps_nan() -> None:
    values = np.array([1.0, 1.00390625, 1.01171875, -2.5, math.nan], np.float32)
    bits = tensors.float_to_bf16_bits(values)
    back = tensors.bf16_bits_to_float(bits)
    assert back[:4].tolist() == [1.0, 1.0, 1.015625, -2.5] and math.isnan(back[4])


@pytest.mark.parametrize(
    ("values", "datatype", "shape", "words"),
    [
        ([1.5, 2], "INT32", (2,), "non-integer"),
        (["1", "2"], "FP32", (2,), "strings"),
        ([1, 2, 3], "FP32", (2,), "has 3 elements"),
        ([[1, 2], [3]], "FP32", (3,), "ragged"),
        ([300], "INT8", (1,), "out of the range"),
        ([True], "FP32", (1,), "booleans"),
    ],
)
def test_json_values_that_do_not_fit_are_refused(values: object, datatype: str, shape: tuple, words: str) -> None:
    with pytest.raises(OipError, match=words) as caught:
        tensors.from_values(values, datatype, shape, "x")
    assert caught.value.status is Status.INVALID_ARGUMENT


def test_raw_bytes_of_the_wrong_size_and_unserved_datatypes_are_refused() -> None:
    with pytest.raises(OipError, match="12 bytes of data"):
        tensors.from_bytes(b"\0" * 12, "FP32", (2, 2), "x")
    with pytest.raises(OipError, match="not served"):
        tensors.check_datatype("BYTES", "x")
    with pytest.raises(OipError, match="unknown datatype"):
        tensors.check_datatype("FLOAT", "x")
    with pytest.raises(OipError, match="positive integers"):
        tensors.check_shape([2, 0], "x")


def _request(body: dict, binary: bytes = b"") -> tuple:
    header = json.dumps(body).encode()
    request, rest = split_body(header + binary, str(len(header)).encode() if binary else None)
    return parse_infer_request(request, rest)


def test_a_binary_request_takes_its_tensor_from_after_the_json_header() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}]}
    body["outputs"] = [{"name": "output", "parameters": {"binary_data": True}}]
    inputs, outputs, binary_outputs, timeout = _request(body, array.tobytes())
    assert np.array_equal(inputs[0].array, array) and outputs == ["output"] and binary_outputs == {"output"}
    assert timeout is None


def test_request_parameters_binary_output_and_timeout() -> None:
    body = {"inputs": [{"name": "input", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]}]}
    body["parameters"] = {"binary_data_output": True, "timeout": 250_000}
    _, outputs, binary_outputs, timeout = _request(body)
    assert outputs is None and binary_outputs is True and timeout == 0.25


@pytest.mark.parametrize(
    ("body", "words", "status"),
    [
        ({"inputs": []}, "needs 'inputs'", Status.INVALID_ARGUMENT),
        ({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1]}]}, "neither", Status.INVALID_ARGUMENT),
        ({"inputs": [{"name": "i", "datatype": "FP32", "shape": [1], "data": [1]}], "parameters": {"timeout": 0}},
         "positive integer", Status.INVALID_ARGUMENT),
        ({"inputs": [{"name": "i", "datatype": "FP32", "shape": [1], "data": [1]}],
          "parameters": {"classification": 3}}, "classification", Status.UNIMPLEMENTED),
        ({"inputs": [{"name": "i", "datatype": "FP32", "shape": [1], "parameters": {"shared_memory_region": "r"}}]},
         "shared-memory", Status.UNIMPLEMENTED),
    ],
)  # fmt: skip
def test_malformed_requests_say_what_is_wrong(body: dict, words: str, status: Status) -> None:
    with pytest.raises(OipError, match=words) as caught:
        _request(body)
    assert caught.value.status is status


def test_binary_data_must_add_up() -> None:
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}]}
    with pytest.raises(OipError, match="not claimed"):
        _request(body, b"\0" * 8)
    with pytest.raises(OipError, match="runs past"):
        _request(body, b"\0" * 2)
    with pytest.raises(OipError, match="Inference-Header-Content-Length"):
        split_body(b"{}", b"99")


def test_model_names_and_the_endpoint_a_gateway_connects_to() -> None:
    assert default_model_name("builtin:resnet50") == "resnet50"
    assert default_model_name("/mnt/models/model.pt2") == "model"
    assert default_model_name("tests.model_factories:slow_mlp") == "slow_mlp"
    assert connect_endpoint("tcp://0.0.0.0:5555") == "tcp://127.0.0.1:5555"
    assert connect_endpoint("tcp://*:5555") == "tcp://127.0.0.1:5555"
    assert connect_endpoint("tcp://[::]:5555") == "tcp://[::1]:5555"
    assert connect_endpoint("ipc:///run/packrat/front.ipc") == "ipc:///run/packrat/front.ipc"


def test_a_public_bind_needs_tls_or_consent() -> None:
    with pytest.raises(ConfigError, match="TLS certificate"):
        GatewayOptions("ipc:///x", http_port=8000, address="0.0.0.0").check()
    GatewayOptions("ipc:///x", http_port=8000, address="0.0.0.0", insecure_public=True).check()
    GatewayOptions("ipc:///x", http_port=8000, address="0.0.0.0", tls_cert="c.pem", tls_key="k.pem").check()
    GatewayOptions("ipc:///x", grpc_port=8001, address="::1").check()
    with pytest.raises(ConfigError, match="both a certificate"):
        GatewayOptions("ipc:///x", http_port=8000, tls_cert="c.pem").check()
    with pytest.raises(ConfigError, match="serve nothing"):
        GatewayOptions("ipc:///x").check()


def _receive(chunks: list[bytes]):  # type: ignore[no-untyped-def]
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict:
        return messages.pop(0)

    return receive


@pytest.mark.parametrize(
    ("chunks", "headers", "outcome"),
    [
        ([b"abc", b"def"], {b"content-length": b"6"}, b"abcdef"),
        ([b"abcdef"], {b"content-length": b"6"}, b"abcdef"),
        ([b"abc", b"defg"], {b"content-length": b"6"}, "longer than its Content-Length"),
        ([b"abc", b""], {b"content-length": b"6"}, "but its Content-Length says 6"),
        ([b"abc", b"def"], {}, b"abcdef"),
        ([b"a" * 600, b"a" * 600], {}, "over 1000 bytes"),
        ([b"a" * 2000], {b"content-length": b"2000"}, "takes at most 1000"),
        ([zlib.compress(b"x" * 5000)], {b"content-encoding": b"deflate"}, "over 1000 bytes"),
        ([gzip.compress(b"x" * 500)], {b"content-encoding": b"gzip"}, b"x" * 500),
        ([b""], {b"content-encoding": b"br"}, "not supported"),
    ],
)
def test_a_body_is_read_within_its_limit(chunks: list[bytes], headers: dict, outcome: bytes | str) -> None:
    import asyncio

    from packrat_daemon.protocol.rest import read_body

    if isinstance(outcome, bytes):
        assert bytes(asyncio.run(read_body(_receive(chunks), headers, 1000))) == outcome
    else:
        with pytest.raises(OipError, match=outcome):
            asyncio.run(read_body(_receive(chunks), headers, 1000))


def test_a_request_id_must_be_a_string() -> None:
    from packrat_daemon.protocol.model import ModelSpec, TensorSpec
    from packrat_daemon.protocol.rest import _decode

    spec = ModelSpec("m", "builtin:m", "torch", (TensorSpec("input", "FP32", (2,)),),
                     (TensorSpec("output", "FP32", (1,)),), max_batch=4, max_message_bytes=1 << 16,
                     instances=1)  # fmt: skip
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}
    assert _decode(json.dumps({"id": "r1", "inputs": [tensor]}).encode(), None, spec)[0] == "r1"
    with pytest.raises(OipError, match="'id' must be a string"):
        _decode(json.dumps({"id": {"a": 1}, "inputs": [tensor]}).encode(), None, spec)
    with pytest.raises(OipError, match="has 5 samples") as caught:  # checked against the model before decoding
        _decode(json.dumps({"inputs": [{**tensor, "shape": [5, 2], "data": "never read"}]}).encode(), None, spec)
    assert caught.value.status is Status.TOO_LARGE


def test_the_model_configuration_says_the_batching_delay_the_daemon_says_now() -> None:
    """`max_delay_ms` is live: the gateway follows the daemon's `status` for it, never a value from its launch."""
    import asyncio

    from packrat_daemon.protocol.dataplane import DataPlane
    from packrat_daemon.protocol.model import ModelSpec, TensorSpec

    status = {"ok": True, "queue": {"accepting": True}, "model": "builtin:m", "runtime": "torch", "max_batch": 4,
              "input": {"dtype": "float32", "shape": [2]}, "plan": {"instances": [{}]},
              "max_delay_ms": 1.0}  # fmt: skip

    class Daemon:
        async def describe(self, kind: str, timeout_s: float) -> dict:
            assert kind == "status"
            return dict(status)

    plane = DataPlane(Daemon())  # type: ignore[arg-type]
    plane.spec = ModelSpec("m", "builtin:m", "torch", (TensorSpec("input", "FP32", (2,)),),
                           (TensorSpec("output", "FP32", (1,)),), max_batch=4, max_message_bytes=1 << 16,
                           instances=1)  # fmt: skip

    def delay_us() -> object:
        plane._checked = -math.inf  # the readiness answer's window has passed
        return asyncio.run(plane.model_config("m"))["dynamic_batching"].get("max_queue_delay_microseconds")

    assert delay_us() == 1000
    status["max_delay_ms"] = 7.25  # a reload
    assert delay_us() == 7250
    del status["max_delay_ms"]  # an older daemon that does not say it: the last value stays
    assert delay_us() == 7250


def test_a_free_axis_is_minus_one_in_the_metadata_and_takes_any_length_up_to_its_longest() -> None:
    from packrat_daemon.protocol.errors import OipError
    from packrat_daemon.protocol.model import ModelSpec, TensorSpec, check_tensor

    ids = TensorSpec("input_ids", "INT64", (-1,), max_length=128)
    spec = ModelSpec("bert", "hf:bert", "torch", (ids,), (TensorSpec("output", "FP32", (-1, 8)),), max_batch=4,
                     max_message_bytes=1 << 16, instances=1)  # fmt: skip
    assert ids.to_json()["shape"] == [-1, -1] and ids.longest() == (128,)
    for length in (1, 77, 128):
        check_tensor(spec, "input_ids", "INT64", (2, length))
    with pytest.raises(OipError, match=r"takes \[N, -1\] \(N samples; -1: any length up to 128\)"):
        check_tensor(spec, "input_ids", "INT64", (2, 129))

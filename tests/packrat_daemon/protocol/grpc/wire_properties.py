"""Properties of `packrat_daemon.protocol.grpc.wire` against the generated protobuf classes, run as a script
(`python -m tests.packrat_daemon.protocol.grpc.wire_properties`) by test_wire.py: Packrat's stubs register the
`inference.*` messages in protobuf's default pool, as tritonclient's do, so they stay out of pytest's process.

The hand parser must agree with protobuf wherever it accepts a message (less the top-level fields the message
does not define, which it skips), refuse whatever protobuf refuses, and raise nothing but
OipError(INVALID_ARGUMENT), on valid requests, on valid requests damaged, and on any bytes; and a message of
more top-level fields than a request has is refused at once, without an object per field.
"""

from __future__ import annotations

import sys
import tracemalloc

import numpy as np
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packrat_daemon.protocol.errors import OipError, Status
from packrat_daemon.protocol.grpc import inference_pb2 as pb
from packrat_daemon.protocol.grpc.wire import (
    MAX_FIELDS,
    MAX_FIELDS_IN_ALL,
    MAX_PARAMETERS,
    encode_infer_response,
    split_infer_request,
)
from packrat_daemon.wire.codec import MAX_TENSORS

EXAMPLES = 400
texts = st.text(max_size=12)
parameter_values = st.one_of(
    st.builds(lambda v: pb.InferParameter(bool_param=v), st.booleans()),
    st.builds(lambda v: pb.InferParameter(int64_param=v), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda v: pb.InferParameter(string_param=v), texts),
    st.builds(lambda v: pb.InferParameter(double_param=v), st.floats(allow_nan=False)),
    st.builds(lambda v: pb.InferParameter(uint64_param=v), st.integers(0, 2**64 - 1)),
)
parameters = st.dictionaries(texts, parameter_values, max_size=3)
shapes = st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4)


@st.composite
def requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=draw(texts), model_version=draw(texts), id=draw(texts))
    for key, value in draw(parameters).items():
        request.parameters[key].CopyFrom(value)
    for _ in range(draw(st.integers(0, 3))):
        tensor = request.inputs.add(name=draw(texts), datatype=draw(texts), shape=draw(shapes))
        for key, value in draw(parameters).items():
            tensor.parameters[key].CopyFrom(value)
        if draw(st.booleans()):
            tensor.contents.fp32_contents.extend(draw(st.lists(st.floats(width=32, allow_nan=False), max_size=5)))
            tensor.contents.int64_contents.extend(draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5)))
    for name in draw(st.lists(texts, max_size=2)):
        request.outputs.add(name=name)
    request.raw_input_contents.extend(draw(st.lists(st.binary(max_size=300), max_size=3)))
    return request


def _fields(request: pb.ModelInferRequest) -> list[bytes]:
    """The request's top-level fields (each repeated element and map entry alone), serialized one by one."""
    fields = [
        pb.ModelInferRequest(**{name: getattr(request, name)}).SerializeToString()
        for name in ("model_name", "model_version", "id")
    ]
    fields += [
        pb.ModelInferRequest(parameters={key: value}).SerializeToString() for key, value in request.parameters.items()
    ]
    fields += [pb.ModelInferRequest(inputs=[tensor]).SerializeToString() for tensor in request.inputs]
    fields += [pb.ModelInferRequest(outputs=[tensor]).SerializeToString() for tensor in request.outputs]
    fields += [pb.ModelInferRequest(raw_input_contents=[raw]).SerializeToString() for raw in request.raw_input_contents]
    return [field for field in fields if field]


def outcome(data: bytes) -> tuple[pb.ModelInferRequest | None, pb.ModelInferRequest | None]:
    """(protobuf's parse, the hand parser's with its raw contents put back); None for a refusal."""
    try:
        expected: pb.ModelInferRequest | None = pb.ModelInferRequest.FromString(data)
    except DecodeError:
        expected = None
    try:
        request, raw = split_infer_request(data)
    except OipError as exc:
        assert exc.status is Status.INVALID_ARGUMENT, exc.status
        if expected is not None:  # stricter only for a group (proto2's), which no OIP message has, and a bomb
            assert any(words in exc.message for words in ("wire type 3", "top-level fields", "fields in all")), (
                f"the hand parser refused a message protobuf takes: {exc.message}"
            )
        return expected, None
    assert all(isinstance(view, memoryview) and view.obj is data for view in raw)  # views of the bytes received
    request.raw_input_contents.extend(bytes(view) for view in raw)
    return expected, request


def agrees(data: bytes) -> None:
    expected, got = outcome(data)  # a refusal of what protobuf takes fails in there
    if got is not None:
        assert expected is not None, "the hand parser took a message protobuf refuses"
        # Equal once the unknown fields protobuf kept, and the hand parser skipped (top-level ones), are dropped
        # from both (`==` compares them too).
        got.DiscardUnknownFields()
        expected.DiscardUnknownFields()
        assert got == expected and got.SerializeToString() == expected.SerializeToString()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def valid_requests_agree(request: pb.ModelInferRequest) -> None:
    data = request.SerializeToString()
    expected, got = outcome(data)
    assert got is not None and got == expected == request
    _, raw = split_infer_request(data)
    assert [bytes(view) for view in raw] == list(request.raw_input_contents)


@settings(max_examples=EXAMPLES // 4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def fields_in_any_order_agree(data: st.DataObject) -> None:
    request = data.draw(requests())
    shuffled = b"".join(data.draw(st.permutations(_fields(request))))
    expected, got = outcome(shuffled)
    assert got is not None and got == expected


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.data())
def damaged_requests_agree_or_are_refused(request: pb.ModelInferRequest, data: st.DataObject) -> None:
    raw = bytearray(request.SerializeToString())
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        where = data.draw(st.integers(0, len(raw)))
        if action == "flip" and where < len(raw):
            raw[where] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "cut":
            del raw[where:]
        elif action == "insert":
            raw[where:where] = data.draw(st.binary(min_size=1, max_size=11))
        elif where < len(raw):
            del raw[where]
    agrees(bytes(raw))


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.binary(max_size=200))
def any_bytes_agree_or_are_refused(data: bytes) -> None:
    agrees(data)


def bounds() -> None:
    """What a hostile length or varint cannot do: make the parser read past the message or loop."""
    for data in (
        b"\x3a\xff\xff\xff\xff\x0f",  # raw contents of 4 GiB in a message of 6 bytes
        b"\x3a" + b"\xff" * 11,  # a varint past 10 bytes
        b"\x0a\x05ab",  # a string cut short
        b"\x09\x00\x00",  # a fixed64 cut short
        b"\x00\x00",  # field number 0
        b"\x0b\x0c",  # a group
        b"\x0a\x02\xff\xfe",  # model_name not UTF-8: protobuf's own check
    ):
        try:
            split_infer_request(data)
        except OipError as exc:
            assert exc.status is Status.INVALID_ARGUMENT
        else:
            raise AssertionError(f"{data!r} was taken")


def _length_delimited(field: int, payload: bytes) -> bytes:
    return (
        pb.ModelInferRequest(raw_input_contents=[payload])
        .SerializeToString()
        .replace(b"\x3a", bytes([field << 3 | 2]), 1)
    )


def field_bombs() -> None:
    """A message of millions of 2-byte fields inside the message limit (unknown ones, one known field repeated,
    or inside a tensor) is refused at its (MAX_FIELDS + 1)th top-level field or its (MAX_FIELDS_IN_ALL + 1)th
    field in all: no turn, and no object, per field beyond, and nothing handed to protobuf's parser."""
    named = pb.ModelInferRequest(model_name="m", id="x").SerializeToString()
    many = 8 << 20  # 16 MiB of 2-byte fields
    some = 1 << 20  # 2 MiB of them: far past either bound, and quicker to build
    bombs = {
        "unknown": (b"\x40\x00" * many, "top-level fields"),  # field 8, varint 0
        "after a request": (named + b"\x40\x00" * many, "top-level fields"),
        "a known field repeated": (b"\x1a\x00" * many, "top-level fields"),  # `id`, empty: protobuf keeps the last
        # One input tensor of empty parameter entries: upb makes a map entry of each (1.3 GB for 64 MiB).
        "map entries in a tensor": (_length_delimited(5, b"\x22\x00" * some), "fields in all"),
        "bytes_contents in a tensor": (_length_delimited(5, _length_delimited(5, b"\x42\x00" * some)), "fields in all"),
        "unknown fields in a tensor": (_length_delimited(5, b"\x40\x00" * some), "fields in all"),
        "a shape unpacked": (_length_delimited(5, b"\x18\x01" * some), "fields in all"),
        "parameter values": (_length_delimited(4, _length_delimited(2, b"\x08\x01" * some)), "fields in all"),
    }
    for what, (data, which) in bombs.items():
        tracemalloc.start()
        try:
            split_infer_request(data)
        except OipError as exc:
            bound = MAX_FIELDS if which == "top-level fields" else MAX_FIELDS_IN_ALL
            assert exc.status is Status.INVALID_ARGUMENT and f"more than {bound} {which}" in exc.message, exc.message
        else:
            raise AssertionError(f"{what}: a message of 8 Mi fields was taken")
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert peak < 256 << 10, f"{what}: {peak} bytes allocated to refuse it"
    # The bound itself: MAX_FIELDS fields parse (unknown ones skipped), one more does not.
    fields = [b"\x1a\x01x"] * (MAX_FIELDS - 1) + [b"\x40\x07"]
    request, raw = split_infer_request(b"".join(fields))
    assert request.id == "x" and not raw and request.SerializeToString() == b"\x1a\x01x"
    try:
        split_infer_request(b"".join([*fields, b"\x40\x07"]))
    except OipError as exc:
        assert "top-level fields" in exc.message
    else:
        raise AssertionError(f"{MAX_FIELDS + 1} fields were taken")


def the_largest_real_requests_parse() -> None:
    """A request at every bound a real one could reach (every parameter, every tensor, each with parameters,
    its shape sent unpacked, typed contents of every type) is taken, as protobuf takes it."""
    value = pb.InferParameter(string_param="v")
    request = pb.ModelInferRequest(model_name="m", model_version="1", id="x")
    for index in range(MAX_PARAMETERS):
        request.parameters[f"p{index}"].CopyFrom(value)
    tensors = []
    for index in range(MAX_TENSORS):
        tensor = pb.ModelInferRequest.InferInputTensor(name=f"i{index}", datatype="FP32")
        for key in range(8):
            tensor.parameters[f"q{key}"].CopyFrom(value)
        contents = tensor.contents
        contents.bool_contents.append(True)
        contents.int_contents.append(1)
        contents.int64_contents.append(1)
        contents.uint_contents.append(1)
        contents.uint64_contents.append(1)
        contents.fp32_contents.append(1.0)
        contents.fp64_contents.append(1.0)
        # The shape unpacked, each dimension a field of its own, as a proto2-minded writer may send it.
        unpacked = b"".join(bytes([0x18, dim]) for dim in range(1, 9))
        tensors.append(_length_delimited(5, unpacked + tensor.SerializeToString()))
        output = request.outputs.add(name=f"o{index}")
        for key in range(4):
            output.parameters[f"r{key}"].CopyFrom(value)
    data = request.SerializeToString() + b"".join(tensors)
    agrees(data)
    parsed, _ = split_infer_request(data)
    assert len(parsed.inputs) == MAX_TENSORS and list(parsed.inputs[0].shape) == list(range(1, 9))


@settings(max_examples=EXAMPLES // 2, deadline=None)
@given(
    texts,
    texts,
    st.lists(
        st.tuples(
            texts,
            st.sampled_from(["FP32", "FP16", "INT64", "BOOL", "UINT8"]),
            st.lists(st.integers(1, 5), min_size=1, max_size=3),
        ),
        max_size=3,
    ),
)
def responses_parse_back(name: str, request_id: str, outputs: list[tuple[str, str, list[int]]]) -> None:
    dtypes = {"FP32": np.float32, "FP16": np.float16, "INT64": np.int64, "BOOL": np.bool_, "UINT8": np.uint8}
    rng = np.random.default_rng(len(outputs))
    arrays = [(n, d, (rng.standard_normal(s) * 100).astype(dtypes[d])) for n, d, s in outputs]
    arrays = [(n, d, a.T if a.ndim > 1 else a) for n, d, a in arrays]  # not C-contiguous: encoded row-major
    parsed = pb.ModelInferResponse.FromString(encode_infer_response(name, "1", request_id, arrays))
    assert (parsed.model_name, parsed.model_version, parsed.id) == (name, "1", request_id)
    assert [(o.name, o.datatype, list(o.shape)) for o in parsed.outputs] == [
        (n, d, list(a.shape)) for n, d, a in arrays
    ]
    assert list(parsed.raw_output_contents) == [np.ascontiguousarray(a).tobytes() for _, _, a in arrays]


CHECKS = (
    valid_requests_agree,
    fields_in_any_order_agree,
    damaged_requests_agree_or_are_refused,
    any_bytes_agree_or_are_refused,
    bounds,
    field_bombs,
    the_largest_real_requests_parse,
    responses_parse_back,
)

if __name__ == "__main__":
    for check in CHECKS:
        check()
        print(f"ok {check.__name__}")
    sys.exit(0)

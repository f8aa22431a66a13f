"""ModelInferRequest and ModelInferResponse on the wire, with their tensor bytes left where they lie.

protobuf's parser copies every `raw_input_contents` entry into its own memory, and reading the field copies
it once more into a `bytes`; its serializer copies `raw_output_contents` the same way. For a batch of
images that is megabytes copied for nothing. So `ModelInfer` is served bytes in, bytes out:

- `split_infer_request` walks only the request's top level (tags and lengths, bounded by the message's
  own length) and takes each `raw_input_contents` (field 7) as a memoryview of the received bytes. Every
  other field, in order, is parsed by the generated `ModelInferRequest`: protobuf concatenation means those
  fields alone parse to exactly what the whole message would, less field 7. So names, shapes, parameters
  and typed contents are still checked by protobuf itself, and the hand parser has only framing to get right.
- `encode_infer_response` serializes the small part (names, shapes, id) with the generated class and
  appends each output's bytes as field 6, copied once, into the one `bytes` gRPC sends.

Malformed framing is `OipError(INVALID_ARGUMENT)`, as protobuf's own `DecodeError` is, never another exception.
Groups (wire types 3 and 4, proto2 only) are refused: no OIP message has one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from google.protobuf.message import DecodeError

from packrat_daemon.protocol.errors import OipError, Status
from packrat_daemon.protocol.grpc import inference_pb2 as pb

RAW_INPUT_FIELD = 7  # ModelInferRequest.raw_input_contents
RAW_OUTPUT_TAG = b"\x32"  # ModelInferResponse.raw_output_contents: field 6, length-delimited
_MAX_VARINT_BYTES = 10  # a 64-bit value
_MAX_FIELD_NUMBER = (1 << 29) - 1


def _malformed(what: str) -> OipError:
    return OipError(Status.INVALID_ARGUMENT, f"the ModelInferRequest is not valid protobuf: {what}")


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it."""
    value = shift = 0
    for index in range(pos, min(pos + _MAX_VARINT_BYTES, end)):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, index + 1
        shift += 7
    raise _malformed("a varint is truncated or longer than 10 bytes")


def split_infer_request(data: bytes) -> tuple[pb.ModelInferRequest, list[memoryview]]:
    """The request without its raw contents, and its `raw_input_contents` as views of `data`, in order."""
    view = memoryview(data)
    raw: list[memoryview] = []
    rest: list[memoryview] = []  # every other field, tag included, in the order it came
    pos, end = 0, len(data)
    while pos < end:  # each turn moves past one field, at least one byte: bounded by the message's length
        start = pos
        key, pos = _varint(data, pos, end)
        field, wire_type = key >> 3, key & 7
        if not 1 <= field <= _MAX_FIELD_NUMBER:
            raise _malformed(f"field number {field}")
        if wire_type == 0:
            _, pos = _varint(data, pos, end)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            length, pos = _varint(data, pos, end)
            if length > end - pos:
                raise _malformed(f"field {field} says {length} bytes, {end - pos} are left")
            if field == RAW_INPUT_FIELD:
                raw.append(view[pos : pos + length])
                pos += length
                continue
            pos += length
        else:
            raise _malformed(f"wire type {wire_type} (field {field})")
        if pos > end:
            raise _malformed(f"field {field} is truncated")
        rest.append(view[start:pos])
    try:
        request = pb.ModelInferRequest.FromString(b"".join(rest))
    except DecodeError as exc:
        raise _malformed(str(exc) or "protobuf refused it") from None
    return request, raw


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_infer_response(
    model_name: str, model_version: str, request_id: str, outputs: Sequence[tuple[str, str, np.ndarray]]
) -> bytes:
    """A serialized ModelInferResponse: each output (name, datatype, array) described in `outputs` and its
    bytes (row-major, as the array's dtype holds them) in `raw_output_contents`, in the same order."""
    head = pb.ModelInferResponse(model_name=model_name, model_version=model_version, id=request_id)
    parts: list[bytes | memoryview] = [b""]
    for name, datatype, array in outputs:
        head.outputs.add(name=name, datatype=datatype, shape=array.shape)
        flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        parts += [RAW_OUTPUT_TAG, _varint_bytes(flat.nbytes), flat.data]
    parts[0] = head.SerializeToString()
    return b"".join(parts)

"""ModelInferRequest and ModelInferResponse on the wire, with their tensor bytes left where they lie.

protobuf's parser copies every `raw_input_contents` entry into its own memory, and reading the field copies
it once more into a `bytes`; its serializer copies `raw_output_contents` the same way. For a batch of
images that is megabytes copied for nothing. So `ModelInfer` is served bytes in, bytes out:

- `split_infer_request` walks only the request's top level (tags and lengths, bounded by the message's
  own length) and takes each `raw_input_contents` (field 7) as a memoryview of the received bytes. Every
  other field of the message (1 to 6), in order, is parsed by the generated `ModelInferRequest`: protobuf
  concatenation means those fields alone parse to exactly what the whole message would, less field 7. So
  names, shapes, parameters and typed contents are still checked by protobuf itself, and the hand parser has
  only framing to get right. A top-level field the message does not define (8 and up: a newer protocol's,
  or padding) has its framing checked and is skipped, not kept: Packrat reads none.
- The walk is Python, one turn per top-level field, so the number of fields is bounded (`MAX_FIELDS`),
  not only the message's bytes: a message of millions of 2-byte fields inside the 64 MiB message limit
  would otherwise cost a turn (and an object) each, seconds of CPU and gigabytes. No real request comes
  near the bound: it has a name, a version and an id, a parameter map (at most `MAX_PARAMETERS` entries,
  each a field of its own), and at most `MAX_TENSORS` inputs, outputs asked for and raw contents (the
  daemon's own bound on a request's tensors). A message over it is refused at its `MAX_FIELDS + 1`th field,
  before the rest is looked at.
- The messages inside (a tensor, its typed contents, a parameter map's entries and values) are walked the
  same way, framing only, and all fields together are bounded too (`MAX_FIELDS_IN_ALL`): protobuf's C parser
  (upb) makes a structure of tens of bytes for each element of a map or of an unpacked repeated field, so a
  64 MiB message of 2-byte map entries inside one tensor took 4 s and 1.3 GB to parse. Packed repeated
  numbers (a tensor's shape, typed contents) are one field each, whatever their count: upb parses them in C,
  at most 8 bytes of memory per byte received (an int64 sent as a 1-byte varint). Typed contents therefore
  come packed, as every proto3 serializer writes them; `bytes_contents` (BYTES, which Packrat does not
  serve) has a field per element and is bounded like the rest.
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
from packrat_daemon.wire.codec import MAX_TENSORS

RAW_INPUT_FIELD = 7  # ModelInferRequest.raw_input_contents
LAST_KNOWN_FIELD = 7  # ModelInferRequest's fields are 1 to 7; a higher number is skipped, not kept
# A request's `parameters` entries: Triton's clients send a handful (priority, timeout, binary_data_output,
# sequence ids); the protocol sets no number, so this is a generous one.
MAX_PARAMETERS = 128
# Top-level fields in a real request: model_name, model_version, id; the parameter entries; and inputs,
# outputs and raw_input_contents, at most MAX_TENSORS each (the module's docstring says why there is a bound).
MAX_FIELDS = 3 + MAX_PARAMETERS + 3 * MAX_TENSORS
# Fields at every depth: a real request has at most a few thousand (each parameter is an entry of 2 fields and a
# value of 1; each tensor a name, a datatype, a shape, its parameters, its contents of a field per type).
MAX_FIELDS_IN_ALL = 16384
# The messages inside a ModelInferRequest, and which of their fields hold a message walked in turn.
_REQUEST, _INPUT, _OUTPUT, _ENTRY, _PARAMETER, _CONTENTS = range(6)
_INNER: tuple[dict[int, int], ...] = (
    {4: _ENTRY, 5: _INPUT, 6: _OUTPUT},  # ModelInferRequest: parameters, inputs, outputs
    {4: _ENTRY, 5: _CONTENTS},  # InferInputTensor: parameters, contents
    {2: _ENTRY},  # InferRequestedOutputTensor: parameters
    {2: _PARAMETER},  # a parameter map's entry: key (1), value (2)
    {},  # InferParameter
    {},  # InferTensorContents
)
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
    rest: list[memoryview] = []  # fields 1 to 6, tag included, in the order they came
    fields = [0]  # fields seen at every depth
    pos, end, top = 0, len(data), 0
    while pos < end:  # each turn moves past one field, at least one byte: bounded by the message's length
        top += 1
        if top > MAX_FIELDS:  # before anything of it is read: the walk costs at most MAX_FIELDS turns
            raise OipError(
                Status.INVALID_ARGUMENT,
                f"the ModelInferRequest has more than {MAX_FIELDS} top-level fields (name, version, id, at most "
                f"{MAX_PARAMETERS} parameters, at most {MAX_TENSORS} inputs, outputs and raw contents each); "
                "no request needs more",
            )
        start = pos
        field, pos, inner = _field(data, pos, end, fields)
        if field == RAW_INPUT_FIELD and inner is not None:
            raw.append(view[inner:pos])
            continue
        if inner is not None and field in _INNER[_REQUEST]:
            _walk(data, inner, pos, _INNER[_REQUEST][field], fields)
        if field <= LAST_KNOWN_FIELD:
            rest.append(view[start:pos])
    try:
        request = pb.ModelInferRequest.FromString(b"".join(rest))
    except DecodeError as exc:
        raise _malformed(str(exc) or "protobuf refused it") from None
    return request, raw


def _walk(data: bytes, pos: int, end: int, kind: int, fields: list[int]) -> None:
    """Check the framing of the message of `kind` in data[pos:end], and of the messages inside it, counting
    their fields in `fields`."""
    inner_kinds = _INNER[kind]
    while pos < end:
        field, pos, inner = _field(data, pos, end, fields)
        if inner is not None and field in inner_kinds:
            _walk(data, inner, pos, inner_kinds[field], fields)


def _field(data: bytes, pos: int, end: int, fields: list[int]) -> tuple[int, int, int | None]:
    """(field number, the position after the field, where its bytes start if it is length-delimited, else None)
    of the field at `pos`, counted in `fields`."""
    fields[0] += 1
    if fields[0] > MAX_FIELDS_IN_ALL:
        raise OipError(
            Status.INVALID_ARGUMENT,
            f"the ModelInferRequest has more than {MAX_FIELDS_IN_ALL} fields in all (inside its tensors and "
            "parameters included); no request needs more: send typed contents packed, or as raw contents",
        )
    key, pos = _varint(data, pos, end)
    field, wire_type = key >> 3, key & 7
    if not 1 <= field <= _MAX_FIELD_NUMBER:
        raise _malformed(f"field number {field}")
    inner = None
    if wire_type == 0:
        _, pos = _varint(data, pos, end)
    elif wire_type == 1:
        pos += 8
    elif wire_type == 5:
        pos += 4
    elif wire_type == 2:
        length, inner = _varint(data, pos, end)
        if length > end - inner:
            raise _malformed(f"field {field} says {length} bytes, {end - inner} are left")
        pos = inner + length
    else:
        raise _malformed(f"wire type {wire_type} (field {field})")
    if pos > end:
        raise _malformed(f"field {field} is truncated")
    return field, pos, inner


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

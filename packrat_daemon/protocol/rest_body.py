"""A REST request's body, read as its bytes arrive: bounded in size, in time and in the memory all bodies take.

- No allocation before the bytes: a body is kept as the parts it came in (small ones gathered into parts of
  `PART_BYTES`) and joined once at its end, so a client that announces megabytes and sends ten bytes holds ten
  bytes, and a large body is copied once (twice the parts that came small), or not at all when it came whole.
- Size: refused (TOO_LARGE) from its Content-Length before any of it is read, or as soon as a chunked or
  compressed body grows past the limit (decoded).
- Time: each part must come within `body_idle_timeout_s` of the one before, and the whole body within
  `body_timeout_s`; else `RequestTimeout` (408), so a client that stops sending gives its connection back.
- Memory of all bodies together: `Bodies` counts the bytes held by bodies being received; one that would take
  the total past `bodies_in_flight_mb` is refused OVERLOADED (429, retry) unless it is the only one.
- A body that is not the gzip or deflate it says it is: INVALID_ARGUMENT with zlib's one-line reason.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from packrat_daemon.protocol.errors import OipError, Status
from packrat_daemon.protocol.limits import GatewayLimits

Receive = Callable[[], Awaitable[dict[str, Any]]]

DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# Parts smaller than this are gathered into one of this size: a body sent a byte at a time is not kept as
# millions of objects of 33 bytes each.
PART_BYTES = 64 << 10
_DEFAULT_LIMITS = GatewayLimits()


class RequestTimeout(Exception):
    """A body that stopped coming: answered 408, and the connection closed (RFC 9110, 15.5.9)."""


class Bodies:
    """The bytes held by the request bodies being received, all connections together."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.reading = 0  # bodies being received now

    def take(self, size: int) -> None:
        """Hold `size` more bytes for a body being received; OVERLOADED past the limit, unless it is the only one."""
        if self.held + size > self.limit and self.reading > 1:
            raise OipError(
                Status.OVERLOADED,
                f"the gateway is receiving {self.held >> 20} MiB of request bodies, its limit "
                f"(bodies_in_flight_mb {self.limit >> 20}); retry shortly",
            )
        self.held += size


class _Reader:
    """One body's parts, each within its deadline, and held in `bodies` as they come."""

    def __init__(self, receive: Receive, limits: GatewayLimits, bodies: Bodies) -> None:
        self.receive = receive
        self.limits = limits
        self.bodies = bodies
        self.taken = 0
        self.end = asyncio.get_running_loop().time() + limits.body_timeout_s
        self.parts: list[bytes | bytearray] = []
        self.small = bytearray()  # small parts gathered, until PART_BYTES
        self.filled = 0

    async def chunk(self) -> tuple[bytes, bool]:
        idle_until = asyncio.get_running_loop().time() + self.limits.body_idle_timeout_s
        until = min(idle_until, self.end)
        try:
            async with asyncio.timeout_at(until):
                message = await self.receive()
        except TimeoutError:
            if until == self.end:
                raise RequestTimeout(
                    f"the request body took longer than {self.limits.body_timeout_s:g} s; send it faster, or less"
                ) from None
            raise RequestTimeout(
                f"no part of the request body came for {self.limits.body_idle_timeout_s:g} s"
            ) from None
        if message["type"] == "http.disconnect":
            raise OipError(Status.INVALID_ARGUMENT, "the client disconnected before sending the whole body")
        return message.get("body", b""), message.get("more_body", False)

    def add(self, data: bytes) -> None:
        """Keep `data` (the caller checked the size), counted in `bodies`."""
        self.bodies.take(len(data))
        self.taken += len(data)
        self.filled += len(data)
        if len(data) >= PART_BYTES and not self.small:
            self.parts.append(data)  # kept as it came: no copy
            return
        self.small += data
        if len(self.small) >= PART_BYTES:
            self.parts.append(self.small)
            self.small = bytearray()

    def body(self) -> bytes | bytearray:
        parts = [*self.parts, self.small] if self.small else self.parts
        if len(parts) == 1:
            return parts[0]
        body = b"".join(parts)  # the one copy; the parts are let go as this returns
        self.parts, self.small = [], bytearray()
        return body


async def read_body(
    receive: Receive,
    headers: dict[bytes, bytes],
    limit: int,
    limits: GatewayLimits = _DEFAULT_LIMITS,
    bodies: Bodies | None = None,
) -> bytes | bytearray:
    """The request body, refused (TOO_LARGE) as soon as it is known to exceed `limit` bytes (decoded)."""
    length = headers.get(b"content-length")
    encoding = headers.get(b"content-encoding", b"identity").decode("latin-1").strip().lower()
    if encoding not in ("identity", *DECODERS):
        raise OipError(Status.INVALID_ARGUMENT, f"Content-Encoding {encoding!r} is not supported; use gzip or deflate")
    size = None if length is None else int(length)
    if size is not None and size > limit:
        raise OipError(Status.TOO_LARGE, f"the request body is {size} bytes; this server takes at most {limit}")
    bodies = bodies if bodies is not None else Bodies(limits.bodies_in_flight_mb << 20)
    reader = _Reader(receive, limits, bodies)
    bodies.reading += 1
    try:
        if encoding == "identity" and size is not None:
            return await _read_exactly(reader, size)
        return await _read_decoded(reader, encoding, limit)
    finally:
        bodies.reading -= 1
        bodies.held -= reader.taken


async def _read_exactly(reader: _Reader, size: int) -> bytes | bytearray:
    """A body of a known size, or the one chunk itself when it came whole."""
    chunk, more = await reader.chunk()
    if not more and len(chunk) == size:
        return chunk
    while True:
        if reader.filled + len(chunk) > size:
            raise OipError(Status.INVALID_ARGUMENT, f"the body is longer than its Content-Length ({size})")
        reader.add(chunk)
        if not more:
            break
        chunk, more = await reader.chunk()
    if reader.filled != size:
        raise OipError(
            Status.INVALID_ARGUMENT, f"the body is {reader.filled} bytes, but its Content-Length says {size}"
        )
    return reader.body()


async def _read_decoded(reader: _Reader, encoding: str, limit: int) -> bytes | bytearray:
    """A chunked or compressed body, decoded as it comes, refused as soon as it grows past `limit`."""
    decoder = zlib.decompressobj(DECODERS[encoding]) if encoding in DECODERS else None
    more = True
    while more:
        chunk, more = await reader.chunk()
        if decoder is not None:
            try:  # at most one byte past the limit decoded: a small bomb cannot make a large buffer
                chunk = decoder.decompress(chunk, limit + 1 - reader.filled)
            except zlib.error as exc:  # the client's error, said in one line (zlib's reason), never a traceback
                raise OipError(Status.INVALID_ARGUMENT, f"the request body is not valid {encoding}: {exc}") from None
        if reader.filled + len(chunk) > limit:
            raise OipError(Status.TOO_LARGE, f"the request body is over {limit} bytes (decoded); send fewer samples")
        reader.add(chunk)
    if decoder is not None and not decoder.eof:
        raise OipError(Status.INVALID_ARGUMENT, f"the request body is not valid {encoding}: it ends before its end")
    return reader.body()

"""A REST request's body, read as its bytes arrive: bounded in size, in time and in the memory all bodies take.

- No allocation before the bytes: a buffer grows with what has come (doubling, never past the Content-Length),
  so a client that announces megabytes and sends ten bytes holds ten bytes; a large body is copied about once
  in all by the doubling and ends in a buffer of its exact size (or is the one chunk it came in).
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
    """One body's parts, each within its deadline, its buffer's growth held in `bodies`."""

    def __init__(self, receive: Receive, limits: GatewayLimits, bodies: Bodies) -> None:
        self.receive = receive
        self.limits = limits
        self.bodies = bodies
        self.taken = 0
        self.end = asyncio.get_running_loop().time() + limits.body_timeout_s
        self.buffer = bytearray()
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

    def add(self, data: bytes, cap: int) -> None:
        """Append `data`, the buffer doubled as needed but never past `cap` bytes (the caller checked the size)."""
        end = self.filled + len(data)
        if end > len(self.buffer):
            size = min(max(end, 2 * len(self.buffer)), cap)
            self.bodies.take(size - len(self.buffer))
            self.taken += size - len(self.buffer)
            grown = bytearray(size)  # zeroed pages the kernel maps only as they are written
            grown[: self.filled] = memoryview(self.buffer)[: self.filled]
            self.buffer = grown
        self.buffer[self.filled : end] = data
        self.filled = end

    def body(self) -> bytearray:
        del self.buffer[self.filled :]  # a shrink in place, not a copy
        return self.buffer


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
        reader.add(chunk, size)
        if not more:
            break
        chunk, more = await reader.chunk()
    if reader.filled != size:
        raise OipError(
            Status.INVALID_ARGUMENT, f"the body is {reader.filled} bytes, but its Content-Length says {size}"
        )
    return reader.body()


async def _read_decoded(reader: _Reader, encoding: str, limit: int) -> bytearray:
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
        reader.add(chunk, limit)
    if decoder is not None and not decoder.eof:
        raise OipError(Status.INVALID_ARGUMENT, f"the request body is not valid {encoding}: it ends before its end")
    return reader.body()

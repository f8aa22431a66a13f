"""Typed errors, and the codes an error reply carries. Each message says what was wrong and what to do about it.

The bottom of the wire: it imports nothing of Packrat.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

# What a request is identified by on the wire (docs/protocol.md; `codec.check_request_id` says which are valid).
RequestId = str | int


class ErrorCode(StrEnum):
    """The code an error reply carries; a client raises the `ServerError` subclass for it."""

    BAD_REQUEST = "BAD_REQUEST"
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
    TOO_LARGE = "TOO_LARGE"
    OVERLOADED = "OVERLOADED"
    TIMEOUT = "TIMEOUT"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    INTERNAL = "INTERNAL"
    CANCELLED = "CANCELLED"  # the client cancelled the request (op "cancel") before it started computing


class PackratError(Exception):
    """Base class of every error Packrat raises on purpose."""


class ProfileError(PackratError):
    """A profile file or table is malformed or cannot answer the question asked of it."""


class InfeasibleError(PackratError):
    """No plan can serve the batch with the given cores and profile."""

    def __init__(self, message: str, largest_servable_batch: int) -> None:
        super().__init__(message)
        self.largest_servable_batch = largest_servable_batch


class TopologyError(PackratError):
    """The CPU topology or cgroup limits could not be read or leave no usable core."""


class ModelSpecError(PackratError):
    """A model spec string does not name a loadable model."""


class PolicyError(PackratError):
    """A policy name is unknown or its arguments are invalid."""


class ConfigError(PackratError):
    """A command-line option or configuration value is invalid."""


class WorkerBootError(PackratError):
    """A worker failed before it was ready (pinning, threads, warm-up).

    A worker raises it for its template to report; the daemon raises it once several have failed in a
    row, and stops rather than re-fork a model that cannot start.
    """


# -- what a client raises: the server's error replies by code, and the client's own failures -----------


class ServerError(PackratError):
    """The server answered with an error reply; ``code`` says which (an ErrorCode, or the raw string
    for a code this client does not know)."""

    def __init__(self, code: ErrorCode | str, message: str, request_id: RequestId | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id


class BadRequest(ServerError):
    """The request was malformed or does not fit the model; fix it before sending it again."""


class UnsupportedVersion(ServerError):
    """The server does not speak this protocol version; ``versions`` lists the ones it does."""

    def __init__(
        self,
        code: ErrorCode | str,
        message: str,
        request_id: RequestId | None = None,
        versions: Sequence[int] = (),
    ) -> None:
        super().__init__(code, message, request_id)
        self.versions = tuple(versions)


class TooLarge(ServerError):
    """The message is over the server's size limit; send fewer samples per request."""


class Overloaded(ServerError):
    """The server's queue is full; retry later, preferably with back-off."""


class ServerTimeout(ServerError):
    """The server could not start the work within the request's timeout."""


class ShuttingDown(ServerError):
    """The server is draining; send the request to another server or retry after it restarts."""


class InternalError(ServerError):
    """The server failed while serving the request."""


class Cancelled(ServerError):
    """The request was cancelled by its own client (op "cancel") before it started computing."""


class ClientTimeout(PackratError, TimeoutError):
    """No reply came within the client's timeout; the endpoint is skipped for a short back-off."""


class ClientClosed(PackratError):
    """The client was closed while the request was waiting for its reply."""


class BadEndpoint(PackratError, ValueError):
    """A client endpoint that ZeroMQ cannot connect to (a typo, an unknown transport or host)."""

"""What an Open Inference Protocol frontend answers when a request fails: one `Status` per kind of failure,
each with its HTTP status and gRPC code, and the `Status` of every Packrat error code (docs/oip.md, "Errors").

gRPC codes are named, not imported, so that the data plane stays free of either transport.
"""

from __future__ import annotations

from enum import Enum

from packrat_daemon.wire.codec import ErrorCode


class Status(Enum):
    """A failure's kind: (HTTP status, gRPC status code name)."""

    INVALID_ARGUMENT = (400, "INVALID_ARGUMENT")  # fix the request; unchanged it fails again
    NOT_FOUND = (404, "NOT_FOUND")  # no such model, version or route
    # Too many samples or bytes: the same gRPC code as gRPC's own message-size limit, which refuses the largest.
    TOO_LARGE = (413, "RESOURCE_EXHAUSTED")
    # The daemon's queue is full: 429 tells HTTP clients to back off; UNAVAILABLE is gRPC's code to retry.
    OVERLOADED = (429, "UNAVAILABLE")
    UNAVAILABLE = (503, "UNAVAILABLE")  # not serving yet, draining, or the daemon cannot be reached
    DEADLINE_EXCEEDED = (504, "DEADLINE_EXCEEDED")
    INTERNAL = (500, "INTERNAL")
    # The gateway and the daemon speak no common Packrat protocol version: a deployment mismatch.
    BAD_GATEWAY = (502, "INTERNAL")
    UNIMPLEMENTED = (501, "UNIMPLEMENTED")  # a part of the protocol Packrat does not serve (docs/oip.md)
    METHOD_NOT_ALLOWED = (405, "UNIMPLEMENTED")  # REST only: a route asked with the wrong HTTP method
    # The client went away (a gRPC call cancelled, an HTTP connection closed) while its request waited: nobody reads
    # the answer. 499 is nginx's "client closed request".
    CANCELLED = (499, "CANCELLED")

    @property
    def http(self) -> int:
        return self.value[0]

    @property
    def grpc(self) -> str:
        return self.value[1]


# Every Packrat error code (docs/protocol.md, section 5) and what the OIP frontends answer for it.
FROM_PACKRAT: dict[ErrorCode, Status] = {
    ErrorCode.BAD_REQUEST: Status.INVALID_ARGUMENT,
    ErrorCode.UNSUPPORTED_VERSION: Status.BAD_GATEWAY,
    ErrorCode.TOO_LARGE: Status.TOO_LARGE,
    ErrorCode.OVERLOADED: Status.OVERLOADED,
    ErrorCode.TIMEOUT: Status.DEADLINE_EXCEEDED,
    ErrorCode.SHUTTING_DOWN: Status.UNAVAILABLE,
    ErrorCode.INTERNAL: Status.INTERNAL,
    ErrorCode.CANCELLED: Status.CANCELLED,
}


class OipError(Exception):
    """A request the frontend answers with an error: `status` says which, `message` what to do."""

    def __init__(self, status: Status, message: str, packrat_code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.packrat_code = packrat_code  # the daemon's own code, when the daemon refused the request

    @classmethod
    def from_packrat(cls, code: str, message: str) -> OipError:
        """The error for a daemon's error reply; a code this gateway does not know is INTERNAL."""
        try:
            status = FROM_PACKRAT[ErrorCode(code)]
        except ValueError:
            status = Status.INTERNAL
        return cls(status, message, code)

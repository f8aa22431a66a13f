"""The typed errors: what each carries, how it reads, and the families a caller can catch them by."""

from __future__ import annotations

import pytest

from packrat_daemon.wire import errors
from packrat_daemon.wire.codec import ErrorCode, ProtocolError

SERVER_ERRORS = [
    errors.BadRequest,
    errors.UnsupportedVersion,
    errors.TooLarge,
    errors.Overloaded,
    errors.ServerTimeout,
    errors.ShuttingDown,
    errors.InternalError,
]


@pytest.mark.parametrize("cls", SERVER_ERRORS)
def test_a_server_error_keeps_its_code_message_and_request_id(cls: type[errors.ServerError]) -> None:
    error = cls(ErrorCode.OVERLOADED, "queue is full", "r7")
    assert str(error) == "OVERLOADED: queue is full"
    assert (error.code, error.message, error.request_id) == (ErrorCode.OVERLOADED, "queue is full", "r7")
    assert isinstance(error, errors.ServerError) and isinstance(error, errors.PackratError)


def test_a_code_this_client_does_not_know_is_kept_as_sent() -> None:
    error = errors.ServerError("NEWER_CODE", "from a newer server")
    assert str(error) == "NEWER_CODE: from a newer server" and error.request_id is None


def test_unsupported_version_lists_the_servers_versions() -> None:
    error = errors.UnsupportedVersion(ErrorCode.UNSUPPORTED_VERSION, "speaks [1]", 3, versions=[1, 2])
    assert error.versions == (1, 2) and error.request_id == 3
    assert errors.UnsupportedVersion(ErrorCode.UNSUPPORTED_VERSION, "speaks [1]").versions == ()


def test_the_clients_own_failures_are_also_the_standard_exceptions_callers_expect() -> None:
    with pytest.raises(TimeoutError):
        raise errors.ClientTimeout("no reply within 5 s")
    with pytest.raises(ValueError):
        raise errors.BadEndpoint("tcp://nowhere:port")
    assert not issubclass(errors.ClientClosed, errors.ServerError)


def test_every_error_raised_on_purpose_is_a_packrat_error() -> None:
    raised_on_purpose = [
        errors.ProfileError,
        errors.InfeasibleError,
        errors.TopologyError,
        errors.ModelSpecError,
        errors.PolicyError,
        errors.ConfigError,
        errors.WorkerBootError,
        errors.ServerError,
        errors.ClientTimeout,
        errors.ClientClosed,
        errors.BadEndpoint,
        ProtocolError,
    ]
    assert all(issubclass(cls, errors.PackratError) for cls in raised_on_purpose)
    # None of the families is another's: a caller catching ConfigError does not swallow a worker's failure.
    families = raised_on_purpose[:7]
    assert not any(issubclass(a, b) for a in families for b in families if a is not b)

"""Every error the client raises derives from :class:`RespcoordError` and
keeps its cause (``__cause__``). gRPC status codes become error classes in
one place: :func:`error_from_status`."""

from __future__ import annotations

import re

import grpc


class RespcoordError(Exception):
    """The root of every error this package raises."""

    code: grpc.StatusCode | None
    """The gRPC status code, when the error came from (or stands for) one."""

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class InvalidArgument(RespcoordError):
    """Bad input, refused locally or by the server (INVALID_ARGUMENT).
    ``field`` is the wire name of the field at fault."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}", code=grpc.StatusCode.INVALID_ARGUMENT)
        self.field = field
        self.reason = reason


class ConfigError(RespcoordError):
    """Bad connection settings (target, TLS files, token); ``field`` names
    the option."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


class NotFound(RespcoordError):
    """NOT_FOUND: the session does not exist."""


class SessionTerminated(RespcoordError):
    """FAILED_PRECONDITION: the session is terminated; nothing starts on it
    after teardown."""


class PermissionDenied(RespcoordError):
    """PERMISSION_DENIED: a known caller outside its token's scope."""


class Unauthenticated(RespcoordError):
    """UNAUTHENTICATED: no token, or an unknown one."""


class Unavailable(RespcoordError):
    """UNAVAILABLE (after the retries ran out): the coordinator could not be
    reached."""


class DeadlineExceeded(RespcoordError):
    """DEADLINE_EXCEEDED (after the retries ran out)."""


class ResourceExhausted(RespcoordError):
    """RESOURCE_EXHAUSTED: a server limit (sessions, watchers, in-flight
    calls)."""


class OutOfRange(RespcoordError):
    """OUT_OF_RANGE: a watch position the coordinator no longer retains."""


class Aborted(RespcoordError):
    """ABORTED: the backend's compare-and-set lost a race too often."""


class Cancelled(RespcoordError):
    """CANCELLED by the server or the transport (a caller's own cancellation
    is :class:`asyncio.CancelledError`, as everywhere in asyncio)."""


class Internal(RespcoordError):
    """Any other code (UNKNOWN, INTERNAL, UNIMPLEMENTED, DATA_LOSS, ...):
    ``code`` says which."""


class AlreadyFinished(RespcoordError):
    """Local: ``finish()`` was called a second time on the same response."""


class ClientClosed(RespcoordError):
    """Local: the client was closed."""


_BY_CODE: dict[grpc.StatusCode, type[RespcoordError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: SessionTerminated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.CANCELLED: Cancelled,
}

# The server words INVALID_ARGUMENT as "<field>: <reason>" (CONTRACT.md).
_FIELD = re.compile(r"^([a-z_][a-z0-9_.]*): (.*)$", re.DOTALL)


def error_from_status(code: grpc.StatusCode, details: str) -> RespcoordError:
    """The one mapping from a gRPC status to an error class."""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        match = _FIELD.match(details)
        if match is None:
            return InvalidArgument("request", details)
        return InvalidArgument(match.group(1), match.group(2))
    error_class = _BY_CODE.get(code, Internal)
    return error_class(f"{code.name}: {details}", code=code)


def error_from_rpc(error: grpc.aio.AioRpcError) -> RespcoordError:
    """A failed call as a :class:`RespcoordError`, its cause kept."""
    mapped = error_from_status(error.code(), error.details() or "")
    mapped.__cause__ = error
    return mapped

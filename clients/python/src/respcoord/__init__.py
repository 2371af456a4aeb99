"""respcoord: the asyncio client of the respcoord response coordinator.

Per session at most one live response, exactly one terminal per started
response, nothing after teardown, and every stop made by any gateway reaches
this process's fences through the watch of that response's session (one
Watch stream per session where this client has a live response, has opened
the watch ahead, or is within the watch linger after its last response). See
docs/python.md.
"""

from respcoord._client import (
    DEFAULT_WATCH_LINGER,
    MAX_REQUEST_ID_BYTES,
    MAX_SESSION_ID_BYTES,
    Client,
    Completed,
    Failed,
    Fence,
    Response,
    ResponseContext,
    RunOutcome,
    Session,
    Stopped,
    TlsOptions,
    new_request_id,
    validate_session_id,
)
from respcoord._enums import Finished, Phase, SessionState, Source, StopReason, Terminal
from respcoord._errors import (
    Aborted,
    AlreadyFinished,
    Cancelled,
    ClientClosed,
    ConfigError,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    RespcoordError,
    SessionTerminated,
    Unauthenticated,
    Unavailable,
    error_from_status,
)
from respcoord._retry import RetryPolicy
from respcoord._watch import STREAMS_PER_CONNECTION, WatchStatus

__all__ = [
    "DEFAULT_WATCH_LINGER",
    "MAX_REQUEST_ID_BYTES",
    "MAX_SESSION_ID_BYTES",
    "STREAMS_PER_CONNECTION",
    "Aborted",
    "AlreadyFinished",
    "Cancelled",
    "Client",
    "ClientClosed",
    "Completed",
    "ConfigError",
    "DeadlineExceeded",
    "Failed",
    "Fence",
    "Finished",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "Phase",
    "ResourceExhausted",
    "RespcoordError",
    "Response",
    "ResponseContext",
    "RetryPolicy",
    "RunOutcome",
    "Session",
    "SessionState",
    "SessionTerminated",
    "Source",
    "StopReason",
    "Stopped",
    "Terminal",
    "TlsOptions",
    "Unauthenticated",
    "Unavailable",
    "WatchStatus",
    "error_from_status",
    "new_request_id",
    "validate_session_id",
]

__version__ = "0.1.0"

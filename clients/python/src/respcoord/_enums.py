"""The public enums and the session snapshot, and the one place they map to
and from the wire's numbers."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from respcoord.v1 import coordinator_pb2 as pb


class Source(enum.StrEnum):
    """Which gateway path asked. Recorded for observability only: it never
    changes a transition."""

    CLIENT = "client"
    VAD = "vad"


class Terminal(enum.StrEnum):
    """The terminal a gateway reports for its own response."""

    COMPLETED = "completed"
    FAILED = "failed"


class Phase(enum.StrEnum):
    """A session's phase (machine M3). ``TERMINATED`` is absorbing."""

    IDLE = "idle"
    ACTIVE = "active"
    TERMINATED = "terminated"


class StopReason(enum.StrEnum):
    """Why a response stopped being current."""

    SUPERSEDED = "superseded"
    """A newer Start on the session replaced it (from any gateway)."""
    CANCELLED = "cancelled"
    """A Cancel call cancelled it."""
    SHUTDOWN = "shutdown"
    """The session was shut down."""
    EXPIRED = "expired"
    """The session expired (no call for the idle TTL)."""
    ENDED = "ended"
    """A Finish for this id sent by someone else (another holder of the id,
    an operator)."""
    GONE = "gone"
    """The coordinator no longer has it live and the watch could not see how
    it ended: found by a state read (GetState) after the session's watch
    broke, e.g. NOT_FOUND after a restart of an in-memory coordinator."""
    FINISHED = "finished"
    """Local: this handle reported Finish."""
    RELEASED = "released"
    """Local: the handle was released (or the client closed) without Finish;
    nothing can learn about its stop any more, so its fence fails closed."""


class Finished(enum.StrEnum):
    """What became of a Finish."""

    APPLIED = "applied"
    """The coordinator ended the response with this terminal."""
    STALE = "stale"
    """The response was no longer active when the Finish arrived: nothing
    changed. After a retried Finish this may be our own earlier attempt."""
    NOT_SENT = "not_sent"
    """Not sent: the coordinator had already stopped the response."""


@dataclass(frozen=True, slots=True)
class SessionState:
    """A session's state as the coordinator reported it."""

    session_id: str
    phase: Phase
    response_id: int | None
    """The active response, ``None`` unless ``phase`` is ``ACTIVE``."""
    active_source: Source | None
    """The active response's source, ``None`` unless ``phase`` is ``ACTIVE``."""
    revision: int
    """Revision of the session's last event; 0 if it has none."""
    responses_started: int


_SOURCE_TO_WIRE = {Source.CLIENT: pb.SOURCE_CLIENT, Source.VAD: pb.SOURCE_VAD}
_SOURCE_FROM_WIRE = {wire: source for source, wire in _SOURCE_TO_WIRE.items()}
_TERMINAL_TO_WIRE = {
    Terminal.COMPLETED: pb.TERMINAL_STATUS_COMPLETED,
    Terminal.FAILED: pb.TERMINAL_STATUS_FAILED,
}
_PHASE_FROM_WIRE = {
    pb.PHASE_IDLE: Phase.IDLE,
    pb.PHASE_ACTIVE: Phase.ACTIVE,
    pb.PHASE_TERMINATED: Phase.TERMINATED,
}
_STOP_FROM_CANCEL = {
    pb.CANCEL_REASON_SUPERSEDED: StopReason.SUPERSEDED,
    pb.CANCEL_REASON_REQUESTED: StopReason.CANCELLED,
    pb.CANCEL_REASON_SHUTDOWN: StopReason.SHUTDOWN,
    pb.CANCEL_REASON_EXPIRED: StopReason.EXPIRED,
}


def source_to_wire(source: Source) -> pb.Source.ValueType:
    return _SOURCE_TO_WIRE[source]


def terminal_to_wire(terminal: Terminal) -> pb.TerminalStatus.ValueType:
    return _TERMINAL_TO_WIRE[terminal]


def stop_reason_from_cancel(reason: pb.CancelReason.ValueType) -> StopReason:
    """The wire's cancel reason as a stop reason; UNSPECIFIED (never sent for
    a cancel) is ``GONE``."""
    return _STOP_FROM_CANCEL.get(reason, StopReason.GONE)


def state_from_wire(state: pb.SessionState) -> SessionState:
    return SessionState(
        session_id=state.session_id,
        phase=_PHASE_FROM_WIRE.get(state.phase, Phase.IDLE),
        response_id=state.active_response_id or None,
        active_source=_SOURCE_FROM_WIRE.get(state.active_source),
        revision=state.revision,
        responses_started=state.responses_started,
    )

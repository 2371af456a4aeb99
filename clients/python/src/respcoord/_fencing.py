"""The fencing table: per tracked session, which of this client's responses
are known to be no longer live. Pure (no I/O): the session watches
(``_watch.py``) feed it events and re-read states, and carry out the one
effect it asks for, opening or closing a session's watch. This is
``clients/rust/src/fencing.rs`` in Python.

The table. Per tracked session the client keeps ``dead_through``: every
response id of the session up to it is known to be no longer live. Each
event and each re-read state only ever *raises* it, or stops registered
responses, with a fact that is true whenever it is applied:

- ``started(y)``: raise to ``y - 1`` (at most one live response, ids
  increase);
- ``cancel_requested(x)``, ``ended(x)``: raise to ``x`` (``x`` is done);
- ``terminated``: stop every registered response (nothing of the session
  lives after teardown, and none starts);
- state Active(``z``): raise to ``z - 1``, as ``started(z)``; the responses
  the read covered other than ``z`` are gone;
- state Idle or Terminated: stop every response registered before the read
  was sent (the read saw their Starts, and none of them is live);
- NOT_FOUND, or a revision below the one the watch had reached: stop every
  response registered before the read was sent, as gone (the session they
  belong to no longer exists).

Because every update is a max of true facts or stops responses the read
already covered, replaying events, or applying a state read while events
arrive, is harmless: that is what makes resume simple.

Which sessions are watched. A session's events reach this client only
while it has a live response there: :meth:`Tracks.register` asks for the
session's watch when the first one registers (from the Start reply's
revision, so a stop that lands between the reply and the watch is
replayed), and the watch is closed when the last one stops or is released.

No missed stop. A response registers right after its Start reply, and its
session's watch replays from the reply's revision, so every event after
the Start passes through :meth:`Tracks.apply`. A response registered after
its stop was already applied finds ``id <= dead_through`` and is stopped at
once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from respcoord._enums import StopReason, stop_reason_from_cancel
from respcoord.v1 import coordinator_pb2 as pb

_log = logging.getLogger("respcoord.watch")

StopCallback = Callable[[StopReason], None]


class Liveness:
    """One started response's liveness, shared by its handle, its fences and
    the watch. Stopped once; the first reason wins."""

    __slots__ = ("_callbacks", "_event", "id", "reason")

    def __init__(self, response_id: int) -> None:
        self.id = response_id
        self.reason: StopReason | None = None
        self._event: asyncio.Event | None = None
        self._callbacks: list[StopCallback] = []

    def stop(self, reason: StopReason) -> bool:
        """Stops it; true if this call stopped it. Callbacks run here, in
        the stopping code's turn of the event loop, so a body is cancelled
        in the same step that applied the event."""
        if self.reason is not None:
            return False
        self.reason = reason
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(reason)
            except Exception:  # a caller's callback must not break the watch
                _log.exception("a stop callback of response %d raised", self.id)
        return True

    def is_current(self) -> bool:
        """The fence check: one attribute read."""
        return self.reason is None

    def on_stop(self, callback: StopCallback) -> Callable[[], None]:
        """Calls ``callback(reason)`` once it stops (at once if it has);
        returns a function that removes the callback."""
        if self.reason is not None:
            callback(self.reason)
            return _nothing
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    async def stopped(self) -> StopReason:
        if self.reason is None:
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()
        assert self.reason is not None
        return self.reason


def _nothing() -> None:
    return None


class WatchStop:
    """A session watch's stop handle: the table fires it when the session
    has no live response of this client left (or is no longer tracked); the
    watch binds what stops it (its task's ``cancel``)."""

    __slots__ = ("_cancel", "fired")

    def __init__(self) -> None:
        self.fired = False
        self._cancel: Callable[[], object] | None = None

    def fire(self) -> None:
        if self.fired:
            return
        self.fired = True
        cancel, self._cancel = self._cancel, None
        if cancel is not None:
            cancel()

    def bind(self, cancel: Callable[[], object]) -> None:
        """``cancel`` is called when the handle fires (at once if it has)."""
        if self.fired:
            cancel()
        else:
            self._cancel = cancel


@dataclass(frozen=True, slots=True)
class WatchOrder:
    """What the caller of :meth:`Tracks.register` must do: open the
    session's watch, stopped by ``stop``."""

    session: str
    after_revision: int
    """Watch with ``after_revision`` = this."""
    expect_started: int | None
    """The response whose ``started`` event must come first (at
    ``after_revision + 1``): proof that the watch follows the session the
    Start was applied to, not one recreated since."""
    stop: WatchStop


@dataclass(eq=False, slots=True)
class _Registered:
    """A live response of this client, with when it registered."""

    liveness: Liveness
    ticket: int
    """The client-wide registration ticket (:meth:`Tracks.ticket`)."""


@dataclass(eq=False, slots=True)
class _Track:
    refs: int = 0
    """References (handles on responses, Starts in flight) holding it."""
    dead_through: int = 0
    reason: StopReason = StopReason.GONE
    """Why ``dead_through`` last rose (for responses registered late)."""
    responses: list[_Registered] = field(default_factory=list)
    """Live responses of this client in this session (usually one)."""
    watch: WatchStop | None = None
    """The session's watch, open while ``responses`` is not empty."""

    def raise_to(self, through: int, reason: StopReason) -> None:
        if through > self.dead_through:
            self.dead_through = through
            self.reason = reason
        self.stop_where(reason, lambda r: r.liveness.id <= through)

    def stop_where(self, reason: StopReason, which: Callable[[_Registered], bool]) -> None:
        """Stops the registered responses ``which`` selects, raising
        ``dead_through`` over them. The table is consistent (and the watch
        closed if nothing is left) before any stop callback runs."""
        stopped = [r.liveness for r in self.responses if which(r)]
        if not stopped:
            return
        self.responses = [r for r in self.responses if not which(r)]
        highest = max(liveness.id for liveness in stopped)
        if highest > self.dead_through:
            self.dead_through = highest
            self.reason = reason
        self.close_watch_when_idle()
        for liveness in stopped:
            liveness.stop(reason)

    def close_watch_when_idle(self) -> None:
        if not self.responses and self.watch is not None:
            watch, self.watch = self.watch, None
            watch.fire()


class TrackRef:
    """Keeps a session tracked until released (idempotent)."""

    __slots__ = ("_released", "_tracks", "session")

    def __init__(self, tracks: Tracks, session: str) -> None:
        self._tracks = tracks
        self.session = session
        self._released = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._tracks._unref(self.session)


class Tracks:
    """The sessions this client tracks, shared by the handles and the
    session watches."""

    def __init__(self) -> None:
        self._map: dict[str, _Track] = {}
        self._tickets = 0

    def track(self, session: str) -> TrackRef:
        track = self._map.get(session)
        if track is None:
            track = _Track()
            self._map[session] = track
        track.refs += 1
        return TrackRef(self, session)

    def _unref(self, session: str) -> None:
        track = self._map.get(session)
        if track is None:
            return
        track.refs -= 1
        if track.refs == 0:
            del self._map[session]
            if track.watch is not None:
                watch, track.watch = track.watch, None
                watch.fire()

    def register(
        self, ref: TrackRef, response: Liveness, revision: int, fresh: bool
    ) -> WatchOrder | None:
        """Adds a started response whose Start reply carried ``revision``;
        stops it at once if a watch already saw its end. Returns the watch
        to open when the session has none. ``fresh``: the reply was not a
        replay, so the response's ``started`` event is at ``revision``."""
        track = self._map.get(ref.session)
        if track is None:
            return None
        if response.id <= track.dead_through:
            response.stop(track.reason)
            return None
        if not response.is_current():
            return None
        self._tickets += 1
        track.responses.append(_Registered(response, self._tickets))
        if track.watch is not None:
            return None
        track.watch = WatchStop()
        return WatchOrder(
            session=ref.session,
            after_revision=max(revision - 1, 0) if fresh else revision,
            expect_started=response.id if fresh else None,
            stop=track.watch,
        )

    def unregister(self, ref: TrackRef, response: Liveness) -> None:
        track = self._map.get(ref.session)
        if track is None:
            return
        track.responses = [r for r in track.responses if r.liveness is not response]
        track.close_watch_when_idle()

    def ticket(self) -> int:
        """Every response registered so far has a ticket at or below this:
        take it before sending a read, and the read's answer covers them."""
        return self._tickets

    def apply(self, events: Iterable[pb.LifecycleEvent]) -> None:
        """Applies one WatchResponse's events."""
        for event in events:
            track = self._map.get(event.session_id)
            if track is None:
                continue
            kind = event.WhichOneof("kind")
            if kind == "started":
                track.raise_to(event.started.response_id - 1, StopReason.SUPERSEDED)
            elif kind == "cancel_requested":
                track.raise_to(
                    event.cancel_requested.response_id,
                    stop_reason_from_cancel(event.cancel_requested.reason),
                )
            elif kind == "ended":
                ended = event.ended
                reason = (
                    stop_reason_from_cancel(ended.reason)
                    if ended.status == pb.TERMINAL_STATUS_CANCELLED
                    else StopReason.ENDED
                )
                track.raise_to(ended.response_id, reason)
            elif kind == "terminated":
                track.stop_where(stop_reason_from_cancel(event.terminated.reason), _every)

    def apply_state(self, state: pb.SessionState, ticket: int) -> None:
        """Applies a state read (GetState) sent when :meth:`ticket` was
        ``ticket``."""
        track = self._map.get(state.session_id)
        if track is None:
            return

        def read(r: _Registered) -> bool:
            return r.ticket <= ticket

        if state.phase == pb.PHASE_ACTIVE:
            active = state.active_response_id
            track.raise_to(active - 1, StopReason.SUPERSEDED)
            track.stop_where(StopReason.GONE, lambda r: read(r) and r.liveness.id != active)
        elif state.phase == pb.PHASE_TERMINATED:
            track.stop_where(StopReason.SHUTDOWN, read)
        else:
            track.stop_where(StopReason.GONE, read)

    def apply_gone(self, session: str, ticket: int) -> None:
        """The session was not found (or was recreated) by a read sent at
        ``ticket``: the responses it covered belonged to a session that is
        gone."""
        track = self._map.get(session)
        if track is not None:
            track.stop_where(StopReason.GONE, lambda r: r.ticket <= ticket)

    def release_all(self) -> None:
        """Stops every tracked response (the client is closing: nothing can
        learn about stops any more) and closes every watch."""
        for track in list(self._map.values()):
            track.stop_where(StopReason.RELEASED, _every)

    def dead_through(self, session: str) -> int | None:
        track = self._map.get(session)
        return None if track is None else track.dead_through

    def watched(self, session: str) -> bool:
        track = self._map.get(session)
        return track is not None and track.watch is not None

    def __len__(self) -> int:
        return len(self._map)


def _every(_: _Registered) -> bool:
    return True

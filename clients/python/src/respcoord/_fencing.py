"""The fencing table: per tracked session, which of this client's responses
are known to be no longer live. Pure (no I/O, no clock, no tasks): the
session watches (``_watch.py``) feed it events and re-read states, and carry
out what it asks for: open a session's watch, or wait out a linger and hand
the notice back. This is ``clients/rust/src/fencing.rs`` in Python.

The table. Per tracked session the client keeps ``dead_through``: every
response id of the session up to it is known to be no longer live. Each
event and each re-read state only ever *raises* it, or stops registered
responses, with a fact that is true whenever it is applied:

- ``started(y)``: raise to ``y - 1`` (at most one live response, ids
  increase);
- ``cancel_requested(x)``, ``ended(x)``: raise to ``x`` (``x`` is done);
- ``terminated``: stop every registered response (nothing of the session
  lives after teardown, and none starts); the watch is over;
- state Active(``z``): raise to ``z - 1``, as ``started(z)``; the responses
  the read covered other than ``z`` are gone;
- state Idle: stop every response the read covered (it saw their Starts,
  and none of them is live);
- state Terminated: stop every registered response, as ``terminated`` does;
  the watch is over;
- NOT_FOUND, or a revision below the one the watch had reached: stop every
  response registered before the read was sent, as gone (the session they
  belong to no longer exists).

A read covers the responses registered before it was sent (a client-wide
ticket) and those whose Start reply's revision it reached. The last read
applied is kept while its watch lives: a Start whose reply arrives after it,
at a revision it reached, is judged by it at registration.

Because every update is a max of true facts or stops responses the read
already covered, replaying events, or applying a state read while events
arrive, is harmless: that is what makes resume simple.

Which sessions are watched. A session's events reach this client while it
has a live response there, and for a linger after the last one ends:
:meth:`Tracks.register` asks for the session's watch when the first one
registers (from the Start reply's revision, so a stop that lands between the
reply and the watch is replayed), and every later Start finds it open.
:meth:`Tracks.open_watch` opens it ahead of any Start (from a state read).
When the last response stops, or a watch is opened ahead with none live, the
table hands the shell an :class:`Idle` notice; the shell waits out the
linger and hands it back (:meth:`Tracks.linger_over`), and the watch closes
unless the session was used again meanwhile (its generation moved on). The
table never reads a clock.

No missed stop. A response registers right after its Start reply. Its
session's watch either replays from the reply's revision, or was already
open: then it delivers every event after its position with no gap, and what
lies at or below its position was applied or judged by a read. A response
registered after its stop was already applied finds ``id <= dead_through``
(or a read that reached its Start) and is stopped at once.
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
    """A session watch's stop handle: the table fires it when the watch is
    over (its linger ran out, the session was terminated, or the client is
    closing); the watch binds what stops it (its task's ``cancel``)."""

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
    """What the caller of :meth:`Tracks.register` or
    :meth:`Tracks.open_watch` must do: open the session's watch, stopped by
    ``stop``."""

    session: str
    after_revision: int | None
    """Watch with ``after_revision`` = this; ``None``: read the session's
    state first and watch from its revision (a watch opened ahead)."""
    expect_started: int | None
    """The response whose ``started`` event must come first (at
    ``after_revision + 1``): proof that the watch follows the session the
    Start was applied to, not one recreated since."""
    stop: WatchStop


@dataclass(frozen=True, slots=True)
class Idle:
    """A session whose watch is open with no live response of this client:
    the shell waits out the linger, then calls :meth:`Tracks.linger_over`
    with it."""

    session: str
    generation: int


@dataclass(frozen=True, slots=True)
class Effects:
    """What the shell must carry out after :meth:`Tracks.open_watch`."""

    order: WatchOrder | None
    idle: Idle | None


@dataclass(eq=False, slots=True)
class _Registered:
    """A live response of this client, with when it registered."""

    liveness: Liveness
    ticket: int
    """The client-wide registration ticket (:meth:`Tracks.ticket`)."""
    revision: int
    """The revision its Start reply carried: a read at or past it covered
    the response."""


@dataclass(frozen=True, slots=True)
class _Read:
    """The last state read applied while the current watch lives: a true
    fact about the session at ``revision``."""

    revision: int
    phase: pb.Phase.ValueType
    active_response_id: int


@dataclass(eq=False, slots=True)
class _Track:
    session: str
    refs: int = 0
    """References (handles on responses, Starts in flight) holding it."""
    dead_through: int = 0
    reason: StopReason = StopReason.GONE
    """Why ``dead_through`` last rose (for responses registered late)."""
    responses: list[_Registered] = field(default_factory=list)
    """Live responses of this client in this session (usually one)."""
    watch: WatchStop | None = None
    """The session's watch: open while ``responses`` is not empty, opened
    ahead, or lingering after the last response."""
    generation: int = 0
    """Bumped by every registration and every open ahead: a linger that
    began before either is stale."""
    read: _Read | None = None

    def raise_to(self, through: int, reason: StopReason) -> list[Liveness]:
        """Raises ``dead_through``; takes the registered responses at or
        below it (stop them with :func:`_stop` once the table is settled)."""
        if through > self.dead_through:
            self.dead_through = through
            self.reason = reason
        return self.take_where(reason, lambda r: r.liveness.id <= through)

    def take_where(
        self, reason: StopReason, which: Callable[[_Registered], bool]
    ) -> list[Liveness]:
        """Removes the registered responses ``which`` selects, raising
        ``dead_through`` over them, and returns them to be stopped."""
        taken = [r.liveness for r in self.responses if which(r)]
        if not taken:
            return taken
        self.responses = [r for r in self.responses if not which(r)]
        highest = max(liveness.id for liveness in taken)
        if highest > self.dead_through:
            self.dead_through = highest
            self.reason = reason
        return taken

    def end_watch(self) -> None:
        """The watch is over: the next Start opens a new one, with its proof."""
        self.read = None
        if self.watch is not None:
            watch, self.watch = self.watch, None
            watch.fire()

    def idle_notice(self, emptied: bool) -> Idle | None:
        """The notice for a track that just lost its last live response
        while its watch is open."""
        if emptied and self.watch is not None:
            return Idle(self.session, self.generation)
        return None


def _stop(stopped: Iterable[tuple[Liveness, StopReason]]) -> None:
    """Stops responses taken from the table. Their callbacks run here, after
    the table is settled (a callback may release its track)."""
    for liveness, reason in stopped:
        liveness.stop(reason)


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

    def _track(self, session: str) -> _Track:
        track = self._map.get(session)
        if track is None:
            track = _Track(session)
            self._map[session] = track
        return track

    def track(self, session: str) -> TrackRef:
        self._track(session).refs += 1
        return TrackRef(self, session)

    def _unref(self, session: str) -> None:
        track = self._map.get(session)
        if track is None:
            return
        track.refs -= 1
        # A lingering watch keeps the track (and what it knows) until the
        # linger is over.
        self._forget_if_unheld(session)

    def _forget_if_unheld(self, session: str) -> None:
        """Drops a track that no reference holds and no watch keeps."""
        track = self._map.get(session)
        if track is not None and track.refs <= 0 and track.watch is None:
            del self._map[session]

    def register(
        self, ref: TrackRef, response: Liveness, revision: int, fresh: bool
    ) -> WatchOrder | None:
        """Adds a started response whose Start reply carried ``revision``;
        stops it at once if a watch or a read already saw its end. Returns
        the watch to open when the session has none (an open one is reused).
        ``fresh``: the reply was not a replay, so the response's ``started``
        event is at ``revision``."""
        track = self._map.get(ref.session)
        if track is None:
            return None
        if response.id <= track.dead_through:
            response.stop(track.reason)
            return None
        read = track.read
        if (
            read is not None
            and revision <= read.revision
            and not (read.phase == pb.PHASE_ACTIVE and read.active_response_id == response.id)
        ):
            # The read reached this Start and did not find the response live.
            response.stop(StopReason.GONE)
            return None
        if not response.is_current():
            return None
        track.generation += 1
        self._tickets += 1
        track.responses.append(_Registered(response, self._tickets, revision))
        if track.watch is not None:
            return None
        track.watch = WatchStop()
        track.read = None
        return WatchOrder(
            session=ref.session,
            after_revision=max(revision - 1, 0) if fresh else revision,
            expect_started=response.id if fresh else None,
            stop=track.watch,
        )

    def open_watch(self, session: str) -> Effects:
        """The gateway serves ``session``: its watch opens now (from a state
        read) unless it is open, and lingers from now if no response is
        live. The session need not be tracked (nor exist) yet."""
        track = self._track(session)
        track.generation += 1
        order = None
        if track.watch is None:
            track.watch = WatchStop()
            track.read = None
            order = WatchOrder(session, after_revision=None, expect_started=None, stop=track.watch)
        idle = None if track.responses else Idle(session, track.generation)
        return Effects(order, idle)

    def unregister(self, ref: TrackRef, response: Liveness) -> Idle | None:
        """Removes a response that stopped (finished, released, or stopped
        by the table). An idle notice if that left the watch with none."""
        track = self._map.get(ref.session)
        if track is None:
            return None
        before = len(track.responses)
        track.responses = [r for r in track.responses if r.liveness is not response]
        return track.idle_notice(before > 0 and not track.responses)

    def linger_over(self, session: str, generation: int) -> None:
        """The linger that an :class:`Idle` notice began is over: the watch
        closes unless a response registered or the watch was opened ahead
        since; the track goes when no reference holds it."""
        track = self._map.get(session)
        if track is None or track.generation != generation or track.responses:
            return
        track.end_watch()
        self._forget_if_unheld(session)

    def ticket(self) -> int:
        """Every response registered so far has a ticket at or below this:
        take it before sending a read, and the read's answer covers them."""
        return self._tickets

    def apply(self, events: Iterable[pb.LifecycleEvent]) -> list[Idle]:
        """Applies one WatchResponse's events; the idle notices of the
        sessions they left with no live response."""
        notices: list[Idle] = []
        for event in events:
            track = self._map.get(event.session_id)
            if track is None:
                continue
            before = len(track.responses)
            kind = event.WhichOneof("kind")
            if kind == "started":
                reason = StopReason.SUPERSEDED
                taken = track.raise_to(event.started.response_id - 1, reason)
            elif kind == "cancel_requested":
                reason = stop_reason_from_cancel(event.cancel_requested.reason)
                taken = track.raise_to(event.cancel_requested.response_id, reason)
            elif kind == "ended":
                ended = event.ended
                reason = (
                    stop_reason_from_cancel(ended.reason)
                    if ended.status == pb.TERMINAL_STATUS_CANCELLED
                    else StopReason.ENDED
                )
                taken = track.raise_to(ended.response_id, reason)
            elif kind == "terminated":
                # The session emits nothing more: the watch is over.
                reason = stop_reason_from_cancel(event.terminated.reason)
                taken = track.take_where(reason, _every)
                track.end_watch()
                self._forget_if_unheld(track.session)
            else:
                continue
            idle = track.idle_notice(before > 0 and not track.responses)
            if idle is not None:
                notices.append(idle)
            _stop((liveness, reason) for liveness in taken)
        return notices

    def apply_state(self, state: pb.SessionState, ticket: int) -> Idle | None:
        """Applies a state read (GetState) sent when :meth:`ticket` was
        ``ticket``. It covered every response registered before it was sent
        and every one whose Start reply's revision it reached; it is kept
        (for later registrations) while the watch lives."""
        track = self._map.get(state.session_id)
        if track is None:
            return None
        before = len(track.responses)

        def covered(r: _Registered) -> bool:
            return r.ticket <= ticket or r.revision <= state.revision

        stopped: list[tuple[Liveness, StopReason]] = []
        if state.phase == pb.PHASE_ACTIVE:
            active = state.active_response_id
            superseded = track.raise_to(active - 1, StopReason.SUPERSEDED)
            stopped += ((liveness, StopReason.SUPERSEDED) for liveness in superseded)
            gone = track.take_where(
                StopReason.GONE, lambda r: covered(r) and r.liveness.id != active
            )
            stopped += ((liveness, StopReason.GONE) for liveness in gone)
        elif state.phase == pb.PHASE_TERMINATED:
            # Nothing more happens on this session: what is still registered
            # belongs to no live session either, and the watch is over (the
            # next Start opens a new one, with its proof).
            taken = track.take_where(StopReason.SHUTDOWN, _every)
            stopped += ((liveness, StopReason.SHUTDOWN) for liveness in taken)
            track.end_watch()
            self._forget_if_unheld(track.session)
            _stop(stopped)
            return None
        else:
            gone = track.take_where(StopReason.GONE, covered)
            stopped += ((liveness, StopReason.GONE) for liveness in gone)
        if track.watch is not None:
            track.read = _Read(state.revision, state.phase, state.active_response_id)
        idle = track.idle_notice(before > 0 and not track.responses)
        _stop(stopped)
        return idle

    def apply_gone(self, session: str, ticket: int) -> Idle | None:
        """The session was not found (or was recreated) by a read sent at
        ``ticket``: the responses it covered belonged to a session that is
        gone. Revisions of a gone session judge nothing."""
        track = self._map.get(session)
        if track is None:
            return None
        before = len(track.responses)
        taken = track.take_where(StopReason.GONE, lambda r: r.ticket <= ticket)
        track.read = None
        idle = track.idle_notice(before > 0 and not track.responses)
        _stop((liveness, StopReason.GONE) for liveness in taken)
        return idle

    def release_all(self) -> None:
        """Stops every tracked response (the client is closing: nothing can
        learn about stops any more) and closes every watch."""
        stopped: list[tuple[Liveness, StopReason]] = []
        for track in list(self._map.values()):
            taken = track.take_where(StopReason.RELEASED, _every)
            stopped += ((liveness, StopReason.RELEASED) for liveness in taken)
            track.end_watch()
            self._forget_if_unheld(track.session)
        _stop(stopped)

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

"""The shared watch: one watch-all stream per client that stops every
response the coordinator cancels or supersedes, whichever gateway asked.

Fencing state. Per tracked session the client keeps one number,
``dead_through``: every response id of the session up to it is known to be
no longer live. Each event and each re-listed state only ever *raises* it
with a fact that is true whenever it is applied:

====================================  ==========  =================================
event or listing                      raise to    why
====================================  ==========  =================================
started(y)                            y - 1       at most one live response, ids grow
cancel_requested(x), ended(x)         x           x is done
terminated at seq q                   q           a later session mints ids above q
listed Active(z)                      z - 1       as started(z)
listed Idle/Terminated, page seq q    q           nothing up to q is live
not listed (list began at seq q)      q           anything it had up to q is gone
====================================  ==========  =================================

Because every update is a max of true facts, replaying events or applying
them in another order than a listing is harmless: that is what makes resume
and re-list simple. This is ``src/client/watcher.rs`` in Python.

No missed stop: a session is tracked before its Start is sent and the stream
is positioned before that (``Client._ensure_watcher``), so every event of the
Start's response passes through :meth:`Tracks.apply` after the track exists.
A response registered after its stop was applied finds ``id <= dead_through``
and is stopped on registration.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from respcoord._enums import StopReason, stop_reason_from_cancel
from respcoord._retry import RetryPolicy, backoff
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
        self._event = asyncio.Event()
        self._callbacks: list[StopCallback] = []

    def stop(self, reason: StopReason) -> bool:
        """Stops it; true if this call stopped it. Callbacks run here, in
        the stopping code's turn of the event loop, so a body is cancelled
        in the same step that applied the event."""
        if self.reason is not None:
            return False
        self.reason = reason
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
        await self._event.wait()
        assert self.reason is not None
        return self.reason


def _nothing() -> None:
    return None


@dataclass(eq=False, slots=True)
class _Track:
    epoch: int
    """The re-list epoch when the track was made: a re-list that began
    earlier cannot judge it absent."""
    refs: int = 0
    dead_through: int = 0
    reason: StopReason = StopReason.GONE
    """Why ``dead_through`` last rose (for responses registered late)."""
    responses: set[Liveness] = field(default_factory=set)
    """Live responses of this client in this session (usually one)."""

    def raise_to(self, through: int, reason: StopReason) -> None:
        if through > self.dead_through:
            self.dead_through = through
            self.reason = reason
        for response in [r for r in self.responses if r.id <= through]:
            self.responses.discard(response)
            response.stop(reason)


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
    """The sessions this client tracks, shared by the handles and the watch."""

    def __init__(self) -> None:
        self._map: dict[str, _Track] = {}
        self._epoch = 0

    def track(self, session: str) -> TrackRef:
        track = self._map.get(session)
        if track is None:
            track = _Track(epoch=self._epoch)
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

    def register(self, ref: TrackRef, response: Liveness) -> None:
        """Adds a started response; stops it at once if the watch already saw
        its end."""
        track = self._map.get(ref.session)
        if track is None:
            return
        if response.id <= track.dead_through:
            response.stop(track.reason)
        elif response.is_current():
            track.responses.add(response)

    def unregister(self, ref: TrackRef, response: Liveness) -> None:
        track = self._map.get(ref.session)
        if track is not None:
            track.responses.discard(response)

    def apply(self, events: Iterable[pb.LifecycleEvent]) -> int:
        """Applies one WatchResponse's events; returns the highest seq seen."""
        high = 0
        for event in events:
            high = max(high, event.seq)
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
                track.raise_to(event.seq, stop_reason_from_cancel(event.terminated.reason))
        return high

    def apply_listed(
        self, page_seq: int, states: Iterable[pb.SessionState], seen: set[str]
    ) -> None:
        for state in states:
            track = self._map.get(state.session_id)
            if track is None:
                continue
            seen.add(state.session_id)
            if state.phase == pb.PHASE_ACTIVE:
                track.raise_to(state.active_response_id - 1, StopReason.SUPERSEDED)
            elif state.phase == pb.PHASE_TERMINATED:
                track.raise_to(page_seq, StopReason.SHUTDOWN)
            else:
                track.raise_to(page_seq, StopReason.GONE)

    def apply_absent(self, list_epoch: int, first_seq: int, seen: set[str]) -> None:
        for session, track in list(self._map.items()):
            if track.epoch < list_epoch and session not in seen:
                track.raise_to(first_seq, StopReason.GONE)

    def begin_relist(self) -> int:
        self._epoch += 1
        return self._epoch

    def release_all(self) -> None:
        """Stops every tracked response (the client is closing: nothing can
        learn about stops any more)."""
        for track in list(self._map.values()):
            responses = list(track.responses)
            track.responses.clear()
            for response in responses:
                response.stop(StopReason.RELEASED)

    def dead_through(self, session: str) -> int | None:
        track = self._map.get(session)
        return None if track is None else track.dead_through

    def __len__(self) -> int:
        return len(self._map)


@dataclass(frozen=True, slots=True)
class WatchStatus:
    """How the shared watch is doing."""

    connected: bool
    """A stream is open."""
    position: int
    """The seq it would resume after."""
    reconnects: int
    """Streams opened after the first one."""
    relists: int
    """Re-lists after OUT_OF_RANGE."""


class WatchTransport(Protocol):
    """What the watch needs from the client's second connection."""

    def open_watch(
        self, after_seq: int
    ) -> grpc.aio.UnaryStreamCall[pb.WatchRequest, pb.WatchResponse]: ...

    def list_page(self, page_token: str) -> Awaitable[pb.ListSessionsResponse]:
        """One ListSessions page, under the retry policy."""
        ...


class _OutOfRange(Exception):
    pass


class Watcher:
    """The running watch: follow, resume after a break, re-list after
    OUT_OF_RANGE; until stopped."""

    def __init__(
        self,
        transport: WatchTransport,
        tracks: Tracks,
        retry: RetryPolicy,
        position: int,
    ) -> None:
        self._transport = transport
        self._tracks = tracks
        self._retry = retry
        self._position = position
        self._connected = False
        self._opened = 0
        self._relists = 0
        self.last_error: BaseException | None = None
        """The last error the stream or a re-list ended with, for diagnostics."""
        self._task = asyncio.create_task(self._run(), name="respcoord-watch")

    def status(self) -> WatchStatus:
        return WatchStatus(
            connected=self._connected,
            position=self._position,
            reconnects=max(self._opened - 1, 0),
            relists=self._relists,
        )

    async def stop(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise

    async def _run(self) -> None:
        failures = 0
        while True:
            progressed = False
            try:
                progressed = await self._follow()
            except _OutOfRange:
                try:
                    await self._relist()
                    failures = 0
                    continue
                except Exception as error:  # retried after a backoff
                    self.last_error = error
                    _log.debug("re-list failed: %s", error)
            except grpc.aio.AioRpcError as error:
                self.last_error = error
                _log.debug("watch broke: %s", error.code())
            finally:
                self._connected = False
            if progressed:
                failures = 0
            failures += 1
            await asyncio.sleep(backoff(self._retry, failures))

    async def _follow(self) -> bool:
        """Opens a watch-all from the position and applies it until it ends;
        returns whether anything arrived."""
        call = self._transport.open_watch(self._position)
        progressed = False
        try:
            # The response headers are the first sign that the stream is open.
            await call.initial_metadata()
            if not call.done():
                self._opened += 1
                self._connected = True
            async for message in call:
                progressed = True
                # Applied as it arrives: no queue between the socket and the tracks.
                high = max(self._tracks.apply(message.events), message.progress_seq)
                self._position = max(self._position, high)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.OUT_OF_RANGE:
                raise _OutOfRange from error
            raise
        finally:
            call.cancel()
        return progressed

    async def _relist(self) -> None:
        """Lists every session, raises the tracked ones, and moves the
        position to the first page's seq."""
        self._relists += 1
        epoch = self._tracks.begin_relist()
        seen: set[str] = set()
        first_seq: int | None = None
        page_token = ""
        while True:
            page = await self._transport.list_page(page_token)
            if first_seq is None:
                first_seq = page.seq
            self._tracks.apply_listed(page.seq, page.sessions, seen)
            if not page.next_page_token:
                break
            page_token = page.next_page_token
        self._tracks.apply_absent(epoch, first_seq, seen)
        self._position = first_seq

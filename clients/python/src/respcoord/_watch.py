"""Session watches: one Watch stream per session where this client has a
live response, has opened the watch ahead (``Session.open_watch``), or is
waiting out the linger after the last response; opened when the fencing
table asks (``_fencing.py``), closed when it says so. The shell keeps the
clock: it arms the linger's timer on the table's idle notice and hands the
notice back when it runs out. A gateway's cost follows its own sessions, not
the deployment's traffic. This is ``clients/rust/src/watch.rs`` in Python.

One stream's life:

- Opened with ``after_revision`` just below the Start reply's revision, so
  the first event is the response's own ``started``: proof that the stream
  follows the session the Start was applied to. Anything else first (the
  session was recreated since, say after a coordinator restart), or nothing
  within the retry policy's attempt timeout, sends it to a state read.
- Opened ahead: the session's state is read first (a session not found is
  watched from its first event), then the stream follows from the state's
  revision; there is no proof to wait for.
- Every event goes through :meth:`Tracks.apply`; the position is the
  highest revision seen.
- After ``terminated`` the stream ends and so does the watch.
- Broken (transport, server shutdown, fell behind) or OUT_OF_RANGE: the
  session's state is read (GetState) before the stream is reopened, from
  the state's revision. A session not found, or at a revision below the
  position (recreated), means the responses the read covered are gone; so
  does any state that no longer has them active.

Connections: streams share a small pool of channels of their own (not the
calls' channel), at most :data:`STREAMS_PER_CONNECTION` each: the server
allows 1024 concurrent streams per connection by default, and a gateway
with thousands of calls must not queue watches behind that limit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from respcoord._errors import RespcoordError
from respcoord._fencing import Effects, Idle, Tracks, WatchOrder
from respcoord._retry import RetryPolicy, backoff
from respcoord.v1 import coordinator_pb2 as pb

_log = logging.getLogger("respcoord.watch")

STREAMS_PER_CONNECTION = 500
"""Watch streams one pooled connection carries at most."""

_LOOP_TURNS_PER_CLOSED_STREAM = 4
"""Turns of the event loop given, at close, to each cancelled stream's
notifications from grpcio (:meth:`Watches.close`): a stream's cancel
finishes at most three operations; one turn reads one."""


@dataclass(frozen=True, slots=True)
class WatchStatus:
    """How this client's session watches are doing."""

    open: int
    """Session watches running now: one per session with a live response,
    opened ahead, or lingering after its last response."""
    opened: int
    """Watch streams opened so far, reopenings included."""
    reconnects: int
    """Streams reopened after a break, OUT_OF_RANGE or a failed check."""
    rereads: int
    """Session states read (GetState) to resume a watch."""
    connections: int
    """Connections in the watch pool."""


class WatchCall(Protocol):
    """An open Watch call (a ``grpc.aio.UnaryStreamCall``): what a session
    watch uses of it."""

    def initial_metadata(self) -> Awaitable[object]:
        """Resolves when the stream is established (or has ended)."""
        ...

    def done(self) -> bool: ...

    def cancel(self) -> bool: ...

    def __aiter__(self) -> AsyncIterator[pb.WatchResponse]:
        """The messages; ends at OK, raises ``grpc.aio.AioRpcError`` for
        any other status."""
        ...


class WatchTransport(Protocol):
    """What a session watch needs from the wire (one pooled connection): the
    seam through which the watch's reactions are tested against a scripted
    server."""

    def open_watch(self, session_id: str, after_revision: int) -> WatchCall:
        """Watch(session_id, after_revision)."""
        ...

    def get_state(self, session_id: str) -> Awaitable[pb.SessionState]:
        """GetState under the client's retry policy; raises the mapped
        :class:`RespcoordError`."""
        ...

    def close(self) -> Awaitable[None]:
        """Closes the connection (the client is closing)."""
        ...


class _Counts:
    __slots__ = ("open", "opened", "reconnects", "rereads")

    def __init__(self) -> None:
        self.open = 0
        self.opened = 0
        self.reconnects = 0
        self.rereads = 0


@dataclass(eq=False, slots=True)
class _Slot:
    transport: WatchTransport
    streams: int = 0


class Watches:
    """Runs session watches, each in a task of its own, on a pool of
    connections that ``connect`` makes; waits out each idle watch's linger
    (``linger`` seconds; 0 closes a watch with its last response)."""

    def __init__(
        self,
        connect: Callable[[], WatchTransport],
        tracks: Tracks,
        retry: RetryPolicy,
        *,
        linger: float,
    ) -> None:
        self._connect = connect
        self._tracks = tracks
        self._retry = retry
        self._linger = linger
        self._slots: list[_Slot] = []
        self._counts = _Counts()
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        """The running linger of each idle session (a newer notice replaces
        an older one: the older is stale)."""
        self._closed = False

    def status(self) -> WatchStatus:
        counts = self._counts
        return WatchStatus(
            open=counts.open,
            opened=counts.opened,
            reconnects=counts.reconnects,
            rereads=counts.rereads,
            connections=len(self._slots),
        )

    def open_ahead(self, session: str) -> None:
        """Opens ``session``'s watch now unless it is open, and lingers from
        now when no response is live there. Nothing with a linger of 0 or a
        closed client. Raises ``RuntimeError`` outside a running event loop
        (before the table is touched)."""
        if self._linger <= 0 or self._closed:
            return
        asyncio.get_running_loop()
        self.carry_out(self._tracks.open_watch(session))

    def carry_out(self, effects: Effects) -> None:
        """Carries out what the table asked for."""
        if effects.order is not None:
            self.open(effects.order)
        self.linger(effects.idle)

    def linger(self, idle: Idle | None) -> None:
        """Waits out the linger of a watch the table found idle, then hands
        the notice back (at once with a linger of 0, a closed client, or no
        running event loop to wait on)."""
        if idle is None:
            return
        if self._linger <= 0 or self._closed:
            self._tracks.linger_over(idle.session, idle.generation)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._tracks.linger_over(idle.session, idle.generation)
            return
        previous = self._timers.pop(idle.session, None)
        if previous is not None:
            previous.cancel()
        self._timers[idle.session] = loop.call_later(self._linger, self._linger_over, idle)

    def _linger_over(self, idle: Idle) -> None:
        self._timers.pop(idle.session, None)
        self._tracks.linger_over(idle.session, idle.generation)

    def open(self, order: WatchOrder) -> None:
        """Carries out a :class:`WatchOrder`: the watch runs in its own task
        until the order's stop handle fires or the session ends."""
        if self._closed or order.stop.fired:
            return
        slot = self._acquire()
        watch = SessionWatch(
            slot.transport, self._tracks, self._retry, self._counts, order, linger=self.linger
        )
        task = asyncio.create_task(watch.run(), name=f"respcoord-watch {order.session}")
        self._counts.open += 1
        self._tasks.add(task)

        def finished(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            self._counts.open -= 1
            slot.streams -= 1
            if not task.cancelled() and task.exception() is not None:
                _log.error(
                    "the session watch of %s failed", order.session, exc_info=task.exception()
                )

        task.add_done_callback(finished)
        order.stop.bind(task.cancel)

    def _acquire(self) -> _Slot:
        """The first pooled connection with room, or a new one."""
        for slot in self._slots:
            if slot.streams < STREAMS_PER_CONNECTION:
                break
        else:
            slot = _Slot(self._connect())
            self._slots.append(slot)
        slot.streams += 1
        return slot

    async def close(self) -> None:
        """Stops every watch and closes the pool's connections."""
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for slot in self._slots:
            await slot.transport.close()
        # grpcio before 1.78 tells the event loop of each finished operation
        # by one byte on a socket pair, read one per turn of the loop: the
        # streams just cancelled leave hundreds unread. If the loop ends
        # with the pair full, the process hangs at exit (grpc/grpc#40989,
        # seen here with 200 watches on grpcio 1.71). A few turns per stream
        # read them.
        for _ in range(_LOOP_TURNS_PER_CLOSED_STREAM * len(tasks)):
            await asyncio.sleep(0)


@dataclass(frozen=True, slots=True)
class _Reread:
    """A stream ended: read the state before reopening. ``progressed``: it
    delivered something first (a later failure starts the backoff afresh)."""

    progressed: bool


class _Over:
    """Nothing more to follow: the stream ended after ``terminated`` (the
    session will emit nothing more), or the watch was stopped."""


_OVER = _Over()


class SessionWatch:
    """One session's watch: follow, read the state and resume after a
    break; until its task is cancelled or the session ends."""

    __slots__ = (
        "_counts",
        "_expect_started",
        "_linger",
        "_position",
        "_read_first",
        "_retry",
        "_session",
        "_stop",
        "_tracks",
        "_transport",
    )

    def __init__(
        self,
        transport: WatchTransport,
        tracks: Tracks,
        retry: RetryPolicy,
        counts: _Counts,
        order: WatchOrder,
        *,
        linger: Callable[[Idle | None], None],
    ) -> None:
        self._transport = transport
        self._tracks = tracks
        self._linger = linger
        """Where the table's idle notices go (:meth:`Watches.linger`)."""
        self._retry = retry
        self._counts = counts
        self._session = order.session
        self._position = order.after_revision or 0
        """The highest revision applied."""
        self._read_first = order.after_revision is None
        """Opened ahead of any Start: the first stream starts from a state
        read."""
        self._expect_started = order.expect_started
        """The response whose ``started`` must come first on the first stream."""
        self._stop = order.stop

    async def run(self) -> None:
        failures = 0
        if self._read_first:
            failures = await self._read_until_answered(failures)
        while not self._stop.fired:
            ended = await self._follow()
            if isinstance(ended, _Over):
                return
            if ended.progressed:
                failures = 0
            failures = await self._read_until_answered(failures)
            if not ended.progressed:
                failures += 1
                await asyncio.sleep(backoff(self._retry, failures))
            self._counts.reconnects += 1

    async def _read_until_answered(self, failures: int) -> int:
        """Reads the session's state until a read is answered (the position
        is then where the stream goes on from); the failures counted."""
        while True:
            try:
                await self._reread()
                return failures
            except RespcoordError as error:
                _log.info("session state read of %s failed; retrying: %s", self._session, error)
                failures += 1
                await asyncio.sleep(backoff(self._retry, failures))

    async def _follow(self) -> _Reread | _Over:
        """Opens the session's watch from the position and applies it until
        it ends."""
        call = self._transport.open_watch(self._session, self._position)
        progressed = False
        try:
            # The response headers are the first sign that the stream is open.
            await call.initial_metadata()
            if not call.done():
                self._counts.opened += 1
            messages = aiter(call)
            if self._expect_started is not None:
                expected, self._expect_started = self._expect_started, None
                first = await self._proof(messages, expected)
                if first is None:
                    return _Reread(progressed)
                progressed = True
                if self._apply(first.events):
                    return _OVER
            while not self._stop.fired:
                message = await _next(messages)
                if message is None:
                    _log.debug("the session watch of %s ended; reading the state", self._session)
                    return _Reread(progressed)
                progressed = True
                if self._apply(message.events):
                    return _OVER
            return _OVER
        except grpc.aio.AioRpcError as error:
            _log.debug(
                "the session watch of %s broke (%s: %s); reading the state",
                self._session,
                error.code().name,
                error.details(),
            )
            return _Reread(progressed)
        finally:
            call.cancel()

    async def _proof(
        self, messages: AsyncIterator[pb.WatchResponse], expected: int
    ) -> pb.WatchResponse | None:
        """The first message, if it begins with ``started(expected)`` at the
        revision after the position: proof that the stream follows the
        session the Start was applied to. It must come within an attempt
        timeout (it is replayed history); None if it does not."""
        try:
            async with asyncio.timeout(self._retry.attempt_timeout):
                message = await _next(messages)
        except TimeoutError:
            return None
        if message is None or not _starts_with(message.events, expected, self._position + 1):
            return None
        return message

    def _apply(self, events: Sequence[pb.LifecycleEvent]) -> bool:
        """Applies one message's events; true after ``terminated``."""
        # Applied as it arrives: no queue between the socket and the table.
        for idle in self._tracks.apply(events):
            self._linger(idle)
        for event in events:
            self._position = max(self._position, event.revision)
            if event.WhichOneof("kind") == "terminated":
                return True
        return False

    async def _reread(self) -> None:
        """GetState, applied to the fencing table; moves the position to
        where the watch goes on from."""
        self._counts.rereads += 1
        # The read is the check now: the stream it reopens starts past the
        # Start's own event.
        self._expect_started = None
        ticket = self._tracks.ticket()
        try:
            state = await self._transport.get_state(self._session)
        except RespcoordError as error:
            if error.code != grpc.StatusCode.NOT_FOUND:
                raise
            # Responses registered after the read (a session this client
            # created anew) keep the watch open, as does a watch opened
            # ahead of the session's first Start: from the session's first
            # event.
            self._position = 0
            self._linger(self._tracks.apply_gone(self._session, ticket))
            return
        if state.revision < self._position:
            # Revisions start again at 1 when a session is recreated: this
            # is not the session we watched.
            self._linger(self._tracks.apply_gone(self._session, ticket))
        self._position = state.revision
        self._linger(self._tracks.apply_state(state, ticket))


async def _next(messages: AsyncIterator[pb.WatchResponse]) -> pb.WatchResponse | None:
    """The next message; ``None`` when the stream ended with OK."""
    try:
        return await anext(messages)
    except StopAsyncIteration:
        return None


def _starts_with(events: Sequence[pb.LifecycleEvent], response: int, revision: int) -> bool:
    """Whether ``events`` begin with ``started(response)`` at ``revision``."""
    if not events:
        return False
    first = events[0]
    return (
        first.revision == revision
        and first.WhichOneof("kind") == "started"
        and first.started.response_id == response
    )

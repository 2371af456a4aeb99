"""Client, Session and Response: the Rust client's API (``src/client.rs``,
``src/client/response.rs``) in Python's idiom."""

from __future__ import annotations

import asyncio
import math
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Generic, Self, TypeAlias, TypeVar, cast

import grpc

from respcoord._enums import (
    Finished,
    Phase,
    SessionState,
    Source,
    StopReason,
    Terminal,
    source_to_wire,
    state_from_wire,
    terminal_to_wire,
)
from respcoord._errors import (
    AlreadyFinished,
    ClientClosed,
    ConfigError,
    InvalidArgument,
    RespcoordError,
    Unavailable,
)
from respcoord._fencing import Liveness, StopCallback, Tracks
from respcoord._retry import RetryPolicy, with_retry
from respcoord._watch import Watches, WatchStatus
from respcoord.v1 import coordinator_pb2 as pb
from respcoord.v1 import coordinator_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from respcoord.v1.coordinator_pb2_grpc import ResponseCoordinatorAsyncStub

_T = TypeVar("_T")
_Req = TypeVar("_Req")
_Res = TypeVar("_Res")

MAX_SESSION_ID_BYTES = 256
"""Longest session id the contract accepts, in UTF-8 bytes."""
MAX_REQUEST_ID_BYTES = 128
"""Longest request id the contract accepts, in UTF-8 bytes."""
DEFAULT_WATCH_LINGER = 30.0
"""Seconds a session's watch stays open after this client's last response
there ended (``watch_linger``'s default): longer than the pause between a
conversation's turns, short against a session's life."""
_MAX_ID = 1 << 64


def _control_character(value: str) -> str | None:
    """The first Unicode Cc character (C0, DEL, C1) in ``value``, if any."""
    for char in value:
        code = ord(char)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            return char
    return None


def _nonempty_str(field: str, value: object, limit: int, empty: str) -> str:
    """``value`` as a non-empty str of at most ``limit`` UTF-8 bytes, or
    :class:`InvalidArgument` naming ``field`` (``empty`` says what to do
    instead of sending an empty one)."""
    if not isinstance(value, str):
        raise InvalidArgument(field, "must be a str")
    if not value:
        raise InvalidArgument(field, empty)
    size = len(value.encode("utf-8"))
    if size > limit:
        raise InvalidArgument(field, f"is {size} bytes, longer than the limit of {limit}")
    return value


def validate_session_id(session_id: object) -> str:
    """Refuses a session id the coordinator would refuse, naming the field."""
    valid = _nonempty_str("session_id", session_id, MAX_SESSION_ID_BYTES, "must not be empty")
    control = _control_character(valid)
    if control is not None:
        raise InvalidArgument("session_id", f"contains the control character U+{ord(control):04X}")
    return valid


def _validate_request_id(request_id: object) -> str:
    return _nonempty_str(
        "request_id",
        request_id,
        MAX_REQUEST_ID_BYTES,
        "must not be empty (omit it to have one generated)",
    )


def _validate_source(source: object) -> Source:
    if not isinstance(source, Source):
        raise InvalidArgument("source", f"must be one of {', '.join(s.name for s in Source)}")
    return source


def _validate_response_id(field: str, response_id: object) -> int:
    if (
        not isinstance(response_id, int)
        or isinstance(response_id, bool)
        or not 0 < response_id < _MAX_ID
    ):
        raise InvalidArgument(field, "must be an int in [1, 2**64)")
    return response_id


def new_request_id() -> str:
    """A fresh request id: 128 random bits, hex."""
    return f"rc-{secrets.token_hex(16)}"


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """TLS settings; giving any turns TLS on. Paths to PEM files."""

    ca: str | Path | None = None
    """The CA(s) to trust; without it the system's default roots."""
    cert: str | Path | None = None
    """The client certificate chain, for mutual TLS (with ``key``)."""
    key: str | Path | None = None
    domain: str | None = None
    """The name to verify the server's certificate against, when it is not
    the target's host."""


def _read_pem(field: str, path: str | Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(field, f"{path}: {error.strerror or error}") from error


@dataclass(frozen=True, slots=True)
class _Target:
    address: str
    tls: bool


def _parse_target(target: object, tls: TlsOptions | None) -> _Target:
    if not isinstance(target, str) or not target.strip():
        raise ConfigError("target", "must not be empty")
    raw = target.strip()
    if raw.startswith("http://"):
        if tls is not None:
            raise ConfigError("target", f"{raw} is plaintext but TLS options are set; use https://")
        return _Target(_host_port(raw, raw.removeprefix("http://")), tls=False)
    if raw.startswith("https://"):
        return _Target(_host_port(raw, raw.removeprefix("https://")), tls=True)
    if "://" in raw:
        raise ConfigError("target", f"{raw}: the scheme must be http or https")
    return _Target(_host_port(raw, raw), tls=tls is not None)


def _host_port(raw: str, address: str) -> str:
    """``address`` if it is ``host:port`` (a name, an IPv4 address or a
    bracketed IPv6 one, and a port): anything else (``http//host``, a path, no
    port) is a configuration error now, not a connect timeout later."""
    expected = "expected host:port, http://host:port or https://host:port"
    try:
        parts = urllib.parse.urlsplit(f"//{address}")
        port = parts.port
    except ValueError as error:
        raise ConfigError("target", f"{raw}: {expected} ({error})") from None
    if not parts.hostname or port is None or parts.path or parts.query or parts.fragment:
        raise ConfigError("target", f"{raw}: {expected}")
    if parts.username is not None:
        raise ConfigError("target", f"{raw}: credentials go in token=, not in the target")
    return address


def _auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    if token is None:
        return ()
    trimmed = token.strip()
    if not trimmed:
        raise ConfigError("token", "must not be empty")
    if not all(0x20 <= ord(c) <= 0x7E for c in trimmed):
        raise ConfigError("token", "must be printable ASCII")
    return (("authorization", f"Bearer {trimmed}"),)


def _channels(
    target: _Target,
    tls: TlsOptions | None,
    retry: RetryPolicy,
    *,
    private_connection: bool,
) -> Callable[[], grpc.aio.Channel]:
    """Makes channels to ``target``; the settings (TLS files included) are
    read and checked now, once."""
    options: list[tuple[str, str | int]] = [
        # Notice a dead peer on an otherwise quiet connection (a watch).
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Reconnect on the retry policy's time scale, not gRPC's 1 s to 120 s.
        ("grpc.initial_reconnect_backoff_ms", max(int(retry.initial_backoff * 1000), 10)),
        ("grpc.min_reconnect_backoff_ms", max(int(retry.initial_backoff * 1000), 10)),
        ("grpc.max_reconnect_backoff_ms", max(int(retry.max_backoff * 1000), 10)),
    ]
    if private_connection:
        # Each channel of the watch pool gets a connection of its own, so
        # calls and the long-lived streams never share HTTP/2 flow control.
        options.append(("grpc.use_local_subchannel_pool", 1))
    if tls is not None and tls.domain is not None:
        options.append(("grpc.ssl_target_name_override", tls.domain))
        options.append(("grpc.default_authority", tls.domain))
    if not target.tls:
        return lambda: grpc.aio.insecure_channel(target.address, options=options)
    tls = tls or TlsOptions()
    if (tls.cert is None) != (tls.key is None):
        raise ConfigError("tls.cert", "tls.cert and tls.key go together (mutual TLS needs both)")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read_pem("tls.ca", tls.ca),
        private_key=_read_pem("tls.key", tls.key),
        certificate_chain=_read_pem("tls.cert", tls.cert),
    )
    return lambda: grpc.aio.secure_channel(target.address, credentials, options=options)


def _validate_linger(linger: object) -> float:
    if (
        isinstance(linger, bool)
        or not isinstance(linger, int | float)
        or not math.isfinite(linger)
        or linger < 0
    ):
        raise ConfigError("watch_linger", "must be a finite number of seconds, 0 or more")
    return float(linger)


def _stub(channel: grpc.aio.Channel) -> ResponseCoordinatorAsyncStub:
    return cast("ResponseCoordinatorAsyncStub", pb_grpc.ResponseCoordinatorStub(channel))


class Client:
    """A connection to respcoord: one channel for calls, and a pool of
    channels for the session watches (one Watch stream per session where
    this client has a live response, has opened the watch ahead, or is
    within the watch linger after its last response). Use it from one event
    loop; close it (``async with`` or :meth:`close`) to release its
    responses and connections."""

    def __init__(
        self,
        *,
        channel: grpc.aio.Channel,
        watch_channels: Callable[[], grpc.aio.Channel],
        metadata: tuple[tuple[str, str], ...],
        retry: RetryPolicy,
        watch_linger: float = DEFAULT_WATCH_LINGER,
    ) -> None:
        """Use :meth:`connect`. ``watch_channels`` makes the watch pool's
        channels, each a connection of its own."""
        linger = _validate_linger(watch_linger)
        self._channel = channel
        self._stub = _stub(channel)
        self._metadata = metadata
        self._retry = retry
        self._tracks = Tracks()

        def connect_watches() -> _WatchConnection:
            return _WatchConnection(watch_channels(), metadata, retry)

        self._watches = Watches(connect_watches, self._tracks, retry, linger=linger)
        self._closed = False

    @classmethod
    async def connect(
        cls,
        target: str,
        *,
        token: str | None = None,
        tls: TlsOptions | None = None,
        retry: RetryPolicy | None = None,
        connect_timeout: float = 5.0,
        lazy: bool = False,
        watch_linger: float = DEFAULT_WATCH_LINGER,
    ) -> Client:
        """Connects to ``target`` (``host:port``, ``http://host:port`` or
        ``https://host:port``; ``host:port`` means TLS when ``tls`` is
        given). ``token`` goes as ``authorization: Bearer`` on every call,
        the watches included. Raises :class:`Unavailable` if the coordinator
        cannot be reached within ``connect_timeout`` seconds, unless
        ``lazy`` (then the first calls connect, retried like any call).

        ``watch_linger``: seconds a session's watch stays open after this
        client's last response there ended (or after
        :meth:`Session.open_watch`), so that the next Start finds it open
        and a stop right after that Start needs no Watch set-up; 0 closes it
        with the last response. A negative value raises :class:`ConfigError`
        naming ``watch_linger``."""
        parsed = _parse_target(target, tls)
        metadata = _auth_metadata(token)
        linger = _validate_linger(watch_linger)
        policy = retry or RetryPolicy()
        channel = _channels(parsed, tls, policy, private_connection=False)()
        watch_channels = _channels(parsed, tls, policy, private_connection=True)
        client = cls(
            channel=channel,
            watch_channels=watch_channels,
            metadata=metadata,
            retry=policy,
            watch_linger=linger,
        )
        if lazy:
            return client
        try:
            await asyncio.wait_for(channel.channel_ready(), connect_timeout)
        except TimeoutError:
            await client.close()
            raise Unavailable(
                f"cannot connect to {parsed.address} within {connect_timeout} s",
                code=grpc.StatusCode.UNAVAILABLE,
            ) from None
        except BaseException:
            await client.close()
            raise
        return client

    @property
    def retry_policy(self) -> RetryPolicy:
        return self._retry

    def session(self, session_id: str) -> Session:
        """A handle on one session. Raises :class:`InvalidArgument` naming
        ``session_id`` for a malformed id."""
        self._check_open()
        return Session(self, validate_session_id(session_id))

    def watch_status(self) -> WatchStatus:
        """How this client's session watches are doing."""
        return self._watches.status()

    async def get_state(self, session_id: str) -> SessionState:
        """GetState. Idempotent: retried."""
        request = pb.GetStateRequest(session_id=validate_session_id(session_id))
        reply = await self._call(self._stub.GetState, request, idempotent=True)
        return state_from_wire(reply.state)

    async def close(self) -> None:
        """Fails every fence of this client closed (reason ``RELEASED``:
        nothing can learn about stops any more), stops the session watches
        and closes every connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._tracks.release_all()
        await self._watches.close()
        await self._channel.close(None)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # ---- internals used by Session and Response ----

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("the client is closed")

    async def _call(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[_Req, _Res],
        request: _Req,
        *,
        idempotent: bool,
    ) -> _Res:
        """One unary call under the retry policy (only idempotent calls are
        tried again); every attempt carries the token and a deadline."""
        self._check_open()
        policy = self._retry if idempotent else self._retry.single_attempt()

        def attempt(timeout: float) -> Awaitable[_Res]:
            return method(request, metadata=self._metadata, timeout=timeout)

        return await with_retry(policy, attempt)


class _WatchConnection:
    """One connection of the watch pool: the session watches' transport."""

    __slots__ = ("_channel", "_metadata", "_retry", "_stub")

    def __init__(
        self,
        channel: grpc.aio.Channel,
        metadata: tuple[tuple[str, str], ...],
        retry: RetryPolicy,
    ) -> None:
        self._channel = channel
        self._stub = _stub(channel)
        self._metadata = metadata
        self._retry = retry

    def open_watch(
        self, session_id: str, after_revision: int
    ) -> grpc.aio.UnaryStreamCall[pb.WatchRequest, pb.WatchResponse]:
        request = pb.WatchRequest(session_id=session_id, after_revision=after_revision)
        return self._stub.Watch(request, metadata=self._metadata)

    async def get_state(self, session_id: str) -> pb.SessionState:
        request = pb.GetStateRequest(session_id=session_id)

        def attempt(timeout: float) -> Awaitable[pb.GetStateResponse]:
            return self._stub.GetState(request, metadata=self._metadata, timeout=timeout)

        reply = await with_retry(self._retry, attempt)
        return reply.state

    async def close(self) -> None:
        await self._channel.close(None)


class Fence:
    """The output path's fence: cheap to pass around and to check. False
    once the coordinator stopped the response, it was finished, or it was
    released: drop the output."""

    __slots__ = ("_liveness",)

    def __init__(self, liveness: Liveness) -> None:
        self._liveness = liveness

    @property
    def id(self) -> int:
        return self._liveness.id

    def is_current(self) -> bool:
        return self._liveness.is_current()

    def stop_reason(self) -> StopReason | None:
        return self._liveness.reason

    def on_stop(self, callback: StopCallback) -> Callable[[], None]:
        """Calls ``callback(reason)`` in the same step of the event loop that
        closes the fence (at once if it is closed); returns a function that
        removes the callback. For output paths that must react without a
        task of their own (flush a jitter buffer, drop queued audio)."""
        return self._liveness.on_stop(callback)

    def __bool__(self) -> bool:
        return self._liveness.is_current()

    def __repr__(self) -> str:
        return f"Fence(id={self.id}, stop_reason={self.stop_reason()})"


class ResponseContext:
    """What :meth:`Session.run` gives its body."""

    __slots__ = ("_response",)

    def __init__(self, response: Response) -> None:
        self._response = response

    @property
    def response_id(self) -> int:
        return self._response.id

    def is_current(self) -> bool:
        """The fence check: call before emitting each chunk."""
        return self._response.is_current()

    def fence(self) -> Fence:
        return self._response.fence()

    async def stopped(self) -> StopReason:
        """Returns the reason once the response stops."""
        return await self._response.stopped()


@dataclass(frozen=True, slots=True)
class Completed(Generic[_T]):
    """The body returned; Finish(COMPLETED) was reported (``finished`` says
    what became of it: ``NOT_SENT`` if the coordinator stopped the response
    between the body's end and the Finish; a :class:`RespcoordError` if the
    Finish call failed after its retries, so whether it applied is unknown)."""

    value: _T
    finished: Finished | RespcoordError
    response_id: int = 0


@dataclass(frozen=True, slots=True)
class Failed:
    """The body raised; Finish(FAILED) was reported (``finished`` as in
    :class:`Completed`)."""

    error: Exception
    finished: Finished | RespcoordError
    response_id: int = 0


@dataclass(frozen=True, slots=True)
class Stopped:
    """The coordinator stopped the response: the body's task was cancelled
    and has unwound; no Finish was sent."""

    reason: StopReason
    response_id: int = 0


RunOutcome: TypeAlias = Completed[_T] | Failed | Stopped


class Session:
    """A handle on one session. Cheap: the client tracks a session while a
    Start on it is in flight or a response of it is live, and watches it
    while a response of it is live, and for the watch linger after the last
    one ended or after :meth:`open_watch`."""

    __slots__ = ("client", "id")

    def __init__(self, client: Client, session_id: str) -> None:
        """Use :meth:`Client.session`."""
        self.client = client
        self.id = session_id

    def open_watch(self) -> None:
        """Opens the session's watch now, so that a stop right after the
        session's first Start needs no Watch set-up either (a user talking
        over the greeting): call it when the gateway begins serving the
        session. Does not wait. The watch stays open while a response of
        this client is live there, and for ``watch_linger`` after the later
        of this call and the last response's end (with ``watch_linger`` 0
        this does nothing). The session need not exist yet. Call it on the
        client's event loop; raises :class:`ClientClosed` once the client is
        closed."""
        client = self.client
        client._check_open()
        client._watches.open_ahead(self.id)

    async def start(self, source: Source, *, request_id: str | None = None) -> Response:
        """Starts a response, superseding the session's live one wherever it
        runs. The handle is stopped when the coordinator cancels or
        supersedes it. Raises :class:`SessionTerminated` once the session is
        terminated.

        ``request_id`` is the idempotency key (1 to 128 bytes). Without it a
        fresh one is generated, which still makes this call's own retries
        safe; give one to make a repeat of the whole operation (after a
        gateway restart) safe too."""
        wire_source = source_to_wire(_validate_source(source))
        request = pb.StartRequest(
            session_id=self.id,
            source=wire_source,
            request_id=new_request_id() if request_id is None else _validate_request_id(request_id),
        )
        client = self.client
        # Tracked while the Start is in flight (a local count, nothing is
        # sent before the Start): what the table learns meanwhile is kept.
        ref = client._tracks.track(self.id)
        try:
            reply = await client._call(client._stub.Start, request, idempotent=True)
        except BaseException:
            ref.release()
            raise
        liveness = Liveness(reply.response_id)
        state = state_from_wire(reply.state)
        if client._closed:
            # Closed while the Start was in flight: nothing can learn about
            # its stop any more.
            liveness.stop(StopReason.RELEASED)
        elif reply.replayed and state.response_id != reply.response_id:
            # A retry of a Start that applied earlier, whose response has
            # since been replaced or ended.
            liveness.stop(
                StopReason.SHUTDOWN
                if state.phase == Phase.TERMINATED
                else StopReason.SUPERSEDED
                if state.phase == Phase.ACTIVE
                else StopReason.GONE
            )
        # The session's watch, if it has none open (not live, not opened
        # ahead, not lingering), replays from the reply's revision: a stop
        # that lands before the watch opens is not missed.
        order = client._tracks.register(ref, liveness, reply.state.revision, not reply.replayed)
        if order is not None:
            client._watches.open(order)

        def untrack(_: StopReason) -> None:
            client._watches.linger(client._tracks.unregister(ref, liveness))
            ref.release()

        liveness.on_stop(untrack)
        return Response(self, liveness, reply, state)

    async def run(
        self,
        source: Source,
        body: Callable[[ResponseContext], Awaitable[_T]],
        *,
        request_id: str | None = None,
    ) -> RunOutcome[_T]:
        """The whole pattern: start a response and run ``body(ctx)`` in its
        own task, and

        - if the coordinator stops the response first (superseded or
          cancelled by any gateway, shut down, expired, gone): cancel the
          body's task at that moment, wait for it to unwind, send no Finish,
          and return :class:`Stopped`;
        - otherwise report Finish exactly once when the body ends:
          COMPLETED when it returns (:class:`Completed`), FAILED when it
          raises (:class:`Failed`).

        Cancelling the caller's task cancels the body too and releases the
        response (nothing is sent, as a dropped Rust handle)."""
        response = await self.start(source, request_id=request_id)
        ctx = ResponseContext(response)
        task: asyncio.Future[_T] = asyncio.ensure_future(body(ctx))
        stopped_body = False

        def on_stop(_: StopReason) -> None:
            nonlocal stopped_body
            if not task.done():
                stopped_body = True
                task.cancel()

        remove = response._liveness.on_stop(on_stop)
        try:
            value = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if (current is not None and current.cancelling()) or not stopped_body:
                response.release()
                raise
            return Stopped(response.stop_reason() or StopReason.GONE, response.id)
        except Exception as error:
            if stopped_body:
                return Stopped(response.stop_reason() or StopReason.GONE, response.id)
            return Failed(error, await _finish_outcome(response, Terminal.FAILED), response.id)
        finally:
            remove()
        if stopped_body:
            return Stopped(response.stop_reason() or StopReason.GONE, response.id)
        return Completed(value, await _finish_outcome(response, Terminal.COMPLETED), response.id)

    async def cancel(
        self, *, source: Source = Source.CLIENT, if_response_id: int | None = None
    ) -> int | None:
        """Cancels the live response, or only ``if_response_id``. Returns the
        cancelled id, ``None`` if nothing was cancelled. Retried only with
        ``if_response_id`` (a blind retry could cancel a response started in
        between)."""
        wire_source = source_to_wire(_validate_source(source))
        if_id = (
            0 if if_response_id is None else _validate_response_id("if_response_id", if_response_id)
        )
        request = pb.CancelRequest(session_id=self.id, source=wire_source, if_response_id=if_id)
        client = self.client
        reply = await client._call(client._stub.Cancel, request, idempotent=if_id != 0)
        return reply.cancelled_response_id or None

    async def shutdown(self, *, source: Source = Source.CLIENT) -> int | None:
        """Tears the session down (idempotent): nothing starts on it
        afterwards. Returns the cancelled id. ``source`` is recorded as who
        cancelled the live response."""
        wire_source = source_to_wire(_validate_source(source))
        client = self.client
        request = pb.ShutdownRequest(session_id=self.id, source=wire_source)
        reply = await client._call(client._stub.Shutdown, request, idempotent=True)
        return reply.cancelled_response_id or None

    async def state(self) -> SessionState:
        return await self.client.get_state(self.id)


async def _finish_outcome(response: Response, terminal: Terminal) -> Finished | RespcoordError:
    try:
        return await response.finish(terminal)
    except RespcoordError as error:
        return error


class Response:
    """A started response. Finish it with :meth:`finish` (at most once).
    Releasing it unfinished (:meth:`release`, or leaving ``async with``)
    sends nothing: the coordinator keeps it live until it is superseded,
    cancelled or expires; its fence fails closed."""

    def __init__(
        self,
        session: Session,
        liveness: Liveness,
        reply: pb.StartResponse,
        state: SessionState,
    ) -> None:
        """Use :meth:`Session.start`."""
        self.session = session
        self._liveness = liveness
        self.id: int = liveness.id
        """The response id: the fencing token (a uint64)."""
        self.superseded: int | None = reply.superseded_response_id or None
        """The response this Start superseded, if any."""
        self.replayed: bool = reply.replayed
        """True if the Start was answered as a replay of an earlier attempt."""
        self.start_state = state
        """The session's state in the Start reply."""
        self.finish_state: SessionState | None = None
        """The session's state in the Finish reply, once one was sent."""
        self._finish_called = False

    def is_current(self) -> bool:
        """The fence check: false once the coordinator stopped it, or it was
        finished or released."""
        return self._liveness.is_current()

    def fence(self) -> Fence:
        """A fence for the output path (audio sink, conversation append,
        tool calls)."""
        return Fence(self._liveness)

    def stop_reason(self) -> StopReason | None:
        return self._liveness.reason

    async def stopped(self) -> StopReason:
        """Returns why, once the response stops."""
        return await self._liveness.stopped()

    def on_stop(self, callback: StopCallback) -> Callable[[], None]:
        """Calls ``callback(reason)`` in the same step of the event loop that
        learns of the stop (at once if it has stopped); returns a function
        that removes the callback. For frameworks that must react without a
        task of their own."""
        return self._liveness.on_stop(callback)

    async def finish(self, terminal: Terminal) -> Finished:
        """Reports this response's own terminal, unless the coordinator
        already stopped it (then nothing is sent: ``NOT_SENT``). The fence
        closes first, so no output follows a Finish. A second call raises
        :class:`AlreadyFinished`."""
        if not isinstance(terminal, Terminal):
            raise InvalidArgument("terminal", "must be Terminal.COMPLETED or Terminal.FAILED")
        if self._finish_called:
            raise AlreadyFinished(f"response {self.id} was already finished")
        self._finish_called = True
        if not self._liveness.stop(StopReason.FINISHED):
            return Finished.NOT_SENT
        client = self.session.client
        request = pb.FinishRequest(
            session_id=self.session.id,
            response_id=self.id,
            status=terminal_to_wire(terminal),
        )
        reply = await client._call(client._stub.Finish, request, idempotent=True)
        self.finish_state = state_from_wire(reply.state)
        return Finished.APPLIED if reply.applied else Finished.STALE

    async def cancel(self, *, source: Source = Source.CLIENT) -> bool:
        """Cancels this response (only if it is still the live one). True if
        the coordinator cancelled it."""
        cancelled = await self.session.cancel(source=source, if_response_id=self.id)
        return cancelled == self.id

    def release(self) -> None:
        """Lets go of the handle without Finish: nothing is sent; the fence
        fails closed (``RELEASED``)."""
        self._liveness.stop(StopReason.RELEASED)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return (
            f"Response(session={self.session.id!r}, id={self.id}, stop_reason={self.stop_reason()})"
        )

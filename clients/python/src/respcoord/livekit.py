"""LiveKit Agents sessions whose speeches obey respcoord.

:class:`ResponseGate` is a ``livekit.agents.voice.io.AudioOutput`` placed at
the top of the agent session's audio output chain (``next_in_chain`` is the
output it wraps, as the framework's own transcription synchronizer does)::

    await agent_session.start(agent, room=ctx.room)
    gate = ResponseGate.install(agent_session, client.session(call_id))

Both the STT-LLM-TTS pipeline and realtime models end in
``agent_session.output.audio``, so the gate covers both. It puts each agent
speech under the coordinator:

- the gate opens the session's watch when it is made
  (``Session.open_watch``), so a stop right after a speech's Start needs no
  Watch set-up;
- one speech (a ``SpeechHandle``, however many LLM/tool steps it takes) is
  one respcoord response, started when the speech's audio begins (its first
  frame reaches the gate; not at ``speech_created``, which fires when a
  speech is merely queued); its frames wait in the gate until the Start is
  confirmed;
- a frame goes on down the chain only while its response's fence is
  current: once the coordinator stopped it (superseded, cancelled or shut
  down, by any process) its frames are dropped and counted, and the base
  class's playout accounting stays whole (``wait_for_playout`` returns);
- a stop made elsewhere interrupts exactly that speech
  (``handle.interrupt(force=True)``) and clears the output's buffer;
- a speech interrupted here (the user barging in, or the application) goes
  through the coordinator as a fenced Cancel of its response, so every
  other process on the session stops too; a false interruption (the
  framework pauses the output, then resumes the same speech) cancels
  nothing;
- the speech's end is reported with exactly one Finish; a stopped or
  interrupted speech sends none;
- the agent session's close releases what is left; a torn-down respcoord
  session lets no audio out.

Tested with livekit-agents 1.8.9 (docs/livekit.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Final

try:
    from livekit import rtc
    from livekit.agents.voice import AgentSession, SpeechHandle
    from livekit.agents.voice.io import AudioOutput, AudioOutputCapabilities
except ImportError as error:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        "respcoord.livekit needs LiveKit Agents: "
        'pip install "respcoord[livekit]" (tested with livekit-agents 1.8.9)'
    ) from error

from respcoord._client import Response, Session
from respcoord._enums import Finished, Phase, Source, StopReason, Terminal
from respcoord._errors import RespcoordError, SessionTerminated
from respcoord._gate import LOCAL_REASONS as _LOCAL_REASONS
from respcoord._gate import TERMINAL_REASONS as _TERMINAL_REASONS
from respcoord._gate import StopRecord, StopRecords, begin_serving, notify_stop

__all__ = ["RESPONSE_ID_USERDATA", "GateStats", "ResponseGate", "StopRecord"]

LIVEKIT_AGENTS_TESTED_VERSION: Final = "1.8.9"
"""The livekit-agents release this module is tested with."""

RESPONSE_ID_USERDATA: Final = "respcoord.response_id"
"""Key in ``rtc.AudioFrame.userdata`` under which the gate stamps, on every
frame it lets through, the id of the response the frame belongs to."""

_log = logging.getLogger("respcoord.livekit")

_USER_INTERRUPTIONS: Final = frozenset({"audio_activity", "user_turn"})


def _speech_context() -> contextvars.ContextVar[SpeechHandle] | None:
    """The framework's context variable holding the speech a task works for
    (set for every speech task, inherited by its audio forwarding task). It
    is private to livekit-agents: read defensively, with the session's
    ``current_speech`` as the fallback."""
    try:
        from livekit.agents.voice import agent_activity
    except ImportError:  # pragma: no cover - a layout change in the framework
        return None
    var: object = getattr(agent_activity, "_SpeechHandleContextVar", None)
    return var if isinstance(var, contextvars.ContextVar) else None


_SPEECH: Final = _speech_context()


@dataclass
class GateStats:
    """Counters of one :class:`ResponseGate`, updated in place."""

    frames_passed: int = 0
    """Frames handed down the chain while their response was current."""
    frames_dropped: int = 0
    """Frames of a stopped or interrupted speech, of a speech whose Start
    failed, after the session was torn down or closed, or of no speech."""
    responses_started: int = 0
    """Starts the coordinator confirmed."""
    responses_finished: int = 0
    """Speeches whose Finish(COMPLETED) was sent (applied or stale)."""
    responses_stopped: int = 0
    """Responses the coordinator stopped before their end, from any process."""
    responses_interrupted: int = 0
    """Speeches interrupted here (the user, the application) while their
    response was live."""
    responses_released: int = 0
    """Responses let go of unfinished at close (nothing sent)."""
    speeches_interrupted: int = 0
    """Speeches this gate interrupted because the coordinator stopped their
    response."""
    start_failures: int = 0
    finish_failures: int = 0
    barge_ins: int = 0
    """Cancels this gate made for interruptions here (completed calls)."""
    barge_ins_applied: int = 0
    """... of which cancelled a response (this process's or another's)."""
    pauses: int = 0
    """``pause()`` calls (the framework's false-interruption handling): they
    cancel nothing."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _State(Enum):
    PENDING = "pending"
    """Its first frame arrived; its Start is in flight: frames wait."""
    LIVE = "live"
    STOPPED = "stopped"
    """Stopped by the coordinator, interrupted here, or never started."""
    DONE = "done"


class _Turn:
    """One speech as the gate sees it."""

    __slots__ = (
        "cancel_source",
        "forwarded",
        "handle",
        "remove_stop",
        "response",
        "started",
        "state",
    )

    def __init__(self, handle: SpeechHandle) -> None:
        self.handle = handle
        self.state = _State.PENDING
        self.response: Response | None = None
        self.started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Done once the Start's outcome is known."""
        self.forwarded = 0
        self.cancel_source: Source | None = None
        """Interrupted here while its Start was in flight: cancel it once started."""
        self.remove_stop: Callable[[], None] | None = None

    def passes(self) -> bool:
        """The fence check for one frame."""
        return (
            self.state is _State.LIVE and self.response is not None and self.response.is_current()
        )


_Command = Callable[[], Awaitable[None]]


def _state_of(turn: _Turn) -> _State:
    return turn.state


class ResponseGate(AudioOutput):
    """Gates an agent session's audio output on respcoord; see the module
    docs.

    ``session`` is the call's respcoord session (``client.session(id)``),
    whose client runs on the agent session's event loop; ``next_in_chain``
    the audio output it wraps (``agent_session.output.audio``).
    ``agent_session``, when given, is followed: its ``close`` releases the
    gate, and its ``current_speech`` attributes frames if the framework's
    speech context is not available. ``source`` is recorded on the Starts,
    ``interruption_source`` on the Cancels of user interruptions (an
    interruption by the application is a Cancel with source CLIENT).
    ``on_stop(response_id, reason)`` is called in the step that closes a
    response (a stop from any process, or an interruption here).

    :meth:`install` wraps the session's current audio output and sets the gate
    in its place.
    """

    def __init__(
        self,
        session: Session,
        *,
        next_in_chain: AudioOutput,
        agent_session: AgentSession[Any] | None = None,
        source: Source = Source.CLIENT,
        interruption_source: Source = Source.VAD,
        on_stop: Callable[[int, StopReason], None] | None = None,
        label: str = "respcoord.ResponseGate",
    ) -> None:
        super().__init__(
            label=label,
            capabilities=AudioOutputCapabilities(pause=True),
            next_in_chain=next_in_chain,
            sample_rate=next_in_chain.sample_rate,
        )
        self._session = session
        self._agent_session = agent_session
        self._source = source
        self._interruption_source = interruption_source
        self._on_stop_callback = on_stop
        self.stats = GateStats()
        self._turns: dict[SpeechHandle, _Turn] = {}
        self._stops = StopRecords()
        self._commands: asyncio.Queue[_Command] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._capturing = False
        """A frame of the current segment went down the chain."""
        self._terminated = False
        self._closed = False
        if agent_session is not None:
            agent_session.on("close", self._on_session_close)
        # The gate begins serving the session: its watch opens now.
        begin_serving(session)

    @classmethod
    def install(
        cls,
        agent_session: AgentSession[Any],
        session: Session,
        *,
        source: Source = Source.CLIENT,
        interruption_source: Source = Source.VAD,
        on_stop: Callable[[int, StopReason], None] | None = None,
    ) -> ResponseGate:
        """Wraps ``agent_session.output.audio`` (set by ``start(room=...)`` or
        by the application) in a gate and puts the gate in its place."""
        output = agent_session.output.audio
        if output is None:
            raise ValueError("the agent session has no audio output to gate")
        gate = cls(
            session,
            next_in_chain=output,
            agent_session=agent_session,
            source=source,
            interruption_source=interruption_source,
            on_stop=on_stop,
        )
        agent_session.output.audio = gate
        return gate

    # ---- what the application, tests and metrics read ----

    @property
    def session(self) -> Session:
        return self._session

    @property
    def terminated(self) -> bool:
        """True once the respcoord session was torn down: no audio passes."""
        return self._terminated

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def live_response_id(self) -> int | None:
        """The respcoord response whose frames pass now, if any."""
        for turn in self._turns.values():
            if turn.passes() and turn.response is not None:
                return turn.response.id
        return None

    def response_id_of(self, handle: SpeechHandle) -> int | None:
        """The respcoord response of a speech (while the gate tracks it)."""
        turn = self._turns.get(handle)
        return turn.response.id if turn is not None and turn.response is not None else None

    def stop_record(self, response_id: int) -> StopRecord | None:
        """Why and when this gate saw its response ``response_id`` stop (the
        latest responses only), or ``None``."""
        return self._stops.get(response_id)

    # ---- AudioOutput ----

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        turn = self._turn_of_frame()
        if turn is not None and turn.state is _State.PENDING:
            # The Start is in flight: the speech's audio waits for it.
            await asyncio.shield(turn.started)
        if turn is None or not turn.passes() or turn.response is None:
            self.stats.frames_dropped += 1
            return
        # The check above and the hand-over below are one step: nothing runs
        # between them (the base class's capture_frame does not suspend).
        frame.userdata[RESPONSE_ID_USERDATA] = turn.response.id
        turn.forwarded += 1
        self.stats.frames_passed += 1
        self._capturing = True
        await super().capture_frame(frame)
        assert self.next_in_chain is not None
        await self.next_in_chain.capture_frame(frame)

    def flush(self) -> None:
        super().flush()
        if self._capturing:
            # Only a segment that reached the sink is flushed there: a segment
            # the gate dropped whole was never counted (by the base class nor
            # the sink), so the playout accounting stays whole.
            self._capturing = False
            assert self.next_in_chain is not None
            self.next_in_chain.flush()

    def clear_buffer(self) -> None:
        assert self.next_in_chain is not None
        self.next_in_chain.clear_buffer()

    def pause(self) -> None:
        # The framework pauses on a possible interruption and resumes the same
        # speech if it was a false one: nothing is cancelled for a pause.
        self.stats.pauses += 1
        super().pause()

    # ---- speeches ----

    def _turn_of_frame(self) -> _Turn | None:
        if self._closed:
            return None
        handle = _SPEECH.get(None) if _SPEECH is not None else None
        if handle is None and self._agent_session is not None:
            handle = self._agent_session.current_speech
        if handle is None:
            _log.debug("an audio frame outside any speech is dropped")
            return None
        if self._terminated:
            # Nothing plays on a torn-down session: the speech is dropped and
            # stopped, so it does not go on unheard.
            handle.interrupt(force=True)
            return None
        turn = self._turns.get(handle)
        if turn is None:
            if handle.interrupted or handle.done():
                return None
            turn = self._open(handle)
        return turn

    def _open(self, handle: SpeechHandle) -> _Turn:
        """The speech's audio begins: a Start on the session (queued behind
        the gate's earlier calls, so a Finish before it is not superseded)."""
        turn = _Turn(handle)
        self._turns[handle] = turn
        handle.add_done_callback(self._on_speech_done)
        self._spawn(self._watch_interruption(turn))
        self._enqueue(lambda: self._start(turn))
        return turn

    async def _start(self, turn: _Turn) -> None:
        try:
            if turn.state is not _State.PENDING or self._closed or self._terminated:
                if turn.state is _State.PENDING:
                    turn.state = _State.STOPPED
                return
            try:
                response = await self._session.start(self._source)
            except SessionTerminated:
                self._on_terminated()
                self._cannot_run(turn)
                return
            except RespcoordError as error:
                self.stats.start_failures += 1
                _log.warning("respcoord Start failed, the speech is dropped: %s", error)
                self._cannot_run(turn)
                return
            self.stats.responses_started += 1
            turn.response = response
            # Both may have moved while the Start was in flight.
            state, closed = _state_of(turn), self._is_closed()
            if state is _State.DONE and not closed:
                await self._finish(response)
                return
            if state is not _State.PENDING or closed:
                # Interrupted here or closed while the Start was in flight.
                response.release()
                if turn.cancel_source is not None:
                    await self._cancel(response.id, turn.cancel_source)
                elif closed:
                    self.stats.responses_released += 1
                return
            turn.state = _State.LIVE
            # A stop the watch applied first calls back at once.
            turn.remove_stop = response.on_stop(lambda reason: self._on_stop(turn, reason))
        finally:
            if not turn.started.done():
                turn.started.set_result(None)

    def _cannot_run(self, turn: _Turn) -> None:
        """Fails closed: the speech's audio is dropped and the speech
        interrupted, so it does not play on unheard."""
        turn.state = _State.STOPPED
        if not self._closed:
            turn.handle.interrupt(force=True)

    async def _watch_interruption(self, turn: _Turn) -> None:
        """Wakes when the speech is interrupted (or done): an interruption
        this gate did not make is one made here."""
        handle = turn.handle
        done = asyncio.ensure_future(handle.wait_for_playout())
        try:
            await handle.wait_if_not_interrupted([done])
        finally:
            done.cancel()
        if handle.interrupted:
            self._interrupted_here(turn)

    def _on_speech_done(self, handle: SpeechHandle) -> None:
        turn = self._turns.pop(handle, None)
        if turn is None:
            return
        if handle.interrupted:
            self._interrupted_here(turn)
            return
        if turn.state is not _State.LIVE or turn.response is None:
            if turn.state is _State.PENDING:
                # Done (not interrupted) while its Start was in flight: the
                # Start, when it lands, is finished at once.
                turn.state = _State.DONE
            return
        turn.state = _State.DONE
        self._forget(turn)
        response = turn.response
        self._enqueue(lambda: self._finish(response))

    async def _finish(self, response: Response) -> None:
        try:
            finished = await response.finish(Terminal.COMPLETED)
        except RespcoordError as error:
            self.stats.finish_failures += 1
            _log.warning("respcoord Finish of %s failed: %s", response.id, error)
            return
        if finished is not Finished.NOT_SENT:
            self.stats.responses_finished += 1

    def _interrupted_here(
        self, turn: _Turn, source: Source | None = None, *, queue: bool = True
    ) -> int | None:
        """The speech was interrupted here (not by this gate): the user
        barged in, a user turn preempted it, or the application interrupted
        it. Its response is cancelled at the coordinator, fenced (queued
        unless ``queue`` is false: then the caller cancels the id returned)."""
        if turn.state not in (_State.PENDING, _State.LIVE):
            return None
        if source is None and self._agent_session_closing():
            # The session's teardown interrupts its speeches: that is the
            # close, which releases (nothing is cancelled).
            self._close()
            return None
        if source is None:
            cause: object = getattr(turn.handle, "_interrupt_source", None)
            source = self._interruption_source if cause in _USER_INTERRUPTIONS else Source.CLIENT
        pending = turn.state is _State.PENDING
        turn.state = _State.STOPPED
        self._forget(turn)
        if pending:
            turn.cancel_source = source
            return None
        assert turn.response is not None
        response_id = turn.response.id
        self._closed_here(response_id, StopReason.CANCELLED)
        self.stats.responses_interrupted += 1
        turn.response.release()
        if queue and not (self._closed or self._terminated):
            interruption_source = source

            async def cancel() -> None:
                await self._barge_in(response_id, interruption_source)

            self._enqueue(cancel)
        return response_id

    async def barge_in(self) -> int | None:
        """The user started speaking here (the application's own VAD): the
        speech playing here is interrupted and its response cancelled, or,
        if none plays here, the response the coordinator has live (another
        process's) is cancelled. Returns the cancelled response id, or
        ``None`` if nothing live was cancelled."""
        own: int | None = None
        for turn in list(self._turns.values()):
            if turn.state in (_State.PENDING, _State.LIVE):
                response_id = self._interrupted_here(turn, self._interruption_source, queue=False)
                own = response_id if response_id is not None else own
                turn.handle.interrupt(force=True, source="audio_activity")
        done: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

        async def command() -> None:
            done.set_result(await self._barge_in(own, self._interruption_source, fallback=True))

        self._enqueue(command)
        return await done

    async def _barge_in(
        self, own: int | None, source: Source, *, fallback: bool = False
    ) -> int | None:
        """Cancel, fenced with ``if_response_id``, so that neither a retry nor
        a late call cancels a response started afterwards: ours if it was
        live here, else (``fallback``) the one the coordinator has live."""
        if self._terminated or self._closed:
            return None
        cancelled: int | None = None
        try:
            if own is not None:
                cancelled = await self._cancel(own, source)
            if cancelled is None and fallback:
                state = await self._session.state()
                if state.phase is Phase.ACTIVE and state.response_id not in (None, own):
                    assert state.response_id is not None
                    cancelled = await self._cancel(state.response_id, source)
        except SessionTerminated:
            self._on_terminated()
        except RespcoordError as error:
            _log.warning("respcoord Cancel for an interruption failed: %s", error)
        self.stats.barge_ins += 1
        return cancelled

    async def _cancel(self, response_id: int, source: Source) -> int | None:
        cancelled = await self._session.cancel(source=source, if_response_id=response_id)
        if cancelled == response_id:
            self.stats.barge_ins_applied += 1
            return cancelled
        return None

    # ---- stops ----

    def _on_stop(self, turn: _Turn, reason: StopReason) -> None:
        """The response's fence closed (called in the step that closed it)."""
        if reason in _LOCAL_REASONS or turn.state is not _State.LIVE:
            return
        turn.state = _State.STOPPED
        self._forget(turn)
        assert turn.response is not None
        self._closed_here(turn.response.id, reason)
        self.stats.responses_stopped += 1
        if reason in _TERMINAL_REASONS:
            self._on_terminated()
        if self._closed:
            return
        if turn.forwarded:
            # What the sink buffered of it must not play either.
            self.clear_buffer()
        # Exactly this speech, never a blind session.interrupt().
        turn.handle.interrupt(force=True)
        self.stats.speeches_interrupted += 1

    def _closed_here(self, response_id: int, reason: StopReason) -> None:
        self._stops.record(response_id, reason)
        notify_stop(self._on_stop_callback, response_id, reason, _log)

    def _forget(self, turn: _Turn) -> None:
        if turn.remove_stop is not None:
            turn.remove_stop()
            turn.remove_stop = None

    def _on_terminated(self) -> None:
        if not self._terminated:
            self._terminated = True
            _log.warning(
                "respcoord session %r is terminated; no further audio of this agent passes",
                self._session.id,
            )

    # ---- the end ----

    def _is_closed(self) -> bool:
        return self._closed

    def _agent_session_closing(self) -> bool:
        # AgentSession has no public "closing" flag; read its private one
        # defensively (its close interrupts the speeches before "close").
        agent_session = self._agent_session
        if agent_session is None:
            return False
        closing: object = getattr(agent_session, "_is_closing", None)
        return bool(closing()) if callable(closing) else False

    def _on_session_close(self, _event: object) -> None:
        self._close()

    def _close(self) -> None:
        """Releases every response still live here (nothing is sent: the
        coordinator keeps it until it is superseded, cancelled or expires);
        no audio passes afterwards."""
        if self._closed:
            return
        self._closed = True
        if self._agent_session is not None:
            self._agent_session.off("close", self._on_session_close)
        for turn in self._turns.values():
            if turn.state is _State.LIVE and turn.response is not None:
                self.stats.responses_released += 1
                turn.state = _State.STOPPED
                self._forget(turn)
                turn.response.release()

    async def aclose(self) -> None:
        """Closes the gate (as the agent session's close does) and waits for
        its outstanding coordinator calls."""
        self._close()
        if self._worker is not None:
            try:
                await asyncio.wait_for(self._commands.join(), 15.0)
            except TimeoutError:
                _log.warning("respcoord calls still outstanding at close")
            self._worker.cancel()
            self._worker = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- tasks ----

    def _enqueue(self, command: _Command) -> None:
        """The gate's coordinator calls run one at a time, in the order their
        causes arrived: a speech's Start, its Finish, a barge-in's Cancel."""
        if self._worker is None:
            # A context of its own: not the speech task's that first called.
            self._worker = asyncio.get_running_loop().create_task(
                self._run_commands(), context=contextvars.Context()
            )
        self._commands.put_nowait(command)

    async def _run_commands(self) -> None:
        while True:
            command = await self._commands.get()
            try:
                await command()
            except Exception:  # one failed call must not stop the gate
                _log.exception("a respcoord call failed")
            finally:
                self._commands.task_done()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

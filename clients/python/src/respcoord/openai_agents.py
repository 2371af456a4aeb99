"""OpenAI Agents SDK realtime sessions whose responses obey respcoord.

An ``agents.realtime.RealtimeSession`` is consumed as an async iterator of
events and the application plays the audio itself, so the integration wraps
that loop. :class:`ResponseGate` iterates the session for the application::

    async with await runner.run() as realtime:
        async with ResponseGate(realtime, client.session(call_id)) as gate:
            async for event in gate:
                if event.type == "audio":
                    player.play(event.audio.data)      # only audio of a current response
                elif event.type == "audio_interrupted":
                    player.flush()

It puts each model response under the coordinator:

- the gate opens the session's watch when it is made
  (``Session.open_watch``), so a stop right after a response's Start needs
  no Watch set-up;
- a model response (``turn_started``, with the provider's ``response_id``)
  starts a respcoord response on the session; the session's events wait in
  the gate until the Start is confirmed; the follow-up response the SDK
  starts after a tool call or a handoff belongs to the same respcoord
  response;
- an ``audio`` event leaves the gate only while its response's fence is
  current: once the coordinator stopped it (superseded, cancelled or shut
  down, by any process) its audio is dropped and counted;
- a stop made elsewhere interrupts the model for that response
  (``RealtimeModelSendInterrupt(response_id=...)``, what
  ``RealtimeSession.interrupt()`` sends, scoped to the response);
- an ``audio_interrupted`` of a live response here (the model detected the
  user speaking) and :meth:`ResponseGate.barge_in` (the application's own
  VAD) go through the coordinator as a fenced Cancel, so every other process
  on the session stops too;
- the response's end (``turn_ended`` of its last model response) is
  reported with exactly one Finish; a stopped response sends none.

Tested with openai-agents 0.24.0 (docs/openai-agents.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import asdict, dataclass
from enum import Enum
from types import TracebackType
from typing import Any, Final

try:
    from agents.realtime import RealtimeSession
    from agents.realtime.events import RealtimeSessionEvent
    from agents.realtime.model_events import RealtimeModelEvent
    from agents.realtime.model_inputs import RealtimeModelSendInterrupt
except ImportError as error:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        "respcoord.openai_agents needs the OpenAI Agents SDK: "
        'pip install "respcoord[openai-agents]" (tested with openai-agents 0.24.0)'
    ) from error

from respcoord._client import Response, Session
from respcoord._enums import Finished, Phase, Source, StopReason, Terminal
from respcoord._errors import RespcoordError, SessionTerminated
from respcoord._gate import LOCAL_REASONS as _LOCAL_REASONS
from respcoord._gate import TERMINAL_REASONS as _TERMINAL_REASONS
from respcoord._gate import StopRecord, StopRecords, begin_serving, notify_stop, trim

__all__ = ["GateStats", "ResponseGate", "StopRecord"]

OPENAI_AGENTS_TESTED_VERSION: Final = "0.24.0"
"""The openai-agents release this module is tested with."""

_log = logging.getLogger("respcoord.openai_agents")


@dataclass
class GateStats:
    """Counters of one :class:`ResponseGate`, updated in place."""

    audio_passed: int = 0
    """``audio`` events handed to the application while their response was
    current."""
    audio_dropped: int = 0
    """``audio`` events of a stopped response, of a response whose Start
    failed, or after the session was torn down."""
    responses_started: int = 0
    """Starts the coordinator confirmed."""
    responses_finished: int = 0
    """Responses whose Finish(COMPLETED) was sent (applied or stale)."""
    responses_stopped: int = 0
    """Responses the coordinator stopped before their end, from any process."""
    responses_interrupted: int = 0
    """Responses ended by an interruption detected here."""
    responses_released: int = 0
    """Responses let go of unfinished when the gate closed (nothing sent)."""
    model_responses_joined: int = 0
    """Follow-up model responses (after a tool call or handoff) that joined
    the respcoord response of the model response that called the tool."""
    start_failures: int = 0
    finish_failures: int = 0
    interruptions_detected: int = 0
    """``audio_interrupted`` events of a live response here, and
    :meth:`ResponseGate.barge_in` calls."""
    false_interruptions: int = 0
    """``audio_interrupted`` events of audio whose response was no longer
    live (already finished or stopped): no Cancel was sent."""
    barge_ins: int = 0
    """Cancels this gate made for interruptions (completed calls)."""
    barge_ins_applied: int = 0
    """... of which cancelled a response (this process's or another's)."""
    model_interrupts: int = 0
    """Interrupts sent to the model because the coordinator stopped one of
    this session's responses."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _State(Enum):
    LIVE = "live"
    FOLLOW_UP = "follow_up"
    """Its model response ended with a tool call or handoff: the SDK's
    follow-up model response continues it."""
    STOPPED = "stopped"
    DONE = "done"


class _Turn:
    """One respcoord response: one model response, or several when tool
    calls or handoffs chain them."""

    __slots__ = (
        "awaiting_follow_up",
        "items",
        "model_ids",
        "model_interrupted",
        "pending_tools",
        "remove_stop",
        "response",
        "state",
    )

    def __init__(self) -> None:
        self.state = _State.LIVE
        self.response: Response | None = None
        self.model_ids: list[str | None] = []
        """The model responses (provider ids) of this respcoord response."""
        self.items: set[str] = set()
        """Audio item ids seen in this response."""
        self.pending_tools = 0
        """Tool calls of the current model response."""
        self.awaiting_follow_up = False
        """Its last model response ended with tool calls: the SDK starts a
        follow-up model response, which belongs to this one (and is dropped
        and interrupted if this one was stopped meanwhile)."""
        self.model_interrupted = False
        self.remove_stop: Callable[[], None] | None = None

    def passes(self) -> bool:
        """The fence check for one audio event."""
        return (
            self.state in (_State.LIVE, _State.FOLLOW_UP)
            and self.response is not None
            and self.response.is_current()
        )


class ResponseGate:
    """Iterates a ``RealtimeSession`` for the application, under respcoord;
    see the module docs.

    ``realtime`` is the agent session (entered: ``async with await
    runner.run() as realtime``); ``session`` its respcoord session
    (``client.session(call_id)``), whose client runs on the same event loop.
    ``source`` is recorded on the Starts, ``interruption_source`` on the
    barge-in Cancels. ``on_stop(response_id, reason)`` is called in the step
    that closes a response of this gate (a stop from any process, or a
    barge-in here): flush the audio already handed to the player there.

    Use one consumer: ``async for event in gate`` (or ``gate.events()``).
    """

    def __init__(
        self,
        realtime: RealtimeSession,
        session: Session,
        *,
        source: Source = Source.CLIENT,
        interruption_source: Source = Source.VAD,
        on_stop: Callable[[int, StopReason], None] | None = None,
    ) -> None:
        self._realtime = realtime
        self._session = session
        self._source = source
        self._interruption_source = interruption_source
        self._on_stop_callback = on_stop
        self.stats = GateStats()
        self._turn: _Turn | None = None
        """The respcoord response the session's model events belong to now."""
        self._by_model_id: OrderedDict[str, _Turn] = OrderedDict()
        self._by_item: OrderedDict[str, _Turn] = OrderedDict()
        self._stops = StopRecords()
        self._tasks: set[asyncio.Task[None]] = set()
        self._calls = asyncio.Lock()
        """The gate's coordinator calls run one at a time, in order."""
        self._terminated = False
        self._closed = False
        # The gate begins serving the session: its watch opens now.
        begin_serving(session)

    # ---- what the application, tests and metrics read ----

    @property
    def session(self) -> Session:
        return self._session

    @property
    def realtime(self) -> RealtimeSession:
        return self._realtime

    @property
    def terminated(self) -> bool:
        """True once the respcoord session was torn down: no audio passes."""
        return self._terminated

    @property
    def live_response_id(self) -> int | None:
        """The respcoord response whose audio passes now, if any."""
        turn = self._turn
        if turn is not None and turn.passes() and turn.response is not None:
            return turn.response.id
        return None

    def response_id_of(self, event: RealtimeSessionEvent) -> int | None:
        """The respcoord response an ``audio`` (or ``audio_end``,
        ``audio_interrupted``) event belongs to, if the gate knows it."""
        turn: _Turn | None = None
        if event.type == "audio":
            turn = self._by_model_id.get(event.audio.response_id)
        elif event.type in ("audio_end", "audio_interrupted"):
            turn = self._by_item.get(event.item_id)
        return turn.response.id if turn is not None and turn.response is not None else None

    def is_current(self, response_id: int) -> bool:
        """Whether audio of ``response_id`` may still be played: check it
        again after an await between receiving audio and playing it."""
        turn = self._turn
        return (
            turn is not None
            and turn.passes()
            and turn.response is not None
            and turn.response.id == response_id
        )

    def stop_record(self, response_id: int) -> StopRecord | None:
        """Why and when this gate saw its response ``response_id`` stop (the
        latest responses only), or ``None``."""
        return self._stops.get(response_id)

    # ---- the loop ----

    def __aiter__(self) -> AsyncIterator[RealtimeSessionEvent]:
        return self.events()

    async def events(self) -> AsyncIterator[RealtimeSessionEvent]:
        """The session's events, with ``audio`` of stopped responses left
        out. Every ``audio`` event yielded belonged to a response whose fence
        was current in the step that yields it (nothing runs between the
        check and the application resuming). Ends when the session's
        iteration ends; releases what is left then."""
        try:
            async for event in self._realtime:
                if event.type == "raw_model_event":
                    await self._model_event(event.data)
                elif event.type == "audio":
                    turn = self._by_model_id.get(event.audio.response_id)
                    if turn is None:
                        # A transport without turn_started: the audio opens it.
                        turn = await self._open(event.audio.response_id)
                    self._by_item[event.item_id] = turn
                    trim(self._by_item)
                    turn.items.add(event.item_id)
                    if not turn.passes():
                        self.stats.audio_dropped += 1
                        continue
                    self.stats.audio_passed += 1
                elif event.type == "audio_interrupted":
                    await self._audio_interrupted(event.item_id)
                yield event
        finally:
            self._close()

    async def __aenter__(self) -> ResponseGate:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Releases a response still live here (nothing is sent: the
        coordinator keeps it until it is superseded, cancelled or expires)
        and waits for the gate's outstanding model interrupts."""
        self._close()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def barge_in(self) -> int | None:
        """The user started speaking here (the application's own VAD): ends
        this process's response at once, interrupts the model, and cancels
        the live response at the coordinator, wherever it runs. Returns the
        cancelled response id, or ``None`` if nothing live was cancelled."""
        turn = self._turn
        interrupt = turn is not None and turn.passes()
        cancelled = await self._interruption(turn)
        if interrupt and turn is not None:
            await self._interrupt_model(turn)
        return cancelled

    # ---- model events ----

    async def _model_event(self, event: RealtimeModelEvent) -> None:
        """Raw model events come before the session's typed ones and carry
        the provider's response ids (``RealtimeAgentStartEvent`` does not)."""
        if event.type == "turn_started":
            turn = self._turn
            if turn is not None and turn.awaiting_follow_up:
                # The SDK started this response to go on after a tool call or
                # handoff: the same respcoord response. If that one was
                # stopped meanwhile, the follow-up is dropped and interrupted
                # (it must not supersede whoever stopped it).
                turn.awaiting_follow_up = False
                self._bind(turn, event.response_id)
                self.stats.model_responses_joined += 1
                if turn.state is _State.FOLLOW_UP:
                    turn.state = _State.LIVE
                elif turn.state is _State.STOPPED:
                    turn.model_interrupted = False
                    self._spawn(self._interrupt_model(turn))
            elif (
                turn is None
                or event.response_id is None
                or (event.response_id not in turn.model_ids)
            ):
                await self._open(event.response_id)
        elif event.type == "function_call":
            if self._turn is not None:
                self._turn.pending_tools += 1
        elif event.type == "turn_ended":
            await self._turn_ended(event.response_id)

    async def _open(self, model_id: str | None) -> _Turn:
        """A new model response: a Start on the session. Events wait (the
        loop awaits the reply), so no audio passes unconfirmed."""
        previous = self._turn
        if previous is not None and previous.state in (_State.LIVE, _State.FOLLOW_UP):
            # The model moved on without ending the previous one: the Start
            # below supersedes it at the coordinator.
            self._let_go(previous)
        turn = _Turn()
        self._turn = turn
        self._bind(turn, model_id)
        if self._terminated or self._closed:
            # Nothing starts on a torn-down session: drop this response and
            # stop the model producing it.
            turn.state = _State.STOPPED
            if not self._closed:
                self._spawn(self._interrupt_model(turn))
            return turn
        async with self._calls:
            try:
                response = await self._session.start(self._source)
            except SessionTerminated:
                self._on_terminated()
                turn.state = _State.STOPPED
                self._spawn(self._interrupt_model(turn))
                return turn
            except RespcoordError as error:
                self.stats.start_failures += 1
                _log.warning("respcoord Start failed, the response is dropped: %s", error)
                turn.state = _State.STOPPED
                self._spawn(self._interrupt_model(turn))
                return turn
        self.stats.responses_started += 1
        turn.response = response
        if self._closed or turn.state is not _State.LIVE:
            response.release()
            return turn
        # A stop the watch applied first calls back at once.
        turn.remove_stop = response.on_stop(lambda reason: self._on_stop(turn, reason))
        return turn

    def _bind(self, turn: _Turn, model_id: str | None) -> None:
        turn.model_ids.append(model_id)
        if model_id is not None:
            self._by_model_id[model_id] = turn
            trim(self._by_model_id)

    async def _turn_ended(self, model_id: str | None) -> None:
        turn = self._turn
        if turn is None or (model_id is not None and model_id not in turn.model_ids):
            return
        if turn.pending_tools > 0 and turn.state in (_State.LIVE, _State.STOPPED):
            # A tool call or handoff: the SDK sends its output and starts the
            # follow-up response, which is still this response.
            turn.pending_tools = 0
            turn.awaiting_follow_up = True
            if turn.state is _State.LIVE:
                turn.state = _State.FOLLOW_UP
            return
        self._turn = None
        if turn.state is not _State.LIVE or turn.response is None:
            return
        turn.state = _State.DONE
        self._forget(turn)
        async with self._calls:
            try:
                finished = await turn.response.finish(Terminal.COMPLETED)
            except RespcoordError as error:
                self.stats.finish_failures += 1
                _log.warning("respcoord Finish of %s failed: %s", turn.response.id, error)
                return
        if finished is not Finished.NOT_SENT:
            self.stats.responses_finished += 1

    async def _audio_interrupted(self, item_id: str) -> None:
        """The model stopped playing an item. For audio of the live response
        it is the user barging in here; for audio whose response already
        stopped (our own interrupt coming back) or finished it is not."""
        turn = self._by_item.get(item_id)
        if turn is None or not turn.passes() or turn is not self._turn:
            if turn is not None and turn.state is _State.STOPPED:
                turn.model_interrupted = True
            else:
                self.stats.false_interruptions += 1
            return
        turn.model_interrupted = True
        await self._interruption(turn)

    async def _interruption(self, turn: _Turn | None) -> int | None:
        """End our response now and Cancel, fenced with ``if_response_id``,
        so that neither a retry nor a late call cancels a response started
        afterwards: ours if it was live here, else the one the coordinator has
        live (another process's)."""
        self.stats.interruptions_detected += 1
        own: int | None = None
        if turn is not None and turn.passes() and turn.response is not None:
            own = turn.response.id
            self._stop_here(turn, StopReason.CANCELLED)
            self.stats.responses_interrupted += 1
        if self._terminated or self._closed:
            return None
        cancelled: int | None = None
        async with self._calls:
            try:
                if own is not None:
                    cancelled = await self._cancel(own)
                if cancelled is None:
                    state = await self._session.state()
                    if state.phase is Phase.ACTIVE and state.response_id not in (None, own):
                        assert state.response_id is not None
                        cancelled = await self._cancel(state.response_id)
            except SessionTerminated:
                self._on_terminated()
            except RespcoordError as error:
                _log.warning("respcoord Cancel for an interruption failed: %s", error)
        self.stats.barge_ins += 1
        return cancelled

    async def _cancel(self, response_id: int) -> int | None:
        cancelled = await self._session.cancel(
            source=self._interruption_source, if_response_id=response_id
        )
        if cancelled == response_id:
            self.stats.barge_ins_applied += 1
            return cancelled
        return None

    # ---- stops ----

    def _on_stop(self, turn: _Turn, reason: StopReason) -> None:
        """The response's fence closed (called in the step that closed it)."""
        if reason in _LOCAL_REASONS or turn.state in (_State.STOPPED, _State.DONE):
            if turn.response is not None and reason not in _LOCAL_REASONS:
                self._record(turn.response.id, reason)
            return
        self._stop_here(turn, reason)
        self.stats.responses_stopped += 1
        if reason in _TERMINAL_REASONS:
            self._on_terminated()
        if not self._closed:
            self._spawn(self._interrupt_model(turn))

    def _stop_here(self, turn: _Turn, reason: StopReason) -> None:
        """Closes the response here: none of its audio passes from now on."""
        turn.state = _State.STOPPED
        self._forget(turn)
        if turn.response is not None:
            self._record(turn.response.id, reason)
            notify_stop(self._on_stop_callback, turn.response.id, reason, _log)

    def _record(self, response_id: int, reason: StopReason) -> None:
        self._stops.record(response_id, reason)

    async def _interrupt_model(self, turn: _Turn) -> None:
        """Interrupts the model for this response only: what
        ``RealtimeSession.interrupt()`` sends, scoped to the provider's
        response id, so that a late interrupt never cuts the next response.
        The model answers with ``audio_interrupted`` for the response's
        audio, which the application sees and flushes its player on."""
        if turn.model_interrupted or self._realtime_closed():
            return
        turn.model_interrupted = True
        model_id = turn.model_ids[-1] if turn.model_ids else None
        try:
            await self._realtime.model.send_event(
                RealtimeModelSendInterrupt(force_response_cancel=True, response_id=model_id)
            )
        except Exception as error:
            _log.warning("interrupting the realtime model failed: %s", error)
            return
        self.stats.model_interrupts += 1

    def _realtime_closed(self) -> bool:
        # RealtimeSession has no public "closed" flag.
        return bool(getattr(self._realtime, "_closing", False)) or bool(
            getattr(self._realtime, "_closed", False)
        )

    def _on_terminated(self) -> None:
        if not self._terminated:
            self._terminated = True
            _log.warning(
                "respcoord session %r is terminated; no further audio of this session passes",
                self._session.id,
            )

    def _let_go(self, turn: _Turn) -> None:
        """Releases the handle (nothing sent; its fence closes with
        ``RELEASED``, which does not interrupt the model)."""
        if turn.state is not _State.DONE:
            turn.state = _State.STOPPED
        self._forget(turn)
        if turn.response is not None:
            turn.response.release()

    def _forget(self, turn: _Turn) -> None:
        if turn.remove_stop is not None:
            turn.remove_stop()
            turn.remove_stop = None

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        turn = self._turn
        self._turn = None
        if turn is not None and turn.passes():
            self.stats.responses_released += 1
            self._let_go(turn)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

"""Pipecat pipelines whose bot responses obey respcoord.

:class:`ResponseGate` is a Pipecat ``FrameProcessor`` placed after the
LLM/TTS and before the output transport::

    pipeline = Pipeline([
        transport.input(), stt, user_aggregator, llm, tts,
        ResponseGate(client.session(call_id)),
        transport.output(), assistant_aggregator,
    ])

It puts each bot response of the pipeline under the coordinator:

- the pipeline's ``StartFrame`` opens the session's watch
  (``Session.open_watch``), so a stop right after a response's Start needs
  no Watch set-up;
- each response (``LLMFullResponseStartFrame`` downstream, or the first
  output frame outside a response) starts a respcoord response on the
  session; its frames wait in the gate until the Start is confirmed;
- a response's output frames leave the gate only while its fence is current:
  once the coordinator stopped it (superseded, cancelled or shut down, by any
  process) none of its frames passes; they are dropped and counted;
- an interruption detected in this pipeline (an ``InterruptionFrame``
  reaching the gate) goes through the coordinator as a fenced Cancel of the
  live response, so every other gateway on the session stops too;
- a stop made elsewhere interrupts this pipeline the Pipecat way
  (:meth:`FrameProcessor.broadcast_interruption`: an ``InterruptionFrame``
  upstream to the LLM/TTS and downstream to the output transport);
- the end of a response (``LLMFullResponseEndFrame`` leaving the gate) is
  reported with exactly one Finish; a stopped response sends none.

Tested with pipecat-ai 1.14.0 (docs/pipecat.md).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass
from enum import Enum
from functools import partial
from typing import Any, Final

try:
    from loguru import logger
    from pipecat.frames.frames import (
        AggregatedTextFrame,
        CancelFrame,
        EndFrame,
        Frame,
        InterruptionFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        OutputAudioRawFrame,
        OutputImageRawFrame,
        StartFrame,
        SystemFrame,
        TTSStartedFrame,
        TTSStoppedFrame,
    )
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
except ImportError as error:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        "respcoord.pipecat needs Pipecat: "
        'pip install "respcoord[pipecat]" (tested with pipecat-ai 1.14.0)'
    ) from error

from respcoord._client import Response, Session
from respcoord._enums import Finished, Phase, Source, StopReason, Terminal
from respcoord._errors import RespcoordError, SessionTerminated
from respcoord._gate import LOCAL_REASONS as _LOCAL_REASONS
from respcoord._gate import TERMINAL_REASONS as _TERMINAL_REASONS
from respcoord._gate import StopRecord, StopRecords, begin_serving, trim

__all__ = [
    "DEFAULT_OUTPUT_FRAMES",
    "RESPONSE_ID_METADATA",
    "GateStats",
    "ResponseGate",
    "StopRecord",
]

PIPECAT_TESTED_VERSION: Final = "1.14.0"
"""The pipecat-ai release this module is tested with."""

RESPONSE_ID_METADATA: Final = "respcoord.response_id"
"""Key in ``Frame.metadata`` under which the gate stamps, on every output
frame it lets through, the id of the response the frame belongs to (for
downstream processors, observers and tests)."""

_ORIGIN_METADATA: Final = "respcoord.interruption_origin"

DEFAULT_OUTPUT_FRAMES: Final[tuple[type[Frame], ...]] = (
    OutputAudioRawFrame,
    OutputImageRawFrame,
    LLMTextFrame,
    AggregatedTextFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
"""What a bot emits for a response: audio (``TTSAudioRawFrame`` is an
``OutputAudioRawFrame``), images, LLM text, the TTS's aggregated and spoken
text (``TTSTextFrame``), and the TTS's start/stop markers.
``LLMFullResponseStartFrame``/``EndFrame`` are always response frames: they
delimit a response. User transcriptions, control and system frames are not
output and pass untouched."""

_MAX_DEAD_CONTEXTS: Final = 256


@dataclass
class GateStats:
    """Counters of one :class:`ResponseGate`, for tests and metrics. Read
    them; the gate updates them in place."""

    frames_passed: int = 0
    """Output frames that left the gate while their response was current."""
    frames_dropped: int = 0
    """Output frames the gate dropped: of a response stopped (by the
    coordinator or by an interruption here), of a response whose Start
    failed, or after the session was torn down."""
    frames_unattributed: int = 0
    """End markers (``LLMFullResponseEndFrame``, ``TTSStoppedFrame``) that
    arrived outside any response and passed (they carry no output)."""
    responses_started: int = 0
    """Starts the coordinator confirmed."""
    responses_finished: int = 0
    """Responses whose Finish(COMPLETED) was sent (applied or stale)."""
    responses_stopped: int = 0
    """Responses the coordinator stopped before their end, from any process
    (superseded, cancelled, shut down, expired, gone)."""
    responses_interrupted: int = 0
    """Responses ended by an interruption detected in this pipeline."""
    responses_replaced: int = 0
    """Responses replaced by this pipeline's next response before their end."""
    responses_released: int = 0
    """Responses let go of unfinished at the pipeline's end (EndFrame,
    CancelFrame): nothing was sent for them."""
    start_failures: int = 0
    """Starts that failed (after the client's retries), other than on a
    terminated session."""
    finish_failures: int = 0
    interruptions_detected: int = 0
    """Interruptions that reached the gate from this pipeline."""
    barge_ins: int = 0
    """Cancels this gate made for those interruptions (completed calls)."""
    barge_ins_applied: int = 0
    """... of which cancelled a response (this pipeline's or another's)."""
    interruptions_pushed: int = 0
    """Interruptions the gate broadcast because the coordinator stopped this
    pipeline's response (``broadcast_interruption``)."""
    max_held_frames: int = 0
    """The most frames one response held while its Start was in flight."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _State(Enum):
    PENDING = "pending"
    """Opened; its Start is not confirmed yet: its frames are held."""
    LIVE = "live"
    """Confirmed; its frames pass while its fence is current."""
    ENDING = "ending"
    """Its end frame left the gate; its Finish is queued."""
    STOPPED = "stopped"
    """Stopped before its end; while it is the gate's current response it
    absorbs (drops) the frames still arriving for it."""
    DONE = "done"


class _Turn:
    """One bot response as the gate sees it."""

    __slots__ = (
        "contexts",
        "end_context",
        "explicit",
        "interrupted",
        "pending",
        "remove_stop",
        "response",
        "settled",
        "state",
    )

    def __init__(self, *, explicit: bool, end_context: str | None) -> None:
        self.explicit = explicit
        """Opened by an ``LLMFullResponseStartFrame`` (ends at the matching
        end frame); otherwise opened by an output frame outside a response
        (ends at the TTS context's ``TTSStoppedFrame`` as well)."""
        self.end_context = end_context
        self.contexts: set[str] = set()
        """TTS context ids seen in this response."""
        self.state = _State.PENDING
        self.response: Response | None = None
        self.pending: deque[tuple[Frame, FrameDirection]] = deque()
        self.settled = asyncio.Event()
        """Set once the frames held for the Start have been flushed."""
        self.interrupted = False
        self.remove_stop: Callable[[], None] | None = None

    def passes(self) -> bool:
        """The fence check for one output frame."""
        return (
            self.state in (_State.PENDING, _State.LIVE)
            and self.response is not None
            and self.response.is_current()
        )


_Command = Callable[[], Awaitable[None]]


def _context_id(frame: Frame) -> str | None:
    value: object = getattr(frame, "context_id", None)
    return value if isinstance(value, str) else None


class ResponseGate(FrameProcessor):
    """Gates a pipeline's bot output on respcoord; see the module docs.

    ``session`` is the pipeline's respcoord session (``client.session(id)``);
    its client must run on the pipeline's event loop. ``source`` is recorded
    on this gate's Starts, ``interruption_source`` on its Cancels.
    ``output_frames`` are the frame types that are a response's output
    (:data:`DEFAULT_OUTPUT_FRAMES`); ``interruption_frames`` the frames that
    mean "the user interrupted" (Pipecat 1.14 broadcasts an
    ``InterruptionFrame`` when the user starts speaking and interruptions are
    enabled; add ``UserStartedSpeakingFrame`` to cancel on it too).
    ``max_held_frames`` bounds the frames one response holds while its Start
    is in flight (beyond it the gate waits, which backs up Pipecat's queue).
    ``end_timeout`` bounds how long an ``EndFrame`` waits for the gate's
    outstanding coordinator calls (Starts, Finishes, Cancels).

    Event handlers (Pipecat's ``@gate.event_handler(name)``):
    ``on_response_started(gate, response_id)``,
    ``on_response_finished(gate, response_id, finished)``,
    ``on_response_stopped(gate, response_id, reason)`` (the coordinator
    stopped it, from any process; after the interruption was pushed),
    ``on_barge_in(gate, cancelled_response_id)`` (the Cancel for an
    interruption here is done; ``None`` if it found nothing live to cancel)
    and ``on_session_terminated(gate)``.
    """

    def __init__(
        self,
        session: Session,
        *,
        source: Source = Source.CLIENT,
        interruption_source: Source = Source.VAD,
        output_frames: tuple[type[Frame], ...] = DEFAULT_OUTPUT_FRAMES,
        interruption_frames: tuple[type[Frame], ...] = (InterruptionFrame,),
        max_held_frames: int = 512,
        end_timeout: float = 15.0,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        if max_held_frames < 1:
            raise ValueError("max_held_frames must be at least 1")
        self._session = session
        self._source = source
        self._interruption_source = interruption_source
        self._response_frames: tuple[type[Frame], ...] = (
            LLMFullResponseStartFrame,
            LLMFullResponseEndFrame,
            *output_frames,
        )
        self._interruption_frames = interruption_frames
        self._max_held = max_held_frames
        self._end_timeout = end_timeout
        self.stats = GateStats()
        self._turn: _Turn | None = None
        """The response arriving frames belong to."""
        self._held: _Turn | None = None
        """The newest response whose held frames are not flushed yet: other
        frames queue behind it, so the gate keeps the pipeline's order."""
        self._owned: set[_Turn] = set()
        """Responses holding a live handle."""
        self._commands: asyncio.Queue[_Command] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stops = StopRecords()
        self._dead_contexts: OrderedDict[str, None] = OrderedDict()
        self._barge_in_queued = False
        self._terminated = False
        self._closed = False
        self._origin = f"{self.name}#{id(self)}"
        self._passing: set[int] = set()
        for event in (
            "on_response_started",
            "on_response_finished",
            "on_response_stopped",
            "on_barge_in",
            "on_session_terminated",
        ):
            self._register_event_handler(event)

    # ---- what tests and metrics read ----

    @property
    def session(self) -> Session:
        return self._session

    @property
    def terminated(self) -> bool:
        """True once the gate learned that the session was torn down: from
        then on no output passes."""
        return self._terminated

    @property
    def live_response_id(self) -> int | None:
        """The response whose frames pass now, if any."""
        turn = self._turn
        if turn is not None and turn.passes() and turn.response is not None:
            return turn.response.id
        return None

    def stop_record(self, response_id: int) -> StopRecord | None:
        """Why and when this gate saw its response ``response_id`` stop
        (the latest responses only), or ``None``."""
        return self._stops.get(response_id)

    # ---- Pipecat ----

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, SystemFrame):
            await self._system_frame(frame, direction)
        elif direction is FrameDirection.UPSTREAM:
            await self.push_frame(frame, direction)
        elif isinstance(frame, EndFrame):
            await self._end(frame)
        elif isinstance(frame, self._response_frames):
            await self._response_frame(frame)
        else:
            await self._other_frame(frame)

    async def push_frame(
        self, frame: Frame, direction: FrameDirection = FrameDirection.DOWNSTREAM
    ) -> None:
        # Interruptions this gate creates (broadcast_interruption) are marked,
        # so one that comes back is never taken for the user interrupting.
        if (
            isinstance(frame, InterruptionFrame)
            and frame.id not in self._passing
            and _ORIGIN_METADATA not in frame.metadata
        ):
            frame.metadata[_ORIGIN_METADATA] = self._origin
        await super().push_frame(frame, direction)

    async def cleanup(self) -> None:
        await super().cleanup()  # type: ignore[no-untyped-call]  # pipecat leaves it unannotated
        self._close()
        for task in [*self._tasks, *([self._worker] if self._worker else [])]:
            await self.cancel_task(task)
        self._tasks.clear()
        self._worker = None

    # ---- frames ----

    async def _system_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, StartFrame):
            # The pipeline begins serving the session: its watch opens now.
            begin_serving(self._session)
        elif isinstance(frame, CancelFrame):
            self._close()
        elif (
            isinstance(frame, self._interruption_frames)
            and frame.metadata.get(_ORIGIN_METADATA) != self._origin
        ):
            self._interruption_here()
        self._passing.add(frame.id)
        try:
            await self.push_frame(frame, direction)
        finally:
            self._passing.discard(frame.id)

    async def _wait_for_room(self) -> None:
        """Backpressure while a Start is in flight: at most
        ``max_held_frames`` wait in the gate. Waits before the frame is
        looked at, so what a frame belongs to is decided in arrival order."""
        while (held := self._held) is not None and len(held.pending) >= self._max_held:
            await held.settled.wait()

    def _attribute(self, frame: Frame) -> _Turn | None:
        """The response an arriving output frame belongs to, opening one if
        it begins a response; ``None`` if the frame was dropped or is an end
        marker outside any response."""
        turn = self._turn
        context = _context_id(frame)
        if context is not None and context in self._dead_contexts:
            # A late frame of a stopped response's TTS context, even after
            # the next response began.
            self.stats.frames_dropped += 1
            return None
        if isinstance(frame, LLMFullResponseStartFrame):
            if turn is not None and turn.state in (_State.PENDING, _State.LIVE):
                self._replace(turn)
            return self._open(explicit=True, end_context=None)
        if turn is None:
            if isinstance(frame, (LLMFullResponseEndFrame, TTSStoppedFrame)):
                return None
            return self._open(explicit=False, end_context=_context_id(frame))
        if turn.state is _State.STOPPED:
            if self._reopens(turn, frame):
                return self._open(explicit=False, end_context=_context_id(frame))
            # A frame of the stopped response, still in flight from the
            # LLM/TTS: it never leaves.
            self.stats.frames_dropped += 1
            if context is not None:
                turn.contexts.add(context)
                self._bury_context(context)
            if self._ends(turn, frame):
                self._turn = None
            return None
        return turn

    def _stop_here(self, turn: _Turn) -> None:
        """Marks a response stopped; frames of its TTS contexts are dropped
        from now on wherever they turn up."""
        turn.state = _State.STOPPED
        for context in turn.contexts:
            self._bury_context(context)

    def _bury_context(self, context: str) -> None:
        self._dead_contexts[context] = None
        trim(self._dead_contexts, _MAX_DEAD_CONTEXTS)

    async def _response_frame(self, frame: Frame) -> None:
        await self._wait_for_room()
        if self._terminated or self._closed:
            self.stats.frames_dropped += 1
            return
        unattributed = self._turn is None and _context_id(frame) not in self._dead_contexts
        turn = self._attribute(frame)
        if turn is None:
            if unattributed:
                # An end marker outside any response: nothing to gate.
                self.stats.frames_unattributed += 1
                await self.push_frame(frame)
            return
        context = _context_id(frame)
        if context is not None:
            turn.contexts.add(context)
        if self._ends(turn, frame):
            # Frames after the end belong to the next response. The Finish is
            # queued now, so it runs after this response's Start and flush and
            # before the next response's Start; it is sent only if the end
            # frame got out (the response is then ``ENDING``).
            self._turn = None
            self._enqueue(partial(self._finish, turn))
        if turn.state is _State.PENDING:
            turn.pending.append((frame, FrameDirection.DOWNSTREAM))
            self.stats.max_held_frames = max(self.stats.max_held_frames, len(turn.pending))
        else:
            await self._emit(turn, frame, FrameDirection.DOWNSTREAM)

    async def _other_frame(self, frame: Frame) -> None:
        await self._wait_for_room()
        held = self._held
        if held is not None:
            held.pending.append((frame, FrameDirection.DOWNSTREAM))
        else:
            await self.push_frame(frame)

    async def _emit(self, turn: _Turn, frame: Frame, direction: FrameDirection) -> None:
        """Lets a frame out. An output frame passes only if its response is
        current at this instant: the fence check and the push are one step."""
        if not isinstance(frame, self._response_frames):
            await self.push_frame(frame, direction)
            return
        if not turn.passes() or turn.response is None:
            self.stats.frames_dropped += 1
            return
        frame.metadata[RESPONSE_ID_METADATA] = turn.response.id
        self.stats.frames_passed += 1
        if self._ends(turn, frame):
            turn.state = _State.ENDING
        await self.push_frame(frame, direction)

    @staticmethod
    def _ends(turn: _Turn, frame: Frame) -> bool:
        if isinstance(frame, LLMFullResponseEndFrame):
            return True
        if not turn.explicit and isinstance(frame, TTSStoppedFrame):
            return turn.end_context is None or _context_id(frame) == turn.end_context
        return False

    @staticmethod
    def _reopens(turn: _Turn, frame: Frame) -> bool:
        """A new TTS context after a stopped response that was not opened by
        an ``LLMFullResponseStartFrame``: the next utterance (a
        ``TTSSpeakFrame``), not a late frame of the stopped one."""
        context = _context_id(frame)
        return (
            not turn.explicit
            and isinstance(frame, TTSStartedFrame)
            and bool(turn.contexts)
            and context is not None
            and context not in turn.contexts
        )

    async def _end(self, frame: EndFrame) -> None:
        """The pipeline ends after the frames ahead of this one: let the held
        frames out and the queued Finishes go, then release what is left."""
        if self._worker is not None:
            try:
                await asyncio.wait_for(self._commands.join(), self._end_timeout)
            except TimeoutError:
                logger.warning(
                    f"{self}: respcoord calls still outstanding after {self._end_timeout} s "
                    "at the end of the pipeline"
                )
        self._close()
        await self.push_frame(frame)

    # ---- responses ----

    def _open(self, *, explicit: bool, end_context: str | None) -> _Turn:
        turn = _Turn(explicit=explicit, end_context=end_context)
        self._turn = turn
        self._held = turn
        self._enqueue(partial(self._start, turn))
        return turn

    def _replace(self, turn: _Turn) -> None:
        """This pipeline began its next response before the current one
        ended: the next Start supersedes it at the coordinator."""
        self._stop_here(turn)
        self.stats.responses_replaced += 1
        self._let_go(turn)

    def _let_go(self, turn: _Turn) -> None:
        """Releases the handle (nothing sent; its fence closes with
        ``RELEASED``, which does not interrupt the pipeline)."""
        if turn.response is not None:
            turn.response.release()
        self._forget(turn)

    def _forget(self, turn: _Turn) -> None:
        self._owned.discard(turn)
        if turn.remove_stop is not None:
            turn.remove_stop()
            turn.remove_stop = None

    async def _start(self, turn: _Turn) -> None:
        try:
            if turn.state is _State.PENDING and not (self._terminated or self._closed):
                await self._send_start(turn)
            if turn.state is _State.PENDING and turn.response is None:
                self._stop_here(turn)
            while turn.pending:
                frame, direction = turn.pending.popleft()
                await self._emit(turn, frame, direction)
            # No await between the last check of ``pending`` and this: a frame
            # arriving now is either flushed above or emitted directly.
            if turn.state is _State.PENDING:
                turn.state = _State.LIVE
        finally:
            turn.settled.set()
            if self._held is turn:
                self._held = None

    async def _send_start(self, turn: _Turn) -> None:
        try:
            response = await self._session.start(self._source)
        except SessionTerminated:
            self._on_terminated()
            self._cannot_run(turn)
            return
        except RespcoordError as error:
            self.stats.start_failures += 1
            logger.warning(f"{self}: respcoord Start failed, the response is dropped: {error}")
            self._cannot_run(turn)
            return
        self.stats.responses_started += 1
        turn.response = response
        if turn.state is not _State.PENDING or self._closed:
            # Interrupted, replaced or closed while the Start was in flight.
            response.release()
            if self._closed and not turn.interrupted:
                self.stats.responses_released += 1
            if turn.interrupted:
                await self._cancel(response.id)
            return
        self._owned.add(turn)
        # A response stopped already (a replayed Start, or a stop the watch
        # applied first) calls back at once: its held frames are dropped.
        turn.remove_stop = response.on_stop(partial(self._on_stop, turn))
        await self._call_event_handler("on_response_started", response.id)

    def _cannot_run(self, turn: _Turn) -> None:
        """The Start failed: the response's frames are dropped (fail
        closed), and the LLM/TTS are interrupted so they stop producing it,
        unless the pipeline has moved on to another response."""
        if self._turn is turn and not self._closed:
            self._spawn(self._interrupt())

    async def _finish(self, turn: _Turn) -> None:
        if turn.state is not _State.ENDING or turn.response is None:
            return
        response = turn.response
        try:
            finished = await response.finish(Terminal.COMPLETED)
        except RespcoordError as error:
            self.stats.finish_failures += 1
            logger.warning(f"{self}: respcoord Finish of {response.id} failed: {error}")
            return
        finally:
            if turn.state is _State.ENDING:
                turn.state = _State.DONE
            self._forget(turn)
        if finished is not Finished.NOT_SENT:
            self.stats.responses_finished += 1
        await self._call_event_handler("on_response_finished", response.id, finished)

    def _on_stop(self, turn: _Turn, reason: StopReason) -> None:
        """The response's fence closed (called in the step that closed it)."""
        response = turn.response
        if response is None:
            return
        self._stops.record(response.id, reason, replace=True)
        if reason in _LOCAL_REASONS or turn.state in (_State.STOPPED, _State.DONE):
            return
        self._stop_here(turn)
        self.stats.responses_stopped += 1
        self._forget(turn)
        if reason in _TERMINAL_REASONS:
            self._on_terminated()
        if self._closed:
            return
        # A late stop of a response whose frames are all out (its Finish was
        # still queued) does not interrupt the response the pipeline has
        # moved on to.
        interrupt = self._turn is None or self._turn is turn
        self._spawn(self._stopped(response.id, reason, interrupt=interrupt))

    async def _stopped(self, response_id: int, reason: StopReason, *, interrupt: bool) -> None:
        if interrupt:
            await self._interrupt()
        await self._call_event_handler("on_response_stopped", response_id, reason)

    async def _interrupt(self) -> None:
        """Interrupts the pipeline the Pipecat way: the LLM and TTS stop
        generating, the output transport drops what it buffered."""
        await self.broadcast_interruption()  # type: ignore[no-untyped-call]  # unannotated in pipecat
        self.stats.interruptions_pushed += 1

    def _interruption_here(self) -> None:
        """The user interrupted in this pipeline: end our response now and
        cancel the live one at the coordinator, wherever it runs."""
        self.stats.interruptions_detected += 1
        own: int | None = None
        turn = self._turn
        if turn is not None and turn.state in (_State.PENDING, _State.LIVE):
            self._stop_here(turn)
            turn.interrupted = True
            self.stats.responses_interrupted += 1
            if turn.response is not None:
                own = turn.response.id
                self._let_go(turn)
        if self._terminated or self._closed:
            return
        if own is None and self._barge_in_queued:
            return  # one already queued covers this one (UserStarted + Interruption)
        self._barge_in_queued = True
        self._enqueue(partial(self._barge_in, own))

    async def _barge_in(self, own: int | None) -> None:
        """Cancel, fenced with ``if_response_id``, so that neither a retry nor
        a late call cancels a response started after the interruption was
        handled: ours if it was live here, else the one the coordinator has
        live (another gateway's)."""
        self._barge_in_queued = False
        cancelled: int | None = None
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
            logger.warning(f"{self}: respcoord Cancel for an interruption failed: {error}")
        self.stats.barge_ins += 1
        await self._call_event_handler("on_barge_in", cancelled)

    async def _cancel(self, response_id: int) -> int | None:
        """Cancels ``response_id`` if it is still the live one; returns it if
        this call cancelled it."""
        cancelled = await self._session.cancel(
            source=self._interruption_source, if_response_id=response_id
        )
        if cancelled == response_id:
            self.stats.barge_ins_applied += 1
            return cancelled
        return None

    def _on_terminated(self) -> None:
        if self._terminated:
            return
        self._terminated = True
        logger.warning(
            f"{self}: respcoord session {self._session.id!r} is terminated; "
            "no further output of this pipeline passes"
        )
        if not self._closed:
            self._spawn(self._call_event_handler("on_session_terminated"))

    def _close(self) -> None:
        """The pipeline ends: release every response still held (nothing is
        sent: the coordinator keeps it until it is superseded, cancelled or
        expires)."""
        if self._closed:
            return
        self._closed = True
        turns = {*self._owned, *(t for t in (self._turn, self._held) if t is not None)}
        for turn in turns:
            if turn.response is not None and turn in self._owned:
                self.stats.responses_released += 1
            if turn.state is not _State.DONE:
                turn.state = _State.STOPPED
            self._let_go(turn)

    # ---- tasks ----

    def _enqueue(self, command: _Command) -> None:
        """The gate's coordinator calls run one at a time, in the order the
        frames that caused them arrived: a response's Start, the flush of its
        held frames, its Finish, a barge-in's Cancel."""
        if self._worker is None:
            self._worker = self.create_task(self._run_commands(), name="respcoord_commands")
        self._commands.put_nowait(command)

    async def _run_commands(self) -> None:
        while True:
            command = await self._commands.get()
            try:
                await command()
            except Exception as error:  # one failed call must not stop the gate
                logger.exception(f"{self}: respcoord call failed: {error}")
            finally:
                self._commands.task_done()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = self.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

"""respcoord.pipecat with the real pipecat-ai (its own test utilities,
``pipecat.tests.utils.run_test``) against the real scenario fixture server.

Frames that must arrive after a stop are held back by a ``Holder`` processor
until the test has seen the stop (a condition, never a sleep), so what
passes and what is dropped does not depend on timing."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from _integration import run_two_process_example, until
from conftest import Servers
from harness import Recording, within
from loguru import logger
from pipecat.frames.frames import (
    DataFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.frame_processor import FrameCallback, FrameDirection, FrameProcessor
from pipecat.tests.utils import run_test

import respcoord
from respcoord.pipecat import RESPONSE_ID_METADATA, ResponseGate


@pytest.fixture(autouse=True)
def quiet_pipecat() -> Iterator[list[str]]:
    """Pipecat logs every frame link at DEBUG; keep warnings, and collect
    them for the tests that count them."""
    warnings: list[str] = []
    logger.remove()
    handlers = [
        logger.add(sys.stderr, level="WARNING"),
        logger.add(warnings.append, level="WARNING", format="{message}"),
    ]
    yield warnings
    for handler in handlers:
        logger.remove(handler)


@dataclass
class Hold(DataFrame):
    """Holds the frames behind it in the ``Holder`` until ``until`` is set."""

    until: asyncio.Event = field(default_factory=asyncio.Event)
    interruptible: bool = field(default=False, init=False)


class Holder(FrameProcessor):
    """Stands for the LLM/TTS upstream of the gate."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, Hold):
            await frame.until.wait()
        else:
            await self.push_frame(frame, direction)


class Recorder(FrameProcessor):
    """Stands for the output transport. Checks, at the moment a frame
    leaves the gate (the gate's push calls this ``queue_frame``), whether
    the gate had already seen that frame's response stop."""

    def __init__(self, gate: ResponseGate) -> None:
        super().__init__()
        self.gate = gate
        self.passed: list[Frame] = []
        self.after_stop = 0
        self.interruptions = 0

    async def queue_frame(
        self,
        frame: Frame,
        direction: FrameDirection = FrameDirection.DOWNSTREAM,
        callback: FrameCallback | None = None,
    ) -> None:
        response_id = frame.metadata.get(RESPONSE_ID_METADATA)
        if direction is FrameDirection.DOWNSTREAM and isinstance(response_id, int):
            self.passed.append(frame)
            if self.gate.stop_record(response_id) is not None:
                self.after_stop += 1
        await super().queue_frame(frame, direction, callback)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, InterruptionFrame) and direction is FrameDirection.DOWNSTREAM:
            self.interruptions += 1
        await self.push_frame(frame, direction)


def audio(context: str = "c1") -> TTSAudioRawFrame:
    return TTSAudioRawFrame(
        audio=b"\0" * 320, sample_rate=16000, num_channels=1, context_id=context
    )


def after_hold(*frames: Frame) -> list[Frame]:
    """Frames queued behind a Hold: uninterruptible, so the interruption the
    gate pushes upstream does not flush them out of the Holder's queue
    before they reach the gate (the gate must drop them itself)."""
    for frame in frames:
        frame.interruptible = False
    return list(frames)


def response_ids(frames: list[Frame]) -> set[int]:
    return {
        value
        for frame in frames
        if isinstance(value := frame.metadata.get(RESPONSE_ID_METADATA), int)
    }


async def test_a_live_response_passes_and_is_finished_once(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    session = client.session("pc-live")
    gate = ResponseGate(session)
    recorder = Recorder(gate)
    down, _ = await run_test(
        Pipeline([gate, recorder]),
        frames_to_send=[
            LLMFullResponseStartFrame(),
            TTSStartedFrame(context_id="c1"),
            audio(),
            audio(),
            audio(),
            TTSStoppedFrame(context_id="c1"),
            LLMFullResponseEndFrame(),
        ],
        expected_down_frames=[
            LLMFullResponseStartFrame,
            TTSStartedFrame,
            TTSAudioRawFrame,
            TTSAudioRawFrame,
            TTSAudioRawFrame,
            TTSStoppedFrame,
            LLMFullResponseEndFrame,
        ],
        expected_up_frames=[],
    )
    (response_id,) = response_ids(list(down))
    assert response_ids(recorder.passed) == {response_id}
    # The EndFrame waits for the gate's Finish, so it is on the server now.
    assert await server.finishes(response_id) == 1
    state = await session.state()
    assert state.phase is respcoord.Phase.IDLE
    stats = gate.stats
    assert (stats.frames_passed, stats.frames_dropped) == (7, 0)
    assert (stats.responses_started, stats.responses_finished, stats.responses_stopped) == (1, 1, 0)
    assert stats.max_held_frames >= 1  # the start frame waited for the Start
    assert recorder.after_stop == 0
    print(f"\npipecat live response {response_id}: {stats.as_dict()}")


@pytest.mark.parametrize("how", ["cancel", "supersede", "shutdown"])
async def test_a_stop_by_another_client_drops_the_rest_and_interrupts(
    servers: Servers, how: str
) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    other = await servers.client(server.grpc)
    session_id = f"pc-stop-{how}"
    gate = ResponseGate(client.session(session_id))
    recorder = Recorder(gate)
    hold = Hold()
    replacement: list[respcoord.Response] = []

    async def stop_it_elsewhere() -> int:
        await until("three frames passed", lambda: gate.stats.frames_passed >= 3)
        response_id = gate.live_response_id
        assert response_id is not None
        elsewhere = other.session(session_id)
        if how == "cancel":
            assert await elsewhere.cancel(if_response_id=response_id) == response_id
        elif how == "supersede":
            replacement.append(await elsewhere.start(respcoord.Source.VAD))
        else:
            assert await elsewhere.shutdown() == response_id
        await until("the gate saw the stop", lambda: gate.stop_record(response_id) is not None)
        await until("the gate interrupted", lambda: gate.stats.interruptions_pushed == 1)
        hold.until.set()
        return response_id

    stopper = asyncio.create_task(stop_it_elsewhere())
    await run_test(
        Pipeline([Holder(), gate, recorder]),
        frames_to_send=[
            LLMFullResponseStartFrame(),
            TTSStartedFrame(context_id="c1"),
            audio(),
            hold,
            *after_hold(audio(), audio(), TTSStoppedFrame(context_id="c1")),
            *after_hold(LLMFullResponseEndFrame()),
        ],
        expected_down_frames=[
            LLMFullResponseStartFrame,
            TTSStartedFrame,
            TTSAudioRawFrame,
            InterruptionFrame,
        ],
        expected_up_frames=[InterruptionFrame],
    )
    response_id = await stopper
    reason = {
        "cancel": respcoord.StopReason.CANCELLED,
        "supersede": respcoord.StopReason.SUPERSEDED,
        "shutdown": respcoord.StopReason.SHUTDOWN,
    }[how]
    record = gate.stop_record(response_id)
    assert record is not None
    assert record.reason is reason
    assert response_ids(recorder.passed) == {response_id}
    assert len(recorder.passed) == 3
    assert recorder.after_stop == 0
    assert recorder.interruptions == 1
    stats = gate.stats
    assert (stats.frames_passed, stats.frames_dropped) == (3, 4)
    assert (stats.responses_started, stats.responses_finished, stats.responses_stopped) == (1, 0, 1)
    assert gate.terminated is (how == "shutdown")
    assert await server.finishes(response_id) == 0
    for response in replacement:
        await response.finish(respcoord.Terminal.COMPLETED)
    print(
        f"\npipecat stop by another client ({how}): frames passed {stats.frames_passed}, "
        f"dropped after the stop {stats.frames_dropped}, passed after the stop "
        f"{recorder.after_stop}"
    )


async def test_late_frames_of_a_stopped_context_are_dropped_in_the_next_response(
    servers: Servers,
) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    other = await servers.client(server.grpc)
    session_id = "pc-late-context"
    gate = ResponseGate(client.session(session_id))
    recorder = Recorder(gate)
    hold = Hold()

    async def cancel_elsewhere() -> None:
        await until("three frames passed", lambda: gate.stats.frames_passed == 3)
        response_id = gate.live_response_id
        assert response_id is not None
        await other.session(session_id).cancel(if_response_id=response_id)
        await until("the gate interrupted", lambda: gate.stats.interruptions_pushed == 1)
        hold.until.set()

    canceller = asyncio.create_task(cancel_elsewhere())
    await run_test(
        Pipeline([Holder(), gate, recorder]),
        frames_to_send=[
            LLMFullResponseStartFrame(),
            TTSStartedFrame(context_id="c1"),
            audio("c1"),
            hold,
            *after_hold(
                LLMFullResponseStartFrame(),
                audio("c1"),  # late, from the TTS context of the stopped response
                TTSStartedFrame(context_id="c2"),
                audio("c2"),
                LLMFullResponseEndFrame(),
            ),
        ],
        expected_down_frames=[
            LLMFullResponseStartFrame,
            TTSStartedFrame,
            TTSAudioRawFrame,
            InterruptionFrame,
            LLMFullResponseStartFrame,
            TTSStartedFrame,
            TTSAudioRawFrame,
            LLMFullResponseEndFrame,
        ],
        expected_up_frames=[InterruptionFrame],
    )
    await canceller
    first, second = sorted(response_ids(recorder.passed))
    late = [frame for frame in recorder.passed if getattr(frame, "context_id", None) == "c1"]
    assert all(frame.metadata[RESPONSE_ID_METADATA] == first for frame in late)
    assert gate.stats.frames_dropped == 1
    assert recorder.after_stop == 0
    assert await server.finishes(first) == 0
    assert await server.finishes(second) == 1


async def test_frames_wait_for_a_retried_start(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.proxy)
    gate = ResponseGate(client.session("pc-held"))
    recorder = Recorder(gate)
    await server.lose_next_start_reply()
    down, _ = await run_test(
        Pipeline([gate, recorder]),
        frames_to_send=[LLMFullResponseStartFrame(), audio(), audio(), LLMFullResponseEndFrame()],
        expected_down_frames=[
            LLMFullResponseStartFrame,
            TTSAudioRawFrame,
            TTSAudioRawFrame,
            LLMFullResponseEndFrame,
        ],
    )
    # Every frame that left carries the confirmed response's id: none went
    # out before the (retried) Start was answered.
    (response_id,) = response_ids(list(down))
    assert len(recorder.passed) == 4
    assert gate.stats.responses_started == 1
    assert await server.finishes(response_id) == 1


async def test_an_interruption_here_cancels_at_the_coordinator(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    session = client.session("pc-barge-own")
    gate = ResponseGate(session)
    recorder = Recorder(gate)
    holder = Holder()
    hold = Hold()
    watched: list[int] = []

    async def interrupt() -> None:
        await until("two frames passed", lambda: gate.stats.frames_passed >= 2)
        response_id = gate.live_response_id
        assert response_id is not None
        watched.append(response_id)
        # As the user turn processor upstream does when the user speaks.
        await holder.push_frame(InterruptionFrame())
        await until("the Cancel applied", lambda: gate.stats.barge_ins_applied == 1)
        hold.until.set()

    interrupter = asyncio.create_task(interrupt())
    await run_test(
        Pipeline([holder, gate, recorder]),
        frames_to_send=[
            LLMFullResponseStartFrame(),
            audio(),
            hold,
            *after_hold(audio(), LLMFullResponseEndFrame()),
        ],
        expected_down_frames=[LLMFullResponseStartFrame, TTSAudioRawFrame, InterruptionFrame],
        expected_up_frames=[],
    )
    await interrupter
    (response_id,) = watched
    state = await session.state()
    assert state.phase is respcoord.Phase.IDLE
    assert await server.finishes(response_id) == 0
    stats = gate.stats
    assert stats.responses_interrupted == 1
    assert stats.interruptions_pushed == 0  # the pipeline interrupted itself
    assert (stats.frames_passed, stats.frames_dropped) == (2, 2)


async def test_an_interruption_here_cancels_another_gateways_response(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    other = await servers.client(server.grpc)
    session_id = "pc-barge-other"
    response = await other.session(session_id).start(respcoord.Source.CLIENT)
    gate = ResponseGate(client.session(session_id))
    await run_test(
        gate,
        frames_to_send=[InterruptionFrame()],
        expected_down_frames=[InterruptionFrame],
        expected_up_frames=[],
    )
    assert await within("the other gateway's stop", response.stopped()) is (
        respcoord.StopReason.CANCELLED
    )
    assert gate.stats.barge_ins_applied == 1
    assert gate.stats.responses_started == 0


async def test_a_torn_down_session_lets_nothing_out(
    servers: Servers, quiet_pipecat: list[str]
) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    session = client.session("pc-torn-down")
    await session.shutdown()
    gate = ResponseGate(session)
    recorder = Recorder(gate)
    down, _ = await run_test(
        Pipeline([gate, recorder]),
        frames_to_send=[
            LLMFullResponseStartFrame(),
            audio(),
            LLMFullResponseEndFrame(),
            LLMFullResponseStartFrame(),
            audio(),
            LLMFullResponseEndFrame(),
        ],
    )
    assert not [frame for frame in down if not isinstance(frame, InterruptionFrame)]
    assert recorder.passed == []
    assert gate.terminated
    assert gate.stats.frames_dropped == 6
    assert gate.stats.responses_started == 0
    assert sum("is terminated" in message for message in quiet_pipecat) == 1


async def test_back_to_back_responses_are_each_finished_once(servers: Servers) -> None:
    """The second response's frames arrive while the first one's Start may
    still be in flight: its Start waits for the first one's Finish, so the
    first is completed, not superseded."""
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    recording = Recording(server.grpc, "pc-back-", 2)
    await recording.open()
    try:
        gate = ResponseGate(client.session("pc-back-to-back"))
        recorder = Recorder(gate)
        one = [LLMFullResponseStartFrame(), audio(), LLMFullResponseEndFrame()]
        two = [LLMFullResponseStartFrame(), audio(), LLMFullResponseEndFrame()]
        await run_test(Pipeline([gate, recorder]), frames_to_send=[*one, *two])
        await within("both responses ended", recording.all_ended.wait())
    finally:
        await recording.close()
    first, second = sorted(response_ids(recorder.passed))
    assert [frame.metadata[RESPONSE_ID_METADATA] for frame in recorder.passed] == [
        first,
        first,
        first,
        second,
        second,
        second,
    ]
    assert await server.finishes(first) == 1
    assert await server.finishes(second) == 1
    assert recording.ended == {first: 1, second: 1}
    assert (gate.stats.responses_finished, gate.stats.responses_stopped) == (2, 0)


async def test_a_new_response_here_supersedes_without_interrupting(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    gate = ResponseGate(client.session("pc-replace"))
    recorder = Recorder(gate)
    hold = Hold()

    async def release_when_live() -> None:
        await until("the first response is live", lambda: gate.stats.frames_passed == 2)
        hold.until.set()

    releaser = asyncio.create_task(release_when_live())
    await run_test(
        Pipeline([Holder(), gate, recorder]),
        frames_to_send=[
            LLMFullResponseStartFrame(),
            audio(),
            hold,
            # Pipecat's TTS opens a new context for each LLM response.
            *after_hold(LLMFullResponseStartFrame(), audio("c2"), LLMFullResponseEndFrame()),
        ],
        expected_down_frames=[
            LLMFullResponseStartFrame,
            TTSAudioRawFrame,
            LLMFullResponseStartFrame,
            TTSAudioRawFrame,
            LLMFullResponseEndFrame,
        ],
        expected_up_frames=[],
    )
    await releaser
    first, second = sorted(response_ids(recorder.passed))
    assert await server.finishes(first) == 0  # superseded by the second Start
    assert await server.finishes(second) == 1
    stats = gate.stats
    assert (stats.responses_replaced, stats.responses_finished) == (1, 1)
    assert stats.interruptions_pushed == 0


async def test_the_end_of_the_pipeline_releases_a_live_response(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    session = client.session("pc-released")
    gate = ResponseGate(session)
    down, _ = await run_test(
        gate,
        frames_to_send=[LLMFullResponseStartFrame(), audio()],
        expected_down_frames=[LLMFullResponseStartFrame, TTSAudioRawFrame],
    )
    (response_id,) = response_ids(list(down))
    assert gate.stats.responses_released == 1
    # Released sends nothing: the coordinator keeps it until it is
    # superseded, cancelled or expires.
    state = await session.state()
    assert state.response_id == response_id
    assert await server.finishes(response_id) == 0


async def test_speech_outside_an_llm_response_is_a_response_of_its_own(servers: Servers) -> None:
    """A ``TTSSpeakFrame`` utterance: TTS frames with no LLM markers."""
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    gate = ResponseGate(client.session("pc-speak"))
    down, _ = await run_test(
        gate,
        frames_to_send=[
            TTSStartedFrame(context_id="hello"),
            audio("hello"),
            TTSStoppedFrame(context_id="hello"),
            TTSStartedFrame(context_id="again"),
            audio("again"),
            TTSStoppedFrame(context_id="again"),
        ],
    )
    first, second = sorted(response_ids(list(down)))
    assert len(down) == 6
    assert await server.finishes(first) == 1
    assert await server.finishes(second) == 1


def test_without_pipecat_the_import_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    monkeypatch.delitem(sys.modules, "respcoord.pipecat")
    monkeypatch.setitem(sys.modules, "pipecat.frames.frames", None)
    with pytest.raises(ImportError, match=r'pip install "respcoord\[pipecat\]"'):
        importlib.import_module("respcoord.pipecat")


async def test_two_pipelines_in_two_processes(servers: Servers) -> None:
    """The example: gateway A (this test's child) streams TTS audio, gateway
    B (A's child, another process) barges in or answers; A's output stops."""
    server = await servers.fixture()
    rounds = 10
    report = await run_two_process_example(
        server, "pipecat_two_gateways.py", "pc-two-", rounds, 120
    )
    assert all(round_["a_interrupted"] for round_ in report["rounds"])
    assert report["a_bot_interruptions"] == rounds
    delays = sorted(r["delay_ms"] for r in report["rounds"])
    calls = sorted(r["b_call_ms"] for r in report["rounds"])
    a = report["a"]
    print(
        f"\npipecat two processes, {rounds} rounds: A's gate passed {a['frames_passed']} frames, "
        f"dropped {a['frames_dropped']} after the stops, passed {report['frames_after_stop']} "
        f"after it had observed a stop; InterruptionFrames in A's pipeline: "
        f"{report['a_bot_interruptions']} upstream, {report['a_speaker_interruptions']} "
        f"downstream; B's action to A's gate observing the stop: min {delays[0]:.2f} ms, "
        f"median {delays[len(delays) // 2]:.2f} ms, max {delays[-1]:.2f} ms (B's action to "
        f"B's call answered: median {calls[len(calls) // 2]:.2f} ms)"
    )

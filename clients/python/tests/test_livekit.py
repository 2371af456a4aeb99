"""respcoord.livekit with the real livekit-agents: ``AgentSession``s run
without a room (their audio output set directly to a recording sink, under
the gate), no VAD, no turn detector, no STT, no network; speeches come from
``session.say(text, audio=...)`` with frames the test pushes, or from a small
scripted LLM and an agent whose ``tts_node`` turns text into frames; against
the real scenario fixture server.

The test pushes each frame itself and waits for it to reach the sink (or for
the gate to have seen a stop: a condition, never a sleep), so what passes and
what is dropped does not depend on timing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from _integration import other_process, run_two_process_example, until
from conftest import Servers
from harness import Recording, within
from livekit import rtc
from livekit.agents import Agent, AgentSession, function_tool, llm
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, APIConnectOptions
from livekit.agents.voice import ModelSettings, SpeechHandle
from livekit.agents.voice.io import AudioOutput, AudioOutputCapabilities

import respcoord
from respcoord.livekit import RESPONSE_ID_USERDATA, ResponseGate


def frame() -> rtc.AudioFrame:
    return rtc.AudioFrame(b"\0\0" * 160, 16000, 1, 160)


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing in these tests reaches beyond loopback (no model download, no
    LiveKit server, no telemetry): a Python-level connect elsewhere fails."""
    connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else str(address)
        if self.family in (socket.AF_INET, socket.AF_INET6) and host not in (
            "127.0.0.1",
            "::1",
            "localhost",
        ):
            raise AssertionError(f"a test tried to connect to {address!r}")
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)


class Sink(AudioOutput):
    """The audio sink under the gate: records each frame's response and
    whether the gate had already seen that response stop when the frame
    arrived (a leak). A segment ends at flush; a clear interrupts it."""

    def __init__(self) -> None:
        super().__init__(label="test-sink", capabilities=AudioOutputCapabilities(pause=True))
        self.gate: ResponseGate | None = None
        self.frames: Counter[int | None] = Counter()
        self.leaked = 0
        self.clears = 0
        self.pauses = 0
        self.resumes = 0
        self._segment = False
        self._cleared = False
        self._pushed = 0.0

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if not self._segment:
            self._segment, self._cleared, self._pushed = True, False, 0.0
            self.on_playback_started(created_at=time.time())
        rid = frame.userdata.get(RESPONSE_ID_USERDATA)
        self.frames[rid] += 1
        if rid is None or (self.gate is not None and self.gate.stop_record(rid) is not None):
            self.leaked += 1
        self._pushed += frame.duration

    def flush(self) -> None:
        super().flush()
        if self._segment:
            self._segment = False
            self.on_playback_finished(playback_position=self._pushed, interrupted=self._cleared)

    def clear_buffer(self) -> None:
        self.clears += 1
        self._cleared = True

    def pause(self) -> None:
        self.pauses += 1

    def resume(self) -> None:
        self.resumes += 1


class Audio:
    """A speech's audio, frame by frame as the test pushes it."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[rtc.AudioFrame | None] = asyncio.Queue()

    def push(self, count: int = 1) -> None:
        for _ in range(count):
            self._queue.put_nowait(frame())

    def end(self) -> None:
        self._queue.put_nowait(None)

    async def frames(self) -> AsyncGenerator[rtc.AudioFrame, None]:
        while (item := await self._queue.get()) is not None:
            yield item


class ScriptedLLM(llm.LLM[Any]):
    """Answers each chat with the next scripted reply: text, tool calls."""

    def __init__(self) -> None:
        super().__init__()
        self.replies: list[tuple[str, list[llm.FunctionToolCall]]] = []

    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        parallel_tool_calls: Any = NOT_GIVEN,
        tool_choice: Any = NOT_GIVEN,
        extra_kwargs: Any = NOT_GIVEN,
    ) -> llm.LLMStream:
        reply = self.replies.pop(0) if self.replies else ("", [])
        return _Stream(self, reply, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


class _Stream(llm.LLMStream):
    def __init__(
        self,
        owner: ScriptedLLM,
        reply: tuple[str, list[llm.FunctionToolCall]],
        **kwargs: Any,
    ) -> None:
        super().__init__(owner, **kwargs)
        self._reply = reply

    async def _run(self) -> None:
        text, calls = self._reply
        if text:
            self._event_ch.send_nowait(
                llm.ChatChunk(id="c", delta=llm.ChoiceDelta(role="assistant", content=text))
            )
        if calls:
            self._event_ch.send_nowait(
                llm.ChatChunk(id="c", delta=llm.ChoiceDelta(role="assistant", tool_calls=calls))
            )


class Speaker(Agent):
    """An agent whose TTS is three frames per text chunk."""

    async def tts_node(
        self, text: AsyncIterable[str], model_settings: ModelSettings
    ) -> AsyncGenerator[rtc.AudioFrame, None]:
        async for chunk in text:
            if chunk.strip():
                for _ in range(3):
                    yield frame()


class Gateway:
    def __init__(self, session: AgentSession[Any], gate: ResponseGate, sink: Sink) -> None:
        self.session, self.gate, self.sink = session, gate, sink


@contextlib.asynccontextmanager
async def gateway(
    client: respcoord.Client,
    session_id: str,
    agent: Agent | None = None,
    model: llm.LLM[Any] | None = None,
) -> AsyncIterator[Gateway]:
    # No VAD, no turn detector model: nothing to download.
    session: AgentSession[Any] = AgentSession(
        vad=None,
        turn_handling={"turn_detection": None},
        llm=model if model is not None else NOT_GIVEN,
    )
    sink = Sink()
    session.output.audio = sink
    await session.start(agent or Speaker(instructions="test"))
    gate = ResponseGate.install(session, client.session(session_id))
    sink.gate = gate
    try:
        yield Gateway(session, gate, sink)
    finally:
        await session.aclose()
        await gate.aclose()


async def speak(g: Gateway, frames: int) -> tuple[SpeechHandle, Audio, int]:
    """Starts a speech and waits until ``frames`` of it reached the sink."""
    audio = Audio()
    handle = g.session.say("hello", audio=audio.frames())
    before = sum(g.sink.frames.values())
    audio.push(frames)
    await until("the frames reach the sink", lambda: sum(g.sink.frames.values()) >= before + frames)
    rid = g.gate.live_response_id
    assert rid is not None
    return handle, audio, rid


async def test_a_speech_passes_and_is_finished_once(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    recording = Recording(server.grpc, "lk-live-", 1)
    await recording.open()
    try:
        async with gateway(client, "lk-live-1") as g:
            handle, audio, rid = await speak(g, 5)
            audio.end()
            await within("the speech ends", handle.wait_for_playout())
            assert not handle.interrupted
            await until("the Finish", lambda: g.gate.stats.responses_finished == 1)
            await within("the end event", recording.all_ended.wait())
    finally:
        await recording.close()
    assert g.sink.frames == Counter({rid: 5})
    assert await server.finishes(rid) == 1
    assert recording.started == Counter({rid: 1})
    assert recording.ended == Counter({rid: 1})
    assert g.sink.leaked == 0
    assert g.gate.stats.frames_dropped == 0


@pytest.mark.parametrize("action", ["cancel", "shutdown"])
async def test_a_stop_by_another_process_interrupts_that_speech(
    servers: Servers, action: str
) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    session_id = f"lk-stop-{action}"
    async with gateway(client, session_id) as g:
        gate = g.gate
        handle, audio, rid = await speak(g, 3)
        await other_process(server.grpc, session_id, action)
        await until("the gate sees the stop", lambda: gate.stop_record(rid) is not None)
        assert handle.interrupted  # exactly this speech, at once
        assert g.sink.clears >= 1  # the output's buffer was cleared
        audio.push(4)  # late frames of the stopped speech never reach the sink
        await within("the speech ends", handle.wait_for_playout())
        record = gate.stop_record(rid)
        assert record is not None
        assert str(record.reason) == ("cancelled" if action == "cancel" else "shutdown")
        assert gate.stats.speeches_interrupted == 1
        assert gate.stats.barge_ins == 0  # not taken for an interruption here
        if action == "shutdown":
            assert gate.terminated
            # A later speech cannot start: its audio is dropped, it is stopped.
            later = Audio()
            second = g.session.say("again", audio=later.frames())
            later.push(2)
            await within("the later speech ends", second.wait_for_playout())
            assert second.interrupted
            assert gate.stats.responses_started == 1
    assert g.sink.frames == Counter({rid: 3})
    assert g.sink.leaked == 0
    assert await server.finishes(rid) == 0


async def test_an_interruption_here_cancels_at_the_coordinator(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    other = await servers.client(server.grpc)
    session_id = "lk-barge"
    async with gateway(client, session_id) as g:
        gate = g.gate
        # The framework interrupts the speech for the user (what its VAD
        # path does): a fenced Cancel with source VAD.
        handle, audio, rid = await speak(g, 2)
        handle.interrupt(source="audio_activity")
        await until("the Cancel", lambda: gate.stats.barge_ins == 1)
        audio.push(2)
        await within("the speech ends", handle.wait_for_playout())
        assert gate.stats.barge_ins_applied == 1
        record = gate.stop_record(rid)
        assert record is not None
        assert str(record.reason) == "cancelled"
        assert (await other.get_state(session_id)).phase is respcoord.Phase.IDLE
        # The application's own VAD, while another process's response is live.
        theirs = await other.session(session_id).start(respcoord.Source.CLIENT)
        assert await gate.barge_in() == theirs.id
        assert await within("their stop", theirs.stopped()) is respcoord.StopReason.CANCELLED
    assert g.sink.frames == Counter({rid: 2})
    assert g.sink.leaked == 0
    assert await server.finishes(rid) == 0


async def test_a_new_reply_supersedes_the_interrupted_speech(servers: Servers) -> None:
    """A user turn preempts the speech and the framework answers with a new
    one: its Start supersedes (the Cancel was fenced to the old one)."""
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    async with gateway(client, "lk-next") as g:
        first, _, first_id = await speak(g, 2)
        first.interrupt(source="user_turn")
        await within("the first speech ends", first.wait_for_playout())
        second, audio, second_id = await speak(g, 2)
        audio.end()
        await within("the second speech ends", second.wait_for_playout())
        await until("the Finish", lambda: g.gate.stats.responses_finished == 1)
    assert first_id != second_id
    assert await server.finishes(first_id) == 0
    assert await server.finishes(second_id) == 1
    assert g.sink.leaked == 0


async def test_a_false_interruption_cancels_nothing(servers: Servers) -> None:
    """The framework pauses the output when the user may be interrupting and
    resumes the same speech when it was a false interruption: nothing is
    cancelled, the speech finishes."""
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    async with gateway(client, "lk-false") as g:
        handle, audio, rid = await speak(g, 2)
        output = g.session.output.audio
        assert output is g.gate
        assert output.can_pause
        output.pause()
        output.resume()
        audio.push(2)
        audio.end()
        await within("the speech ends", handle.wait_for_playout())
        await until("the Finish", lambda: g.gate.stats.responses_finished == 1)
        assert g.sink.pauses == 1
        assert g.sink.resumes >= 1
        assert g.gate.stats.barge_ins == 0
    assert g.sink.frames == Counter({rid: 4})
    assert await server.finishes(rid) == 1


@function_tool
async def lookup(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@function_tool
async def transfer(city: str) -> tuple[Agent, str]:
    """Hands the caller over to the weather specialist."""
    return Speaker(instructions="the specialist"), f"transferred for {city}"


@pytest.mark.parametrize("step", ["tool", "handoff"])
async def test_a_speech_with_a_follow_up_step_stays_one_response(
    servers: Servers, step: str
) -> None:
    """The LLM calls a tool (or a tool that hands off to another agent with a
    result); the framework's follow-up reply runs on the same speech handle:
    one response, one Finish."""
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    model = ScriptedLLM()
    name = "lookup" if step == "tool" else "transfer"
    call = llm.FunctionToolCall(name=name, arguments=json.dumps({"city": "Oslo"}), call_id="1")
    model.replies = [("Let me look.", [call]), ("It is sunny.", [])]
    prefix = f"lk-{step}-"
    recording = Recording(server.grpc, prefix, 1)
    await recording.open()
    agent = Speaker(instructions="t", tools=[lookup, transfer])
    try:
        async with gateway(client, f"{prefix}1", agent, model) as g:
            handle = g.session.generate_reply(user_input="weather?")
            await within("the speech ends", handle.wait_for_playout())
            assert handle.num_steps == 2
            assert not handle.interrupted
            await until("the Finish", lambda: g.gate.stats.responses_finished == 1)
            await within("the end event", recording.all_ended.wait())
            assert g.gate.stats.responses_started == 1
            if step == "handoff":
                await until("the handoff", lambda: g.session.current_agent is not agent)
    finally:
        await recording.close()
    (rid,) = recording.started
    assert recording.started == Counter({rid: 1})
    assert recording.ended == Counter({rid: 1})
    # Both steps' audio, one response.
    assert set(g.sink.frames) == {rid}
    assert g.gate.stats.frames_passed == sum(g.sink.frames.values()) > 3
    assert await server.finishes(rid) == 1


async def test_closing_releases_a_live_response(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    session_id = "lk-close"
    async with gateway(client, session_id) as g:
        _, _, rid = await speak(g, 2)
    assert g.gate.closed
    assert g.gate.stats.responses_released == 1
    assert g.gate.live_response_id is None
    state = await client.get_state(session_id)
    assert state.phase is respcoord.Phase.ACTIVE
    assert state.response_id == rid
    assert await server.finishes(rid) == 0


def test_without_the_framework_the_import_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    monkeypatch.delitem(sys.modules, "respcoord.livekit", raising=False)
    monkeypatch.setitem(sys.modules, "livekit.agents.voice", None)
    with pytest.raises(ImportError, match=r'pip install "respcoord\[livekit\]"'):
        importlib.import_module("respcoord.livekit")


IMPORT_EVERY_PROTO = """
import importlib, pkgutil, sys
import google.protobuf
import livekit.protocol, livekit.rtc._proto
count = 0
for package in (livekit.protocol, livekit.rtc._proto):
    for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        importlib.import_module(module.name)
        count += 1
import livekit.agents.voice
import respcoord.livekit
print(google.protobuf.__version__, google.protobuf.__file__, count)
"""


async def run_import(env: dict[str, str]) -> list[str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-W",
        "error",
        "-c",
        IMPORT_EVERY_PROTO,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **env},
    )
    out, _ = await within("the import", process.communicate(), 120)
    assert process.returncode == 0, out.decode()
    return out.decode().split()


def floor_overlay(directory: Path) -> None:
    """``directory/google`` holds the floor environment's protobuf."""
    floor = Path(__file__).resolve().parents[3] / "target/python-floor/lib"
    found = sorted(floor.glob("python3*/site-packages/google/protobuf"))
    assert found, f"no floor environment under {floor} (scripts/test-python.sh builds it)"
    overlay = directory / "google"
    overlay.mkdir()
    for name in ("protobuf", "_upb"):
        if (found[-1].parent / name).exists():
            (overlay / name).symlink_to(found[-1].parent / name)


async def test_the_framework_imports_under_the_locked_and_the_floor_protobuf(
    tmp_path: Path,
) -> None:
    """livekit-protocol's and livekit-rtc's generated code check the protobuf
    runtime at import: every one of their modules imports (warnings are
    errors) under the newest protobuf the lock resolves and under the
    client's floor, protobuf 5.29.6 of the floor environment
    (target/python-floor, from requirements/floor.txt) put ahead of this
    environment's."""
    import google.protobuf

    version, _, count = await run_import({})
    assert version == google.protobuf.__version__
    assert version.startswith("6.")
    assert int(count) > 0
    floor_overlay(tmp_path)
    version, location, count = await run_import({"PYTHONPATH": str(tmp_path)})
    assert version == "5.29.6"
    assert location.startswith(str(tmp_path))
    assert int(count) > 0


async def test_two_agent_sessions_in_two_processes(servers: Servers) -> None:
    """The example: agent A (this test's child) speaks, agent B (A's child,
    another process) barges in or answers; A's output stops."""
    server = await servers.fixture()
    rounds = 10
    report = await run_two_process_example(
        server, "livekit_two_processes.py", "lk-two-", rounds, 180
    )
    assert all(round_["a_speech_interrupted"] for round_ in report["rounds"])
    print(f"\nlivekit two processes, {rounds} rounds: {report['summary']}")

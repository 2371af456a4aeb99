"""respcoord.openai_agents with the real openai-agents (its own scripted
transport, ``agents.realtime.testing.ScriptedRealtimeModel``, driving a real
``RealtimeSession`` without the network) against the real scenario fixture
server.

The test decides when each model event is emitted, and waits for a marker
event to reach the application before it looks (the session's queue is in
order), or for the gate to have seen a stop (a condition, never a sleep), so
what passes and what is dropped does not depend on timing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _integration import other_process, run_two_process_example, until
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner, RealtimeSession
from agents.realtime.handoffs import realtime_handoff
from agents.realtime.model_events import (
    RealtimeModelAudioEvent,
    RealtimeModelAudioInterruptedEvent,
    RealtimeModelEvent,
    RealtimeModelOtherEvent,
    RealtimeModelToolCallEvent,
    RealtimeModelTurnEndedEvent,
    RealtimeModelTurnStartedEvent,
)
from agents.realtime.model_inputs import (
    RealtimeModelSendEvent,
    RealtimeModelSendInterrupt,
    RealtimeModelSendToolOutput,
)
from agents.realtime.testing import ScriptedRealtimeModel
from conftest import Servers
from harness import Recording, within

import respcoord
from respcoord.openai_agents import ResponseGate

AUDIO = b"\0" * 320


class VoiceModel(ScriptedRealtimeModel):
    """The SDK's scripted transport, answering the way the OpenAI realtime
    transport does: an interrupt scoped to a response ends that response
    (``audio_interrupted`` for its audio, then ``turn_ended``), and a tool
    output that asks for a response gets the next scripted one."""

    def __init__(self) -> None:
        super().__init__(strict=False)
        self.items: dict[str, list[str]] = {}
        self.live: set[str] = set()
        self.interrupts: list[str | None] = []
        self.follow_ups: list[list[RealtimeModelEvent]] = []

    async def send_event(self, event: RealtimeModelSendEvent) -> None:
        await super().send_event(event)
        if isinstance(event, RealtimeModelSendInterrupt):
            self.interrupts.append(event.response_id)
            rid = event.response_id
            if rid is not None and rid in self.live:
                self.live.discard(rid)
                await self.emit(
                    *(
                        RealtimeModelAudioInterruptedEvent(item_id=item, content_index=0)
                        for item in self.items.get(rid, [])
                    ),
                    RealtimeModelTurnEndedEvent(response_id=rid),
                )
        elif (
            isinstance(event, RealtimeModelSendToolOutput)
            and event.start_response
            and self.follow_ups
        ):
            await self.emit(*self.follow_ups.pop(0))

    def start(self, rid: str) -> RealtimeModelEvent:
        self.live.add(rid)
        return RealtimeModelTurnStartedEvent(response_id=rid)

    def audio(self, rid: str, item: str) -> RealtimeModelEvent:
        self.items.setdefault(rid, [])
        if item not in self.items[rid]:
            self.items[rid].append(item)
        return RealtimeModelAudioEvent(data=AUDIO, response_id=rid, item_id=item, content_index=0)

    def end(self, rid: str) -> RealtimeModelEvent:
        self.live.discard(rid)
        return RealtimeModelTurnEndedEvent(response_id=rid)


class App:
    """The application: consumes the gate, "plays" the audio, and checks at
    the moment each audio event reaches it whether the gate had already seen
    that event's response stop (a leak)."""

    def __init__(self, gate: ResponseGate) -> None:
        self.gate = gate
        self.audio: Counter[int | None] = Counter()
        self.leaked = 0
        self.audio_interrupted = 0
        self._markers: dict[str, asyncio.Event] = {}
        self._n = 0
        self.task = asyncio.create_task(self._consume())

    async def _consume(self) -> None:
        async for event in self.gate:
            if event.type == "audio":
                rid = self.gate.response_id_of(event)
                self.audio[rid] += 1
                if rid is None or self.gate.stop_record(rid) is not None:
                    self.leaked += 1
            elif event.type == "audio_interrupted":
                self.audio_interrupted += 1
            elif event.type == "raw_model_event" and event.data.type == "other":
                marker = self._markers.get(str(event.data.data))
                if marker is not None:
                    marker.set()

    async def sync(self, model: VoiceModel) -> None:
        """Returns once every event emitted before has reached the app."""
        self._n += 1
        name = f"marker-{self._n}"
        reached = self._markers[name] = asyncio.Event()
        await model.emit(RealtimeModelOtherEvent(data=name))
        await within("the marker reaches the application", reached.wait())


class Agent:
    """One agent session under a gate, on a respcoord session."""

    def __init__(
        self, realtime: RealtimeSession, model: VoiceModel, gate: ResponseGate, app: App
    ) -> None:
        self.realtime, self.model, self.gate, self.app = realtime, model, gate, app


@contextlib.asynccontextmanager
async def agent_session(
    client: respcoord.Client, session_id: str, agent: RealtimeAgent[Any] | None = None
) -> AsyncIterator[Agent]:
    model = VoiceModel()
    runner = RealtimeRunner(agent or RealtimeAgent(name="assistant"), model=model)
    async with await runner.run() as realtime:
        gate = ResponseGate(realtime, client.session(session_id))
        app = App(gate)
        try:
            yield Agent(realtime, model, gate, app)
        finally:
            await gate.aclose()
    await within("the application's loop ends", app.task)


async def test_a_live_response_passes_and_is_finished_once(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    recording = Recording(server.grpc, "oa-live-", 1)
    await recording.open()
    try:
        async with agent_session(client, "oa-live-1") as a:
            m = a.model
            await m.emit(m.start("r1"), *(m.audio("r1", "i1") for _ in range(5)), m.end("r1"))
            await a.app.sync(m)
            (rid,) = a.app.audio
            assert isinstance(rid, int)
            assert a.app.audio[rid] == 5
            assert a.gate.stats.responses_finished == 1
            await within("the end event", recording.all_ended.wait())
    finally:
        await recording.close()
    assert await server.finishes(rid) == 1
    assert recording.started == Counter({rid: 1})
    assert recording.ended == Counter({rid: 1})
    assert a.app.leaked == 0
    assert m.interrupts == []


@pytest.mark.parametrize("action", ["cancel", "shutdown"])
async def test_a_stop_by_another_process_drops_the_rest_and_interrupts(
    servers: Servers, action: str
) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    session_id = f"oa-stop-{action}"
    async with agent_session(client, session_id) as a:
        m, gate = a.model, a.gate
        await m.emit(m.start("r1"), m.audio("r1", "i1"), m.audio("r1", "i1"))
        await a.app.sync(m)
        rid = gate.live_response_id
        assert rid is not None
        await other_process(server.grpc, session_id, action)
        await until("the gate sees the stop", lambda: gate.stop_record(rid) is not None)
        # The model's late audio for the stopped response never reaches the app.
        await m.emit(m.audio("r1", "i1"), m.audio("r1", "i2"))
        await until("the model is interrupted", lambda: "r1" in m.interrupts)
        await a.app.sync(m)
        record = gate.stop_record(rid)
        assert record is not None
        assert str(record.reason) == ("cancelled" if action == "cancel" else "shutdown")
        assert a.app.audio[rid] == 2
        assert gate.stats.audio_dropped == 2
        assert a.app.audio_interrupted >= 1  # the model's answer: flush the player
        assert gate.stats.interruptions_detected == 0  # not taken for a barge-in
        if action == "shutdown":
            assert gate.terminated
            # A later model response cannot start: its audio is dropped, the
            # model is interrupted for it.
            await m.emit(m.start("r2"), m.audio("r2", "i3"))
            await until("the model is interrupted again", lambda: "r2" in m.interrupts)
            await a.app.sync(m)
            assert sum(a.app.audio.values()) == 2
    assert a.app.leaked == 0
    assert await server.finishes(rid) == 0


async def test_an_interruption_here_cancels_at_the_coordinator(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    other = await servers.client(server.grpc)
    session_id = "oa-barge"
    async with agent_session(client, session_id) as a:
        m, gate = a.model, a.gate
        # The model hears the user while it speaks: audio_interrupted.
        await m.emit(m.start("r1"), m.audio("r1", "i1"))
        await a.app.sync(m)
        rid = gate.live_response_id
        assert rid is not None
        await m.emit(RealtimeModelAudioInterruptedEvent(item_id="i1", content_index=0))
        await m.emit(m.audio("r1", "i1"), m.end("r1"))
        await a.app.sync(m)
        record = gate.stop_record(rid)
        assert record is not None
        assert str(record.reason) == "cancelled"
        assert gate.stats.barge_ins_applied == 1
        assert (await other.get_state(session_id)).phase is respcoord.Phase.IDLE
        # The application's own VAD, while another process's response is live.
        theirs = await other.session(session_id).start(respcoord.Source.CLIENT)
        assert await gate.barge_in() == theirs.id
        assert await within("their stop", theirs.stopped()) is respcoord.StopReason.CANCELLED
    assert a.app.audio[rid] == 1
    assert a.app.leaked == 0
    assert await server.finishes(rid) == 0


async def test_a_false_interruption_cancels_nothing(servers: Servers) -> None:
    """``audio_interrupted`` for audio of a response that already ended here
    (the player still had some of it) is no barge-in: the response another
    process has live now goes on."""
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    other = await servers.client(server.grpc)
    session_id = "oa-false"
    async with agent_session(client, session_id) as a:
        m, gate = a.model, a.gate
        await m.emit(m.start("r1"), m.audio("r1", "i1"), m.end("r1"))
        await a.app.sync(m)
        assert gate.stats.responses_finished == 1
        theirs = await other.session(session_id).start(respcoord.Source.CLIENT)
        await m.emit(RealtimeModelAudioInterruptedEvent(item_id="i1", content_index=0))
        await a.app.sync(m)
        assert gate.stats.false_interruptions == 1
        assert gate.stats.barge_ins == 0
        assert theirs.is_current()
        state = await other.get_state(session_id)
        assert state.phase is respcoord.Phase.ACTIVE
        assert state.response_id == theirs.id
        assert await theirs.finish(respcoord.Terminal.COMPLETED) is respcoord.Finished.APPLIED


@function_tool
def lookup(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@pytest.mark.parametrize("step", ["tool", "handoff"])
async def test_a_response_with_a_follow_up_step_stays_one_response(
    servers: Servers, step: str
) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    prefix = f"oa-follow-{step}-"
    specialist: RealtimeAgent[Any] = RealtimeAgent(name="specialist")
    agent: RealtimeAgent[Any] = RealtimeAgent(
        name="assistant", tools=[lookup], handoffs=[realtime_handoff(specialist)]
    )
    name = "lookup" if step == "tool" else realtime_handoff(specialist).tool_name
    recording = Recording(server.grpc, prefix, 1)
    await recording.open()
    try:
        async with agent_session(client, f"{prefix}1", agent) as a:
            m, gate = a.model, a.gate
            m.follow_ups.append([m.start("r2"), m.audio("r2", "i2"), m.end("r2")])
            await m.emit(
                m.start("r1"),
                m.audio("r1", "i1"),
                RealtimeModelToolCallEvent(
                    name=name, call_id="c1", arguments=json.dumps({"city": "Oslo"})
                ),
                m.end("r1"),
            )
            await until("the follow-up response ends", lambda: gate.stats.responses_finished > 0)
            await a.app.sync(m)
            await within("the end event", recording.all_ended.wait())
            assert gate.stats.model_responses_joined == 1
            assert gate.stats.responses_started == 1
    finally:
        await recording.close()
    (rid,) = recording.started
    assert recording.started == Counter({rid: 1})
    assert recording.ended == Counter({rid: 1})
    assert a.app.audio == Counter({rid: 2})
    assert await server.finishes(rid) == 1


GO = asyncio.Event()


@function_tool
async def slow_lookup(city: str) -> str:
    """The weather in a city, once the test lets it answer."""
    await GO.wait()
    return f"rain in {city}"


async def test_a_follow_up_of_a_response_stopped_during_its_tool_call_is_dropped(
    servers: Servers,
) -> None:
    """Another process cancels while the tool runs: the follow-up response the
    SDK then starts is dropped and interrupted, and never supersedes."""
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    session_id = "oa-follow-stopped"
    GO.clear()
    agent: RealtimeAgent[Any] = RealtimeAgent(name="assistant", tools=[slow_lookup])
    async with agent_session(client, session_id, agent) as a:
        m, gate = a.model, a.gate
        m.follow_ups.append([m.start("r2"), m.audio("r2", "i2"), m.end("r2")])
        await m.emit(
            m.start("r1"),
            m.audio("r1", "i1"),
            RealtimeModelToolCallEvent(
                name="slow_lookup", call_id="c1", arguments=json.dumps({"city": "Oslo"})
            ),
            m.end("r1"),
        )
        await a.app.sync(m)
        rid = gate.live_response_id  # still live: waiting for the follow-up
        assert rid is not None
        await other_process(server.grpc, session_id, "cancel")
        await until("the gate sees the stop", lambda: gate.stop_record(rid) is not None)
        GO.set()
        await until("the follow-up is interrupted", lambda: "r2" in m.interrupts)
        await a.app.sync(m)
        assert gate.stats.model_responses_joined == 1
        assert gate.stats.responses_started == 1
        assert (await client.get_state(session_id)).phase is respcoord.Phase.IDLE
    assert a.app.audio == Counter({rid: 1})
    assert a.app.leaked == 0
    assert await server.finishes(rid) == 0


async def test_closing_releases_a_live_response(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    session_id = "oa-close"
    async with agent_session(client, session_id) as a:
        m = a.model
        await m.emit(m.start("r1"), m.audio("r1", "i1"))
        await a.app.sync(m)
        rid = a.gate.live_response_id
        assert rid is not None
    # The realtime session closed, the gate released the response: nothing
    # was sent, the coordinator keeps it live.
    assert a.gate.stats.responses_released == 1
    assert a.gate.live_response_id is None
    state = await client.get_state(session_id)
    assert state.phase is respcoord.Phase.ACTIVE
    assert state.response_id == rid
    assert await server.finishes(rid) == 0
    assert m.interrupts == []


def test_without_the_sdk_the_import_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    monkeypatch.delitem(sys.modules, "respcoord.openai_agents", raising=False)
    monkeypatch.setitem(sys.modules, "agents.realtime", None)
    with pytest.raises(ImportError, match=r'pip install "respcoord\[openai-agents\]"'):
        importlib.import_module("respcoord.openai_agents")


async def test_two_agent_sessions_in_two_processes(servers: Servers) -> None:
    """The example: agent A (this test's child) speaks, agent B (A's child,
    another process) barges in or answers; A's output stops."""
    server = await servers.fixture()
    rounds = 10
    report = await run_two_process_example(
        server, "openai_agents_two_processes.py", "oa-two-", rounds, 180
    )
    assert all(round_["a_model_interrupted"] for round_ in report["rounds"])
    print(f"\nopenai-agents two processes, {rounds} rounds: {report['summary']}")

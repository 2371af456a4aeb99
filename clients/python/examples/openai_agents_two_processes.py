"""Two OpenAI Agents realtime sessions on one respcoord session, in two processes.

Agent A (this process) runs an ``agents.realtime.RealtimeSession`` whose model
streams audio; agent B (a second process this one spawns) runs its own on the
same respcoord session. Both applications consume their session through
``respcoord.openai_agents.ResponseGate``. Each round A's model starts
talking, then B either barges in (the user speaks at B: ``gate.barge_in()``,
a Cancel at the coordinator) or answers (B's model starts a response, whose
Start supersedes A's). A's gate learns of the stop through its client's
watch, no further audio of A's response reaches A's application, and A's
model is interrupted for that response.

    python examples/openai_agents_two_processes.py 127.0.0.1:50051 [--rounds 100] [--json]

needs a respcoord server at that address (``respcoord serve``; ``cargo
install --locked --path .`` from the repository root puts ``respcoord`` on
the PATH) and, from the repository root, ``pip install
"./clients/python[openai-agents]"``: the client from this checkout (it is
not on PyPI) with the OpenAI Agents SDK, PyPI's ``openai-agents`` 0.24.0,
imported as ``agents``. The models are the SDK's own
scripted transport (``agents.realtime.testing.ScriptedRealtimeModel``)
streaming silence every 5 ms: no network, no API key, no audio device. The
report prints the audio events that reached A's application after A's gate
had observed their response stop (must be 0) and the delay from B's action
to A's gate observing the stop (from then on nothing of A's response is
played: the barge-in-to-silence latency at the gate; both processes read the
same monotonic clock), p50/p99 over the rounds. Exits 1 if any round broke
the guarantees.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from _two_process import (
    WAIT,
    OtherProcess,
    arguments,
    check,
    conclude,
    emit,
    latency_parts,
    summary,
    until,
)
from agents.realtime import RealtimeAgent, RealtimeRunner
from agents.realtime.model_events import (
    RealtimeModelAudioEvent,
    RealtimeModelAudioInterruptedEvent,
    RealtimeModelOtherEvent,
    RealtimeModelTurnEndedEvent,
    RealtimeModelTurnStartedEvent,
)
from agents.realtime.model_inputs import RealtimeModelSendEvent, RealtimeModelSendInterrupt
from agents.realtime.testing import ScriptedRealtimeModel

import respcoord
from respcoord.openai_agents import ResponseGate

FRAME_SECONDS = 0.005
"""Each audio event is 5 ms of 16 kHz audio, emitted every 5 ms."""
SILENCE = b"\0" * 160
A_FRAMES_BEFORE_B_ACTS = 10
A_MAX_FRAMES = 6000
"""A's model would talk for 30 s if nothing stopped it."""
B_ANSWER_FRAMES = 20


class TalkingModel(ScriptedRealtimeModel):
    """The realtime model: ``talk(rid)`` streams one response (turn_started,
    audio every 5 ms, turn_ended). Like the OpenAI transport, an interrupt
    scoped to a response cancels it: ``audio_interrupted`` for its audio,
    then ``turn_ended``."""

    def __init__(self) -> None:
        super().__init__(strict=False)
        self.interrupted: set[str] = set()
        self.streams_ended = 0
        self._stop: dict[str, asyncio.Event] = {}

    async def send_event(self, event: RealtimeModelSendEvent) -> None:
        await super().send_event(event)
        if isinstance(event, RealtimeModelSendInterrupt) and event.response_id is not None:
            self.interrupted.add(event.response_id)
            stop = self._stop.get(event.response_id)
            if stop is not None:
                stop.set()

    async def talk(self, rid: str, frames: int, *, every: float = FRAME_SECONDS) -> None:
        stop = self._stop[rid] = asyncio.Event()
        item = f"item-{rid}"
        try:
            await self.emit(RealtimeModelTurnStartedEvent(response_id=rid))
            for _ in range(frames):
                if stop.is_set():
                    await self.emit(
                        RealtimeModelAudioInterruptedEvent(item_id=item, content_index=0)
                    )
                    break
                await self.emit(
                    RealtimeModelAudioEvent(
                        data=SILENCE, response_id=rid, item_id=item, content_index=0
                    )
                )
                if every:
                    await asyncio.sleep(every)
            await self.emit(RealtimeModelTurnEndedEvent(response_id=rid))
        finally:
            del self._stop[rid]
            self.streams_ended += 1


class Player:
    """The application's audio output: consumes the gate and checks, as each
    audio event reaches it, whether A's gate had already observed that
    event's response stop (such an event is a leak)."""

    def __init__(self, gate: ResponseGate) -> None:
        self.gate = gate
        self.frames: Counter[int] = Counter()
        self.last: int | None = None
        """The response of the latest audio played."""
        self.after_stop = 0
        self.flushes = 0
        self._markers: dict[str, asyncio.Event] = {}
        self.task = asyncio.create_task(self._play())

    async def _play(self) -> None:
        async for event in self.gate:
            if event.type == "audio":
                rid = self.gate.response_id_of(event)
                if rid is None or self.gate.stop_record(rid) is not None:
                    self.after_stop += 1
                if rid is not None:
                    self.frames[rid] += 1
                    self.last = rid
            elif event.type == "audio_interrupted":
                self.flushes += 1  # a real player drops its buffer here
            elif event.type == "raw_model_event" and event.data.type == "other":
                reached = self._markers.pop(str(event.data.data), None)
                if reached is not None:
                    reached.set()

    async def flush(self, model: TalkingModel) -> None:
        """Returns once every event the model emitted before has been
        through the gate."""
        name = uuid.uuid4().hex
        reached = self._markers[name] = asyncio.Event()
        await model.emit(RealtimeModelOtherEvent(data=name))
        await asyncio.wait_for(reached.wait(), WAIT)


class Agent:
    def __init__(self, model: TalkingModel, gate: ResponseGate, player: Player) -> None:
        self.model, self.gate, self.player = model, gate, player


@contextlib.asynccontextmanager
async def agent(client: respcoord.Client, session_id: str, name: str) -> AsyncIterator[Agent]:
    model = TalkingModel()
    runner = RealtimeRunner(RealtimeAgent(name=name), model=model)
    async with await runner.run() as realtime:
        gate = ResponseGate(realtime, client.session(session_id))
        player = Player(gate)
        try:
            yield Agent(model, gate, player)
        finally:
            await gate.aclose()
    await asyncio.wait_for(player.task, WAIT)


async def agent_b(target: str, session_id: str) -> None:
    """B: reads actions on stdin, answers on stdout, one JSON line each."""
    async with (
        await respcoord.Client.connect(target) as client,
        agent(client, session_id, "agent-b") as b,
    ):
        emit({"ready": True})
        while line := await asyncio.to_thread(sys.stdin.readline):
            action = json.loads(line)
            if action["action"] == "end":
                break
            t0 = time.monotonic()
            if action["action"] == "barge-in":
                # The user speaks at B: B's VAD (or its model's) goes
                # through the coordinator.
                cancelled = await b.gate.barge_in()
                emit({"round": action["round"], "t0": t0, "cancelled": cancelled})
            else:
                finished = b.gate.stats.responses_finished
                await b.model.talk(f"b-{action['round']}", B_ANSWER_FRAMES, every=0)
                await until(lambda: b.gate.stats.responses_finished > finished)  # noqa: B023
                await b.player.flush(b.model)
                emit({"round": action["round"], "t0": t0, "response": b.player.last})
        stats = b.gate.stats.as_dict()
    emit({"b": stats, "b_after_stop": b.player.after_stop})


async def one_round(a: Agent, b: OtherProcess, round_: int) -> dict[str, Any]:
    model, gate, player = a.model, a.gate, a.player
    rid = f"a-{round_}"
    ended = model.streams_ended
    talking = asyncio.create_task(model.talk(rid, A_MAX_FRAMES))

    def speaking() -> bool:
        live = gate.live_response_id
        return live is not None and player.frames[live] >= A_FRAMES_BEFORE_B_ACTS

    await until(speaking)
    response_id = gate.live_response_id
    assert response_id is not None
    action = "respond" if round_ % 2 else "barge-in"
    await b.send({"round": round_, "action": action})
    await until(lambda: gate.stop_record(response_id) is not None)
    record = gate.stop_record(response_id)
    assert record is not None
    # A's model was interrupted; its late audio reaches the gate (which drops
    # it) before the marker does.
    await until(lambda: model.streams_ended > ended)
    await talking
    await player.flush(model)
    reply = await b.receive()
    return {
        "round": round_,
        "action": action,
        "a_response": response_id,
        "a_stop": str(record.reason),
        "a_frames": player.frames[response_id],
        "a_model_interrupted": rid in model.interrupted,
        "b_response": reply.get("response"),
        "b_cancelled": reply.get("cancelled"),
        "delay_ms": (record.observed_at - reply["t0"]) * 1000,
    }


async def agent_a(target: str, session_id: str, rounds: int) -> dict[str, Any]:
    """A: runs the rounds, drives B, returns the report."""
    report: dict[str, Any] = {"session": session_id, "rounds": []}
    async with OtherProcess.running(__file__, target, session_id, "agent B") as b:
        async with (
            await respcoord.Client.connect(target) as client,
            agent(client, session_id, "agent-a") as a,
        ):
            for round_ in range(rounds):
                report["rounds"].append(await one_round(a, b, round_))
        report["a"] = a.gate.stats.as_dict()
        report["frames_after_stop"] = a.player.after_stop
        report["a_flushes"] = a.player.flushes
        final = await b.end()
        report["b"] = final["b"]
        report["b_after_stop"] = final["b_after_stop"]
    report["summary"] = summary_line(report)
    return report


def broken(report: dict[str, Any]) -> list[str]:
    """What in the report breaks the guarantees."""
    return check(
        report,
        "audio events reached A after the stop",
        "a_model_interrupted",
        "A's model was not interrupted",
    )


def summary_line(report: dict[str, Any]) -> str:
    a = report["a"]
    parts = [
        f"frames leaked after stops: {report['frames_after_stop']} "
        f"(A played {a['audio_passed']}, its gate dropped {a['audio_dropped']} late ones)"
    ]
    parts.extend(latency_parts(report))
    return "; ".join(parts)


def main() -> int:
    parser = arguments(
        "Two OpenAI Agents realtime sessions on one respcoord session.", "openai-agents-demo", 100
    )
    args = parser.parse_args()
    if args.role == "b":
        asyncio.run(agent_b(args.target, args.session))
        return 0
    report = asyncio.run(agent_a(args.target, args.session, args.rounds))
    return conclude(report, broken(report), args.json, summary)


if __name__ == "__main__":
    sys.exit(main())

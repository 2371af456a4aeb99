"""Two LiveKit Agents sessions on one respcoord session, in two processes.

Agent A (this process) runs an ``AgentSession`` that speaks; agent B (a
second process this one spawns) runs its own on the same respcoord session.
Both put ``respcoord.livekit.ResponseGate`` at the top of their audio output
chain. Each round A speaks, then B either barges in (the user speaks at B:
``gate.barge_in()``, a Cancel at the coordinator) or answers (B says
something, whose Start supersedes A's speech). A's gate learns of the stop
through its client's watch, no further frame of A's speech leaves A's gate,
and A's speech handle is interrupted.

    python examples/livekit_two_processes.py 127.0.0.1:50051 [--rounds 100] [--json]

needs a respcoord server at that address (``respcoord serve``; ``cargo
install --locked --path .`` from the repository root puts ``respcoord`` on
the PATH) and, from the repository root, ``pip install
"./clients/python[livekit]"``: the client from this checkout (it is not on
PyPI) with its livekit extra. The agent sessions run without a room:
their audio output is a sink that plays nothing, no VAD, no turn detector,
no STT/LLM/TTS (``session.say(text, audio=...)`` with silence every 5 ms):
no network, no model download, no audio device. The report prints the frames
that reached A's sink after A's gate had observed their response stop (must
be 0) and the delay from B's action to A's gate observing the stop (from then
on nothing of A's speech leaves the gate: the barge-in-to-silence latency at
the gate; both processes read the same monotonic clock), p50/p99 over the
rounds. Exits 1 if any round broke the guarantees.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator
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
from livekit import rtc
from livekit.agents import Agent, AgentSession
from livekit.agents.voice import SpeechHandle
from livekit.agents.voice.io import AudioOutput, AudioOutputCapabilities

import respcoord
from respcoord.livekit import RESPONSE_ID_USERDATA, ResponseGate

FRAME_SECONDS = 0.005
"""Each frame is 5 ms of 16 kHz audio, produced every 5 ms."""
A_FRAMES_BEFORE_B_ACTS = 10
A_MAX_FRAMES = 6000
"""A would talk for 30 s if nothing stopped it."""
B_ANSWER_FRAMES = 20


async def silence(frames: int, every: float) -> AsyncGenerator[rtc.AudioFrame, None]:
    for _ in range(frames):
        yield rtc.AudioFrame(b"\0\0" * 80, 16000, 1, 80)
        if every:
            await asyncio.sleep(every)


class Player(AudioOutput):
    """The sink under the gate: counts each frame's response and whether A's
    gate had already observed that response stop when it arrived (a leak)."""

    def __init__(self) -> None:
        super().__init__(label="player", capabilities=AudioOutputCapabilities(pause=True))
        self.gate: ResponseGate | None = None
        self.frames: Counter[int] = Counter()
        self.last: int | None = None
        self.after_stop = 0
        self.clears = 0
        self._segment = False
        self._pushed = 0.0

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if not self._segment:
            self._segment, self._pushed = True, 0.0
            self.on_playback_started(created_at=time.time())
        rid = frame.userdata.get(RESPONSE_ID_USERDATA)
        if not isinstance(rid, int) or (
            self.gate is not None and self.gate.stop_record(rid) is not None
        ):
            self.after_stop += 1
        if isinstance(rid, int):
            self.frames[rid] += 1
            self.last = rid
        self._pushed += frame.duration

    def flush(self) -> None:
        super().flush()
        if self._segment:
            self._segment = False
            self.on_playback_finished(playback_position=self._pushed, interrupted=False)

    def clear_buffer(self) -> None:
        self.clears += 1  # a real sink drops what it buffered here


class Speaker:
    def __init__(self, session: AgentSession[Any], gate: ResponseGate, player: Player) -> None:
        self.session, self.gate, self.player = session, gate, player


@contextlib.asynccontextmanager
async def speaker(client: respcoord.Client, session_id: str) -> AsyncIterator[Speaker]:
    # No VAD, no turn detector model: nothing to download.
    session: AgentSession[Any] = AgentSession(vad=None, turn_handling={"turn_detection": None})
    player = Player()
    session.output.audio = player
    await session.start(Agent(instructions="a voice agent"))
    gate = ResponseGate.install(session, client.session(session_id))
    player.gate = gate
    try:
        yield Speaker(session, gate, player)
    finally:
        await session.aclose()
        await gate.aclose()


async def agent_b(target: str, session_id: str) -> None:
    """B: reads actions on stdin, answers on stdout, one JSON line each."""
    async with (
        await respcoord.Client.connect(target) as client,
        speaker(client, session_id) as b,
    ):
        emit({"ready": True})
        while line := await asyncio.to_thread(sys.stdin.readline):
            action = json.loads(line)
            if action["action"] == "end":
                break
            t0 = time.monotonic()
            if action["action"] == "barge-in":
                # The user speaks at B: B's VAD goes through the coordinator.
                cancelled = await b.gate.barge_in()
                emit({"round": action["round"], "t0": t0, "cancelled": cancelled})
            else:
                finished = b.gate.stats.responses_finished
                handle = b.session.say("an answer", audio=silence(B_ANSWER_FRAMES, 0))
                await asyncio.wait_for(handle.wait_for_playout(), WAIT)
                await until(lambda: b.gate.stats.responses_finished > finished)  # noqa: B023
                emit({"round": action["round"], "t0": t0, "response": b.player.last})
        stats = b.gate.stats.as_dict()
    emit({"b": stats, "b_after_stop": b.player.after_stop})


async def one_round(a: Speaker, b: OtherProcess, round_: int) -> dict[str, Any]:
    gate, player = a.gate, a.player
    handle: SpeechHandle = a.session.say(
        f"round {round_}", audio=silence(A_MAX_FRAMES, FRAME_SECONDS)
    )

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
    # A's speech was interrupted; it ends (its late frames dropped at the gate).
    await asyncio.wait_for(handle.wait_for_playout(), WAIT)
    reply = await b.receive()
    return {
        "round": round_,
        "action": action,
        "a_response": response_id,
        "a_stop": str(record.reason),
        "a_frames": player.frames[response_id],
        "a_speech_interrupted": handle.interrupted,
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
            speaker(client, session_id) as a,
        ):
            for round_ in range(rounds):
                report["rounds"].append(await one_round(a, b, round_))
        report["a"] = a.gate.stats.as_dict()
        report["frames_after_stop"] = a.player.after_stop
        report["a_clears"] = a.player.clears
        final = await b.end()
        report["b"] = final["b"]
        report["b_after_stop"] = final["b_after_stop"]
    report["summary"] = summary_line(report)
    return report


def broken(report: dict[str, Any]) -> list[str]:
    """What in the report breaks the guarantees."""
    return check(
        report,
        "frames reached A's sink after the stop",
        "a_speech_interrupted",
        "A's speech was not interrupted",
    )


def summary_line(report: dict[str, Any]) -> str:
    a = report["a"]
    parts = [
        f"frames leaked after stops: {report['frames_after_stop']} "
        f"(A's gate passed {a['frames_passed']}, dropped {a['frames_dropped']} late ones)"
    ]
    parts.extend(latency_parts(report))
    return "; ".join(parts)


def main() -> int:
    parser = arguments("Two LiveKit Agents sessions on one respcoord session.", "livekit-demo", 100)
    args = parser.parse_args()
    # The framework logs every interruption at INFO/WARNING: keep stdout clean.
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    if args.role == "b":
        asyncio.run(agent_b(args.target, args.session))
        return 0
    report = asyncio.run(agent_a(args.target, args.session, args.rounds))
    return conclude(report, broken(report), args.json, summary)


if __name__ == "__main__":
    sys.exit(main())

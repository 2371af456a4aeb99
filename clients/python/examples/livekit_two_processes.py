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

needs a respcoord server at that address (``respcoord serve``) and
``pip install "respcoord[livekit]"``. The agent sessions run without a room:
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

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

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
WAIT = 30.0
"""Bound on every wait for something to happen (not a timing requirement)."""


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


async def until(condition: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not condition():  # noqa: ASYNC110 - counters have no event to wait on
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), WAIT)


def emit(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


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


class OtherProcess:
    """Agent B, a child process: one JSON line per action and per reply."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self._process = process
        self._in = process.stdin
        self._out = process.stdout

    @classmethod
    async def spawn(cls, target: str, session_id: str) -> OtherProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            target,
            "--session",
            session_id,
            "--role",
            "b",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def send(self, message: dict[str, Any]) -> None:
        self._in.write(json.dumps(message).encode() + b"\n")
        await self._in.drain()

    async def receive(self) -> dict[str, Any]:
        line = await asyncio.wait_for(self._out.readline(), WAIT)
        if not line:
            raise RuntimeError("agent B exited")
        message: dict[str, Any] = json.loads(line)
        return message

    async def close(self) -> None:
        if not self._in.is_closing():
            self._in.close()
        try:
            await asyncio.wait_for(self._process.wait(), WAIT)
        except TimeoutError:
            self._process.kill()
            await self._process.wait()


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


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values."""
    if not sorted_values:
        return float("nan")
    rank = min(len(sorted_values) - 1, max(0, -(-len(sorted_values) * p // 100) - 1))
    return sorted_values[int(rank)]


async def agent_a(target: str, session_id: str, rounds: int) -> dict[str, Any]:
    """A: runs the rounds, drives B, returns the report."""
    b = await OtherProcess.spawn(target, session_id)
    report: dict[str, Any] = {"session": session_id, "rounds": []}
    try:
        assert (await b.receive()).get("ready")
        async with (
            await respcoord.Client.connect(target) as client,
            speaker(client, session_id) as a,
        ):
            for round_ in range(rounds):
                report["rounds"].append(await one_round(a, b, round_))
        report["a"] = a.gate.stats.as_dict()
        report["frames_after_stop"] = a.player.after_stop
        report["a_clears"] = a.player.clears
        await b.send({"action": "end"})
        final = await b.receive()
        report["b"] = final["b"]
        report["b_after_stop"] = final["b_after_stop"]
    finally:
        await b.close()
    report["summary"] = summary_line(report)
    return report


def broken(report: dict[str, Any]) -> list[str]:
    """What in the report breaks the guarantees."""
    problems = []
    if report["frames_after_stop"] != 0:
        problems.append(f"{report['frames_after_stop']} frames reached A's sink after the stop")
    for r in report["rounds"]:
        expected = "superseded" if r["action"] == "respond" else "cancelled"
        if r["a_stop"] != expected:
            problems.append(f"round {r['round']}: A's response {r['a_stop']}, not {expected}")
        if not r["a_speech_interrupted"]:
            problems.append(f"round {r['round']}: A's speech was not interrupted")
        if r["action"] == "barge-in" and r["b_cancelled"] != r["a_response"]:
            problems.append(f"round {r['round']}: B's barge-in cancelled {r['b_cancelled']}")
    return problems


def summary_line(report: dict[str, Any]) -> str:
    a = report["a"]
    parts = [
        f"frames leaked after stops: {report['frames_after_stop']} "
        f"(A's gate passed {a['frames_passed']}, dropped {a['frames_dropped']} late ones)"
    ]
    every = sorted(r["delay_ms"] for r in report["rounds"])
    if every:
        parts.append(
            f"B's action to A's silence ({len(every)} rounds): "
            f"p50 {percentile(every, 50):.2f} ms, p99 {percentile(every, 99):.2f} ms"
        )
    for kind in ("barge-in", "respond"):
        delays = sorted(r["delay_ms"] for r in report["rounds"] if r["action"] == kind)
        if delays:
            parts.append(
                f"B's {'barge-in' if kind == 'barge-in' else 'answer'} to A's silence "
                f"({len(delays)} rounds): p50 {percentile(delays, 50):.2f} ms, "
                f"p99 {percentile(delays, 99):.2f} ms"
            )
    return "; ".join(parts)


def summary(report: dict[str, Any]) -> str:
    lines = [
        f"{r['round']:3} {r['action']:9} A's response {r['a_response']} {r['a_stop']:10} "
        f"after {r['a_frames']} frames; B's action to A's stop observed {r['delay_ms']:.2f} ms"
        for r in report["rounds"]
    ]
    lines.append(report["summary"])
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Two LiveKit Agents sessions on one respcoord session."
    )
    parser.add_argument("target", help="the respcoord server, host:port")
    parser.add_argument("--session", default=f"livekit-demo-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--role", choices=["a", "b"], default="a", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # The framework logs every interruption at INFO/WARNING: keep stdout clean.
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    if args.role == "b":
        asyncio.run(agent_b(args.target, args.session))
        return 0
    report = asyncio.run(agent_a(args.target, args.session, args.rounds))
    problems = broken(report)
    report["problems"] = problems
    print(json.dumps(report) if args.json else summary(report))
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

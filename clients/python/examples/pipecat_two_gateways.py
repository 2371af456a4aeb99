"""Two Pipecat gateways on one respcoord session, in two processes.

Gateway A (this process) runs a pipeline whose bot streams TTS audio; gateway
B (a second process this one spawns) runs its own pipeline on the same
session. Each round A's bot starts talking, then B either barges in (the
user speaks at B: an ``InterruptionFrame`` enters B's pipeline) or answers
(B's bot starts a response, which supersedes A's). Both pipelines have a
``respcoord.pipecat.ResponseGate`` between the bot and the output, so B's
barge-in is a Cancel at the coordinator, A's gate learns of the stop through
its client's watch, no further frame of A's response reaches A's output, and
A's pipeline is interrupted the Pipecat way.

    python examples/pipecat_two_gateways.py 127.0.0.1:50051 [--rounds 10] [--json]

needs a respcoord server at that address (``respcoord serve``; ``cargo
install --locked --path .`` from the repository root puts ``respcoord`` on
the PATH) and, from the repository root, ``pip install
"./clients/python[pipecat]"``: the client from this checkout (it is not on
PyPI) with its pipecat extra. The bots stand in for an LLM + TTS: no
model, no audio device. The report prints, per round, how A's response
stopped and how long from B's action to A's gate observing the stop (both
processes read the same monotonic clock), and overall the frames A's gate
let through, dropped after the stop, and let through after it had observed
the stop (a frame of a stopped response leaving the gate: must be 0). Exits
1 if any round broke the guarantees.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from _two_process import WAIT, OtherProcess, arguments, check, conclude, emit, round_lines, until
from loguru import logger
from pipecat.frames.frames import (
    DataFrame,
    EndFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMRunFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    UserStartedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameCallback, FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

import respcoord
from respcoord.pipecat import RESPONSE_ID_METADATA, ResponseGate

SAMPLE_RATE = 16000
FRAME_SECONDS = 0.005
"""Each audio frame is 5 ms of audio, pushed every 5 ms."""
A_FRAMES_BEFORE_B_ACTS = 10
A_MAX_FRAMES = 6000
"""A's bot would talk for 30 s if nothing stopped it."""
B_ANSWER_FRAMES = 20


@dataclass
class Marker(DataFrame):
    """Sent after a round; when it reaches the speaker, every frame before it
    has gone through the gate."""

    reached: asyncio.Event = field(default_factory=asyncio.Event)
    interruptible: bool = field(default=False, init=False)


class FakeBot(FrameProcessor):
    """The LLM + TTS: on ``LLMRunFrame`` it streams one response (start,
    TTS audio every 5 ms, end) until it is interrupted; like Pipecat's LLM
    services it still sends ``LLMFullResponseEndFrame`` when interrupted."""

    def __init__(self, frames: int) -> None:
        super().__init__()
        self._frames = frames
        self._stream: asyncio.Task[None] | None = None
        self.interruptions = 0
        self.streams_ended = 0

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMRunFrame):
            if self._stream is None:
                self._stream = self.create_task(self._talk())
            return
        if isinstance(frame, InterruptionFrame):
            self.interruptions += 1
            if self._stream is not None:
                await self.cancel_task(self._stream)
        await self.push_frame(frame, direction)

    async def _talk(self) -> None:
        context = uuid.uuid4().hex
        silence = b"\0" * int(SAMPLE_RATE * FRAME_SECONDS) * 2
        try:
            await self.push_frame(LLMFullResponseStartFrame())
            await self.push_frame(TTSStartedFrame(context_id=context))
            for _ in range(self._frames):
                await self.push_frame(
                    TTSAudioRawFrame(
                        audio=silence, sample_rate=SAMPLE_RATE, num_channels=1, context_id=context
                    )
                )
                await asyncio.sleep(FRAME_SECONDS)
            await self.push_frame(TTSStoppedFrame(context_id=context))
        finally:
            await self.push_frame(LLMFullResponseEndFrame())
            self._stream = None
            self.streams_ended += 1


class Speaker(FrameProcessor):
    """The output transport. Checks, at the moment each frame leaves the
    gate (the gate's push calls ``queue_frame``), whether the gate had
    already observed that frame's response stop: such a frame is a leak."""

    def __init__(self, gate: ResponseGate) -> None:
        super().__init__()
        self._gate = gate
        self.frames: dict[int, int] = {}
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
            self.frames[response_id] = self.frames.get(response_id, 0) + 1
            if self._gate.stop_record(response_id) is not None:
                self.after_stop += 1
        await super().queue_frame(frame, direction, callback)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, InterruptionFrame) and direction is FrameDirection.DOWNSTREAM:
            self.interruptions += 1
        if isinstance(frame, Marker):
            frame.reached.set()
        await self.push_frame(frame, direction)


class Gateway:
    """One pipeline: bot -> ResponseGate -> speaker, on the session."""

    def __init__(self, session: respcoord.Session, bot_frames: int) -> None:
        self.bot = FakeBot(bot_frames)
        self.gate = ResponseGate(session)
        self.speaker = Speaker(self.gate)
        self.worker = PipelineWorker(
            Pipeline([self.bot, self.gate, self.speaker]),
            params=PipelineParams(),
            cancel_on_idle_timeout=False,
            enable_rtvi=False,
        )
        self._runner = WorkerRunner(handle_sigint=False)
        self._running: asyncio.Task[None] | None = None

    async def start(self) -> None:
        started = asyncio.Event()

        async def on_started(worker: PipelineWorker, frame: Frame) -> None:
            started.set()

        self.worker.add_event_handler("on_pipeline_started", on_started)
        await self._runner.add_workers(self.worker)
        self._running = asyncio.create_task(self._runner.run())
        await asyncio.wait_for(started.wait(), WAIT)

    async def flush(self) -> None:
        marker = Marker()
        await self.worker.queue_frame(marker)
        await asyncio.wait_for(marker.reached.wait(), WAIT)

    async def stop(self) -> None:
        await self.worker.queue_frame(EndFrame())
        if self._running is not None:
            await asyncio.wait_for(self._running, WAIT)


def events(gate: ResponseGate, name: str) -> asyncio.Queue[tuple[Any, ...]]:
    """The gate's event ``name`` as a queue of its arguments."""
    queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

    async def handler(_: ResponseGate, *args: Any) -> None:
        queue.put_nowait(args)

    gate.add_event_handler(name, handler)
    return queue


async def gateway_b(target: str, session_id: str) -> None:
    """B: reads actions on stdin, answers on stdout, one JSON line each."""
    async with await respcoord.Client.connect(target) as client:
        b = Gateway(client.session(session_id), B_ANSWER_FRAMES)
        barge_ins = events(b.gate, "on_barge_in")
        started = events(b.gate, "on_response_started")
        finished = events(b.gate, "on_response_finished")
        await b.start()
        emit({"ready": True})
        while line := await asyncio.to_thread(sys.stdin.readline):
            action = json.loads(line)
            t0 = time.monotonic()
            if action["action"] == "end":
                break
            if action["action"] == "barge-in":
                # What Pipecat's user turn processor pushes when the user
                # starts speaking with interruptions enabled.
                await b.worker.queue_frame(UserStartedSpeakingFrame())
                await b.worker.queue_frame(InterruptionFrame())
                (cancelled,) = await asyncio.wait_for(barge_ins.get(), WAIT)
                done = time.monotonic()
                emit({"round": action["round"], "t0": t0, "done": done, "cancelled": cancelled})
            else:
                await b.worker.queue_frame(LLMRunFrame())
                (response_id,) = await asyncio.wait_for(started.get(), WAIT)
                done = time.monotonic()
                done_id, outcome = await asyncio.wait_for(finished.get(), WAIT)
                emit(
                    {
                        "round": action["round"],
                        "t0": t0,
                        "done": done,
                        "response": response_id,
                        "finished": str(outcome),
                    }
                )
                assert done_id == response_id
        await b.stop()
        emit({"b": b.gate.stats.as_dict()})


async def one_round(a: Gateway, b: OtherProcess, round_: int) -> dict[str, Any]:
    gate, speaker, bot = a.gate, a.speaker, a.bot
    bot_interruptions = bot.interruptions
    speaker_interruptions = speaker.interruptions
    ended = bot.streams_ended
    await a.worker.queue_frame(LLMRunFrame())

    def talking() -> bool:
        live = gate.live_response_id
        return live is not None and speaker.frames.get(live, 0) >= A_FRAMES_BEFORE_B_ACTS

    await until(talking)
    response_id = gate.live_response_id
    assert response_id is not None
    action = "respond" if round_ % 2 else "barge-in"
    await b.send({"round": round_, "action": action})
    await until(lambda: gate.stop_record(response_id) is not None)
    record = gate.stop_record(response_id)
    assert record is not None
    # The bot was interrupted; its late frames reach the gate (which drops
    # them) before the marker does.
    await until(lambda: bot.streams_ended > ended)
    await a.flush()
    reply = await b.receive()
    return {
        "round": round_,
        "action": action,
        "a_response": response_id,
        "a_stop": str(record.reason),
        "a_frames": speaker.frames.get(response_id, 0),
        "a_interrupted": bot.interruptions > bot_interruptions
        and speaker.interruptions > speaker_interruptions,
        "b_response": reply.get("response"),
        "b_cancelled": reply.get("cancelled"),
        "delay_ms": (record.observed_at - reply["t0"]) * 1000,
        "b_call_ms": (reply["done"] - reply["t0"]) * 1000,
    }


async def gateway_a(target: str, session_id: str, rounds: int) -> dict[str, Any]:
    """A: runs the rounds, drives B, returns the report."""
    report: dict[str, Any] = {"session": session_id, "rounds": []}
    async with OtherProcess.running(__file__, target, session_id, "gateway B") as b:
        async with await respcoord.Client.connect(target) as client:
            a = Gateway(client.session(session_id), A_MAX_FRAMES)
            await a.start()
            for round_ in range(rounds):
                report["rounds"].append(await one_round(a, b, round_))
            await a.stop()
            report["a"] = a.gate.stats.as_dict()
            report["frames_after_stop"] = a.speaker.after_stop
            report["a_bot_interruptions"] = a.bot.interruptions
            report["a_speaker_interruptions"] = a.speaker.interruptions
        report["b"] = (await b.end())["b"]
    return report


def broken(report: dict[str, Any]) -> list[str]:
    """What in the report breaks the guarantees."""
    return check(
        report,
        "frames left A's gate after the stop",
        "a_interrupted",
        "A's pipeline got no InterruptionFrame",
    )


def summary(report: dict[str, Any]) -> str:
    delays = sorted(r["delay_ms"] for r in report["rounds"])
    a = report["a"]
    lines = round_lines(report)
    lines.append(
        f"A: frames passed {a['frames_passed']}, dropped after the stop {a['frames_dropped']}, "
        f"passed after the stop {report['frames_after_stop']}; interruptions pushed "
        f"{a['interruptions_pushed']}; responses started {a['responses_started']}, "
        f"stopped {a['responses_stopped']}, finished {a['responses_finished']}"
    )
    if delays:
        lines.append(
            f"B's action to A's stop observed: min {delays[0]:.2f} ms, "
            f"median {delays[len(delays) // 2]:.2f} ms, max {delays[-1]:.2f} ms"
        )
    return "\n".join(lines)


def main() -> int:
    parser = arguments(
        "Two Pipecat gateways on one respcoord session, in two processes.", "pipecat-demo", 10
    )
    parser.add_argument("--verbose", action="store_true", help="Pipecat's debug log")
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="DEBUG" if args.verbose else "WARNING")
    if args.role == "b":
        asyncio.run(gateway_b(args.target, args.session))
        return 0
    report = asyncio.run(gateway_a(args.target, args.session, args.rounds))
    return conclude(report, broken(report), args.json, summary)


if __name__ == "__main__":
    sys.exit(main())

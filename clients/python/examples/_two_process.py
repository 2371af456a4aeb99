"""What the two-process examples share (pipecat_two_gateways.py,
openai_agents_two_processes.py, livekit_two_processes.py): B as a child
process driven over JSON lines, the bounded waits, and the report's checks
and summary. Each example runs as ``python examples/<name>.py``: Python puts
the example's own directory first on ``sys.path``, so this module imports
from any working directory."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

WAIT = 30.0
"""Bound on every wait for something to happen (not a timing requirement)."""


async def until(condition: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not condition():  # noqa: ASYNC110 - counters have no event to wait on
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), WAIT)


def emit(message: dict[str, Any]) -> None:
    """B's side of the conversation: one JSON line on stdout."""
    print(json.dumps(message), flush=True)


class OtherProcess:
    """B, a child process running ``script`` with ``--role b``: one JSON line
    per action and per reply."""

    def __init__(self, process: asyncio.subprocess.Process, name: str) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self._process = process
        self._name = name
        self._in = process.stdin
        self._out = process.stdout

    @classmethod
    async def spawn(cls, script: str, target: str, session_id: str, name: str) -> OtherProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            script,
            target,
            "--session",
            session_id,
            "--role",
            "b",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process, name)

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls, script: str, target: str, session_id: str, name: str
    ) -> AsyncIterator[OtherProcess]:
        """B started and ready; closed (or killed) at the end."""
        b = await cls.spawn(script, target, session_id, name)
        try:
            assert (await b.receive()).get("ready")
            yield b
        finally:
            await b.close()

    async def end(self) -> dict[str, Any]:
        """Tells B the rounds are over; B's last line (its statistics)."""
        await self.send({"action": "end"})
        return await self.receive()

    async def send(self, message: dict[str, Any]) -> None:
        self._in.write(json.dumps(message).encode() + b"\n")
        await self._in.drain()

    async def receive(self) -> dict[str, Any]:
        line = await asyncio.wait_for(self._out.readline(), WAIT)
        if not line:
            raise RuntimeError(f"{self._name} exited")
        message: dict[str, Any] = json.loads(line)
        return message

    async def close(self) -> None:
        """Closes B's stdin (B ends and exits)."""
        if not self._in.is_closing():
            self._in.close()
        try:
            await asyncio.wait_for(self._process.wait(), WAIT)
        except TimeoutError:
            self._process.kill()
            await self._process.wait()


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values."""
    if not sorted_values:
        return float("nan")
    rank = min(len(sorted_values) - 1, max(0, -(-len(sorted_values) * p // 100) - 1))
    return sorted_values[int(rank)]


def check(report: dict[str, Any], leaked: str, interrupted: str, not_interrupted: str) -> list[str]:
    """What in the report breaks the guarantees: anything of A's that got
    out after the stop (``leaked`` says what), a stop of the wrong kind, A's
    output not interrupted (the round's ``interrupted`` flag; the problem
    worded ``not_interrupted``), a barge-in that cancelled another response."""
    problems = []
    if report["frames_after_stop"] != 0:
        problems.append(f"{report['frames_after_stop']} {leaked}")
    for r in report["rounds"]:
        expected = "superseded" if r["action"] == "respond" else "cancelled"
        if r["a_stop"] != expected:
            problems.append(f"round {r['round']}: A's response {r['a_stop']}, not {expected}")
        if not r[interrupted]:
            problems.append(f"round {r['round']}: {not_interrupted}")
        if r["action"] == "barge-in" and r["b_cancelled"] != r["a_response"]:
            problems.append(f"round {r['round']}: B's barge-in cancelled {r['b_cancelled']}")
    return problems


def latency_parts(report: dict[str, Any]) -> list[str]:
    """B's action to A's silence, p50/p99: over every round, then over the
    barge-ins and over the answers."""
    parts = []
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
    return parts


def round_lines(report: dict[str, Any]) -> list[str]:
    """One line a round: how A's response stopped, and when."""
    return [
        f"{r['round']:3} {r['action']:9} A's response {r['a_response']} {r['a_stop']:10} "
        f"after {r['a_frames']} frames; B's action to A's stop observed {r['delay_ms']:.2f} ms"
        for r in report["rounds"]
    ]


def arguments(description: str, demo: str, rounds: int) -> argparse.ArgumentParser:
    """The examples' command line: the server, the session (``<demo>-`` and
    a random suffix by default), the rounds, ``--json``, and the hidden
    ``--role b`` that A starts B with."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("target", help="the respcoord server, host:port")
    parser.add_argument("--session", default=f"{demo}-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--role", choices=["a", "b"], default="a", help=argparse.SUPPRESS)
    return parser


def summary(report: dict[str, Any]) -> str:
    """The rounds, then the report's one-line ``summary``."""
    lines = round_lines(report)
    lines.append(report["summary"])
    return "\n".join(lines)


def conclude(
    report: dict[str, Any],
    problems: list[str],
    as_json: bool,
    summary: Callable[[dict[str, Any]], str],
) -> int:
    """Prints the report (JSON, or its ``summary``) and the problems; the
    exit code."""
    report["problems"] = problems
    print(json.dumps(report) if as_json else summary(report))
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0

"""What the framework integrations' tests share (test_pipecat,
test_openai_agents, test_livekit): polling a gate's counters, a stop made by
another process, and the two-process example run against a recording of the
server's events."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import Fixture, Recording, within

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


async def until(what: str, condition: Callable[[], bool], seconds: float = 20.0) -> None:
    """Waits for ``condition()`` to hold (a generous bound, not a timing
    assertion)."""

    async def poll() -> None:
        # Counters and records have no event to wait on; polling them is the
        # test's view.
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.002)

    await within(what, poll(), seconds)


async def other_process(target: str, session_id: str, action: str) -> None:
    """A Cancel or a Shutdown made by another process."""
    script = textwrap.dedent(
        f"""
        import asyncio, respcoord
        async def main():
            async with await respcoord.Client.connect({target!r}) as client:
                result = await client.session({session_id!r}).{action}()
                assert result is not None, result
        asyncio.run(main())
        """
    )
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", script)
    assert await within("the other process", process.wait(), 60) == 0


async def run_two_process_example(
    server: Fixture, example: str, prefix: str, rounds: int, seconds: float
) -> dict[str, Any]:
    """Runs ``examples/<example>`` (A, which starts B) for ``rounds`` rounds
    on the session ``<prefix>1`` and checks what the server saw against its
    JSON report: every response started and ended once, A's responses
    stopped (superseded when B answered, cancelled when B barged in) and
    never finished, B's answers finished once, no frame passed A's gate after
    it had observed a stop. Returns the report for the integration's own
    checks."""
    # Ends: one per A response, and one per B response (every other round).
    recording = Recording(server.grpc, prefix, rounds + rounds // 2)
    await recording.open()
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(EXAMPLES / example),
            server.grpc,
            "--session",
            f"{prefix}1",
            "--rounds",
            str(rounds),
            "--json",
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
        out, _ = await within("the example runs", process.communicate(), seconds)
        assert process.returncode == 0, out.decode()
        report: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        await within("every response ended", recording.all_ended.wait())
    finally:
        await recording.close()
    a_ids = [r["a_response"] for r in report["rounds"]]
    b_ids = [r["b_response"] for r in report["rounds"] if r["b_response"] is not None]
    assert len(a_ids) == rounds
    assert len(b_ids) == rounds // 2
    assert set(recording.started) == {*a_ids, *b_ids}
    assert all(count == 1 for count in recording.started.values())
    assert all(recording.ended[i] == 1 for i in recording.started), recording.ended
    for round_ in report["rounds"]:
        assert round_["a_stop"] == ("superseded" if round_["b_response"] else "cancelled")
    assert report["frames_after_stop"] == 0
    for response_id in a_ids:
        assert await server.finishes(response_id) == 0
    for response_id in b_ids:
        assert await server.finishes(response_id) == 1
    assert report["b"]["barge_ins_applied"] == rounds - rounds // 2
    assert report["b"]["responses_finished"] == rounds // 2
    return report

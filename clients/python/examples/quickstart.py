"""Quickstart: connect, start a response, barge in, finish.

Start a coordinator (`respcoord serve --listen 127.0.0.1:50051`), then
`python quickstart.py` (or `python quickstart.py host:port`).
scripts/test-python.sh runs this file against the installed wheel and sdist.
"""

import asyncio
import os
import sys
import time

import respcoord


async def main(target: str) -> None:
    async with await respcoord.Client.connect(target) as client:  # Unavailable if nothing answers
        session = client.session(f"quickstart-{os.getpid()}-{time.time_ns()}")

        # The assistant starts answering: the session's one live response.
        first = await session.start(respcoord.Source.CLIENT)
        print(f"response {first.id} started")

        # The user barges in (on this gateway process or any other): a second
        # Start supersedes the first.
        second = await session.start(respcoord.Source.VAD)
        assert second.superseded == first.id
        print(f"response {second.id} started, superseding {first.id}")

        # The first response's fence turns false: stop sending its audio.
        # (Check first.is_current() before every chunk, or use first.on_stop.)
        reason = await first.stopped()
        assert reason is respcoord.StopReason.SUPERSEDED
        assert not first.is_current()
        print(f"response {first.id} stopped ({reason}); its fence is closed")

        # The second response runs to its end: report its terminal, exactly once.
        finished = await second.finish(respcoord.Terminal.COMPLETED)
        assert finished is respcoord.Finished.APPLIED
        print(f"response {second.id} finished: {finished}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"))

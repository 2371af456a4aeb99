"""A gateway that holds one live response and does nothing else, for
``respcoord-bench gateways`` (what an idle gateway pays for the rest of the
deployment's traffic):

    python idle_gateway.py ENDPOINT SESSION

Prints ``ready`` once the response is live; exits when its standard input
closes (or with status 3 if the response is stopped meanwhile). The Rust
probe is clients/rust/examples/idle_gateway.rs.
"""

import asyncio
import sys

import respcoord


async def stdin_closed() -> None:
    """Returns once standard input reaches its end."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    try:
        while await reader.read(4096):
            pass
    finally:
        transport.close()


async def main(endpoint: str, session: str) -> int:
    async with await respcoord.Client.connect(endpoint) as client:
        response = await client.session(session).start(respcoord.Source.CLIENT)
        print("ready", flush=True)
        closed = asyncio.ensure_future(stdin_closed())
        stopped = asyncio.ensure_future(response.stopped())
        await asyncio.wait([closed, stopped], return_when=asyncio.FIRST_COMPLETED)
        closed.cancel()
        stopped.cancel()
        if stopped.done() and not stopped.cancelled():
            print(f"idle_gateway: the response was stopped: {stopped.result()}", file=sys.stderr)
            return 3
        return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: idle_gateway.py ENDPOINT SESSION")
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))

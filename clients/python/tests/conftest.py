from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import pytest
from harness import Binary, Fixture

import respcoord


class Servers:
    """Every client and server a test made, closed whatever happened."""

    def __init__(self, stack: contextlib.AsyncExitStack) -> None:
        self._stack = stack

    async def fixture(self, *args: str) -> Fixture:
        backend = os.environ.get("RESPCOORD_TEST_BACKEND", "memory")
        if backend == "nats":
            url = os.environ.get("RESPCOORD_TEST_NATS_URL", "nats://127.0.0.1:4222")
            args = (*args, "--backend", "nats", "--nats-url", url)
        server = await Fixture.start(*args)
        self._stack.push_async_callback(server.stop)
        return server

    async def binary(self, port: int, *args: str) -> Binary:
        server = await Binary.start(port, *args)
        self._stack.push_async_callback(server.kill)
        return server

    async def client(self, target: str, **options: object) -> respcoord.Client:
        client = await respcoord.Client.connect(target, **options)  # type: ignore[arg-type]
        self._stack.push_async_callback(client.close)
        return client

    def defer(self, callback: object) -> None:
        self._stack.callback(callback)  # type: ignore[arg-type]


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    async with contextlib.AsyncExitStack() as stack:
        yield Servers(stack)

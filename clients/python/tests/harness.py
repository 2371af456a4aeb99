"""Real servers on loopback for the tests: the scenario fixture and the
respcoord binary, found through RESPCOORD_FIXTURE_BIN / RESPCOORD_SERVER_BIN
(default: target/debug under the repository root)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import urllib.request
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import grpc

from respcoord.v1 import coordinator_pb2 as pb
from respcoord.v1 import coordinator_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from respcoord.v1.coordinator_pb2_grpc import ResponseCoordinatorAsyncStub

_T = TypeVar("_T")

REPO_ROOT = Path(__file__).resolve().parents[3]
FIXTURE_BIN = os.environ.get(
    "RESPCOORD_FIXTURE_BIN", str(REPO_ROOT / "target/debug/examples/scenario_fixture")
)
SERVER_BIN = os.environ.get("RESPCOORD_SERVER_BIN", str(REPO_ROOT / "target/debug/respcoord"))
SCENARIOS_FILE = REPO_ROOT / "clients/scenarios/scenarios.json"


@dataclass(frozen=True)
class Scenario:
    id: str
    server: str
    title: str
    params: dict[str, Any]

    def number(self, name: str) -> int:
        value = self.params.get(name)
        if not isinstance(value, int):
            raise AssertionError(f"scenario {self.id}: no number param {name}")
        return value

    def string(self, name: str) -> str:
        value = self.params.get(name)
        if not isinstance(value, str):
            raise AssertionError(f"scenario {self.id}: no string param {name}")
        return value


def load_scenarios() -> list[Scenario]:
    data = json.loads(SCENARIOS_FILE.read_text())
    return [
        Scenario(s["id"], s["server"], s["title"], s.get("params", {})) for s in data["scenarios"]
    ]


async def within(what: str, awaitable: Awaitable[_T], seconds: float = 20.0) -> _T:
    """Fails a "did it happen at all" wait after a generous time (never a
    timing assertion)."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        raise AssertionError(f"{what}: did not happen within {seconds} s") from None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Fixture:
    """A running scenario_fixture (it exits when its stdin closes)."""

    def __init__(self, process: asyncio.subprocess.Process, addresses: dict[str, str]) -> None:
        self._process = process
        self.grpc = addresses["grpc"]
        self.proxy = addresses["proxy"]
        self.control = addresses["control"]

    @classmethod
    async def start(cls, *args: str) -> Fixture:
        process = await asyncio.create_subprocess_exec(
            FIXTURE_BIN,
            "serve",
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        assert process.stdout is not None
        line = await within("the fixture prints its addresses", process.stdout.readline())
        if not line:
            await process.wait()
            raise AssertionError(f"scenario_fixture exited ({process.returncode})")
        return cls(process, json.loads(line))

    async def _control(self, method: str, path: str) -> bytes:
        def request() -> bytes:
            req = urllib.request.Request(f"{self.control}{path}", method=method)
            with urllib.request.urlopen(req, timeout=10) as reply:
                body: bytes = reply.read()
                return body

        return await asyncio.to_thread(request)

    async def finishes(self, response_id: int) -> int:
        count: int = json.loads(await self._control("GET", f"/finishes/{response_id}"))["count"]
        return count

    async def starts(self) -> int:
        count: int = json.loads(await self._control("GET", "/starts"))["count"]
        return count

    async def lose_next_start_reply(self) -> None:
        await self._control("POST", "/lose-next-start-reply")

    async def cut(self) -> None:
        await self._control("POST", "/cut")

    async def hold_next_watch(self) -> None:
        """The next Watch call waits, before the server sees it, until
        :meth:`release_watches`."""
        await self._control("POST", "/hold-next-watch")

    async def held_watches(self) -> int:
        count: int = json.loads(await self._control("GET", "/held-watches"))["count"]
        return count

    async def release_watches(self) -> None:
        await self._control("POST", "/release-watches")

    async def stop(self) -> None:
        if self._process.returncode is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            self._process.terminate()
            await self._process.wait()

    @staticmethod
    async def certs(directory: Path) -> None:
        process = await asyncio.create_subprocess_exec(FIXTURE_BIN, "certs", str(directory))
        if await process.wait() != 0:
            raise AssertionError(f"scenario_fixture certs: exit {process.returncode}")


async def _port_accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


class Binary:
    """The real respcoord binary on a fixed port."""

    def __init__(self, process: asyncio.subprocess.Process, port: int) -> None:
        self._process = process
        self.port = port

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    async def start(cls, port: int, *args: str) -> Binary:
        process = await asyncio.create_subprocess_exec(
            SERVER_BIN,
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )

        async def accepting() -> None:
            while not await _port_accepts(port):
                if process.returncode is not None:
                    raise AssertionError(f"respcoord exited ({process.returncode})")
                await asyncio.sleep(0.025)

        await within("the respcoord binary accepts connections", accepting())
        return cls(process, port)

    async def kill(self) -> None:
        if self._process.returncode is None:
            self._process.kill()
            await self._process.wait()


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values."""
    if not sorted_values:
        return float("nan")
    rank = min(len(sorted_values) - 1, max(0, -(-len(sorted_values) * p // 100) - 1))
    return sorted_values[int(rank)]


def latency_summary(millis: list[float]) -> str:
    """p50, p99 and max of latencies in milliseconds, as the latency scenarios print them."""
    ordered = sorted(millis)
    return (
        f"p50 {percentile(ordered, 50):.2f} ms, p99 {percentile(ordered, 99):.2f} ms, "
        f"max {ordered[-1]:.2f} ms"
    )


def rng(seed: int) -> random.Random:
    """A seeded generator, so a failing round can be replayed."""
    return random.Random(seed)


class Recording:
    """A raw watch-all, positioned before the first round, counting the
    started and ended events of sessions with a prefix."""

    def __init__(self, target: str, prefix: str, expected_ends: int) -> None:
        self._channel = grpc.aio.insecure_channel(target)
        self._stub = cast(
            "ResponseCoordinatorAsyncStub", pb_grpc.ResponseCoordinatorStub(self._channel)
        )
        self._prefix = prefix
        self._expected = expected_ends
        self.started: Counter[int] = Counter()
        self.ended: Counter[int] = Counter()
        self.all_ended = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        listed = await self._stub.ListSessions(pb.ListSessionsRequest(page_size=1))
        call = self._stub.Watch(pb.WatchRequest(session_id="", after_seq=listed.seq))
        await call.initial_metadata()
        self._task = asyncio.create_task(self._follow(call))

    async def _follow(
        self, call: grpc.aio.UnaryStreamCall[pb.WatchRequest, pb.WatchResponse]
    ) -> None:
        try:
            async for message in call:
                for event in message.events:
                    if not event.session_id.startswith(self._prefix):
                        continue
                    kind = event.WhichOneof("kind")
                    if kind == "started":
                        self.started[event.started.response_id] += 1
                    elif kind == "ended":
                        self.ended[event.ended.response_id] += 1
                        if sum(self.ended.values()) == self._expected:
                            self.all_ended.set()
        finally:
            self.all_ended.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self._channel.close(None)

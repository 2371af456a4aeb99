"""Who asked for a cancel reaches the watched event (issue 45): the source
this client sends with a Cancel and with a Shutdown is the ``source`` of the
``cancel_requested`` the coordinator emits. Against the real server on the
backend the run selects."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import grpc
from conftest import Servers

import respcoord
from respcoord.v1 import coordinator_pb2 as pb
from respcoord.v1 import coordinator_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from respcoord.v1.coordinator_pb2_grpc import ResponseCoordinatorAsyncStub


async def test_cancel_and_shutdown_send_their_source(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    session = client.session("who-asked")
    first = await session.start(respcoord.Source.CLIENT)
    assert await session.cancel(source=respcoord.Source.VAD) == first.id
    second = await session.start(respcoord.Source.VAD)
    assert await session.shutdown(source=respcoord.Source.CLIENT) == second.id
    cancels: list[tuple[int, int, int]] = []
    async with grpc.aio.insecure_channel(server.grpc) as channel:
        # The generated stub is typed for a synchronous channel; on an aio
        # channel it is the async stub (as tests/harness.py casts it).
        stub = cast("ResponseCoordinatorAsyncStub", pb_grpc.ResponseCoordinatorStub(channel))
        request = pb.WatchRequest(session_id="who-asked", after_revision=0)
        # The session is torn down: its watch ends after `terminated`.
        async for reply in stub.Watch(request):
            for event in reply.events:
                if event.WhichOneof("kind") == "cancel_requested":
                    cancel = event.cancel_requested
                    cancels.append((cancel.response_id, cancel.reason, cancel.source))
    assert cancels == [
        (first.id, pb.CANCEL_REASON_REQUESTED, pb.SOURCE_VAD),
        (second.id, pb.CANCEL_REASON_SHUTDOWN, pb.SOURCE_CLIENT),
    ]

"""The rules written once for every client (clients/scenarios/rules.json):
this client's id validation, retry classification and stop reasons must say
what the file says. The Rust and TypeScript clients have the same test; a
rule changed in one place fails until all three agree."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import grpc
import pytest
from conftest import Servers
from harness import within

import respcoord
from respcoord._client import _validate_request_id, validate_session_id
from respcoord._enums import stop_reason_from_cancel
from respcoord._retry import RetryPolicy, retryable, with_retry
from respcoord.v1 import coordinator_pb2 as pb
from respcoord.v1 import coordinator_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from respcoord.v1.coordinator_pb2_grpc import ResponseCoordinatorAsyncStub

CLIENT_DIR = Path(__file__).resolve().parents[1]
"""clients/python: the rules are beside it."""
RULES_FILE = CLIENT_DIR / ".." / "scenarios" / "rules.json"
RULES: dict[str, Any] = json.loads(RULES_FILE.read_text(encoding="utf-8"))
RESETTING_SERVER = Path(__file__).resolve().parent / "resetting_server.mjs"

_VALIDATE = {"session_id": validate_session_id, "request_id": _validate_request_id}
"""What the client refuses before sending: its own validation of each field
(``Client.session``/``get_state`` and ``Session.start``'s given request id)."""

_STATUS_NAMES = {code.name for code in grpc.StatusCode if code != grpc.StatusCode.OK}


def _case_value(case: dict[str, Any]) -> str:
    if "value" in case:
        value: str = case["value"]
        return value
    repeated: str = case["repeat"] * case["times"]
    return repeated


def _case_id(case: dict[str, Any]) -> str:
    shown = repr(case["value"]) if "value" in case else f"{case['repeat']!r}*{case['times']}"
    return f"{case['field']}={shown}"


def _stub(channel: grpc.aio.Channel) -> ResponseCoordinatorAsyncStub:
    return cast("ResponseCoordinatorAsyncStub", pb_grpc.ResponseCoordinatorStub(channel))


def _sent(code: grpc.StatusCode, details: str = "from the server") -> grpc.aio.AioRpcError:
    """A failed call as grpcio raises it for a status the server sent."""
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details, debug_error_string=""
    )


def test_the_file_is_the_version_this_test_reads() -> None:
    assert RULES["version"] == 1


def test_the_id_limits_are_the_rules_max_bytes() -> None:
    assert RULES["ids"]["session_id"]["max_bytes"] == respcoord.MAX_SESSION_ID_BYTES
    assert RULES["ids"]["request_id"]["max_bytes"] == respcoord.MAX_REQUEST_ID_BYTES
    assert len(RULES["ids"]["cases"]) > 10


@pytest.mark.parametrize("case", RULES["ids"]["cases"], ids=_case_id)
def test_each_id_case_is_accepted_or_refused_naming_the_field(case: dict[str, Any]) -> None:
    validate = _VALIDATE[case["field"]]
    value = _case_value(case)
    if case["valid"]:
        assert validate(value) == value
    else:
        with pytest.raises(respcoord.InvalidArgument) as refused:
            validate(value)
        assert refused.value.field == case["field"]
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_the_file_classifies_every_status_code_once() -> None:
    retried, final = RULES["retry"]["retryable"], RULES["retry"]["final"]
    assert len(set(retried)) == len(retried)
    assert len(set(final)) == len(final)
    assert not set(retried) & set(final)
    assert len(_STATUS_NAMES) == 16
    assert set(retried) | set(final) == _STATUS_NAMES


def test_every_status_code_the_server_sends_is_retried_or_final_as_the_rules_say() -> None:
    for name in RULES["retry"]["retryable"]:
        assert retryable(_sent(grpc.StatusCode[name])), f"{name} is retryable"
    for name in RULES["retry"]["final"]:
        assert not retryable(_sent(grpc.StatusCode[name])), f"{name} is final"


def test_every_cancel_reason_on_the_wire_maps_to_the_stop_reason_the_rules_name() -> None:
    mapping: dict[str, str] = RULES["stop_reasons"]["from_cancel_reason"]
    assert set(mapping) == set(pb.CancelReason.keys())
    for name, stop in mapping.items():
        assert stop_reason_from_cancel(pb.CancelReason.Value(name)) == stop, name


def test_stop_reason_has_exactly_the_rules_names() -> None:
    names: list[str] = RULES["stop_reasons"]["names"]
    assert sorted(reason.value for reason in respcoord.StopReason) == sorted(names)


# An INTERNAL from the transport (rules: retry.internal_from_the_transport),
# against a bare HTTP/2 server that resets streams as a replica killed
# mid-call does (tests/resetting_server.mjs, run by Node).


def test_the_rules_say_an_internal_from_the_transport_is_retried() -> None:
    assert RULES["retry"]["internal_from_the_transport"].startswith("retryable: ")


@contextlib.asynccontextmanager
async def _http2_server(mode: str) -> AsyncIterator[str]:
    """tests/resetting_server.mjs in ``mode``; yields its ``host:port``."""
    node = shutil.which("node")
    assert node is not None, "the resetting server needs Node (20+) on PATH"
    process = await asyncio.create_subprocess_exec(
        node,
        str(RESETTING_SERVER),
        mode,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        line = await within("the resetting server listens", process.stdout.readline())
        assert line.strip().isdigit(), f"the resetting server printed {line!r}"
        yield f"127.0.0.1:{int(line)}"
    finally:
        # It exits when its stdin closes.
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


async def _get_state(target: str) -> grpc.aio.AioRpcError:
    """One GetState through the generated stub, no retries: the error grpcio
    raises."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = _stub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.GetState(pb.GetStateRequest(session_id="s"), timeout=5)
        return failed.value


async def test_a_reset_stream_is_internal_with_the_transports_details_and_retryable() -> None:
    async with _http2_server("reset") as target:
        error = await _get_state(target)
    assert error.code() == grpc.StatusCode.INTERNAL, error
    # grpcio 1.71: "Received RST_STREAM with error code 2"; newer ones wrap it
    # as "Stream removed (RST_STREAM (Received RST_STREAM with error code 2))".
    assert "Received RST_STREAM with error code 2" in (error.details() or ""), error
    assert retryable(error)


async def test_the_client_retries_a_reset_stream_and_the_next_attempt_is_answered(
    servers: Servers,
) -> None:
    async with _http2_server("reset-once") as target:
        client = await servers.client(f"http://{target}", lazy=True)
        state = await within("GetState", client.get_state("s"))
    assert state.phase == respcoord.Phase.IDLE


async def test_resets_are_retried_until_the_policy_ends() -> None:
    policy = RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.002)
    attempts = 0
    async with (
        _http2_server("reset") as target,
        grpc.aio.insecure_channel(target) as channel,
    ):
        stub = _stub(channel)

        async def attempt(seconds: float) -> pb.GetStateResponse:
            nonlocal attempts
            attempts += 1
            return await stub.GetState(pb.GetStateRequest(session_id="s"), timeout=seconds)

        with pytest.raises(respcoord.Internal) as failed:
            await within("the retries end", with_retry(policy, attempt))
    assert attempts == 3
    assert failed.value.code == grpc.StatusCode.INTERNAL


async def test_an_internal_the_server_sent_is_final(servers: Servers) -> None:
    async with _http2_server("internal") as target:
        error = await _get_state(target)
        assert error.code() == grpc.StatusCode.INTERNAL
        assert error.details() == "a server bug (stream 1)"
        assert not retryable(error)
        client = await servers.client(
            f"http://{target}",
            lazy=True,
            retry=RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.002),
        )
        with pytest.raises(respcoord.Internal) as failed:
            await within("GetState", client.get_state("s"))
    # The server counted one more stream: the client's one attempt.
    assert str(failed.value) == "INTERNAL: a server bug (stream 2)"

"""The pure parts: the fencing table, the error mapping, retries and
validation; and the local API rules against a real fixture."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import grpc
import pytest
from conftest import Servers
from harness import free_port, within

import respcoord
from respcoord import _retry
from respcoord._retry import RetryPolicy, backoff, with_retry
from respcoord._watcher import Liveness, Tracks
from respcoord.v1 import coordinator_pb2 as pb


def started(session: str, seq: int, response_id: int) -> pb.LifecycleEvent:
    return pb.LifecycleEvent(
        session_id=session, seq=seq, started=pb.ResponseStarted(response_id=response_id)
    )


def cancel_requested(session: str, seq: int, response_id: int, reason: int) -> pb.LifecycleEvent:
    return pb.LifecycleEvent(
        session_id=session,
        seq=seq,
        cancel_requested=pb.ResponseCancelRequested(response_id=response_id, reason=reason),  # type: ignore[arg-type]
    )


def terminated(session: str, seq: int) -> pb.LifecycleEvent:
    return pb.LifecycleEvent(
        session_id=session,
        seq=seq,
        terminated=pb.SessionTerminated(reason=pb.CANCEL_REASON_SHUTDOWN),
    )


class TestFencingTable:
    def test_a_supersede_stops_the_old_response_and_not_the_new_one(self) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        old, new = Liveness(10), Liveness(11)
        tracks.register(ref, old)
        tracks.register(ref, new)
        assert tracks.apply([started("s", 5, 11)]) == 5
        assert old.reason is respcoord.StopReason.SUPERSEDED
        assert new.is_current()
        tracks.apply([cancel_requested("s", 6, 11, pb.CANCEL_REASON_REQUESTED)])
        assert new.reason is respcoord.StopReason.CANCELLED

    def test_a_response_registered_after_its_stop_was_seen_is_stopped_at_once(self) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        tracks.apply([started("s", 1, 8)])
        late = Liveness(7)
        tracks.register(ref, late)
        assert late.reason is respcoord.StopReason.SUPERSEDED

    def test_dead_through_only_rises(self) -> None:
        tracks = Tracks()
        tracks.track("s")
        tracks.apply([started("s", 2, 20)])
        tracks.apply([started("s", 1, 5)])
        assert tracks.dead_through("s") == 19

    def test_termination_is_fenced_at_its_seq_so_a_reborn_session_lives(self) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        old = Liveness(3)
        tracks.register(ref, old)
        tracks.apply([terminated("s", 40)])
        assert old.reason is respcoord.StopReason.SHUTDOWN
        reborn = Liveness(41)
        tracks.register(ref, reborn)
        assert reborn.is_current()

    def test_untracked_sessions_are_ignored_and_a_track_goes_with_its_last_reference(
        self,
    ) -> None:
        tracks = Tracks()
        first, second = tracks.track("s"), tracks.track("s")
        tracks.apply([started("other", 1, 100)])
        assert tracks.dead_through("other") is None
        first.release()
        first.release()
        assert len(tracks) == 1
        second.release()
        assert len(tracks) == 0

    def test_a_relist_raises_from_listed_states_and_from_absence(self) -> None:
        tracks = Tracks()
        active, idle, gone = tracks.track("active"), tracks.track("idle"), tracks.track("gone")
        responses = {name: Liveness(5) for name in ("active", "idle", "gone")}
        for ref in (active, idle, gone):
            tracks.register(ref, responses[ref.session])
        epoch = tracks.begin_relist()
        late = tracks.track("late")  # made after the re-list began: not judged absent
        seen: set[str] = set()
        tracks.apply_listed(
            50,
            [
                pb.SessionState(session_id="active", phase=pb.PHASE_ACTIVE, active_response_id=9),
                pb.SessionState(session_id="idle", phase=pb.PHASE_IDLE),
            ],
            seen,
        )
        tracks.apply_absent(epoch, 50, seen)
        assert responses["active"].reason is respcoord.StopReason.SUPERSEDED
        assert responses["idle"].reason is respcoord.StopReason.GONE
        assert responses["gone"].reason is respcoord.StopReason.GONE
        assert tracks.dead_through(late.session) == 0

    def test_a_stop_callback_runs_once_in_the_stopping_step(self) -> None:
        liveness = Liveness(1)
        seen: list[respcoord.StopReason] = []
        remove = liveness.on_stop(seen.append)
        removed: list[respcoord.StopReason] = []
        liveness.on_stop(removed.append)()
        assert liveness.stop(respcoord.StopReason.CANCELLED)
        assert not liveness.stop(respcoord.StopReason.SUPERSEDED)
        remove()
        assert seen == [respcoord.StopReason.CANCELLED]
        assert removed == []
        late: list[respcoord.StopReason] = []
        liveness.on_stop(late.append)
        assert late == [respcoord.StopReason.CANCELLED]


class TestErrorMapping:
    @pytest.mark.parametrize(
        ("code", "error_class"),
        [
            (grpc.StatusCode.NOT_FOUND, respcoord.NotFound),
            (grpc.StatusCode.FAILED_PRECONDITION, respcoord.SessionTerminated),
            (grpc.StatusCode.PERMISSION_DENIED, respcoord.PermissionDenied),
            (grpc.StatusCode.UNAUTHENTICATED, respcoord.Unauthenticated),
            (grpc.StatusCode.UNAVAILABLE, respcoord.Unavailable),
            (grpc.StatusCode.DEADLINE_EXCEEDED, respcoord.DeadlineExceeded),
            (grpc.StatusCode.RESOURCE_EXHAUSTED, respcoord.ResourceExhausted),
            (grpc.StatusCode.OUT_OF_RANGE, respcoord.OutOfRange),
            (grpc.StatusCode.ABORTED, respcoord.Aborted),
            (grpc.StatusCode.CANCELLED, respcoord.Cancelled),
            (grpc.StatusCode.INTERNAL, respcoord.Internal),
            (grpc.StatusCode.UNIMPLEMENTED, respcoord.Internal),
        ],
    )
    def test_each_code_maps_to_its_class_under_the_root(
        self, code: grpc.StatusCode, error_class: type[respcoord.RespcoordError]
    ) -> None:
        error = respcoord.error_from_status(code, "details")
        assert type(error) is error_class
        assert isinstance(error, respcoord.RespcoordError)
        assert error.code == code
        assert "details" in str(error)

    def test_invalid_argument_names_the_field_from_the_servers_message(self) -> None:
        error = respcoord.error_from_status(
            grpc.StatusCode.INVALID_ARGUMENT, "session_id: must not be empty"
        )
        assert isinstance(error, respcoord.InvalidArgument)
        assert error.field == "session_id"
        assert error.reason == "must not be empty"
        unnamed = respcoord.error_from_status(grpc.StatusCode.INVALID_ARGUMENT, "Bad Thing")
        assert isinstance(unnamed, respcoord.InvalidArgument)
        assert unnamed.field == "request"


class FakeRpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(
            code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=code.name, debug_error_string=""
        )


class TestRetries:
    def test_backoff_doubles_with_jitter_up_to_the_cap(self) -> None:
        policy = RetryPolicy(initial_backoff=0.1, max_backoff=0.5)
        assert backoff(policy, 1, lambda: 0.0) == pytest.approx(0.05)
        assert backoff(policy, 1, lambda: 1.0) == pytest.approx(0.1)
        assert backoff(policy, 2, lambda: 1.0) == pytest.approx(0.2)
        assert backoff(policy, 10, lambda: 1.0) == pytest.approx(0.5)
        assert backoff(policy, 10_000, lambda: 0.0) == pytest.approx(0.25)

    async def test_transport_failures_are_retried_and_final_answers_are_not(self) -> None:
        policy = RetryPolicy(initial_backoff=0.001, max_backoff=0.002)
        codes = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED]
        attempts: list[float] = []

        async def flaky(seconds: float) -> str:
            attempts.append(seconds)
            if codes:
                raise FakeRpcError(codes.pop(0))
            return "ok"

        assert await with_retry(policy, flaky) == "ok"
        assert len(attempts) == 3
        assert all(0 < t <= policy.attempt_timeout for t in attempts)

        final: list[float] = []

        async def refused(seconds: float) -> str:
            final.append(seconds)
            raise FakeRpcError(grpc.StatusCode.NOT_FOUND)

        with pytest.raises(respcoord.NotFound) as caught:
            await with_retry(policy, refused)
        assert len(final) == 1
        assert isinstance(caught.value.__cause__, grpc.aio.AioRpcError)

    async def test_the_deadline_and_max_attempts_bound_all_attempts(self) -> None:
        async def down(_: float) -> str:
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)

        began = time.monotonic()
        with pytest.raises(respcoord.Unavailable):
            await with_retry(RetryPolicy(deadline=0.2, initial_backoff=0.01), down)
        assert time.monotonic() - began < 5, "the deadline ends the retries"
        count = 0

        async def counted(_: float) -> str:
            nonlocal count
            count += 1
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)

        with pytest.raises(respcoord.Unavailable):
            await with_retry(RetryPolicy(max_attempts=3, initial_backoff=0.001), counted)
        assert count == 3

    async def test_a_backoff_that_overruns_the_deadline_raises_the_last_real_failure(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A sleep can wake after the deadline it fitted before; the caller
        then hears the failure that was retried, and no attempt is made with
        no time left (it could only time out)."""
        now = [1000.0]

        async def oversleep(seconds: float) -> None:
            now[0] += seconds + 1.0

        monkeypatch.setattr(_retry, "time", SimpleNamespace(monotonic=lambda: now[0]))
        monkeypatch.setattr(_retry, "asyncio", SimpleNamespace(sleep=oversleep))
        calls = 0

        async def refused(_: float) -> str:
            nonlocal calls
            calls += 1
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)

        with pytest.raises(respcoord.Unavailable):
            await with_retry(RetryPolicy(deadline=0.5, initial_backoff=0.01), refused)
        assert calls == 1


class TestValidation:
    @pytest.mark.parametrize(
        "session_id", ["", "x" * 257, "tab\there", "nul\x00", "c1\x85", "del\x7f"]
    )
    def test_malformed_session_ids_are_refused_naming_the_field(self, session_id: str) -> None:
        with pytest.raises(respcoord.InvalidArgument) as caught:
            respcoord.validate_session_id(session_id)
        assert caught.value.field == "session_id"

    def test_the_longest_session_id_and_unicode_are_accepted(self) -> None:
        assert respcoord.validate_session_id("é" * 128) == "é" * 128
        assert respcoord.validate_session_id("x" * 256) == "x" * 256


async def test_local_rules_against_the_fixture(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    with pytest.raises(respcoord.InvalidArgument) as caught:
        client.session("bad\nid")
    assert caught.value.field == "session_id"
    session = client.session("local-rules")
    with pytest.raises(respcoord.InvalidArgument) as request_id:
        await session.start(respcoord.Source.CLIENT, request_id="r" * 129)
    assert request_id.value.field == "request_id"
    with pytest.raises(respcoord.InvalidArgument) as if_id:
        await session.cancel(if_response_id=0)
    assert if_id.value.field == "if_response_id"
    with pytest.raises(respcoord.InvalidArgument) as source:
        await session.start("client")  # type: ignore[arg-type]
    assert source.value.field == "source"
    assert await server.starts() == 0, "nothing was sent"
    with pytest.raises(respcoord.NotFound):
        await client.get_state("never-started")

    response = await session.start(respcoord.Source.CLIENT)
    assert await response.finish(respcoord.Terminal.COMPLETED) is respcoord.Finished.APPLIED
    assert response.stop_reason() is respcoord.StopReason.FINISHED
    with pytest.raises(respcoord.AlreadyFinished):
        await response.finish(respcoord.Terminal.COMPLETED)
    assert await server.finishes(response.id) == 1

    async with await session.start(respcoord.Source.VAD) as held:
        fence = held.fence()
        assert fence.is_current()
    assert not fence.is_current(), "leaving async with releases the response"
    assert fence.stop_reason() is respcoord.StopReason.RELEASED
    assert (await session.state()).phase is respcoord.Phase.ACTIVE, "release sends nothing"


async def test_a_body_that_raises_is_failed_and_finished_once(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)

    async def broken(_: respcoord.ResponseContext) -> None:
        raise ValueError("model crashed")

    outcome = await client.session("raises").run(respcoord.Source.CLIENT, broken)
    assert isinstance(outcome, respcoord.Failed)
    assert isinstance(outcome.error, ValueError)
    assert outcome.finished is respcoord.Finished.APPLIED
    assert await server.finishes(outcome.response_id) == 1


async def test_cancelling_the_caller_cancels_the_body_and_sends_nothing(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc)
    entered = asyncio.Event()
    unwound = asyncio.Event()
    fences: list[respcoord.Fence] = []

    async def body(ctx: respcoord.ResponseContext) -> None:
        fences.append(ctx.fence())
        entered.set()
        try:
            await asyncio.Event().wait()
        finally:
            unwound.set()

    run = asyncio.ensure_future(client.session("caller-cancel").run(respcoord.Source.CLIENT, body))
    await within("the body starts", entered.wait())
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert unwound.is_set(), "run returned after the body unwound"
    assert fences[0].stop_reason() is respcoord.StopReason.RELEASED
    assert await server.finishes(fences[0].id) == 0


async def test_a_stopped_body_has_unwound_when_run_returns(servers: Servers) -> None:
    server = await servers.fixture()
    a = await servers.client(server.grpc)
    b = await servers.client(server.grpc)
    entered = asyncio.Event()
    unwound: list[bool] = []

    async def body(_: respcoord.ResponseContext) -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # a slow cleanup is waited for
            unwound.append(True)
            raise

    run = asyncio.ensure_future(a.session("unwind").run(respcoord.Source.CLIENT, body))
    await within("the body starts", entered.wait())
    await b.session("unwind").cancel()
    outcome = await within("A's run returns", run)
    assert outcome.reason is respcoord.StopReason.CANCELLED  # type: ignore[union-attr]
    assert unwound == [True]


async def test_closing_the_client_fails_every_fence_closed(servers: Servers) -> None:
    server = await servers.fixture()
    client = await respcoord.Client.connect(server.grpc)
    response = await client.session("close").start(respcoord.Source.CLIENT)
    fence = response.fence()
    await client.close()
    await client.close()
    assert fence.stop_reason() is respcoord.StopReason.RELEASED
    with pytest.raises(respcoord.ClientClosed):
        client.session("close")


async def test_connect_fails_fast_with_unavailable_when_nothing_listens() -> None:
    with pytest.raises(respcoord.Unavailable):
        await respcoord.Client.connect(f"127.0.0.1:{free_port()}", connect_timeout=0.5)


async def test_bad_connection_settings_are_refused_naming_the_option() -> None:
    with pytest.raises(respcoord.ConfigError) as target:
        await respcoord.Client.connect("ftp://x:1")
    assert target.value.field == "target"
    with pytest.raises(respcoord.ConfigError) as token:
        await respcoord.Client.connect("127.0.0.1:1", token="bad\ntoken", lazy=True)
    assert token.value.field == "token"
    with pytest.raises(respcoord.ConfigError) as tls:
        await respcoord.Client.connect(
            "127.0.0.1:1", tls=respcoord.TlsOptions(ca="/nonexistent/ca.pem"), lazy=True
        )
    assert tls.value.field == "tls.ca"


@pytest.mark.parametrize(
    "target",
    ["http//nope", "nope", "localhost:port", "http://localhost:1/v1", "[::1", "u:p@host:1"],
)
async def test_a_malformed_target_is_a_config_error_at_once_not_a_timeout(target: str) -> None:
    started = time.monotonic()
    with pytest.raises(respcoord.ConfigError) as error:
        await respcoord.Client.connect(target, connect_timeout=5.0)
    assert error.value.field == "target"
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize(
    "target", ["localhost:50051", "http://127.0.0.1:1", "https://example.com:443", "[::1]:7"]
)
async def test_host_port_targets_are_accepted(target: str) -> None:
    client = await respcoord.Client.connect(target, lazy=True)
    await client.close()

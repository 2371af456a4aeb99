"""The shared client scenarios (clients/scenarios/scenarios.json), each
implemented under its id with its params read from the file, against the
real servers on loopback. RESPCOORD_TEST_BACKEND=nats runs the fixture on
the NATS JetStream backend."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from conftest import Servers
from harness import (
    Binary,
    Fixture,
    Recording,
    Scenario,
    free_port,
    latency_summary,
    load_scenarios,
    rng,
    within,
)

import respcoord

if TYPE_CHECKING:
    pass

Implementation = Callable[[Scenario, Servers], Awaitable[None]]
IMPLEMENTATIONS: dict[str, Implementation] = {}


def scenario(implementation: Implementation) -> Implementation:
    IMPLEMENTATIONS[implementation.__name__] = implementation
    return implementation


def endless(
    fence: asyncio.Future[respcoord.Fence],
) -> Callable[[respcoord.ResponseContext], Awaitable[None]]:
    """A body that never ends by itself: it hands out its fence and waits."""

    async def body(ctx: respcoord.ResponseContext) -> None:
        fence.set_result(ctx.fence())
        await asyncio.Event().wait()

    return body


def new_future() -> asyncio.Future[respcoord.Fence]:
    return asyncio.get_running_loop().create_future()


@scenario
async def superseded_by_another_gateway(_: Scenario, servers: Servers) -> None:
    server = await servers.fixture()
    a = await servers.client(server.grpc)
    b = await servers.client(server.grpc)
    fence = new_future()
    run = asyncio.ensure_future(
        a.session("superseded").run(respcoord.Source.CLIENT, endless(fence))
    )
    a_fence = await within("A's body starts", fence)
    b_response = await b.session("superseded").start(respcoord.Source.VAD)
    assert b_response.superseded == a_fence.id, "B's Start reports A's response as superseded"
    outcome = await within("A's run returns", run)
    assert outcome == respcoord.Stopped(respcoord.StopReason.SUPERSEDED, a_fence.id)
    assert await server.finishes(a_fence.id) == 0, "no Finish for A's response"
    assert not a_fence.is_current()
    assert a_fence.stop_reason() is respcoord.StopReason.SUPERSEDED
    assert b_response.is_current(), "B's response is still current"
    cancelled = await a.session("superseded").cancel()
    assert cancelled == b_response.id, "A's Cancel returns B's response id"
    assert await within("B's response stops", b_response.stopped()) is (
        respcoord.StopReason.CANCELLED
    )
    assert not b_response.is_current()


@scenario
async def cancelled_and_shut_down_by_another_gateway(_: Scenario, servers: Servers) -> None:
    server = await servers.fixture()
    a = await servers.client(server.grpc)
    b = await servers.client(server.grpc)
    first = await a.session("teardown").start(respcoord.Source.CLIENT)
    assert await b.session("teardown").cancel() == first.id, "B's Cancel returns A's response id"
    assert await within("the cancel reaches A", first.stopped()) is respcoord.StopReason.CANCELLED
    assert await first.finish(respcoord.Terminal.COMPLETED) is respcoord.Finished.NOT_SENT
    assert first.stop_reason() is respcoord.StopReason.CANCELLED
    assert await server.finishes(first.id) == 0
    second = await a.session("teardown").start(respcoord.Source.CLIENT)
    assert await b.session("teardown").shutdown() == second.id, "B's Shutdown returns the 2nd id"
    assert await within("the shutdown reaches A", second.stopped()) is (
        respcoord.StopReason.SHUTDOWN
    )
    with pytest.raises(respcoord.SessionTerminated) as terminated:
        await a.session("teardown").start(respcoord.Source.CLIENT)
    assert terminated.value.code == grpc.StatusCode.FAILED_PRECONDITION

    async def quick(_: respcoord.ResponseContext) -> str:
        return "done"

    outcome = await a.session("teardown-2").run(respcoord.Source.CLIENT, quick)
    assert isinstance(outcome, respcoord.Completed), outcome
    assert outcome.value == "done"
    assert outcome.finished is respcoord.Finished.APPLIED
    state = await a.session("teardown-2").state()
    assert state.phase is respcoord.Phase.IDLE
    assert state.revision == 2


@scenario
async def finish_vs_cancel_race(spec: Scenario, servers: Servers) -> None:
    rounds = spec.number("rounds")
    max_delay = spec.number("max_delay_micros") / 1e6
    server = await servers.fixture()
    a = await servers.client(server.grpc)
    b = await servers.client(server.grpc)
    recording = Recording(server.grpc, "race-", rounds)
    await recording.open()
    servers._stack.push_async_callback(recording.close)
    draw = rng(0x5EED)
    tally: Counter[str] = Counter()
    for round_ in range(rounds):
        session = f"race-{round_}"
        body_delay = draw.random() * max_delay
        cancel_delay = draw.random() * max_delay
        known: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def body(
            ctx: respcoord.ResponseContext,
            delay: float = body_delay,
            known: asyncio.Future[int] = known,
        ) -> int:
            known.set_result(ctx.response_id)
            await asyncio.sleep(delay)
            return 1

        run = asyncio.ensure_future(a.session(session).run(respcoord.Source.CLIENT, body))
        response_id = await within("A's response starts", known)
        await asyncio.sleep(cancel_delay)
        await b.session(session).cancel(if_response_id=response_id)
        outcome = await within("A's run returns", run)
        finishes = await server.finishes(response_id)
        match outcome:
            case respcoord.Completed(
                finished=respcoord.Finished.APPLIED | respcoord.Finished.STALE as finished
            ):
                tally[finished.value] += 1
                assert finishes == 1, f"round {round_}: {finished} means exactly 1 Finish"
            case respcoord.Completed(finished=respcoord.Finished.NOT_SENT):
                tally["not_sent"] += 1
                assert finishes == 0, f"round {round_}: not_sent means no Finish"
            case respcoord.Stopped():
                tally["stopped"] += 1
                assert finishes == 0, f"round {round_}: stopped means no Finish"
            case _:
                pytest.fail(f"round {round_}: unexpected outcome {outcome!r}")
    await within("every response's end is recorded", recording.all_ended.wait())
    assert len(recording.started) == rounds, "one started event per round"
    assert sum(recording.ended.values()) == rounds, "one ended event per round"
    for response_id, count in recording.started.items():
        assert count == 1
        assert recording.ended[response_id] == 1, f"exactly one ended event for {response_id}"
    print(f"finish vs cancel race (python, {rounds} rounds): {dict(tally)}")


@scenario
async def lost_start_reply_is_replayed(_: Scenario, servers: Servers) -> None:
    server = await servers.fixture()
    a = await servers.client(server.grpc)
    session = a.session("lost-reply")
    await server.lose_next_start_reply()
    before = await server.starts()
    first = await session.start(respcoord.Source.CLIENT)
    assert await server.starts() - before == 2, "the first call reached the server twice"
    assert first.replayed
    assert first.is_current()
    state = await session.state()
    assert state.responses_started == 1
    assert state.response_id == first.id
    turn = await session.start(respcoord.Source.CLIENT, request_id="turn-7")
    assert turn.superseded == first.id, "the first turn-7 Start supersedes"
    assert await within("the first response stops", first.stopped()) is (
        respcoord.StopReason.SUPERSEDED
    )
    again = await session.start(respcoord.Source.CLIENT, request_id="turn-7")
    assert again.replayed
    assert again.id == turn.id
    assert turn.is_current()
    assert again.is_current()
    assert await again.finish(respcoord.Terminal.COMPLETED) is respcoord.Finished.APPLIED


@scenario
async def coordinator_down_then_back(_: Scenario, servers: Servers) -> None:
    port = free_port()
    a = await servers.client(
        f"127.0.0.1:{port}", lazy=True, retry=respcoord.RetryPolicy(deadline=20.0)
    )
    start = asyncio.ensure_future(a.session("down-then-back").start(respcoord.Source.CLIENT))
    await asyncio.sleep(0.3)
    await servers.fixture("--listen", f"127.0.0.1:{port}")
    response = await within("the Start succeeds", start, 30.0)
    assert response.is_current()
    assert (await a.session("down-then-back").state()).responses_started == 1


async def until(what: str, condition: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not condition():  # noqa: ASYNC110 (a client's status, no event to wait on)
            await asyncio.sleep(0.01)

    await within(what, poll())


@scenario
async def watch_broken_and_resumed(spec: Scenario, servers: Servers) -> None:
    server = await servers.fixture()
    a = await servers.client(server.proxy, watch_linger=spec.number("linger_ms") / 1000)
    b = await servers.client(server.grpc)
    response = await a.session("broken-watch").start(respcoord.Source.CLIENT)
    await until("A's session watch is open", lambda: a.watch_status().opened == 1)
    before = a.watch_status()
    assert before.open == 1, f"one session watch: {before}"
    # Cut A off; once its watch noticed (a state read is under way or done),
    # supersede its response.
    await server.cut()
    await until("A's watch notices the cut", lambda: a.watch_status().rereads > before.rereads)
    barge_in = await b.session("broken-watch").start(respcoord.Source.VAD)
    assert barge_in.superseded == response.id
    assert await within("A learns after resuming", response.stopped()) is (
        respcoord.StopReason.SUPERSEDED
    )
    await until("the watch closes after the linger", lambda: a.watch_status().open == 0)
    after = a.watch_status()
    assert after.rereads > before.rereads, f"{before} -> {after}"


@scenario
async def coordinator_restart_mid_run(_: Scenario, servers: Servers) -> None:
    port = free_port()
    first = await Binary.start(port)
    servers._stack.push_async_callback(first.kill)
    a = await servers.client(f"127.0.0.1:{port}", retry=respcoord.RetryPolicy(deadline=20.0))
    fence = new_future()
    run = asyncio.ensure_future(a.session("restart").run(respcoord.Source.CLIENT, endless(fence)))
    old_fence = await within("A's body starts", fence)
    await first.kill()
    await servers.binary(port)
    outcome = await within("A's run returns", run, 30.0)
    assert outcome == respcoord.Stopped(respcoord.StopReason.GONE, old_fence.id)
    assert not old_fence.is_current()
    status = a.watch_status()
    assert status.rereads >= 1, f"the watch read the session's state: {status}"
    renewed = await a.session("restart").start(respcoord.Source.CLIENT)
    assert renewed.id > old_fence.id
    assert (await a.session("restart").state()).responses_started == 1
    b = await servers.client(f"127.0.0.1:{port}")
    await b.session("restart").start(respcoord.Source.VAD)
    assert await within("a new watch works after the restart", renewed.stopped()) is (
        respcoord.StopReason.SUPERSEDED
    )


def open_and_opened(client: respcoord.Client) -> tuple[int, int]:
    status = client.watch_status()
    return status.open, status.opened


@scenario
async def session_watch_follows_live_responses(spec: Scenario, servers: Servers) -> None:
    linger = spec.number("linger_ms") / 1000
    server = await servers.fixture()
    a = await servers.client(server.grpc, watch_linger=linger)
    b = await servers.client(server.grpc)
    x, y = a.session("follow-x"), a.session("follow-y")
    status = a.watch_status()
    assert (status.open, status.opened) == (0, 0), f"handles alone: {status}"
    on_x = await x.start(respcoord.Source.CLIENT)
    assert a.watch_status().open == 1
    on_y = await y.start(respcoord.Source.CLIENT)
    assert a.watch_status().open == 2
    await until("both watches are open", lambda: a.watch_status().opened == 2)
    assert await on_x.finish(respcoord.Terminal.COMPLETED) is respcoord.Finished.APPLIED
    await b.session("follow-y").start(respcoord.Source.VAD)
    assert await within("Y's response is superseded", on_y.stopped()) is (
        respcoord.StopReason.SUPERSEDED
    )
    assert open_and_opened(a) == (2, 2), f"the watches linger: {a.watch_status()}"
    # Traffic on a session A has nothing live in reaches A not at all.
    z = b.session("follow-z")
    for _round in range(5):
        await z.start(respcoord.Source.VAD)
    await asyncio.sleep(linger)
    await until("no watch after the linger", lambda: a.watch_status().open == 0)
    assert a.watch_status().opened == 2, "no watch of Z, nor of everything"


@scenario
async def stop_between_start_reply_and_watch(_: Scenario, servers: Servers) -> None:
    server = await servers.fixture()
    a = await servers.client(server.grpc)
    b = await servers.client(server.grpc)
    await server.hold_next_watch()
    response = await a.session("between").start(respcoord.Source.CLIENT)

    async def held() -> None:
        while await server.held_watches() != 1:  # noqa: ASYNC110 (the fixture's count)
            await asyncio.sleep(0.01)

    await within("A's session watch reaches the hold", held())
    await b.session("between").start(respcoord.Source.VAD)
    await asyncio.sleep(0.05)
    assert response.is_current(), "nothing has told A yet"
    await server.release_watches()
    assert await within("the watch replays the supersede", response.stopped()) is (
        respcoord.StopReason.SUPERSEDED
    )
    assert a.watch_status().rereads == 0, "replayed from the Start reply's revision, no state read"


@scenario
async def watch_lingers_across_responses(spec: Scenario, servers: Servers) -> None:
    server = await servers.fixture()
    a = await servers.client(server.grpc, watch_linger=spec.number("linger_ms") / 1000)
    b = await servers.client(server.grpc)
    session = a.session("linger")
    first = await session.start(respcoord.Source.CLIENT)
    assert await first.finish(respcoord.Terminal.COMPLETED) is respcoord.Finished.APPLIED
    await until("the watch's stream is open", lambda: a.watch_status().opened == 1)
    assert open_and_opened(a) == (1, 1), f"after the first Finish: {a.watch_status()}"
    second = await session.start(respcoord.Source.CLIENT)
    assert open_and_opened(a) == (1, 1), f"no new Watch call: {a.watch_status()}"
    await b.session("linger").start(respcoord.Source.VAD)
    assert await within("A's second response is superseded", second.stopped()) is (
        respcoord.StopReason.SUPERSEDED
    )
    status = a.watch_status()
    assert (status.opened, status.rereads) == (1, 0), f"one stream, no state read: {status}"


@scenario
async def open_watch_before_first_start(spec: Scenario, servers: Servers) -> None:
    server = await servers.fixture()
    a = await servers.client(server.grpc, watch_linger=spec.number("linger_ms") / 1000)
    b = await servers.client(server.grpc)
    session = a.session("ahead")
    session.open_watch()
    assert a.watch_status().open == 1, "right after open_watch"
    await until("the stream is open", lambda: a.watch_status().opened == 1)
    response = await session.start(respcoord.Source.CLIENT)
    assert a.watch_status().opened == 1, "the Start needed no Watch call"
    await b.session("ahead").start(respcoord.Source.VAD)
    assert await within("A's response is superseded", response.stopped()) is (
        respcoord.StopReason.SUPERSEDED
    )


async def opened_beyond(client: respcoord.Client, opened: int) -> None:
    await until("the stream is open", lambda: client.watch_status().opened > opened)


@scenario
async def stop_right_after_start_reply(spec: Scenario, servers: Servers) -> None:
    rounds = spec.number("rounds")
    run = f"{os.getpid()}-{time.time_ns()}"
    server = await servers.fixture()
    a = await servers.client(server.grpc)
    b = await servers.client(server.grpc)
    millis: dict[bool, list[float]] = {True: [], False: []}
    for round_ in range(rounds):
        name = f"quick-{run}-{round_}"
        session = a.session(name)
        ahead = round_ % 2 == 0
        if ahead:
            # A gateway opens it when it begins serving the session, well
            # before its first response: the stream is open by then.
            opened = a.watch_status().opened
            session.open_watch()
            await opened_beyond(a, opened)
        response = await session.start(respcoord.Source.CLIENT)
        stop_seen: list[float] = []

        def closed(_: respcoord.StopReason, seen: list[float] = stop_seen) -> None:
            seen.append(time.perf_counter())

        response.on_stop(closed)
        began = time.perf_counter()
        cancelled = await b.session(name).cancel(if_response_id=response.id)
        assert cancelled == response.id, f"round {round_}: B cancelled A's response"
        assert await within("A's response stops", response.stopped()) is (
            respcoord.StopReason.CANCELLED
        ), f"round {round_}"
        assert stop_seen, f"round {round_}: the fence closed"
        millis[ahead].append((stop_seen[0] - began) * 1000)

    print(
        f"stop after start (python, {rounds} rounds, B's Cancel right after A's Start reply "
        f"to A's fence turning false): watch opened ahead {latency_summary(millis[True])}; "
        f"not ahead {latency_summary(millis[False])}"
    )


@scenario
async def hundreds_of_sessions_on_one_client(spec: Scenario, servers: Servers) -> None:
    sessions = spec.number("sessions")
    server = await servers.fixture()
    a = await servers.client(server.grpc, watch_linger=spec.number("linger_ms") / 1000)
    b = await servers.client(server.grpc)
    responses = [
        await a.session(f"many-{i}").start(respcoord.Source.CLIENT) for i in range(sessions)
    ]
    assert a.watch_status().open == sessions
    for i in range(sessions):
        await b.session(f"many-{i}").start(respcoord.Source.VAD)
    for response in responses:
        assert await within("every response is superseded", response.stopped()) is (
            respcoord.StopReason.SUPERSEDED
        )
    await until("no watch after the linger", lambda: a.watch_status().open == 0)


def temporary_directory(servers: Servers, prefix: str) -> Path:
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    servers.defer(lambda: shutil.rmtree(directory, ignore_errors=True))
    return directory


@scenario
async def bearer_token_on_every_call(spec: Scenario, servers: Servers) -> None:
    token = spec.string("token")
    directory = temporary_directory(servers, "respcoord-py-token-")
    (directory / "tokens").write_text(f"{token}\n")
    server = await servers.fixture("--auth-tokens", str(directory / "tokens"))
    anonymous = await servers.client(server.grpc)
    with pytest.raises(respcoord.Unauthenticated):
        await anonymous.get_state("token-1")
    a = await servers.client(server.grpc, token=token)
    b = await servers.client(server.grpc, token=token)
    response = await a.session("token-1").start(respcoord.Source.CLIENT)
    await b.session("token-1").start(respcoord.Source.VAD)
    assert await within("A's authorized watch sees the supersede", response.stopped()) is (
        respcoord.StopReason.SUPERSEDED
    )


@scenario
async def mutual_tls_with_scoped_token(spec: Scenario, servers: Servers) -> None:
    token = spec.string("token")
    directory = temporary_directory(servers, "respcoord-py-tls-")
    await Fixture.certs(directory)
    (directory / "tokens").write_text(f"{token} {spec.string('scope')}\n")
    port = free_port()
    await servers.binary(
        port,
        "--tls-cert",
        str(directory / "server.pem"),
        "--tls-key",
        str(directory / "server-key.pem"),
        "--tls-client-ca",
        str(directory / "client-ca.pem"),
        "--auth-tokens",
        str(directory / "tokens"),
    )
    domain = spec.string("domain")
    tls = respcoord.TlsOptions(
        ca=directory / "server-ca.pem",
        cert=directory / "gateway.pem",
        key=directory / "gateway-key.pem",
        domain=domain,
    )
    a = await servers.client(f"127.0.0.1:{port}", tls=tls, token=token)
    b = await servers.client(f"127.0.0.1:{port}", tls=tls, token=token)
    session = spec.string("session")
    response = await a.session(session).start(respcoord.Source.CLIENT)
    await b.session(session).start(respcoord.Source.VAD)
    assert await within("the supersede arrives over mutual TLS", response.stopped()) is (
        respcoord.StopReason.SUPERSEDED
    )
    with pytest.raises(respcoord.PermissionDenied):
        await a.get_state(spec.string("outside"))
    no_certificate = await servers.client(
        f"127.0.0.1:{port}",
        tls=respcoord.TlsOptions(ca=tls.ca, domain=domain),
        token=token,
        lazy=True,
        retry=respcoord.RetryPolicy(deadline=3.0),
    )
    with pytest.raises(respcoord.Unavailable):
        await no_certificate.get_state(session)


@scenario
async def cancel_propagation_latency(spec: Scenario, servers: Servers) -> None:
    rounds = spec.number("rounds")
    # On NATS the scenario checks the other backend, not the latency of a
    # warm gateway: no warm-up there (it would add thousands of NATS rounds).
    warmup = 0 if ON_NATS else spec.number("warmup_rounds")
    sessions = spec.number("sessions")
    server = await servers.fixture()
    a = await servers.client(server.grpc)
    b = await servers.client(server.grpc)
    # A serves these sessions: their watches open ahead, and stay open
    # across the rounds (each lingers between its responses).
    for i in range(sessions):
        a.session(f"latency-{i}").open_watch()
    await until("every watch's stream is open", lambda: a.watch_status().opened == sessions)
    millis: list[float] = []
    for round_ in range(warmup + rounds):
        session = f"latency-{round_ % sessions}"
        fence = new_future()
        run = asyncio.ensure_future(a.session(session).run(respcoord.Source.CLIENT, endless(fence)))
        a_fence = await within("A's body starts", fence)
        # The moment A's fence turns false: the watch's own step, before A's
        # run has even resumed.
        stop_seen: list[float] = []

        def closed(_: respcoord.StopReason, seen: list[float] = stop_seen) -> None:
            seen.append(time.perf_counter())

        unhook = a_fence.on_stop(closed)
        began = time.perf_counter()
        if round_ % 2 == 0:
            await asyncio.gather(run, b.session(session).cancel(if_response_id=a_fence.id))
        else:
            _, replacing = await asyncio.gather(run, b.session(session).start(respcoord.Source.VAD))
            replacing.release()
        outcome = run.result()
        unhook()
        assert stop_seen, f"round {round_}: A's fence is closed when its run returns"
        millis.append((stop_seen[0] - began) * 1000)
        assert isinstance(outcome, respcoord.Stopped), f"round {round_}: {outcome!r}"
    assert a.watch_status().opened == sessions, f"every round reused a watch: {a.watch_status()}"
    warm = f"; last {rounds} of {warmup + rounds} {latency_summary(millis[-rounds:])}"
    print(
        "cancel propagation (python, B's call to A's fence turning false): "
        f"first {rounds} rounds {latency_summary(millis[:rounds])}{warm if warmup else ''}"
    )


SCENARIOS = load_scenarios()
ON_NATS = os.environ.get("RESPCOORD_TEST_BACKEND") == "nats"


def test_every_scenario_has_an_implementation_and_nothing_else_does() -> None:
    ids = [s.id for s in SCENARIOS]
    assert [i for i in ids if i not in IMPLEMENTATIONS] == [], "scenarios without a Python test"
    assert [i for i in IMPLEMENTATIONS if i not in ids] == [], "tests of scenarios not in the file"


@pytest.mark.parametrize("spec", SCENARIOS, ids=[s.id for s in SCENARIOS])
async def test_scenario(spec: Scenario, servers: Servers) -> None:
    if ON_NATS and spec.server == "binary":
        pytest.skip("runs the real binary on its default memory backend")
    await IMPLEMENTATIONS[spec.id](spec, servers)

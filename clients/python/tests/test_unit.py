"""The pure parts: the fencing table, the error mapping, retries and
validation; the session watch against a scripted server; and the local API
rules against a real fixture."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from conftest import Servers
from harness import free_port, within

import respcoord
from respcoord import _retry
from respcoord._fencing import Idle, Liveness, Tracks, WatchOrder
from respcoord._retry import RetryPolicy, backoff, with_retry
from respcoord._watch import Watches
from respcoord.v1 import coordinator_pb2 as pb


def event(session: str, revision: int, **kind: Any) -> pb.LifecycleEvent:
    return pb.LifecycleEvent(session_id=session, revision=revision, seq=revision, **kind)


def started(response_id: int) -> dict[str, Any]:
    return {"started": pb.ResponseStarted(response_id=response_id, source=pb.SOURCE_CLIENT)}


def cancel_requested(response_id: int, reason: pb.CancelReason.ValueType) -> dict[str, Any]:
    return {"cancel_requested": pb.ResponseCancelRequested(response_id=response_id, reason=reason)}


def terminated(reason: pb.CancelReason.ValueType) -> dict[str, Any]:
    return {"terminated": pb.SessionTerminated(reason=reason)}


def state(session: str, phase: pb.Phase.ValueType, active: int, revision: int) -> pb.SessionState:
    return pb.SessionState(
        session_id=session, phase=phase, active_response_id=active, revision=revision
    )


def order_of(order: WatchOrder | None) -> WatchOrder:
    assert order is not None, "a watch order"
    return order


def fired(order: WatchOrder) -> bool:
    """Whether the order's watch was told to stop."""
    return order.stop.fired


class TestFencingTable:
    """The cases of clients/rust/src/fencing.rs's tests."""

    def test_the_first_response_opens_the_watch_from_its_start_and_the_last_idles_it(
        self,
    ) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        assert not tracks.watched("s"), "a tracked session alone watches nothing"
        first = Liveness(10)
        order = order_of(tracks.register(ref, first, 7, True))
        assert (order.session, order.after_revision, order.expect_started) == ("s", 6, 10), (
            "replays the response's own start"
        )
        second = Liveness(11)
        assert tracks.register(ref, second, 9, True) is None, "one watch a session"
        assert tracks.unregister(ref, first) is None, "one response still live"
        assert not fired(order)
        notices = tracks.apply([event("s", 10, **started(12))])
        assert second.reason is respcoord.StopReason.SUPERSEDED
        assert not fired(order), "no live response left: the watch lingers"
        assert [n.session for n in notices] == ["s"]
        tracks.linger_over(notices[0].session, notices[0].generation)
        assert fired(order), "the linger is over: the watch closes"
        replayed = Liveness(20)
        order = order_of(tracks.register(ref, replayed, 30, False))
        assert (order.after_revision, order.expect_started) == (30, None)

    def test_supersede_stops_the_old_response_and_not_the_new_one(self) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        old = Liveness(10)
        tracks.register(ref, old, 1, True)
        tracks.apply(
            [
                event("s", 1, **started(10)),
                event("s", 2, **cancel_requested(10, pb.CANCEL_REASON_SUPERSEDED)),
                event("s", 4, **started(20)),
            ]
        )
        assert old.reason is respcoord.StopReason.SUPERSEDED
        # The new response registers after the watch saw its own start.
        new = Liveness(20)
        tracks.register(ref, new, 4, True)
        assert new.is_current()
        assert tracks.dead_through("s") == 19

    def test_a_response_registered_after_its_stop_was_seen_is_stopped_at_once(self) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        other = Liveness(1)
        tracks.register(ref, other, 1, True)
        tracks.apply([event("s", 3, **cancel_requested(30, pb.CANCEL_REASON_REQUESTED))])
        late = Liveness(30)
        assert tracks.register(ref, late, 2, True) is None
        assert late.reason is respcoord.StopReason.CANCELLED

    def test_termination_stops_every_response_and_a_reborn_session_lives(self) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        a = Liveness(5)
        tracks.register(ref, a, 1, True)
        tracks.apply([event("s", 2, **terminated(pb.CANCEL_REASON_EXPIRED))])
        assert a.reason is respcoord.StopReason.EXPIRED
        reborn = Liveness(100)
        tracks.register(ref, reborn, 1, True)
        assert reborn.is_current()

    def test_untracked_sessions_are_ignored_and_tracks_go_with_their_references(self) -> None:
        tracks = Tracks()
        first, second = tracks.track("s"), tracks.track("s")
        tracks.apply([event("other", 3, **started(3))])
        assert tracks.dead_through("other") is None
        first.release()
        first.release()
        assert tracks.dead_through("s") is not None
        second.release()
        assert tracks.dead_through("s") is None
        assert len(tracks) == 0

    def test_a_state_read_stops_what_it_covered_and_spares_later_starts(self) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        old, active = Liveness(5), Liveness(6)
        tracks.register(ref, old, 1, True)
        tracks.register(ref, active, 3, True)
        ticket = tracks.ticket()
        # Registered while the read was on its way: the read cannot judge it.
        later = Liveness(9)
        tracks.register(ref, later, 9, True)
        tracks.apply_state(state("s", pb.PHASE_ACTIVE, 6, 4), ticket)
        assert old.reason is respcoord.StopReason.SUPERSEDED
        assert active.is_current(), "the active response lives on"
        assert later.is_current()
        tracks.apply_state(state("s", pb.PHASE_IDLE, 0, 8), ticket)
        assert active.reason is respcoord.StopReason.GONE
        assert later.is_current(), "started after the read was sent"

    def test_a_session_gone_or_recreated_stops_the_responses_the_read_covered(self) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        lost = Liveness(5)
        order = order_of(tracks.register(ref, lost, 3, True))
        idle = tracks.apply_gone("s", tracks.ticket())
        assert lost.reason is respcoord.StopReason.GONE
        assert idle is not None
        assert not order.stop.fired, "the watch lingers, from the new session's first event"
        ended = Liveness(7)
        tracks.register(ref, ended, 1, True)
        tracks.apply_state(state("s", pb.PHASE_TERMINATED, 0, 2), tracks.ticket())
        assert ended.reason is respcoord.StopReason.SHUTDOWN

    def test_the_table_is_settled_before_a_stop_callback_runs(self) -> None:
        """A callback that releases the track (as a response's handle does
        when it stops) finds the response already removed and the rest of
        the events still applied; the lingering watch keeps the track until
        the linger is over."""
        tracks = Tracks()
        ref = tracks.track("s")
        response = Liveness(4)
        order = order_of(tracks.register(ref, response, 2, True))
        seen: list[Idle | None] = []

        def untrack(_: respcoord.StopReason) -> None:
            seen.append(tracks.unregister(ref, response))
            ref.release()

        response.on_stop(untrack)
        notices = tracks.apply(
            [
                event("s", 3, **cancel_requested(4, pb.CANCEL_REASON_REQUESTED)),
                event("s", 4, **started(5)),
            ]
        )
        assert response.reason is respcoord.StopReason.CANCELLED
        assert seen == [None], "already unregistered: no second notice"
        assert len(notices) == 1
        assert len(tracks) == 1, "kept by the lingering watch"
        assert tracks.dead_through("s") == 4
        tracks.linger_over("s", notices[0].generation)
        assert order.stop.fired
        assert len(tracks) == 0, "no handle, no watch: forgotten"

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


def linger_over(tracks: Tracks, idle: Idle | None) -> None:
    assert idle is not None, "an idle notice"
    tracks.linger_over(idle.session, idle.generation)


class TestLingeringWatches:
    """The table's linger rules (issue 43): idle notices, generations, the
    kept read, open ahead."""

    def test_a_start_within_the_linger_reuses_the_watch_and_makes_the_notice_stale(
        self,
    ) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        first = Liveness(1)
        order = order_of(tracks.register(ref, first, 1, True))
        idle = tracks.unregister(ref, first)
        assert idle == Idle("s", idle.generation if idle else -1), "idle: a notice"
        second = Liveness(2)
        assert tracks.register(ref, second, 3, True) is None, "the open watch is reused"
        linger_over(tracks, idle)
        assert not fired(order), "a stale notice closes nothing"
        later = tracks.unregister(ref, second)
        assert later is not None
        assert idle is not None
        assert later.generation > idle.generation
        linger_over(tracks, later)
        assert fired(order), "the current notice closes the watch"
        assert not tracks.watched("s")

    def test_a_notice_is_stale_while_a_response_is_live(self) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        order = order_of(tracks.register(ref, Liveness(1), 1, True))
        tracks.linger_over("s", 1)
        assert not fired(order), "a live response keeps the watch whatever the generation"
        assert tracks.unregister(ref, Liveness(99)) is None, "not registered: nothing emptied"

    def test_the_track_outlives_its_last_handle_while_the_watch_lingers(self) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        response = Liveness(7)
        order = order_of(tracks.register(ref, response, 4, True))
        response.stop(respcoord.StopReason.FINISHED)
        idle = tracks.unregister(ref, response)
        tracks.apply([event("s", 5, **cancel_requested(8, pb.CANCEL_REASON_REQUESTED))])
        ref.release()
        assert len(tracks) == 1, "kept by the lingering watch"
        again = tracks.track("s")
        late = Liveness(8)
        assert tracks.register(again, late, 5, True) is None
        assert late.reason is respcoord.StopReason.CANCELLED, "dead_through survived"
        again.release()
        linger_over(tracks, idle)
        assert fired(order)
        assert len(tracks) == 0

    def test_a_read_covers_responses_whose_start_revision_it_reached(self) -> None:
        """A Start answered after the read was sent, applied before the
        read's answer: the ticket says "not covered", the revision says
        "covered"."""
        tracks = Tracks()
        ref = tracks.track("s")
        ticket = tracks.ticket()
        reached, beyond = Liveness(5), Liveness(9)
        tracks.register(ref, reached, 6, True)
        tracks.register(ref, beyond, 9, True)
        assert tracks.apply_state(state("s", pb.PHASE_IDLE, 0, 8), ticket) is None
        assert reached.reason is respcoord.StopReason.GONE, "revision 6 <= 8: the read saw it end"
        assert beyond.is_current(), "revision 9 > 8: after the read"

    def test_a_terminated_read_stops_everything_and_ends_the_watch(self) -> None:
        """Nothing more happens on a terminated session: even a response the
        read did not cover is stopped, and the watch is over (the next Start
        opens a new one, with its proof)."""
        tracks = Tracks()
        ref = tracks.track("s")
        order = order_of(tracks.open_watch("s").order)
        ticket = tracks.ticket()
        uncovered = Liveness(4)
        tracks.register(ref, uncovered, 9, True)
        assert tracks.apply_state(state("s", pb.PHASE_TERMINATED, 0, 3), ticket) is None
        assert uncovered.reason is respcoord.StopReason.SHUTDOWN
        assert fired(order)
        reborn = order_of(tracks.register(ref, Liveness(12), 1, True))
        assert reborn.expect_started == 12

    def test_an_active_read_spares_its_active_response_covered_by_revision(self) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        ticket = tracks.ticket()
        live = Liveness(5)
        tracks.register(ref, live, 6, True)
        tracks.apply_state(state("s", pb.PHASE_ACTIVE, 5, 8), ticket)
        assert live.is_current()

    def test_a_late_register_is_judged_by_the_kept_read(self) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        effects = tracks.open_watch("s")
        order = order_of(effects.order)
        tracks.apply_state(state("s", pb.PHASE_IDLE, 0, 10), tracks.ticket())
        ended = Liveness(4)
        assert tracks.register(ref, ended, 9, True) is None
        assert ended.reason is respcoord.StopReason.GONE, "the read reached its Start: not live"
        after = Liveness(5)
        assert tracks.register(ref, after, 11, True) is None, "registered on the open watch"
        assert after.is_current()
        tracks.apply_state(state("s", pb.PHASE_ACTIVE, 6, 12), tracks.ticket())
        assert after.reason is respcoord.StopReason.SUPERSEDED
        active = Liveness(6)
        tracks.register(ref, active, 12, True)
        assert active.is_current(), "the read found it active"
        assert not fired(order)

    def test_a_read_is_forgotten_when_the_session_is_gone_or_the_watch_ends(self) -> None:
        tracks = Tracks()
        ref = tracks.track("s")
        tracks.open_watch("s")
        tracks.apply_state(state("s", pb.PHASE_IDLE, 0, 10), tracks.ticket())
        tracks.apply_gone("s", tracks.ticket())
        reborn = Liveness(3)
        tracks.register(ref, reborn, 2, True)
        assert reborn.is_current(), "revisions of a gone session judge nothing"
        tracks.apply_state(state("s", pb.PHASE_IDLE, 0, 10), tracks.ticket())
        assert reborn.reason is respcoord.StopReason.GONE
        tracks.apply([event("s", 11, **terminated(pb.CANCEL_REASON_EXPIRED))])
        assert not tracks.watched("s")
        renewed = Liveness(4)
        order = order_of(tracks.register(ref, renewed, 1, True))
        assert renewed.is_current(), "the read ended with the watch"
        assert order.expect_started == 4, "a new watch, with its proof"

    def test_open_watch_reads_first_and_lingers_from_now(self) -> None:
        tracks = Tracks()
        effects = tracks.open_watch("w")
        order = order_of(effects.order)
        assert (order.session, order.after_revision, order.expect_started) == ("w", None, None)
        assert effects.idle is not None, "nothing live: the linger starts now"
        again = tracks.open_watch("w")
        assert again.order is None, "open already"
        assert again.idle is not None
        assert again.idle.generation > effects.idle.generation, "the linger restarts"
        linger_over(tracks, effects.idle)
        assert not fired(order), "the first notice is stale"
        ref = tracks.track("w")
        response = Liveness(1)
        assert tracks.register(ref, response, 1, True) is None, "the first Start reuses it"
        linger_over(tracks, again.idle)
        assert not fired(order), "a Start since"
        busy = tracks.open_watch("w")
        assert busy == type(busy)(None, None), "a live response: no order, no notice"
        linger_over(tracks, tracks.unregister(ref, response))
        assert fired(order)
        assert len(tracks) == 1, "the handle still holds the track"
        ref.release()
        assert len(tracks) == 0

    def test_terminated_ends_a_lingering_watch_and_forgets_an_unheld_track(self) -> None:
        tracks = Tracks()
        effects = tracks.open_watch("s")
        order = order_of(effects.order)
        assert tracks.apply([event("s", 3, **terminated(pb.CANCEL_REASON_REQUESTED))]) == []
        assert fired(order), "the stream ends: the watch is over"
        assert len(tracks) == 0
        linger_over(tracks, effects.idle)
        assert len(tracks) == 0, "a notice of a forgotten track is harmless"

    def test_closing_the_client_closes_lingering_watches_and_forgets_their_tracks(self) -> None:
        tracks = Tracks()
        ahead = order_of(tracks.open_watch("a").order)
        ref = tracks.track("b")
        live = Liveness(1)
        order = order_of(tracks.register(ref, live, 1, True))
        tracks.release_all()
        assert fired(ahead)
        assert fired(order)
        assert live.reason is respcoord.StopReason.RELEASED
        assert len(tracks) == 1, "b's handle still holds it"
        ref.release()
        assert len(tracks) == 0


class ScriptedCall:
    """A scripted Watch stream: its messages, then a failure with ``then``
    (a status code) or, for None, silence."""

    def __init__(self, messages: list[pb.WatchResponse], then: grpc.StatusCode | None) -> None:
        self._messages = messages
        self._then = then
        self.cancelled = False

    async def initial_metadata(self) -> None:
        return None

    def done(self) -> bool:
        return False

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def __aiter__(self) -> AsyncIterator[pb.WatchResponse]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[pb.WatchResponse]:
        for message in self._messages:
            yield message
        if self._then is None:
            await asyncio.Event().wait()
        else:
            raise FakeRpcError(self._then)


class HeldCall(ScriptedCall):
    """A Watch the server never answers."""

    def __init__(self) -> None:
        super().__init__([], None)

    async def initial_metadata(self) -> None:
        await asyncio.Event().wait()


class Script:
    """A scripted server: each Watch takes the next stream, each GetState
    the next answer (a call past the script waits forever); every call is
    recorded."""

    def __init__(self) -> None:
        self.watches: deque[ScriptedCall] = deque()
        self.states: deque[pb.SessionState | respcoord.RespcoordError] = deque()
        self.calls: list[str] = []
        self.connections = 0

    def connect(self) -> Script:
        self.connections += 1
        return self

    def open_watch(self, session_id: str, after_revision: int) -> ScriptedCall:
        self.calls.append(f"watch {after_revision}")
        return self.watches.popleft() if self.watches else HeldCall()

    async def get_state(self, session_id: str) -> pb.SessionState:
        self.calls.append("get_state")
        if not self.states:
            await asyncio.Event().wait()
        answer = self.states.popleft()
        if isinstance(answer, respcoord.RespcoordError):
            raise answer
        return answer

    async def close(self) -> None:
        return None


class HeldRead(Script):
    """A script whose one state read is answered when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.answer: asyncio.Future[pb.SessionState] = asyncio.get_running_loop().create_future()

    async def get_state(self, session_id: str) -> pb.SessionState:
        self.calls.append("get_state")
        return await self.answer


def message(*events: pb.LifecycleEvent) -> pb.WatchResponse:
    return pb.WatchResponse(events=events)


def active(response_id: int, revision: int) -> pb.SessionState:
    return state("s", pb.PHASE_ACTIVE, response_id, revision)


class Running:
    """Response 10, whose Start reply carried revision 5, and its session's
    watch running against a script."""

    def __init__(
        self, script: Script, retry: RetryPolicy | None = None, linger: float = 0.0
    ) -> None:
        self.tracks = Tracks()
        self.ref = self.tracks.track("s")
        self.response = Liveness(10)
        self.order = order_of(self.tracks.register(self.ref, self.response, 5, True))
        self.watches = Watches(script.connect, self.tracks, retry or RetryPolicy(), linger=linger)
        self.watches.open(self.order)

    async def stopped(self) -> respcoord.StopReason:
        return await within("the response stops", self.response.stopped())


class TestSessionWatch:
    """The session watch against a scripted server: the cases of
    clients/rust/src/watch.rs's tests."""

    async def test_a_stop_replayed_after_the_proof_of_the_start_stops_the_response(self) -> None:
        script = Script()
        script.watches.append(
            ScriptedCall(
                [
                    message(event("s", 5, **started(10))),
                    message(
                        event("s", 6, **cancel_requested(10, pb.CANCEL_REASON_SUPERSEDED)),
                        event("s", 8, **started(11)),
                    ),
                ],
                None,
            )
        )
        running = Running(script)
        assert await running.stopped() is respcoord.StopReason.SUPERSEDED
        assert running.order.stop.fired, "nothing live: the watch closed"
        await until("the watch ends", lambda: running.watches.status().open == 0)
        assert script.calls == ["watch 4"], "replayed from just below the reply"
        await running.watches.close()

    async def test_a_first_event_that_is_not_the_start_means_a_recreated_session(self) -> None:
        script = Script()
        script.watches.append(ScriptedCall([message(event("s", 5, **started(3)))], None))
        # Revision 2: below the watch's position, a new session of that id.
        script.states.append(active(12, 2))
        running = Running(script)
        assert await running.stopped() is respcoord.StopReason.GONE
        assert script.calls == ["watch 4", "get_state"]
        await running.watches.close()

    async def test_a_session_not_found_after_a_break_is_gone(self) -> None:
        script = Script()
        script.watches.append(
            ScriptedCall([message(event("s", 5, **started(10)))], grpc.StatusCode.UNAVAILABLE)
        )
        script.states.append(respcoord.error_from_status(grpc.StatusCode.NOT_FOUND, "no session s"))
        running = Running(script)
        assert await running.stopped() is respcoord.StopReason.GONE
        assert script.calls == ["watch 4", "get_state"]
        await running.watches.close()

    async def test_a_broken_stream_resumes_from_the_state_it_read(self) -> None:
        script = Script()
        script.watches.extend(
            [
                ScriptedCall([message(event("s", 5, **started(10)))], grpc.StatusCode.UNAVAILABLE),
                ScriptedCall(
                    [message(event("s", 7, **cancel_requested(10, pb.CANCEL_REASON_REQUESTED)))],
                    None,
                ),
            ]
        )
        script.states.append(active(10, 6))
        running = Running(script)
        assert await running.stopped() is respcoord.StopReason.CANCELLED
        assert script.calls == ["watch 4", "get_state", "watch 6"]
        await until("the watch ends", lambda: running.watches.status().open == 0)
        assert running.watches.status() == respcoord.WatchStatus(
            open=0, opened=2, reconnects=1, rereads=1, connections=1
        )
        await running.watches.close()

    async def test_no_proof_within_the_attempt_timeout_is_checked_by_a_state_read(self) -> None:
        script = Script()
        script.watches.extend([ScriptedCall([], None), ScriptedCall([], None)])
        script.states.append(active(10, 5))
        running = Running(script, RetryPolicy(attempt_timeout=0.05))
        await until("a state read and a new stream", lambda: len(script.calls) >= 3)
        assert script.calls == ["watch 4", "get_state", "watch 5"]
        assert running.response.is_current(), "the state shows it active"
        await running.watches.close()
        assert running.watches.status().open == 0

    async def test_a_watch_lingers_after_its_last_response_then_closes(self) -> None:
        script = Script()
        stop = message(event("s", 6, **cancel_requested(10, pb.CANCEL_REASON_REQUESTED)))
        script.watches.append(ScriptedCall([message(event("s", 5, **started(10))), stop], None))
        running = Running(script, linger=0.05)
        assert await running.stopped() is respcoord.StopReason.CANCELLED
        assert not fired(running.order), "the watch lingers"
        assert running.watches.status().open == 1
        await until("the linger runs out", lambda: running.watches.status().open == 0)
        assert fired(running.order)
        assert script.calls == ["watch 4"]
        assert len(running.tracks) == 1, "the test's handle still holds the track"
        await running.watches.close()

    async def test_a_start_within_the_linger_needs_no_watch_call(self) -> None:
        script = Script()
        script.watches.append(
            ScriptedCall(
                [
                    message(event("s", 5, **started(10))),
                    message(event("s", 6, **cancel_requested(10, pb.CANCEL_REASON_REQUESTED))),
                ],
                None,
            )
        )
        running = Running(script, linger=60.0)
        assert await running.stopped() is respcoord.StopReason.CANCELLED
        second = Liveness(11)
        assert running.tracks.register(running.ref, second, 7, True) is None
        assert running.watches.status().open == 1
        assert script.calls == ["watch 4"], "no second Watch call"
        await running.watches.close()
        assert running.watches.status().open == 0, "close ends a lingering watch"

    async def test_a_watch_opened_ahead_reads_first_and_not_found_watches_from_0(self) -> None:
        script = Script()
        script.states.append(respcoord.error_from_status(grpc.StatusCode.NOT_FOUND, "no session w"))
        script.watches.append(
            ScriptedCall(
                [
                    message(event("w", 1, **started(1))),
                    message(event("w", 2, **cancel_requested(1, pb.CANCEL_REASON_REQUESTED))),
                ],
                None,
            )
        )
        tracks = Tracks()
        watches = Watches(script.connect, tracks, RetryPolicy(), linger=60.0)
        watches.open_ahead("w")
        assert watches.status().open == 1
        await until("the stream is open", lambda: watches.status().opened == 1)
        assert script.calls == ["get_state", "watch 0"], "from the session's first event"
        ref = tracks.track("w")
        response = Liveness(1)
        assert tracks.register(ref, response, 1, True) is None, "the first Start reuses it"
        assert await within("the stop arrives", response.stopped()) is (
            respcoord.StopReason.CANCELLED
        )
        assert watches.status() == respcoord.WatchStatus(
            open=1, opened=1, reconnects=0, rereads=1, connections=1
        )
        await watches.close()

    async def test_a_start_answered_during_the_ahead_read_is_judged_by_it(self) -> None:
        script = HeldRead()
        tracks = Tracks()
        watches = Watches(script.connect, tracks, RetryPolicy(), linger=60.0)
        watches.open_ahead("s")
        await until("the read is sent", lambda: script.calls == ["get_state"])
        ref = tracks.track("s")
        superseded = Liveness(3)
        assert tracks.register(ref, superseded, 4, True) is None
        script.watches.append(ScriptedCall([], None))
        script.answer.set_result(active(4, 6))
        assert await within("the read judges it", superseded.stopped()) is (
            respcoord.StopReason.SUPERSEDED
        )
        await until("the stream follows", lambda: script.calls == ["get_state", "watch 6"])
        await watches.close()

    async def test_no_watch_ahead_with_a_linger_of_0(self) -> None:
        script = Script()
        tracks = Tracks()
        watches = Watches(script.connect, tracks, RetryPolicy(), linger=0.0)
        watches.open_ahead("s")
        assert watches.status().open == 0
        assert len(tracks) == 0
        await watches.close()

    async def test_the_pool_adds_a_connection_when_every_one_is_full(self) -> None:
        script = Script()
        tracks = Tracks()
        watches = Watches(script.connect, tracks, RetryPolicy(), linger=0.0)
        refs = [tracks.track(f"s{i}") for i in range(respcoord.STREAMS_PER_CONNECTION + 1)]
        first = Liveness(1)
        for i, ref in enumerate(refs):
            watches.open(
                order_of(tracks.register(ref, first if i == 0 else Liveness(1), i + 1, True))
            )
        status = watches.status()
        assert (status.open, status.connections) == (respcoord.STREAMS_PER_CONNECTION + 1, 2)
        assert script.connections == 2
        watches.linger(tracks.unregister(refs[0], first))
        refs[0].release()
        await until("the released session's watch ends", lambda: watches.status().open == 500)
        watches.open(order_of(tracks.register(tracks.track("again"), Liveness(1), 1, True)))
        assert watches.status().connections == 2, "the freed room is reused"
        await watches.close()
        assert watches.status().open == 0


async def until(what: str, condition: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not condition():  # noqa: ASYNC110 (a status, no event to wait on)
            await asyncio.sleep(0.005)

    await within(what, poll())


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


_EXIT_AFTER_CLOSE = """
import asyncio, sys
import respcoord

async def main() -> None:
    client = await respcoord.Client.connect(sys.argv[1])
    for i in range(int(sys.argv[2])):
        await client.session(f"exit-{i}").start(respcoord.Source.CLIENT)
    assert client.watch_status().open == int(sys.argv[2])
    await client.close()

asyncio.run(main())
"""


async def test_a_process_exits_after_closing_a_client_with_hundreds_of_watches(
    servers: Servers,
) -> None:
    """grpcio before 1.78 hung such a process at exit (Watches.close)."""
    server = await servers.fixture()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _EXIT_AFTER_CLOSE, server.grpc, "300"
    )
    try:
        code = await asyncio.wait_for(process.wait(), timeout=60)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError("the process hung at exit after Client.close()") from None
    assert code == 0


async def test_a_negative_or_non_finite_watch_linger_is_refused_naming_the_option() -> None:
    for linger in (-1.0, float("nan"), float("inf"), True):
        with pytest.raises(respcoord.ConfigError) as error:
            await respcoord.Client.connect("127.0.0.1:1", lazy=True, watch_linger=linger)
        assert error.value.field == "watch_linger"
    client = await respcoord.Client.connect("127.0.0.1:1", lazy=True, watch_linger=0)
    await client.close()


async def test_open_watch_with_a_linger_of_0_does_nothing(servers: Servers) -> None:
    server = await servers.fixture()
    client = await servers.client(server.grpc, watch_linger=0.0)
    client.session("no-linger").open_watch()
    assert client.watch_status().open == 0
    response = await client.session("no-linger").start(respcoord.Source.CLIENT)
    assert client.watch_status().open == 1
    await response.finish(respcoord.Terminal.COMPLETED)
    assert client.watch_status().open in (0, 1)
    await until("the watch closes with its last response", lambda: client.watch_status().open == 0)
    session = client.session("closed")
    await client.close()
    with pytest.raises(respcoord.ClientClosed):
        session.open_watch()


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

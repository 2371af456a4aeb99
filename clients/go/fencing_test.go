package respcoord

// The fencing table alone: no wire, no goroutines. Each test feeds it events
// and state reads and checks which responses it stops and which watches it
// asks for.

import (
	"testing"

	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

func started(session string, revision, id uint64) *pb.LifecycleEvent {
	return &pb.LifecycleEvent{SessionId: session, Revision: revision, Kind: &pb.LifecycleEvent_Started{Started: &pb.ResponseStarted{ResponseId: id}}}
}

func cancelRequested(session string, revision, id uint64, reason pb.CancelReason) *pb.LifecycleEvent {
	return &pb.LifecycleEvent{SessionId: session, Revision: revision, Kind: &pb.LifecycleEvent_CancelRequested{CancelRequested: &pb.ResponseCancelRequested{ResponseId: id, Reason: reason}}}
}

func endedEvent(session string, revision, id uint64, status pb.TerminalStatus, reason pb.CancelReason) *pb.LifecycleEvent {
	return &pb.LifecycleEvent{SessionId: session, Revision: revision, Kind: &pb.LifecycleEvent_Ended{Ended: &pb.ResponseEnded{ResponseId: id, Status: status, Reason: reason}}}
}

func terminatedEvent(session string, revision uint64, reason pb.CancelReason) *pb.LifecycleEvent {
	return &pb.LifecycleEvent{SessionId: session, Revision: revision, Kind: &pb.LifecycleEvent_Terminated{Terminated: &pb.SessionTerminated{Reason: reason}}}
}

// startOn registers a response as Session.Start does after its reply.
func startOn(t *tracks, session string, id, revision uint64, fresh bool) (*liveness, *watchOrder) {
	t.track(session)
	l := newLiveness(id)
	return l, t.register(session, l, revision, fresh)
}

func wantStopped(t *testing.T, l *liveness, reason StopReason) {
	t.Helper()
	if l.current.Load() || l.stopReason() != reason {
		t.Fatalf("response %d: current %v, reason %q; want stopped %q", l.id, l.current.Load(), l.stopReason(), reason)
	}
	select {
	case <-l.done:
	default:
		t.Fatalf("response %d: Done not closed", l.id)
	}
	if l.ctx.Err() == nil {
		t.Fatalf("response %d: context not cancelled", l.id)
	}
}

func wantCurrent(t *testing.T, l *liveness) {
	t.Helper()
	if !l.current.Load() {
		t.Fatalf("response %d stopped (%q); want current", l.id, l.stopReason())
	}
}

func TestFirstResponseOpensTheWatchFromItsStartAndTheLastClosesIt(t *testing.T) {
	tr := newTracks()
	a, order := startOn(tr, "s", 3, 5, true)
	if order == nil || order.session != "s" || order.afterRevision != 4 || order.expectStarted != 3 {
		t.Fatalf("order %+v; want a watch of s after revision 4 expecting started(3)", order)
	}
	if !tr.watched("s") {
		t.Fatal("s is not watched")
	}
	b, again := startOn(tr, "s", 4, 6, true)
	if again != nil {
		t.Fatalf("a second response opened a second watch: %+v", again)
	}
	// The first is superseded by the second: the watch stays for the second.
	tr.apply([]*pb.LifecycleEvent{started("s", 6, 4)})
	wantStopped(t, a, StopSuperseded)
	wantCurrent(t, b)
	if !tr.watched("s") || order.ctx.Err() != nil {
		t.Fatal("the watch closed while a response is live")
	}
	b.stop(StopFinished)
	tr.unregister("s", b)
	if tr.watched("s") || order.ctx.Err() == nil || tr.size() != 0 {
		t.Fatalf("after the last response: watched %v, ctx %v, %d tracks", tr.watched("s"), order.ctx.Err(), tr.size())
	}
}

func TestAReplayedStartWatchesFromTheReplyRevisionWithoutProof(t *testing.T) {
	tr := newTracks()
	_, order := startOn(tr, "s", 3, 9, false)
	if order == nil || order.afterRevision != 9 || order.expectStarted != 0 {
		t.Fatalf("order %+v; want after revision 9, no proof", order)
	}
}

func TestCancelAndEndStopWithTheirReasons(t *testing.T) {
	tr := newTracks()
	a, _ := startOn(tr, "s", 1, 1, true)
	tr.apply([]*pb.LifecycleEvent{cancelRequested("s", 2, 1, pb.CancelReason_CANCEL_REASON_REQUESTED)})
	wantStopped(t, a, StopCancelled)

	b, _ := startOn(tr, "t", 1, 1, true)
	tr.apply([]*pb.LifecycleEvent{endedEvent("t", 2, 1, pb.TerminalStatus_TERMINAL_STATUS_COMPLETED, pb.CancelReason_CANCEL_REASON_UNSPECIFIED)})
	wantStopped(t, b, StopEnded)

	c, _ := startOn(tr, "u", 1, 1, true)
	tr.apply([]*pb.LifecycleEvent{endedEvent("u", 2, 1, pb.TerminalStatus_TERMINAL_STATUS_CANCELLED, pb.CancelReason_CANCEL_REASON_EXPIRED)})
	wantStopped(t, c, StopExpired)
}

func TestAResponseRegisteredAfterItsStopWasSeenIsStoppedAtOnce(t *testing.T) {
	tr := newTracks()
	tr.track("s") // a Start in flight
	tr.apply(nil)
	live, _ := startOn(tr, "s", 7, 1, true) // keeps the track
	tr.apply([]*pb.LifecycleEvent{started("s", 3, 9)})
	wantStopped(t, live, StopSuperseded)
	// The in-flight Start's reply arrives late, for response 8 < 9.
	late := newLiveness(8)
	if order := tr.register("s", late, 2, true); order != nil {
		t.Fatalf("a stopped response asked for a watch: %+v", order)
	}
	wantStopped(t, late, StopSuperseded)
	if tr.size() != 0 {
		t.Fatalf("%d tracks left; every reference is released", tr.size())
	}
}

func TestTerminationStopsEveryResponseAndARebornSessionLives(t *testing.T) {
	tr := newTracks()
	a, _ := startOn(tr, "s", 1, 1, true)
	b, _ := startOn(tr, "s", 2, 2, true)
	tr.apply([]*pb.LifecycleEvent{terminatedEvent("s", 5, pb.CancelReason_CANCEL_REASON_SHUTDOWN)})
	wantStopped(t, a, StopShutdown)
	wantStopped(t, b, StopShutdown)
	if tr.size() != 0 {
		t.Fatal("the terminated session is still tracked")
	}
	// Forgotten by the coordinator after its tombstone TTL, the id is new.
	c, order := startOn(tr, "s", 3, 1, true)
	wantCurrent(t, c)
	if order == nil {
		t.Fatal("the reborn session is not watched")
	}
}

func TestUntrackedSessionsAreIgnored(t *testing.T) {
	tr := newTracks()
	a, _ := startOn(tr, "s", 1, 1, true)
	tr.apply([]*pb.LifecycleEvent{started("other", 1, 50), terminatedEvent("other", 2, pb.CancelReason_CANCEL_REASON_SHUTDOWN)})
	wantCurrent(t, a)
	if _, ok := tr.deadThrough("other"); ok {
		t.Fatal("an untracked session got a track")
	}
}

func TestAStateReadStopsWhatItCoveredAndSparesLaterStarts(t *testing.T) {
	tr := newTracks()
	a, _ := startOn(tr, "s", 4, 4, true)
	ticket := tr.ticket()
	// Registered after the read was sent: the read cannot know it.
	b, _ := startOn(tr, "s", 6, 6, true)
	tr.applyState("s", SessionState{Phase: PhaseIdle, Revision: 5}, ticket)
	wantStopped(t, a, StopGone)
	wantCurrent(t, b)
	// Active(z) stops the covered responses that are not z, as superseded when below z.
	c, _ := startOn(tr, "t", 2, 2, true)
	d, _ := startOn(tr, "t", 3, 3, true)
	tr.applyState("t", SessionState{Phase: PhaseActive, ResponseID: 3, Revision: 7}, tr.ticket())
	wantStopped(t, c, StopSuperseded)
	wantCurrent(t, d)
	tr.applyState("t", SessionState{Phase: PhaseTerminated, Revision: 9}, tr.ticket())
	wantStopped(t, d, StopShutdown)
}

func TestASessionGoneStopsTheResponsesTheReadCovered(t *testing.T) {
	tr := newTracks()
	a, _ := startOn(tr, "s", 4, 4, true)
	ticket := tr.ticket()
	b, _ := startOn(tr, "s", 1, 1, true) // created anew after the read was sent
	tr.applyGone("s", ticket)
	wantStopped(t, a, StopGone)
	wantCurrent(t, b)
}

func TestDeadThroughOnlyRises(t *testing.T) {
	tr := newTracks()
	a, _ := startOn(tr, "s", 10, 10, true)
	tr.apply([]*pb.LifecycleEvent{started("s", 10, 10)})
	wantCurrent(t, a) // its own start stops nothing
	if dt, _ := tr.deadThrough("s"); dt != 9 {
		t.Fatalf("dead through %d; want 9", dt)
	}
	tr.apply([]*pb.LifecycleEvent{started("s", 3, 3), endedEvent("s", 4, 2, pb.TerminalStatus_TERMINAL_STATUS_COMPLETED, 0)})
	if dt, _ := tr.deadThrough("s"); dt != 9 {
		t.Fatalf("a replayed older event moved dead through to %d", dt)
	}
	wantCurrent(t, a)
}

func TestReleaseAllFailsEveryFenceClosedAndLaterStartsToo(t *testing.T) {
	tr := newTracks()
	a, order := startOn(tr, "s", 1, 1, true)
	tr.releaseAll()
	wantStopped(t, a, StopReleased)
	if order.ctx.Err() == nil {
		t.Fatal("the watch is still open")
	}
	b, again := startOn(tr, "t", 2, 2, true)
	wantStopped(t, b, StopReleased)
	if again != nil {
		t.Fatal("a closed client opened a watch")
	}
}

func TestTieCancelsAtOnceWhenAlreadyStopped(t *testing.T) {
	l := newLiveness(5)
	l.stop(StopCancelled)
	var cause error
	l.tie(func(err error) { cause = err })
	se, ok := cause.(*StoppedError)
	if !ok || se.ResponseID != 5 || se.Reason != StopCancelled {
		t.Fatalf("cause %v; want the stop", cause)
	}
	if l.stop(StopSuperseded) || l.stopReason() != StopCancelled {
		t.Fatal("a second stop changed the reason")
	}
}

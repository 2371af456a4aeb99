package respcoord

// The fencing table alone: no wire, no goroutines. Each test feeds it events
// and state reads and checks which responses it stops and which watches it
// asks for.

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

func TestAStopHookRunsOnceOnTheStoppingGoroutineAfterTheTableUnlocks(t *testing.T) {
	tr := newTracks()
	a, _ := startOn(tr, "s", 3, 3, true)
	var order []string
	for _, name := range []string{"first", "second"} {
		a.onStop(func(reason StopReason) {
			// The table's lock is free (ticket takes it), the stop already
			// applied: fence closed, Done closed, context cancelled, the
			// response out of the table (its last one: the track is gone).
			tr.ticket()
			wantStopped(t, a, StopSuperseded)
			order = append(order, fmt.Sprintf("%s %s %d", name, reason, tr.size()))
		})
	}
	tr.apply([]*pb.LifecycleEvent{started("s", 4, 4)})
	// No wait: it ran within apply, on this goroutine.
	if want := []string{"first superseded 0", "second superseded 0"}; !slices.Equal(order, want) {
		t.Fatalf("hooks ran %q; want %q", order, want)
	}
	tr.apply([]*pb.LifecycleEvent{cancelRequested("s", 5, 3, pb.CancelReason_CANCEL_REASON_REQUESTED)})
	a.stop(StopReleased)
	if len(order) != 2 {
		t.Fatalf("hooks ran again: %q", order)
	}
}

func TestAStopHookRegisteredAfterTheStopRunsAtOnceOnAGoroutineOfItsOwn(t *testing.T) {
	l := newLiveness(5)
	l.stop(StopCancelled)
	var mu sync.Mutex
	ran := make(chan StopReason, 1)
	mu.Lock()
	// fn takes a lock the caller holds: it must not run on the caller's goroutine.
	stop := l.onStop(func(reason StopReason) {
		mu.Lock()
		defer mu.Unlock()
		ran <- reason
	})
	mu.Unlock()
	select {
	case reason := <-ran:
		if reason != StopCancelled {
			t.Fatalf("ran with %q", reason)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the hook never ran")
	}
	if stop() {
		t.Fatal("stop after the hook ran said it kept it from running")
	}
}

func TestStoppingAStopHookKeepsItFromRunning(t *testing.T) {
	l := newLiveness(5)
	ran := 0
	stop := l.onStop(func(StopReason) { ran++ })
	kept := l.onStop(func(StopReason) { ran += 10 })
	if !stop() {
		t.Fatal("stop before the stop did not keep the hook from running")
	}
	if stop() {
		t.Fatal("a second stop said it kept the hook from running")
	}
	l.stop(StopFinished)
	if ran != 10 {
		t.Fatalf("ran %d; want only the hook still registered", ran)
	}
	if kept() {
		t.Fatal("stop after the hook ran said it kept it from running")
	}
}

// A hook that waits for a lock whose holder calls the table (as the LocalAI
// drop-in's hook waits for the coordinator's lock, held by an Apply that
// releases a response) does not deadlock: it runs after the table unlocks.
func TestAStopHookWaitingForALockDoesNotHoldTheTable(t *testing.T) {
	tr := newTracks()
	a, _ := startOn(tr, "s", 3, 3, true)
	b, _ := startOn(tr, "t", 1, 1, true)
	var mu sync.Mutex
	entered := make(chan struct{})
	a.onStop(func(StopReason) {
		close(entered)
		mu.Lock()
		defer mu.Unlock()
	})
	mu.Lock()
	applied := make(chan struct{})
	go func() {
		defer close(applied)
		tr.apply([]*pb.LifecycleEvent{started("s", 4, 4)})
	}()
	<-entered
	// The hook waits for mu; this goroutine, holding mu, uses the table.
	released := make(chan struct{})
	go func() {
		defer close(released)
		tr.unregister("t", b)
		tr.releaseAll()
	}()
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		t.Fatal("the table is held while a stop hook waits")
	}
	mu.Unlock()
	<-applied
}

func TestStopHooksUnderConcurrentStopsAndUnregistersRunAtMostOnce(t *testing.T) {
	for range 200 {
		l := newLiveness(1)
		var ran atomic.Int32
		stop := l.onStop(func(StopReason) { ran.Add(1) })
		var wg sync.WaitGroup
		var kept atomic.Bool
		wg.Go(func() { l.stop(StopCancelled) })
		wg.Go(func() { l.stop(StopReleased) })
		wg.Go(func() { kept.Store(stop()) })
		wg.Wait()
		if n := ran.Load(); (kept.Load() && n != 0) || (!kept.Load() && n != 1) {
			t.Fatalf("ran %d times, stop kept it: %v", n, kept.Load())
		}
	}
}

func TestReleaseAllRunsTheStopHooks(t *testing.T) {
	tr := newTracks()
	a, _ := startOn(tr, "s", 1, 1, true)
	var got StopReason
	a.onStop(func(reason StopReason) { got = reason })
	tr.releaseAll()
	if got != StopReleased {
		t.Fatalf("hook got %q", got)
	}
}

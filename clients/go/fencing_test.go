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
	order, _ := t.register(session, l, revision, fresh)
	return l, order
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

func TestFirstResponseOpensTheWatchFromItsStartAndItClosesAfterTheLinger(t *testing.T) {
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
	idle := tr.unregister("s", b)
	// Idle: the table does not close the watch, it asks for the linger.
	if len(idle) != 1 || idle[0].session != "s" {
		t.Fatalf("idle notices %+v; want one for s", idle)
	}
	if !tr.watched("s") || order.ctx.Err() != nil || tr.size() != 1 {
		t.Fatalf("right after the last response: watched %v, ctx %v, %d tracks; want the watch lingering", tr.watched("s"), order.ctx.Err(), tr.size())
	}
	tr.lingerOver("s", idle[0].generation)
	if tr.watched("s") || order.ctx.Err() == nil || tr.size() != 0 {
		t.Fatalf("after the linger: watched %v, ctx %v, %d tracks", tr.watched("s"), order.ctx.Err(), tr.size())
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
	order, idle := tr.register("s", late, 2, true)
	if order != nil {
		t.Fatalf("a stopped response asked for a watch: %+v", order)
	}
	wantStopped(t, late, StopSuperseded)
	// Every reference is released; the track stays while its watch lingers.
	if len(idle) != 1 || tr.size() != 1 {
		t.Fatalf("idle %+v, %d tracks; want the lingering track and its notice", idle, tr.size())
	}
	tr.lingerOver("s", idle[0].generation)
	if tr.size() != 0 {
		t.Fatalf("%d tracks left after the linger", tr.size())
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
			// response out of the table (its last one: the track lingers
			// with its watch).
			tr.ticket()
			wantStopped(t, a, StopSuperseded)
			order = append(order, fmt.Sprintf("%s %s %d", name, reason, tr.size()))
		})
	}
	tr.apply([]*pb.LifecycleEvent{started("s", 4, 4)})
	// No wait: it ran within apply, on this goroutine.
	if want := []string{"first superseded 1", "second superseded 1"}; !slices.Equal(order, want) {
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

// Lingering watches (issue 43): the table hands out idle notices and closes a
// watch only on lingerOver of the current generation; it never reads a clock.

// finishOn unregisters l as Finish does, returning the idle notices.
func finishOn(tr *tracks, session string, l *liveness) []idleNotice {
	l.halt(StopFinished)
	return tr.unregister(session, l)
}

func TestAStartWithinTheLingerReusesTheOpenWatch(t *testing.T) {
	tr := newTracks()
	a, order := startOn(tr, "s", 3, 3, true)
	idle := finishOn(tr, "s", a)
	if len(idle) != 1 {
		t.Fatalf("idle %+v", idle)
	}
	tr.track("s")
	b := newLiveness(5)
	again, none := tr.register("s", b, 5, true)
	if again != nil || none != nil {
		t.Fatalf("order %+v, idle %+v; want the open watch reused", again, none)
	}
	wantCurrent(t, b)
	// The notice from before the Start is stale: the linger ends nothing.
	tr.lingerOver("s", idle[0].generation)
	if !tr.watched("s") || order.ctx.Err() != nil {
		t.Fatal("a stale linger closed the watch of a live response")
	}
	// The events after the Start reach b through the reused watch.
	tr.apply([]*pb.LifecycleEvent{started("s", 5, 5), started("s", 6, 6)})
	wantStopped(t, b, StopSuperseded)
}

func TestLingerOverClosesOnlyTheCurrentIdleGeneration(t *testing.T) {
	tr := newTracks()
	a, order := startOn(tr, "s", 3, 3, true)
	first := finishOn(tr, "s", a)
	b, _ := startOn(tr, "s", 4, 4, true)
	second := finishOn(tr, "s", b)
	if len(first) != 1 || len(second) != 1 || first[0].generation == second[0].generation {
		t.Fatalf("notices %+v then %+v; want two of different generations", first, second)
	}
	tr.lingerOver("s", first[0].generation)
	if !tr.watched("s") {
		t.Fatal("the older linger closed the watch")
	}
	// A response registered: even the current generation's linger waits.
	c, _ := startOn(tr, "s", 5, 5, true)
	tr.lingerOver("s", second[0].generation)
	if !tr.watched("s") {
		t.Fatal("a linger closed the watch of a live response")
	}
	third := finishOn(tr, "s", c)
	tr.lingerOver("s", third[0].generation)
	if tr.watched("s") || order.ctx.Err() == nil || tr.size() != 0 {
		t.Fatalf("after the current linger: watched %v, %d tracks", tr.watched("s"), tr.size())
	}
	tr.lingerOver("s", third[0].generation) // twice: nothing
}

func TestStopsThatEmptyATrackGiveTheIdleNoticeInsteadOfClosing(t *testing.T) {
	tr := newTracks()
	a, order := startOn(tr, "s", 3, 3, true)
	idle := tr.apply([]*pb.LifecycleEvent{cancelRequested("s", 4, 3, pb.CancelReason_CANCEL_REASON_REQUESTED)})
	wantStopped(t, a, StopCancelled)
	if len(idle) != 1 || idle[0].session != "s" || order.ctx.Err() != nil || !tr.watched("s") {
		t.Fatalf("apply: idle %+v, watched %v", idle, tr.watched("s"))
	}
	b, _ := startOn(tr, "t", 1, 1, true)
	if idle, _ := tr.applyState("t", SessionState{Phase: PhaseIdle, Revision: 2}, tr.ticket()); len(idle) != 1 || idle[0].session != "t" {
		t.Fatalf("applyState: idle %+v", idle)
	}
	wantStopped(t, b, StopGone)
	c, _ := startOn(tr, "u", 1, 1, true)
	if idle, _ := tr.applyGone("u", tr.ticket()); len(idle) != 1 || idle[0].session != "u" {
		t.Fatalf("applyGone: idle %+v", idle)
	}
	wantStopped(t, c, StopGone)
	// Stops that leave a response registered give none.
	d, _ := startOn(tr, "v", 1, 1, true)
	e, _ := startOn(tr, "v", 2, 2, true)
	if idle := tr.apply([]*pb.LifecycleEvent{started("v", 2, 2)}); idle != nil {
		t.Fatalf("idle %+v while e is live", idle)
	}
	wantStopped(t, d, StopSuperseded)
	wantCurrent(t, e)
}

func TestTheTrackOutlivesItsLastHandleWhileTheWatchLingers(t *testing.T) {
	tr := newTracks()
	live, _ := startOn(tr, "s", 7, 7, true)
	idle := tr.apply([]*pb.LifecycleEvent{started("s", 9, 9)})
	wantStopped(t, live, StopSuperseded)
	// No response, no Start in flight: the track stays, and what it knows
	// stops a Start answered inside the linger for an older response.
	if dt, ok := tr.deadThrough("s"); !ok || dt != 8 {
		t.Fatalf("dead through %d, tracked %v; want 8, tracked", dt, ok)
	}
	tr.track("s")
	late := newLiveness(8)
	order, again := tr.register("s", late, 8, true)
	wantStopped(t, late, StopSuperseded)
	if order != nil || len(again) != 1 || again[0].generation == idle[0].generation {
		t.Fatalf("order %+v, idle %+v; want a fresh notice (the register counts as activity)", order, again)
	}
	tr.lingerOver("s", idle[0].generation)
	if _, ok := tr.deadThrough("s"); !ok {
		t.Fatal("a stale linger forgot the track")
	}
	tr.lingerOver("s", again[0].generation)
	if _, ok := tr.deadThrough("s"); ok {
		t.Fatal("the linger's end did not forget the track")
	}
}

func TestAStartInFlightKeepsTheTrackWhenTheLingerEnds(t *testing.T) {
	tr := newTracks()
	a, first := startOn(tr, "s", 3, 3, true)
	idle := finishOn(tr, "s", a)
	tr.track("s") // a Start in flight
	tr.lingerOver("s", idle[0].generation)
	if tr.watched("s") || first.ctx.Err() == nil || tr.size() != 1 {
		t.Fatalf("watched %v, %d tracks; want the watch closed, the track held", tr.watched("s"), tr.size())
	}
	// Its reply registers and opens a new watch, with proof.
	b := newLiveness(5)
	order, _ := tr.register("s", b, 5, true)
	if order == nil || order.afterRevision != 4 || order.expectStarted != 5 || order.readFirst {
		t.Fatalf("order %+v; want a new watch after revision 4 expecting started(5)", order)
	}
}

func TestAStateReadCoversAResponseByItsStartRevision(t *testing.T) {
	tr := newTracks()
	ticket := tr.ticket() // the read is sent
	// A Start answered after the read was sent, registered before its answer.
	a, _ := startOn(tr, "s", 4, 4, true)
	b, _ := startOn(tr, "s", 6, 6, true)
	tr.applyState("s", SessionState{Phase: PhaseIdle, Revision: 5}, ticket)
	wantStopped(t, a, StopGone) // its Start (4) is at or below the read's revision: covered
	wantCurrent(t, b)           // 6 is after the read
	// Active(z) spares z, however covered.
	c, _ := startOn(tr, "t", 2, 2, true)
	d, _ := startOn(tr, "t", 3, 3, true)
	tr.applyState("t", SessionState{Phase: PhaseActive, ResponseID: 3, Revision: 3}, 0)
	wantStopped(t, c, StopSuperseded)
	wantCurrent(t, d)
	// A gone session's revisions mean nothing: the ticket alone covers.
	e, _ := startOn(tr, "u", 2, 2, true)
	tr.applyGone("u", 0)
	wantCurrent(t, e)
}

func TestAStartRegisteredAfterAReadThatCoveredItIsStoppedAtOnce(t *testing.T) {
	tr := newTracks()
	order, _ := tr.openWatch("s")
	if order == nil || !order.readFirst {
		t.Fatalf("order %+v; want read first", order)
	}
	tr.applyState("s", SessionState{Phase: PhaseIdle, Revision: 8}, tr.ticket())
	// Answered at revision 7 (before the read), registered after the read's
	// answer: the read saw the session idle after it, so it is over.
	tr.track("s")
	late := newLiveness(7)
	if o, idle := tr.register("s", late, 7, true); o != nil || len(idle) != 1 {
		t.Fatalf("order %+v, idle %+v", o, idle)
	}
	wantStopped(t, late, StopGone)
	// After the read's revision: registered on the open watch.
	later, o := startOn(tr, "s", 9, 9, true)
	if o != nil {
		t.Fatalf("order %+v; want the open watch reused", o)
	}
	wantCurrent(t, later)
	// A read that finds it active spares it, even when it covers its Start.
	tr.applyState("s", SessionState{Phase: PhaseActive, ResponseID: 9, Revision: 9}, tr.ticket())
	wantCurrent(t, later)
	tr.track("s")
	replayed := newLiveness(9)
	if o, _ := tr.register("s", replayed, 9, false); o != nil {
		t.Fatalf("order %+v", o)
	}
	wantCurrent(t, replayed)
	// NOT_FOUND clears the read: a Start of the session created anew lives.
	tr.applyGone("s", tr.ticket())
	reborn, _ := startOn(tr, "s", 12, 1, true)
	wantCurrent(t, reborn)
}

func TestOpenWatchReadsFirstAndCountsAsActivity(t *testing.T) {
	tr := newTracks()
	order, idle := tr.openWatch("w")
	if order == nil || !order.readFirst || order.session != "w" || len(idle) != 1 {
		t.Fatalf("order %+v, idle %+v; want a read-first watch of w and its linger", order, idle)
	}
	if !tr.watched("w") || tr.size() != 1 {
		t.Fatal("w is not watched")
	}
	// Again: no second watch, the linger restarts (a newer generation).
	again, restart := tr.openWatch("w")
	if again != nil || len(restart) != 1 || restart[0].generation == idle[0].generation {
		t.Fatalf("order %+v, idle %+v", again, restart)
	}
	tr.lingerOver("w", idle[0].generation)
	if !tr.watched("w") {
		t.Fatal("the first linger closed a watch opened again since")
	}
	// With a response live, openWatch counts as activity but gives no notice.
	a, o := startOn(tr, "w", 1, 1, true)
	if o != nil {
		t.Fatalf("order %+v; want the open watch reused", o)
	}
	if _, none := tr.openWatch("w"); none != nil {
		t.Fatalf("idle %+v while a response is live", none)
	}
	last := finishOn(tr, "w", a)
	tr.lingerOver("w", last[0].generation)
	if tr.watched("w") || order.ctx.Err() == nil || tr.size() != 0 {
		t.Fatalf("watched %v, %d tracks", tr.watched("w"), tr.size())
	}
	// A closed client opens nothing.
	tr.releaseAll()
	if order, idle := tr.openWatch("x"); order != nil || idle != nil || tr.size() != 0 {
		t.Fatalf("after releaseAll: %+v %+v", order, idle)
	}
}

func TestTerminatedEndsALingeringWatch(t *testing.T) {
	tr := newTracks()
	first, _ := tr.openWatch("s")
	a, _ := startOn(tr, "s", 3, 3, true)
	idle := finishOn(tr, "s", a)
	tr.applyState("s", SessionState{Phase: PhaseIdle, Revision: 4}, tr.ticket())
	if got := tr.apply([]*pb.LifecycleEvent{terminatedEvent("s", 5, pb.CancelReason_CANCEL_REASON_EXPIRED)}); got != nil {
		t.Fatalf("idle %+v after terminated; the watch is over, nothing lingers", got)
	}
	if tr.watched("s") || first.ctx.Err() == nil || tr.size() != 0 {
		t.Fatalf("watched %v, %d tracks; want the watch over and the track forgotten", tr.watched("s"), tr.size())
	}
	tr.lingerOver("s", idle[0].generation) // nothing left to close
	// With a Start in flight the track stays, without its watch or read: the
	// reply opens a new watch, with proof.
	b, _ := startOn(tr, "t", 3, 3, true)
	tr.applyState("t", SessionState{Phase: PhaseActive, ResponseID: 3, Revision: 3}, tr.ticket())
	tr.track("t")
	tr.apply([]*pb.LifecycleEvent{terminatedEvent("t", 4, pb.CancelReason_CANCEL_REASON_SHUTDOWN)})
	wantStopped(t, b, StopShutdown)
	if tr.watched("t") || tr.size() != 1 {
		t.Fatalf("watched %v, %d tracks", tr.watched("t"), tr.size())
	}
	c := newLiveness(9)
	order, _ := tr.register("t", c, 1, true)
	if order == nil || order.expectStarted != 9 {
		t.Fatalf("order %+v; want a new watch with proof", order)
	}
	wantCurrent(t, c) // no read left to cover revision 1
}

// A read answered while a Start registered cannot tell whether the stream it
// positions will mention that Start (another incarnation may have answered
// it): the watch is told to read again, and the next read decides by ticket.
func TestAReadThatCannotDecideALaterStartIsTakenAgain(t *testing.T) {
	tr := newTracks()
	tr.openWatch("s")
	ticket := tr.ticket()
	a, _ := startOn(tr, "s", 40, 3, true) // answered while the read was out
	if _, retake := tr.applyGone("s", ticket); !retake {
		t.Fatal("NOT_FOUND said nothing of a Start registered while it was out")
	}
	wantCurrent(t, a)
	// The read again, from a coordinator that restarted: NOT_FOUND again.
	if _, retake := tr.applyGone("s", tr.ticket()); retake {
		t.Fatal("a read sent after the registration must decide it")
	}
	wantStopped(t, a, StopGone)

	ticket = tr.ticket()
	b, _ := startOn(tr, "t", 50, 6, true)
	c, _ := startOn(tr, "t", 51, 8, true)
	// The state at revision 7 covers b (6) by revision, not c (8).
	if _, retake := tr.applyState("t", SessionState{Phase: PhaseIdle, Revision: 7}, ticket); !retake {
		t.Fatal("c's Start after the read's revision: the read cannot decide it")
	}
	wantStopped(t, b, StopGone)
	wantCurrent(t, c)
	if _, retake := tr.applyState("t", SessionState{Phase: PhaseActive, ResponseID: 51, Revision: 8}, tr.ticket()); retake {
		t.Fatal("the read again decides c")
	}
	wantCurrent(t, c)
}

func TestATerminatedReadStopsEveryResponseAndEndsTheWatch(t *testing.T) {
	tr := newTracks()
	tr.track("s")
	order, _ := tr.openWatch("s")
	if order == nil || !order.readFirst {
		t.Fatalf("openWatch: %+v; want a read-first order", order)
	}
	ticket := tr.ticket()
	// Not covered by the read (registered after it was sent, a Start past
	// its revision): stopped all the same, nothing lives after teardown.
	uncovered, _ := startOn(tr, "s", 4, 9, true)
	idle, retake := tr.applyState("s", SessionState{Phase: PhaseTerminated, Revision: 3}, ticket)
	if idle != nil || retake {
		t.Fatalf("idle %v, retake %v; want neither: the watch is over", idle, retake)
	}
	wantStopped(t, uncovered, StopShutdown)
	if tr.watched("s") || order.ctx.Err() == nil {
		t.Fatal("the watch outlived a terminated read")
	}
	_, reborn := startOn(tr, "s", 12, 1, true)
	if reborn == nil || reborn.expectStarted != 12 {
		t.Fatalf("the next Start: %+v; want a new watch with its proof", reborn)
	}
}

package respcoord

// The fencing table: per tracked session, which of this client's responses
// are known to be no longer live. Pure bookkeeping, no I/O, no clock, no
// goroutines: the session watches (watch.go) feed it events and state
// reads, and the client carries out what it asks for: open a session's
// watch (a watchOrder), and arm a linger timer (an idleNotice) whose end
// comes back as lingerOver. This is clients/rust/src/fencing.rs (and the
// TypeScript and Python ports) in Go.
//
// Per tracked session the client keeps deadThrough: every response id of the
// session up to it is known to be no longer live. Each event and each state
// read only ever RAISES it, or stops registered responses, with a fact that
// is true whenever it is applied:
//
//	started(y)                      -> raise to y-1 (at most one live response, ids increase)
//	cancel_requested(x), ended(x)   -> raise to x   (x is done)
//	terminated                      -> stop every registered response
//	state Active(z)                 -> raise to z-1 (as started(z)), and stop, as gone,
//	                                   every response registered before the read that is not z
//	state Idle                      -> stop every response the read covered (registered
//	                                   before it was sent, or whose Start it reached)
//	state Terminated                -> stop every registered response; the watch is over
//	NOT_FOUND, or a lower revision  -> stop, as gone, every response registered before the
//	than the watch had reached         read was sent (their session no longer exists)
//
// Because every update is a max of true facts, or stops responses the read
// already covered, replaying events or applying a state read while events
// arrive is harmless: that is what makes resuming a broken watch simple.
//
// A response registers right after its Start reply. If its session has no
// watch, one is opened that replays from the reply's revision; if it has one
// (open for another response, opened ahead by OpenWatch, or lingering after
// the last response), that watch is reused and every event after the Start
// passes through apply all the same. A response registered after its stop
// was applied finds id <= deadThrough, or a state read that already covered
// its Start, and is stopped at once: no stop is missed.
//
// Which sessions are watched: a session's watch stays open while this client
// has a live response there, and for the client's linger after the last one
// ends or after OpenWatch, whichever is later. The table never reads a clock:
// when a track goes idle with its watch open it hands the caller an
// idleNotice (session, generation); the caller arms a timer and then calls
// lingerOver, which closes the watch only if nothing registered and no
// OpenWatch came since (the generation is unchanged). A track outlives its
// last reference while its watch lingers, so deadThrough stays known to a
// Start inside the linger; closing the watch forgets it.
//
// One mutex guards the table: its critical sections are short and never
// block (a liveness's stop only closes a channel and cancels contexts). The
// stop hooks (Response.OnStop) of the responses a critical section stopped
// run right after it, on the same goroutine, once the mutex is released:
// never under the table's lock or a liveness's, so a hook may call back
// into the client, and a hook that waits for a lock of the caller's cannot
// deadlock against that caller calling the client while holding it.

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

// liveness is one started response's liveness, shared by its handle, its
// fences and the watch. Once stopped it stays stopped; the first reason wins.
type liveness struct {
	id      uint64
	current atomic.Bool // the fence check: one atomic load

	mu      sync.Mutex
	reason  StopReason
	done    chan struct{}
	cancels []context.CancelCauseFunc
	hooks   []*stopHook
	ctx     context.Context
}

// stopHook is one OnStop function. claimed makes it run at most once, and
// lets its stop function tell whether it kept it from running.
type stopHook struct {
	fn      func(StopReason)
	claimed atomic.Bool
}

// firing is the hooks a stop left to run, with its reason.
type firing struct {
	hooks  []*stopHook
	reason StopReason
}

// run runs them in registration order on this goroutine.
func (f firing) run() {
	for _, h := range f.hooks {
		if h.claimed.CompareAndSwap(false, true) {
			h.fn(f.reason)
		}
	}
}

func newLiveness(id uint64) *liveness {
	l := &liveness{id: id, done: make(chan struct{})}
	ctx, cancel := context.WithCancelCause(context.Background())
	l.ctx = ctx
	l.cancels = []context.CancelCauseFunc{cancel}
	l.current.Store(true)
	return l
}

// stop stops it, then runs its stop hooks on this goroutine; true if this
// call stopped it. The caller holds none of the client's locks (a hook may
// call back into the client).
func (l *liveness) stop(reason StopReason) bool {
	f, stopped := l.halt(reason)
	f.run()
	return stopped
}

// halt stops it and leaves its stop hooks to the caller, to run once it
// has let go of its locks; true if this call stopped it. Every context
// tied to it is cancelled here, synchronously, with a *StoppedError as the
// cause: the moment a watch applies the stop, the body's context is done.
func (l *liveness) halt(reason StopReason) (firing, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reason != "" {
		return firing{}, false
	}
	l.reason = reason
	l.current.Store(false)
	close(l.done)
	cause := &StoppedError{ResponseID: l.id, Reason: reason}
	for _, cancel := range l.cancels {
		cancel(cause)
	}
	l.cancels = nil
	f := firing{hooks: l.hooks, reason: reason}
	l.hooks = nil
	return f, true
}

// onStop registers fn to run once, when it stops; at once on a goroutine
// of its own if it already has. The returned function unregisters it: true
// if that kept fn from running.
func (l *liveness) onStop(fn func(StopReason)) (stop func() bool) {
	h := &stopHook{fn: fn}
	stop = func() bool {
		if !h.claimed.CompareAndSwap(false, true) {
			return false
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if i := slices.Index(l.hooks, h); i >= 0 {
			l.hooks = slices.Delete(l.hooks, i, i+1)
		}
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reason != "" {
		go firing{hooks: []*stopHook{h}, reason: l.reason}.run()
		return stop
	}
	l.hooks = append(l.hooks, h)
	return stop
}

// tie cancels cancel (with the stop's cause) when it stops, at once if it
// already has.
func (l *liveness) tie(cancel context.CancelCauseFunc) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reason != "" {
		cancel(&StoppedError{ResponseID: l.id, Reason: l.reason})
		return
	}
	l.cancels = append(l.cancels, cancel)
}

func (l *liveness) stopReason() StopReason {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reason
}

// registered is a live response of this client, with the client-wide ticket
// of its registration and its Start reply's revision.
type registered struct {
	l        *liveness
	ticket   uint64
	revision uint64
}

// stateRead is the last state read applied while the current watch lives.
type stateRead struct {
	revision uint64
	phase    Phase
	active   uint64
}

type track struct {
	// refs: Starts in flight and registered responses holding the track.
	refs        int
	deadThrough uint64
	// reason is why deadThrough last rose (for responses registered late).
	reason    StopReason
	responses []registered
	// watch stops the session's watch; set while the watch is open: while
	// responses is not empty, and while it lingers after.
	watch context.CancelFunc
	// generation is bumped by every register and every openWatch: an
	// idleNotice of an older generation is stale.
	generation uint64
	// read is the last state read applied while the current watch lives;
	// nil when the watch ends, a new one opens, or NOT_FOUND answered.
	read *stateRead
}

// watchOrder is what register and openWatch ask their caller to do: open the
// session's watch, which runs until ctx is done.
type watchOrder struct {
	session string
	// readFirst: a watch opened ahead (openWatch) begins with a state read,
	// as a resume does, and streams from the state's revision (from the
	// session's first event on NOT_FOUND); afterRevision and expectStarted
	// are then unused.
	readFirst bool
	// afterRevision is the Watch's after_revision.
	afterRevision uint64
	// expectStarted, when not 0, is the response whose started event must
	// come first (at afterRevision+1): proof that the stream follows the
	// session the Start was applied to, not one recreated since.
	expectStarted uint64
	ctx           context.Context
}

// idleNotice says a session's track went idle (no registered response) with
// its watch open, at generation: the caller arms the linger and then calls
// lingerOver(session, generation).
type idleNotice struct {
	session    string
	generation uint64
}

// tracks are the sessions this client tracks, shared by handles and watches.
type tracks struct {
	mu      sync.Mutex
	m       map[string]*track
	tickets uint64
	closed  bool
	// pending: the stop hooks of the responses stopped under mu, run by
	// unlock once mu is released, on the same goroutine.
	pending []firing
}

// unlock releases mu, then runs the stop hooks of the responses stopped
// while it was held. Every method that can stop a response unlocks with it.
func (t *tracks) unlock() {
	pending := t.pending
	t.pending = nil
	t.mu.Unlock()
	for _, f := range pending {
		f.run()
	}
}

// haltLocked stops l, its stop hooks left to unlock. The caller holds mu.
func (t *tracks) haltLocked(l *liveness, reason StopReason) {
	if f, stopped := l.halt(reason); stopped && len(f.hooks) > 0 {
		t.pending = append(t.pending, f)
	}
}

func newTracks() *tracks { return &tracks{m: map[string]*track{}} }

// trackLocked is the session's track, made if it has none.
func (t *tracks) trackLocked(session string) *track {
	tr := t.m[session]
	if tr == nil {
		tr = &track{reason: StopGone}
		t.m[session] = tr
	}
	return tr
}

// idleLocked is the notice to hand out when tr is idle with its watch open.
func idleLocked(session string, tr *track) []idleNotice {
	if tr.watch == nil || len(tr.responses) > 0 {
		return nil
	}
	return []idleNotice{{session: session, generation: tr.generation}}
}

// closeWatchLocked ends the session's watch (if open) and forgets the track
// when nothing holds it.
func (t *tracks) closeWatchLocked(session string, tr *track) {
	if tr.watch != nil {
		tr.watch()
		tr.watch = nil
	}
	tr.read = nil
	if tr.refs <= 0 && t.m[session] == tr {
		delete(t.m, session)
	}
}

func below(x uint64) uint64 {
	if x > 0 {
		return x - 1
	}
	return 0
}

// track holds the session tracked while a Start is in flight: what its
// watch (if another response of ours is live there) learns meanwhile
// applies to the response the Start will return.
func (t *tracks) track(session string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.trackLocked(session).refs++
}

// release drops one reference; the last one forgets the session, unless its
// watch is open (lingering): lingerOver forgets it then.
func (t *tracks) release(session string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.releaseLocked(session, t.m[session])
}

func (t *tracks) releaseLocked(session string, tr *track) {
	if tr == nil {
		return
	}
	tr.refs--
	if tr.refs <= 0 && tr.watch == nil && t.m[session] == tr {
		delete(t.m, session)
	}
}

// register adds a started response whose Start reply carried revision, and
// takes over the reference track took. fresh: the reply was not a replay,
// so the response's started event is at revision. It stops the response at
// once if a watch already saw its end (deadThrough), or if a state read
// applied to the current watch already covered its Start (revision <= the
// read's) and did not find it active. It returns the watch to open when the
// session has none (an open one is reused), and the idle notice when the
// response was stopped at once on a session whose watch is open.
func (t *tracks) register(session string, l *liveness, revision uint64, fresh bool) (*watchOrder, []idleNotice) {
	t.mu.Lock()
	defer t.unlock()
	tr := t.m[session]
	if tr == nil {
		t.haltLocked(l, StopReleased)
		return nil, nil
	}
	if t.closed {
		t.haltLocked(l, StopReleased)
	} else if l.id <= tr.deadThrough {
		t.haltLocked(l, tr.reason)
	} else if r := tr.read; r != nil && revision <= r.revision && (r.phase != PhaseActive || r.active != l.id) {
		t.haltLocked(l, StopGone)
	}
	tr.generation++
	if !l.current.Load() {
		idle := idleLocked(session, tr)
		if t.closed {
			idle = nil
		}
		t.releaseLocked(session, tr)
		return nil, idle
	}
	t.tickets++
	tr.responses = append(tr.responses, registered{l: l, ticket: t.tickets, revision: revision})
	if tr.watch != nil {
		return nil, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	tr.watch = cancel
	tr.read = nil
	order := &watchOrder{session: session, afterRevision: revision, ctx: ctx}
	if fresh {
		order.afterRevision = below(revision)
		order.expectStarted = l.id
	}
	return order, nil
}

// openWatch opens the session's watch ahead of a Start (tracking the session
// if it is not): an order to read the state first when it has no watch, and
// the idle notice when nothing is registered, which restarts the linger of
// an open watch. Nothing once the client is closing.
func (t *tracks) openWatch(session string) (*watchOrder, []idleNotice) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, nil
	}
	tr := t.trackLocked(session)
	tr.generation++
	var order *watchOrder
	if tr.watch == nil {
		ctx, cancel := context.WithCancel(context.Background())
		tr.watch = cancel
		tr.read = nil
		order = &watchOrder{session: session, readFirst: true, ctx: ctx}
	}
	return order, idleLocked(session, tr)
}

// lingerOver is the end of the linger an idleNotice of generation armed:
// unless a response registered or openWatch came since (the generation
// moved) or one is registered, the session's watch closes and the track is
// forgotten when nothing holds it.
func (t *tracks) lingerOver(session string, generation uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tr := t.m[session]
	if tr == nil || tr.generation != generation || len(tr.responses) > 0 || tr.watch == nil {
		return
	}
	t.closeWatchLocked(session, tr)
}

// unregister removes a response stopped locally (finished, released) and
// drops its reference; the idle notice when the session's last one went.
func (t *tracks) unregister(session string, l *liveness) []idleNotice {
	t.mu.Lock()
	defer t.unlock()
	tr := t.m[session]
	if tr == nil {
		return nil
	}
	return t.stopWhereLocked(session, tr, "", func(r registered) bool { return r.l == l })
}

// stopWhereLocked stops (reason "" leaves them as they are) and removes the
// registered responses which selects, raising deadThrough over them, and
// drops their references. It returns the idle notice when that left the
// track idle with its watch open.
func (t *tracks) stopWhereLocked(session string, tr *track, reason StopReason, which func(registered) bool) []idleNotice {
	var highest uint64
	removed := 0
	kept := tr.responses[:0]
	for _, r := range tr.responses {
		if !which(r) {
			kept = append(kept, r)
			continue
		}
		if reason != "" {
			t.haltLocked(r.l, reason)
			highest = max(highest, r.l.id)
		}
		removed++
	}
	clear(tr.responses[len(kept):])
	tr.responses = kept
	if highest > tr.deadThrough {
		tr.deadThrough = highest
		tr.reason = reason
	}
	for range removed {
		t.releaseLocked(session, tr)
	}
	if removed == 0 {
		return nil
	}
	return idleLocked(session, tr)
}

func (t *tracks) raiseLocked(session string, tr *track, through uint64, reason StopReason) []idleNotice {
	if through > tr.deadThrough {
		tr.deadThrough = through
		tr.reason = reason
	}
	return t.stopWhereLocked(session, tr, reason, func(r registered) bool { return r.l.id <= through })
}

// apply applies one WatchResponse's events; it returns the idle notices of
// the sessions whose last registered response they stopped. After
// terminated the session's stream ends, so its watch is over: the track has
// no watch (a later Start opens a new one, with proof) and is forgotten
// when nothing holds it.
func (t *tracks) apply(events []*pb.LifecycleEvent) []idleNotice {
	t.mu.Lock()
	defer t.unlock()
	var idle []idleNotice
	for _, e := range events {
		session := e.GetSessionId()
		tr := t.m[session]
		if tr == nil {
			continue
		}
		switch kind := e.GetKind().(type) {
		case *pb.LifecycleEvent_Started:
			idle = append(idle, t.raiseLocked(session, tr, below(kind.Started.GetResponseId()), StopSuperseded)...)
		case *pb.LifecycleEvent_CancelRequested:
			idle = append(idle, t.raiseLocked(session, tr, kind.CancelRequested.GetResponseId(), StopReasonFromCancel(kind.CancelRequested.GetReason()))...)
		case *pb.LifecycleEvent_Ended:
			reason := StopEnded
			if kind.Ended.GetStatus() == pb.TerminalStatus_TERMINAL_STATUS_CANCELLED {
				reason = StopReasonFromCancel(kind.Ended.GetReason())
			}
			idle = append(idle, t.raiseLocked(session, tr, kind.Ended.GetResponseId(), reason)...)
		case *pb.LifecycleEvent_Terminated:
			t.stopWhereLocked(session, tr, StopReasonFromCancel(kind.Terminated.GetReason()), func(registered) bool { return true })
			t.closeWatchLocked(session, tr)
			idle = slices.DeleteFunc(idle, func(n idleNotice) bool { return n.session == session })
		}
	}
	return idle
}

// ticket is the registration ticket now: take it before sending a state
// read, and the read's answer covers every response registered up to it.
func (t *tracks) ticket() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tickets
}

// applyState applies a state read of session sent at ticket, and keeps it as
// the track's read. The read covers every response registered up to ticket,
// and every response whose Start reply's revision is at or below the
// state's (a Start answered after the read was sent but registered before
// its answer came). It returns the idle notice when it stopped the
// session's last registered response, and retake: a response registered
// while the read was out is not covered by it, so the caller must read
// again (see retakeLocked).
func (t *tracks) applyState(session string, s SessionState, ticket uint64) (idle []idleNotice, retake bool) {
	t.mu.Lock()
	defer t.unlock()
	tr := t.m[session]
	if tr == nil {
		return nil, false
	}
	covered := func(r registered) bool { return r.ticket <= ticket || r.revision <= s.Revision }
	switch s.Phase {
	case PhaseActive:
		active := s.ResponseID
		idle = t.raiseLocked(session, tr, below(active), StopSuperseded)
		idle = append(idle, t.stopWhereLocked(session, tr, StopGone, func(r registered) bool { return covered(r) && r.l.id != active })...)
	case PhaseTerminated:
		// Nothing more happens on this session: what is still registered
		// belongs to no live session either, and the watch is over (a
		// later Start opens a new one, with proof), as after terminated.
		t.stopWhereLocked(session, tr, StopShutdown, func(registered) bool { return true })
		t.closeWatchLocked(session, tr)
		return nil, false
	default:
		idle = t.stopWhereLocked(session, tr, StopGone, covered)
	}
	if t.m[session] == tr {
		tr.read = &stateRead{revision: s.Revision, phase: s.Phase, active: s.ResponseID}
	}
	return idle, retakeLocked(tr, func(r registered) bool { return !covered(r) })
}

// retakeLocked: a response which selects registered while the read was out
// and the read does not cover. Its Start was answered before it registered,
// but the read may have been answered by another incarnation of the session
// (the coordinator restarted, or the session was forgotten and created
// anew, while the read was out): then the stream the read positions will
// never mention it. A read sent now, after its registration, decides it by
// its ticket, whichever incarnation answers: it is the active response, or
// it is stopped.
func retakeLocked(tr *track, which func(registered) bool) bool {
	return slices.ContainsFunc(tr.responses, which)
}

// applyGone: a read sent at ticket found the session missing (or
// recreated): the responses it covered (by ticket only: the revisions of a
// session that is gone mean nothing) belong to a session that is gone, and
// the track's read is cleared. It returns the idle notice when it stopped
// the session's last registered response, and retake: a response
// registered while the read was out, which the read cannot decide.
func (t *tracks) applyGone(session string, ticket uint64) (idle []idleNotice, retake bool) {
	t.mu.Lock()
	defer t.unlock()
	tr := t.m[session]
	if tr == nil {
		return nil, false
	}
	tr.read = nil
	idle = t.stopWhereLocked(session, tr, StopGone, func(r registered) bool { return r.ticket <= ticket })
	return idle, retakeLocked(tr, func(registered) bool { return true })
}

// releaseAll stops every tracked response as released, closes every watch
// and forgets every track: the client is closing, nothing can learn about
// stops any more. Later registrations are released at once, and openWatch
// does nothing.
func (t *tracks) releaseAll() {
	t.mu.Lock()
	defer t.unlock()
	t.closed = true
	for _, session := range slices.Collect(maps.Keys(t.m)) {
		if tr := t.m[session]; tr != nil {
			t.stopWhereLocked(session, tr, StopReleased, func(registered) bool { return true })
			if tr.watch != nil {
				tr.watch()
				tr.watch = nil
			}
			delete(t.m, session)
		}
	}
}

// deadThrough and watched are for tests and WatchStatus.
func (t *tracks) deadThrough(session string) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tr := t.m[session]
	if tr == nil {
		return 0, false
	}
	return tr.deadThrough, true
}

func (t *tracks) watched(session string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	tr := t.m[session]
	return tr != nil && tr.watch != nil
}

func (t *tracks) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

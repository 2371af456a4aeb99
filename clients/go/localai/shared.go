package respcoord

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// stopKind is what ended one of this process's responses, as far as the
// coordinator's State needs to know.
type stopKind int

const (
	// stopOther: superseded by another process's Start (so a response of
	// another process is live now).
	stopOther stopKind = iota
	// stopCancelled: a Cancel, from any process (the session is idle now).
	stopCancelled
	// stopSessionOver: Shutdown or idle expiry: nothing starts here again.
	stopSessionOver
	// stopFinished: this process's own Finish closed it; Apply(Finished)
	// performs the terminal, the stop hook does nothing.
	stopFinished
	// stopLost: no longer live, or no longer fenceable, for a reason that
	// says nothing certain about the session (found gone by a state read
	// after a broken watch; another holder of the id finished it; the
	// client was closed).
	stopLost
)

// remoteSession is what a shared coordinator needs from the respcoord client
// for one session. It is an interface so that the decision logic here is
// written once against the facts it needs (an id, a stop signal and its
// reason, Finish's applied-or-stale answer), not against the client's types.
type remoteSession interface {
	// start starts a response; errSessionOver wraps the answer for a
	// terminated session.
	start(ctx context.Context, src Source) (remoteResponse, error)
	// cancel cancels whatever is live, unconditionally; terminated: the
	// reply says the session is shut down or expired. A session that does
	// not exist has nothing live: that is not an error.
	cancel(ctx context.Context, src Source) (terminated bool, err error)
	// shutdown terminates the session; idempotent.
	shutdown(ctx context.Context) error
}

// remoteResponse is one response this process started.
type remoteResponse interface {
	// id is the server's id for it.
	id() uint64
	// stopped is closed once the response is no longer live, for any
	// reason; reason then says why.
	stopped() <-chan struct{}
	reason() stopKind
	// onStop registers fn to run once, with the reason, when it stops: on
	// the goroutine that applies the stop (the session's watch, Finish,
	// release, the client's Close), holding none of the client's locks; at
	// once on a goroutine of its own if it already has. The returned stop
	// unregisters fn.
	onStop(fn func(stopKind)) (stop func() bool)
	// finish reports COMPLETED. applied is false when the server had
	// already stopped the response (or the client knew it had and sent
	// nothing).
	finish(ctx context.Context) (applied bool, err error)
	// release tells the client this process no longer tracks the response.
	release()
}

// shared is the part of a Coordinator made by NewShared.
type shared struct {
	session   string
	remote    remoteSession
	timeout   time.Duration
	initErr   error // the client refused the session; every Apply returns it
	closeOnce sync.Once

	// Guarded by Coordinator.mu.
	own        *own // this process's live response, nil if none
	othersLive bool // last learned: another process's response is live
	terminated bool
	closed     bool

	// ids maps this process's response ids to the server's, for ServerID.
	// Guarded by idsMu, not Coordinator.mu, so a sink may ask from Perform.
	idsMu sync.Mutex
	ids   map[ResponseID]uint64
	order []ResponseID
}

// own is one response of this process: the caller's id and the server's
// handle. A pointer identifies it, so a stop that arrives for a response
// already ended here is recognised and dropped.
type own struct {
	local  ResponseID
	remote remoteResponse
	// unhook unregisters the stop hook; called, under Coordinator.mu,
	// before the handle is released there (a release runs the handle's
	// stop hooks on the releasing goroutine, and the hook takes
	// Coordinator.mu).
	unhook func() bool
}

// maxRememberedIDs bounds the ServerID table of one coordinator: a long
// session must not grow it without limit, and a log line correlating ids
// only ever needs recent ones.
const maxRememberedIDs = 1024

func (s *shared) stateLocked() State {
	switch {
	case s.terminated:
		return Terminated{}
	case s.own != nil:
		return Active{ID: s.own.local}
	case s.othersLive:
		return Active{ID: 0}
	default:
		return Idle{}
	}
}

func (s *shared) apply(ctx context.Context, c *Coordinator, e Event) error {
	if s.initErr != nil {
		return fmt.Errorf("respcoord: %v: %w", e, s.initErr)
	}
	c.mu.Lock()
	closed, terminated := s.closed, s.terminated
	c.mu.Unlock()
	if closed {
		return fmt.Errorf("respcoord: %v: %w", e, ErrClosed)
	}
	switch ev := e.(type) {
	case Start:
		if terminated {
			return nil // absorbed: nothing starts after Terminated
		}
		return s.applyStart(ctx, c, ev)
	case Finished:
		return s.applyFinished(ctx, c, ev)
	case Cancel:
		if terminated {
			return nil
		}
		return s.applyCancel(ctx, c, ev)
	case Shutdown:
		if terminated {
			return nil // idempotent, as on the server
		}
		return s.applyShutdown(ctx, c)
	}
	return nil
}

// applyStart asks the server for a response. Whatever this process ran is no
// longer live once the server has started a newer one, so it is cancelled and
// terminated first, then the new one is started: the three effects in that
// order, with nothing between them, before Apply returns.
func (s *shared) applyStart(ctx context.Context, c *Coordinator, ev Start) error {
	r, err := s.remote.start(ctx, ev.Source)
	if err != nil {
		if isSessionOver(err) {
			// The session was shut down or expired elsewhere: the Start is
			// absorbed, and this process's response (if the stop has not
			// reached it yet) is over too.
			c.mu.Lock()
			s.stopOwnLocked(c)
			s.terminated = true
			c.mu.Unlock()
			return nil
		}
		return fmt.Errorf("respcoord: %v on session %q: %w", ev, s.session, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.closed {
		// Closed while the call was out: nothing may be started or
		// watched any more. The server's response is left to be
		// superseded, cancelled or expired, like any released one.
		r.release()
		return fmt.Errorf("respcoord: %v: %w", ev, ErrClosed)
	}
	s.stopOwnLocked(c)
	s.othersLive = false
	if s.terminated {
		// Learned while the call was out that the session is over:
		// nothing starts after Terminated, whatever the reply said.
		r.release()
		return nil
	}
	select {
	case <-r.stopped():
		// Stopped between the server's answer and now, by a decision of
		// another process that reached this one first.
		kind := r.reason()
		r.release()
		s.noteStopLocked(kind)
		if kind == stopSessionOver {
			// Shut down or expired: starting it now would start a response
			// after Terminated. The Start is absorbed, as after Shutdown.
			return nil
		}
		// Superseded or cancelled: the server started it and stopped it, and
		// the sink sees exactly that, so the caller's Start still gets its
		// start and its one (cancelled) terminal, as LocalAI's coordinator
		// would give a Start followed at once by another Start or a Cancel.
		s.remember(ev.ID, r.id())
		c.perform(StartResponse{ID: ev.ID}, CancelResponse{ID: ev.ID}, EmitTerminal{ID: ev.ID, Status: StatusCancelled})
		return nil
	default:
	}
	o := &own{local: ev.ID, remote: r}
	// If r stopped since the select, the hook runs at once on a goroutine
	// of its own, which waits for c.mu: after StartResponse.
	o.unhook = r.onStop(func(kind stopKind) { s.onStop(c, o, kind) })
	s.own = o
	s.remember(ev.ID, r.id())
	c.perform(StartResponse{ID: ev.ID})
	return nil
}

// onStop delivers a stop decided elsewhere: when the server stops o (any
// other process's Start, a Cancel, a Shutdown, expiry), the sink gets
// CancelResponse then EmitTerminal(cancelled), unless Apply already ended o.
// It is o's stop hook, so it runs on the goroutine that applied the stop,
// the session's watch for a remote one, with no lock of the client held:
// c.mu is taken there, and the effects performed under it, as from Apply.
// No deadlock: whoever holds c.mu (Apply, Close) never waits for the watch
// (under c.mu they only release handles, which takes the client's locks
// briefly and never a lock held while a stop hook runs) and unregisters
// the hook before releasing o.
func (s *shared) onStop(c *Coordinator, o *own, kind stopKind) {
	if kind == stopFinished {
		return // our own Finish, run by Apply(Finished), which emits the terminal
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.own != o {
		return // ended by an Apply first, or the coordinator closed
	}
	s.stopOwnLocked(c)
	s.noteStopLocked(kind)
}

// applyFinished reports the end of this process's live response. Any other id
// (stale, unknown, another process's, not yet minted) is ignored without a
// call: only the live response's owner can finish it.
func (s *shared) applyFinished(ctx context.Context, c *Coordinator, ev Finished) error {
	c.mu.Lock()
	o := s.own
	c.mu.Unlock()
	if o == nil || o.local != ev.ID {
		return nil
	}
	applied, err := o.remote.finish(ctx)
	if err != nil {
		return fmt.Errorf("respcoord: %v on session %q: %w", ev, s.session, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.own != o {
		return nil // the stop reached this process first: cancelled terminal already emitted
	}
	s.own = nil
	o.unhook()
	o.remote.release()
	if applied {
		c.perform(EmitTerminal{ID: o.local, Status: StatusCompleted})
		return nil
	}
	// The server had stopped it before the Finish arrived; the stop is on
	// its way over the watch, or already here. It ends as a stop does.
	s.noteStopLocked(o.remote.reason())
	c.perform(CancelResponse{ID: o.local}, EmitTerminal{ID: o.local, Status: StatusCancelled})
	return nil
}

// applyCancel cancels the session's live response, in whichever process it
// runs. After an unconditional Cancel the session has nothing live, so this
// process's response, if it still has one, is over whichever response the
// server cancelled.
// If the reply says the session is terminated (shut down or expired
// elsewhere), the coordinator is Terminated from then on, as after a Start
// the server refuses for that reason.
func (s *shared) applyCancel(ctx context.Context, c *Coordinator, ev Cancel) error {
	terminated, err := s.remote.cancel(ctx, ev.Source)
	if err != nil {
		return fmt.Errorf("respcoord: %v on session %q: %w", ev, s.session, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s.stopOwnLocked(c)
	s.othersLive = false
	if terminated {
		s.terminated = true
	}
	return nil
}

// applyShutdown ends the session for every process. This process's response
// is cancelled and the coordinator is Terminated even when the server could
// not be told: the caller is tearing the session down and waits for its
// response goroutines, which must not outlive it. The error then says the
// server still holds the session (it expires after the server's idle TTL).
func (s *shared) applyShutdown(ctx context.Context, c *Coordinator) error {
	err := s.remote.shutdown(ctx)
	c.mu.Lock()
	s.stopOwnLocked(c)
	s.terminated = true
	s.othersLive = false
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("respcoord: Shutdown of session %q (stopped here, not recorded by the server): %w", s.session, err)
	}
	return nil
}

// stopOwnLocked ends this process's live response, if any, as a stop: cancel
// its context, then its cancelled terminal. The caller holds c.mu.
func (s *shared) stopOwnLocked(c *Coordinator) {
	o := s.own
	if o == nil {
		return
	}
	s.own = nil
	o.unhook()
	o.remote.release()
	c.perform(CancelResponse{ID: o.local}, EmitTerminal{ID: o.local, Status: StatusCancelled})
}

// noteStopLocked records what a stop says about the session.
func (s *shared) noteStopLocked(kind stopKind) {
	switch kind {
	case stopOther:
		s.othersLive = true
	case stopCancelled:
		s.othersLive = false
	case stopSessionOver:
		s.othersLive = false
		s.terminated = true
	}
}

func (s *shared) remember(local ResponseID, server uint64) {
	s.idsMu.Lock()
	defer s.idsMu.Unlock()
	if _, ok := s.ids[local]; !ok {
		s.order = append(s.order, local)
	}
	s.ids[local] = server
	if len(s.order) > maxRememberedIDs {
		delete(s.ids, s.order[0])
		s.order = s.order[1:]
	}
}

// ServerID returns the respcoord server's id for a response this process
// started (one of the last 1024), for logs and for correlating with the
// server's watch and metrics. It takes no lock a sink holds, so a sink may
// call it from Perform. A coordinator made by New has no server ids.
func (c *Coordinator) ServerID(id ResponseID) (uint64, bool) {
	if c.shared == nil {
		return 0, false
	}
	s := c.shared
	s.idsMu.Lock()
	defer s.idsMu.Unlock()
	server, ok := s.ids[id]
	return server, ok
}

// Close releases what this coordinator holds in the client, without telling
// the server anything: the session goes on for the other processes. A
// response this process still runs gets no further effects (call
// Apply(Cancel) or Apply(Shutdown) first to end it). Apply returns ErrClosed
// afterwards. The session's watch closes the client's watch linger later
// (a NewShared on the same session before then reuses it). Close of a
// coordinator made by New does nothing.
func (c *Coordinator) Close() {
	s := c.shared
	if s == nil {
		return
	}
	s.closeOnce.Do(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		s.closed = true
		if o := s.own; o != nil {
			s.own = nil
			o.unhook()
			o.remote.release()
		}
	})
}

package respcoord

import (
	"context"
	"fmt"
	"sync/atomic"

	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

// Session is a handle on one session, from Client.Session. Cheap: the client
// tracks a session while a Start on it is in flight, a response of it is
// live, or its watch is open, and watches it (one Watch stream) while a
// response of it is live and for the client's watch linger after (see
// WithWatchLinger and OpenWatch). Safe for concurrent use.
type Session struct {
	client *Client
	id     string
}

// ID is the session id.
func (s *Session) ID() string { return s.id }

// Client is the client the handle belongs to.
func (s *Session) Client() *Client { return s.client }

// StartOption configures Session.Start and Session.Run.
type StartOption func(*startOptions)

type startOptions struct {
	requestID string
	set       bool
}

// WithRequestID sets the Start's idempotency key (1 to 128 bytes). Without
// it a fresh one is generated, which still makes the call's own retries
// safe; give one to make a repeat of the whole operation (after a gateway
// restart, say) safe too: the coordinator answers it as a replay.
func WithRequestID(id string) StartOption {
	return func(o *startOptions) { o.requestID, o.set = id, true }
}

// Start starts a response, superseding the session's live one wherever it
// runs. The returned Response is stopped (its Done channel closed, its
// Context cancelled, IsCurrent false) the moment this client learns that the
// coordinator cancelled or superseded it. A Start is retried under the
// client's policy, safely: every attempt carries the same request id, so an
// attempt whose reply was lost is answered as a replay. Once the session is
// terminated it fails with ErrSessionTerminated.
func (s *Session) Start(ctx context.Context, source Source, opts ...StartOption) (*Response, error) {
	var o startOptions
	for _, opt := range opts {
		opt(&o)
	}
	if !source.valid() {
		return nil, invalidArgument("source", fmt.Sprintf("unknown source %d", source))
	}
	requestID := NewRequestID()
	if o.set {
		if err := ValidateRequestID(o.requestID); err != nil {
			return nil, err
		}
		requestID = o.requestID
	}
	c := s.client
	// Tracked while the Start is in flight; nothing else is sent before the
	// Start: the session's watch, unless already open (OpenWatch, another
	// live response, the linger), opens after the reply, from its revision.
	c.tracks.track(s.id)
	reply, err := call(ctx, c, c.raw.Start, &pb.StartRequest{SessionId: s.id, Source: source.wire(), RequestId: requestID}, true)
	if err != nil {
		c.tracks.release(s.id)
		return nil, err
	}
	l := newLiveness(reply.GetResponseId())
	state := stateFromWire(reply.GetState())
	if reply.GetReplayed() && state.ResponseID != l.id {
		// A retry of a Start that applied earlier, whose response has since
		// been replaced or ended.
		switch state.Phase {
		case PhaseTerminated:
			l.stop(StopShutdown)
		case PhaseActive:
			l.stop(StopSuperseded)
		default:
			l.stop(StopGone)
		}
	}
	// The session's watch, when it has none yet, replays from the reply's
	// revision: a stop that lands before the watch opens is not missed; an
	// open watch is reused. register stops the response at once when the
	// client closed.
	order, idle := c.tracks.register(s.id, l, state.Revision, !reply.GetReplayed())
	if order != nil {
		c.pool.openWatch(order)
	}
	c.linger(idle)
	return &Response{
		session:    s,
		l:          l,
		superseded: reply.GetSupersededResponseId(),
		replayed:   reply.GetReplayed(),
		startState: state,
	}, nil
}

// Run is the whole pattern. It starts a response, then calls body on the
// calling goroutine with a context derived from ctx that is cancelled, with
// a *StoppedError as its cause, the moment the coordinator stops the
// response (superseded or cancelled by any gateway, shut down, expired,
// gone), and with the response's Fence for the output path. Then:
//
//   - if the response was stopped before body returned: no Finish is sent
//     (RunStopped, RunResult.Reason says why), whatever body returned;
//   - otherwise exactly one Finish is sent: COMPLETED when body returned nil
//     (RunCompleted), FAILED when it returned an error (RunFailed, BodyErr).
//
// Run returns when body returns, so body must return promptly once its
// context is done. The error is the Start's, or, when ctx ended while the
// response was current, ctx's (the response is then released: nothing is
// sent, it stays live at the coordinator until superseded, cancelled or
// expired). A panic in body releases the response and is re-raised.
func (s *Session) Run(ctx context.Context, source Source, body func(ctx context.Context, fence Fence) error, opts ...StartOption) (RunResult, error) {
	r, err := s.Start(ctx, source, opts...)
	if err != nil {
		return RunResult{}, err
	}
	bctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.l.tie(cancel)
	bodyErr := runBody(bctx, r, body)
	result := RunResult{ResponseID: r.ID()}
	if !r.IsCurrent() {
		result.Kind, result.Reason = RunStopped, r.StopReason()
		return result, nil
	}
	if ctx.Err() != nil {
		r.Release()
		return result, contextError(ctx, 0)
	}
	terminal := TerminalCompleted
	result.Kind = RunCompleted
	if bodyErr != nil {
		terminal, result.Kind, result.BodyErr = TerminalFailed, RunFailed, bodyErr
	}
	result.Finish, result.FinishErr = r.Finish(ctx, terminal)
	return result, nil
}

// runBody calls body, releasing the response if it panics.
func runBody(ctx context.Context, r *Response, body func(context.Context, Fence) error) (err error) {
	panicked := true
	defer func() {
		if panicked {
			r.Release()
		}
	}()
	err = body(ctx, r.Fence())
	panicked = false
	return err
}

// Cancel cancels the session's live response, whichever it is. The
// result's CancelledID is its id (0 if nothing was live), its State the
// session's state in the reply (PhaseTerminated if the session was shut
// down or expired). It is sent once, never retried: a blind retry could
// cancel a response started in between. Use CancelIf to cancel a response
// you know.
func (s *Session) Cancel(ctx context.Context, source Source) (CancelResult, error) {
	return s.cancel(ctx, source, 0)
}

// CancelIf cancels responseID only if it is still the session's live
// response. The result's CancelledID is responseID, or 0 if it was not
// live; its State is the session's state in the reply. Being conditional,
// it is retried under the client's policy.
func (s *Session) CancelIf(ctx context.Context, source Source, responseID uint64) (CancelResult, error) {
	if responseID == 0 {
		return CancelResult{}, invalidArgument("if_response_id", "must not be 0 (use Cancel to cancel whatever is live)")
	}
	return s.cancel(ctx, source, responseID)
}

func (s *Session) cancel(ctx context.Context, source Source, ifResponseID uint64) (CancelResult, error) {
	if !source.valid() {
		return CancelResult{}, invalidArgument("source", fmt.Sprintf("unknown source %d", source))
	}
	c := s.client
	reply, err := call(ctx, c, c.raw.Cancel, &pb.CancelRequest{SessionId: s.id, Source: source.wire(), IfResponseId: ifResponseID}, ifResponseID != 0)
	if err != nil {
		return CancelResult{}, err
	}
	return CancelResult{CancelledID: reply.GetCancelledResponseId(), State: stateFromWire(reply.GetState())}, nil
}

// Shutdown tears the session down: its live response is cancelled and no
// response starts on it afterwards (Start fails with ErrSessionTerminated).
// Idempotent, so retried. The result's CancelledID is the response it
// cancelled, 0 if none; its State the session's (PhaseTerminated). The
// coordinator records SourceClient as who asked; ShutdownFrom names another.
func (s *Session) Shutdown(ctx context.Context) (CancelResult, error) {
	return s.ShutdownFrom(ctx, SourceClient)
}

// ShutdownFrom is Shutdown with the source recorded (for observability
// only) on the live response's cancel_requested event, as a Cancel's is.
func (s *Session) ShutdownFrom(ctx context.Context, source Source) (CancelResult, error) {
	if !source.valid() {
		return CancelResult{}, invalidArgument("source", fmt.Sprintf("unknown source %d", source))
	}
	c := s.client
	reply, err := call(ctx, c, c.raw.Shutdown, &pb.ShutdownRequest{SessionId: s.id, Source: source.wire()}, true)
	if err != nil {
		return CancelResult{}, err
	}
	return CancelResult{CancelledID: reply.GetCancelledResponseId(), State: stateFromWire(reply.GetState())}, nil
}

// OpenWatch opens the session's watch now, ahead of its Starts, so that
// even the session's first Start needs no Watch call and a stop that lands
// right after a Start's reply travels on a stream that is already open. A
// gateway calls it when it begins serving a session (a call connects, a
// realtime session opens), before the greeting the user may talk over.
//
// It does not wait and sends nothing on the caller's goroutine: the watch
// reads the session's state (GetState) and then streams from its revision,
// in the background. The session need not exist yet: the watch then waits
// for its first event. It counts as activity: the watch stays open for the
// client's watch linger (WithWatchLinger) after the later of this call and
// the end of the session's last live response of this client; calling it
// again restarts the linger. With a linger of 0, or on a closed client, it
// does nothing.
func (s *Session) OpenWatch() {
	c := s.client
	if c.watchLinger == 0 || c.isClosed() {
		return
	}
	order, idle := c.tracks.openWatch(s.id)
	if order != nil {
		c.pool.openWatch(order)
	}
	c.linger(idle)
}

// State reads the session's state (GetState); ErrNotFound when it does not
// exist.
func (s *Session) State(ctx context.Context) (SessionState, error) {
	return s.client.State(ctx, s.id)
}

// Response is a started response. Finish it with Finish (at most once).
// Releasing it unfinished (Release) sends nothing: the coordinator keeps it
// live until it is superseded, cancelled or expires; its fence fails closed.
// Safe for concurrent use.
type Response struct {
	session    *Session
	l          *liveness
	superseded uint64
	replayed   bool
	startState SessionState
	finished   atomic.Bool
}

// ID is the response id: the fencing token.
func (r *Response) ID() uint64 { return r.l.id }

// Session is the session the response belongs to.
func (r *Response) Session() *Session { return r.session }

// Superseded is the response this Start superseded, 0 if the session was idle.
func (r *Response) Superseded() uint64 { return r.superseded }

// Replayed is true when the Start was answered as a replay of an earlier
// attempt with the same request id.
func (r *Response) Replayed() bool { return r.replayed }

// StartState is the session's state in the Start reply.
func (r *Response) StartState() SessionState { return r.startState }

// IsCurrent is the fence check: false once the coordinator stopped the
// response, or it was finished or released. One atomic load.
func (r *Response) IsCurrent() bool { return r.l.current.Load() }

// Fence is the response's fence, to hand to the output path.
func (r *Response) Fence() Fence { return Fence{l: r.l} }

// Done is closed when the response stops, for any reason.
func (r *Response) Done() <-chan struct{} { return r.l.done }

// Context is cancelled when the response stops; its cause
// (context.Cause) is a *StoppedError saying why.
func (r *Response) Context() context.Context { return r.l.ctx }

// StopReason is why the response stopped, "" while it is current.
func (r *Response) StopReason() StopReason { return r.l.stopReason() }

// OnStop arranges for fn to be called with the stop's reason when the
// response stops, for any reason, as context.AfterFunc does for a context:
//
//   - fn runs once at most. It runs on the goroutine that applies the stop,
//     right after it (the fence closed, Done closed, Context cancelled): the
//     session's watch, for a stop decided by the coordinator (superseded,
//     cancelled, shut down, expired, gone); the caller of Finish (before
//     the Finish is sent) or Release, for StopFinished and StopReleased;
//     Client.Close, for the StopReleased of its live responses. No lock of
//     the client is held then, so fn may call the client.
//   - If the response has already stopped, fn runs at once on a goroutine
//     of its own, never on the caller's: OnStop may be called with a lock
//     held that fn takes.
//   - Hooks of one response run in the order they were registered.
//
// fn must be quick and must not block: while it runs, the session's watch
// delivers nothing more (every other live response of this client on the
// session waits for it), and Finish or Release does not return. Waiting
// briefly for a lock is fine as long as no holder of that lock waits for
// the stop (Finish and Release of this response run fn on their own
// goroutine: calling them with a lock fn takes is a deadlock; unregister
// fn first).
//
// The returned stop unregisters fn: true if that kept fn from running,
// false if fn has run or is running (stop does not wait for it) or was
// already unregistered.
func (r *Response) OnStop(fn func(StopReason)) (stop func() bool) {
	return r.l.onStop(fn)
}

// Finish reports the response's own terminal (TerminalCompleted or
// TerminalFailed), unless the coordinator already stopped it: then nothing is
// sent (FinishNotSent, with the reason). The fence closes before the call,
// so no output follows a Finish. Retried under the client's policy (a retry
// of an applied Finish answers FinishStale). A second call fails with
// ErrAlreadyFinished.
func (r *Response) Finish(ctx context.Context, terminal Terminal) (FinishResult, error) {
	if terminal != TerminalCompleted && terminal != TerminalFailed {
		return FinishResult{}, invalidArgument("status", "must be completed or failed")
	}
	if !r.finished.CompareAndSwap(false, true) {
		return FinishResult{}, fmt.Errorf("response %d: %w", r.ID(), ErrAlreadyFinished)
	}
	f, stopped := r.l.halt(StopFinished)
	if !stopped {
		return FinishResult{Outcome: FinishNotSent, Reason: r.l.stopReason()}, nil
	}
	c := r.session.client
	c.linger(c.tracks.unregister(r.session.id, r.l))
	f.run()
	reply, err := call(ctx, c, c.raw.Finish, &pb.FinishRequest{SessionId: r.session.id, ResponseId: r.ID(), Status: pb.TerminalStatus(terminal)}, true)
	if err != nil {
		return FinishResult{}, err
	}
	outcome := FinishStale
	if reply.GetApplied() {
		outcome = FinishApplied
	}
	return FinishResult{Outcome: outcome, State: stateFromWire(reply.GetState())}, nil
}

// Cancel cancels this response if it is still the session's live one
// (CancelIf); true if the coordinator cancelled it.
func (r *Response) Cancel(ctx context.Context, source Source) (bool, error) {
	res, err := r.session.CancelIf(ctx, source, r.ID())
	return res.CancelledID == r.ID(), err
}

// Release lets go of the handle without Finish: nothing is sent, the fence
// fails closed (StopReleased) and, if this was the session's last live
// response of this client, the session's watch closes after the client's
// watch linger. Idempotent.
func (r *Response) Release() {
	if f, stopped := r.l.halt(StopReleased); stopped {
		c := r.session.client
		c.linger(c.tracks.unregister(r.session.id, r.l))
		f.run()
	}
}

// Fence is a response's fence for the output path (audio sink, conversation
// append, tool calls): check IsCurrent before emitting each piece of output
// and drop it when false. A value, cheap to copy and to check.
type Fence struct {
	l *liveness
}

// ID is the fenced response's id; 0 for the zero Fence.
func (f Fence) ID() uint64 {
	if f.l == nil {
		return 0
	}
	return f.l.id
}

// IsCurrent is false once the response stopped, was finished or released
// (and always for the zero Fence: fail closed).
func (f Fence) IsCurrent() bool { return f.l != nil && f.l.current.Load() }

// StopReason is why the response stopped, "" while it is current.
func (f Fence) StopReason() StopReason {
	if f.l == nil {
		return StopReleased
	}
	return f.l.stopReason()
}

// Done is closed when the response stops (nil, never closed, for the zero Fence).
func (f Fence) Done() <-chan struct{} {
	if f.l == nil {
		return nil
	}
	return f.l.done
}

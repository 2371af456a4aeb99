package respcoord

import (
	"context"
	"errors"
	"fmt"
	"time"

	client "github.com/respcoord/respcoord/clients/go"
	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

// Option configures NewShared.
type Option func(*shared)

// WithTimeout bounds every Apply of the coordinator (the wait for an earlier
// Apply included), instead of DefaultTimeout. The client's own retry policy
// runs inside it: a call that is still retrying when it ends fails with the
// deadline.
func WithTimeout(d time.Duration) Option {
	return func(s *shared) {
		if d > 0 {
			s.timeout = d
		}
	}
}

// NewShared returns a Coordinator for session sessionID whose decisions are
// the respcoord server's, reached through c, so that every process running
// the session (each with its own NewShared on the same session id) shares one
// machine M3: at most one live response across all of them. Effects for this
// process's responses are performed via sink, whichever process decided them.
//
// It never fails and never waits, so it replaces New(sink) in one line; a
// session id the client refuses (empty, longer than 256 bytes, a control
// character) makes every Apply return that error. It opens the session's
// watch ahead (client.Session.OpenWatch), in the background, so that the
// session's first Apply(Start) needs no Watch call and a stop that lands
// right after a Start is delivered on a stream that is already open. The
// watch stays open while this process runs a response there, and for the
// client's watch linger (client.WithWatchLinger, 30 s by default) after the
// later of NewShared and the end of its last response. The client is
// shared: one per gateway process, for all its sessions. Close the
// Coordinator when the session is done in this process.
func NewShared(c *client.Client, sessionID string, sink EffectSink, opts ...Option) *Coordinator {
	s := &shared{
		session: sessionID,
		timeout: DefaultTimeout,
		ids:     map[ResponseID]uint64{},
	}
	for _, opt := range opts {
		opt(s)
	}
	if c == nil {
		s.initErr = errors.New("respcoord: NewShared: nil client")
	} else if session, err := c.Session(sessionID); err != nil {
		s.initErr = err
	} else {
		s.remote = &clientSession{session: session}
		// This process serves the session from now on: its watch opens
		// now, not on the first Start's path.
		session.OpenWatch()
	}
	return &Coordinator{sink: sink, turn: make(chan struct{}, 1), shared: s}
}

// clientSession is remoteSession over the Go client.
type clientSession struct {
	session *client.Session
}

// wireSource maps LocalAI's sources (client 0, vad 1) to the client's (which
// are the wire's: client 1, vad 2); any other value is recorded as
// unspecified, as the server records a source it is not told.
func wireSource(s Source) client.Source {
	switch s {
	case SourceClient:
		return client.SourceClient
	case SourceVAD:
		return client.SourceVAD
	default:
		return client.SourceUnspecified
	}
}

func (cs *clientSession) start(ctx context.Context, src Source) (remoteResponse, error) {
	r, err := cs.session.Start(ctx, wireSource(src))
	if err != nil {
		return nil, err
	}
	return &clientResponse{r: r}, nil
}

func (cs *clientSession) cancel(ctx context.Context, src Source) (bool, error) {
	res, err := cs.session.Cancel(ctx, wireSource(src))
	if errors.Is(err, client.ErrNotFound) {
		// The session does not exist (never started, or forgotten after
		// its end): nothing is live, which is what Cancel wants.
		return false, nil
	}
	return res.State.Phase == client.PhaseTerminated, err
}

func (cs *clientSession) shutdown(ctx context.Context) error {
	_, err := cs.session.Shutdown(ctx)
	return err
}

// isSessionOver is the client's answer to a Start on a terminated session.
func isSessionOver(err error) bool {
	return errors.Is(err, client.ErrSessionTerminated)
}

// clientResponse is remoteResponse over the client's Response.
type clientResponse struct {
	r *client.Response
	// sent: a Finish went out through the handle once and failed; the
	// handle refuses a second, so a repeated Apply(Finished) goes over the
	// raw stub (Finish is fenced by its id, so repeating it is safe).
	sent bool
}

func (cr *clientResponse) id() uint64               { return cr.r.ID() }
func (cr *clientResponse) stopped() <-chan struct{} { return cr.r.Done() }
func (cr *clientResponse) release()                 { cr.r.Release() }

func (cr *clientResponse) reason() stopKind { return kindOf(cr.r.StopReason()) }

func (cr *clientResponse) onStop(fn func(stopKind)) func() bool {
	return cr.r.OnStop(func(reason client.StopReason) { fn(kindOf(reason)) })
}

// kindOf is what a stop's reason says about the session.
func kindOf(reason client.StopReason) stopKind {
	switch reason {
	case client.StopSuperseded:
		return stopOther
	case client.StopCancelled:
		return stopCancelled
	case client.StopShutdown, client.StopExpired:
		return stopSessionOver
	case client.StopFinished:
		return stopFinished
	default:
		// StopGone (a state read after a broken watch found it no longer
		// live: the session idle, another response live, or the session
		// missing after a coordinator restart), StopEnded (someone else
		// reported Finish for this id) or StopReleased (the client was
		// closed under the coordinator): the response is over, or can no
		// longer be fenced, and nothing more is known about the session.
		return stopLost
	}
}

// finish reports COMPLETED and says whether the server applied it.
func (cr *clientResponse) finish(ctx context.Context) (bool, error) {
	if cr.sent {
		s := cr.r.Session()
		reply, err := s.Client().Raw().Finish(ctx, &pb.FinishRequest{
			SessionId:  s.ID(),
			ResponseId: cr.r.ID(),
			Status:     pb.TerminalStatus_TERMINAL_STATUS_COMPLETED,
		})
		if err != nil {
			return false, fmt.Errorf("repeated Finish of response %d: %w", cr.r.ID(), err)
		}
		return reply.GetApplied(), nil
	}
	res, err := cr.r.Finish(ctx, client.TerminalCompleted)
	if err != nil {
		cr.sent = true
		return false, err
	}
	return res.Outcome == client.FinishApplied, nil
}

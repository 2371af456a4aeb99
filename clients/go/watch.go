package respcoord

// Session watches: one Watch stream per session where this client has a live
// response, has called OpenWatch, or lingers after the last one, opened when
// the fencing table asks (fencing.go) and closed when it says so, so a
// gateway's cost follows its own sessions, not the deployment's traffic.
// This is clients/rust/src/watch.rs in Go.
//
// One stream's life:
//   - Opened for a Start (the session had no watch) with after_revision just
//     below the Start reply's revision, so the first event is the response's
//     own started: proof that the stream follows the session the Start was
//     applied to. Anything else first (the session was recreated since, say
//     after a coordinator restart), or nothing within an attempt timeout,
//     sends it to a state read.
//   - Opened ahead (OpenWatch): the session's state is read first (GetState,
//     applied to the table as a resume's read is), then the stream opens
//     from the state's revision; from 0 (the session's first event) when
//     the session does not exist yet. No proof is expected.
//   - A Start on a session whose watch is open (another live response,
//     opened ahead, or lingering) reuses it: no Watch call.
//   - Every event goes through tracks.apply as it arrives, on the goroutine
//     that received it (no queue between the socket and the table); the
//     position is the highest revision seen.
//   - After terminated the stream ends and so does the watch.
//   - Broken (transport, server shutdown, fell behind) or OUT_OF_RANGE: the
//     session's state is read (GetState) before the stream is reopened from
//     the state's revision. A session not found, or at a revision below the
//     position (recreated), means the responses the read covered are gone;
//     so does any state that no longer has them active.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

// WatchStatus says how a client's session watches are doing.
type WatchStatus struct {
	// Open is the session watches running now: one per session with a live
	// response of this client, opened ahead (Session.OpenWatch), or
	// lingering after its last response (WithWatchLinger).
	Open int
	// Opened counts the Watch streams established so far, reopenings included.
	Opened int
	// Reconnects counts streams reopened after a break, OUT_OF_RANGE or a
	// failed proof.
	Reconnects int
	// Rereads counts the session states read (GetState) to resume a watch.
	// The read that begins a watch opened ahead is not one.
	Rereads int
	// Connections is the number of connections in the watch pool.
	Connections int
}

type slot struct {
	conn    *grpc.ClientConn
	stub    pb.ResponseCoordinatorClient
	streams int
}

// watchPool runs session watches on a pool of connections of its own.
type watchPool struct {
	client         *Client
	dial           func() (*grpc.ClientConn, error)
	streamsPerConn int

	mu     sync.Mutex
	slots  []*slot
	closed bool

	open, opened, reconnects, rereads atomic.Int64
	wg                                sync.WaitGroup
}

func newWatchPool(c *Client, dial func() (*grpc.ClientConn, error), streamsPerConn int) *watchPool {
	return &watchPool{client: c, dial: dial, streamsPerConn: max(streamsPerConn, 1)}
}

func (p *watchPool) status() WatchStatus {
	p.mu.Lock()
	connections := len(p.slots)
	p.mu.Unlock()
	return WatchStatus{
		Open:        int(p.open.Load()),
		Opened:      int(p.opened.Load()),
		Reconnects:  int(p.reconnects.Load()),
		Rereads:     int(p.rereads.Load()),
		Connections: connections,
	}
}

// acquire is the first pooled connection with room, or a new one. It counts
// the watch in the wait group under the same lock that close takes first,
// so close never waits on a group that can still grow.
func (p *watchPool) acquire() (*slot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	var s *slot
	for _, candidate := range p.slots {
		if candidate.streams < p.streamsPerConn {
			s = candidate
			break
		}
	}
	if s == nil {
		// grpc.NewClient does not dial: it only checks the target.
		conn, err := p.dial()
		if err != nil {
			return nil, err
		}
		s = &slot{conn: conn, stub: pb.NewResponseCoordinatorClient(conn)}
		p.slots = append(p.slots, s)
	}
	s.streams++
	p.wg.Add(1)
	return s, nil
}

func (p *watchPool) releaseSlot(s *slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s.streams--
}

// openWatch carries out a watchOrder: the watch runs on a goroutine of its
// own until the order's context ends or the session ends.
func (p *watchPool) openWatch(order *watchOrder) {
	s, err := p.acquire()
	if err != nil {
		// A closed client (its responses are released), or a target
		// grpc.NewClient refused, which Connect already accepted once.
		return
	}
	p.open.Add(1)
	w := &sessionWatch{
		pool:          p,
		stub:          s.stub,
		session:       order.session,
		ctx:           order.ctx,
		position:      order.afterRevision,
		expectStarted: order.expectStarted,
		readFirst:     order.readFirst,
	}
	go func() {
		defer p.wg.Done()
		defer p.releaseSlot(s)
		defer p.open.Add(-1)
		w.run()
	}()
}

// close closes every pooled connection (the watches are stopped by the
// table) and waits for the watches to end.
func (p *watchPool) close() {
	p.mu.Lock()
	p.closed = true
	slots := p.slots
	p.mu.Unlock()
	for _, s := range slots {
		_ = s.conn.Close()
	}
	p.wg.Wait()
}

// sessionWatch is one session's watch.
type sessionWatch struct {
	pool    *watchPool
	stub    pb.ResponseCoordinatorClient
	session string
	ctx     context.Context
	// position is the highest revision applied.
	position uint64
	// expectStarted is the response whose started must come first on the
	// first stream, 0 once proven or replaced by a state read.
	expectStarted uint64
	// readFirst: opened ahead, it reads the session's state before its
	// first stream.
	readFirst bool
	// lastErr is the last error a stream or a state read ended with.
	lastErr error
}

// how a stream ended
type ended int

const (
	endStopped ended = iota // the watch's context ended
	endOver                 // after terminated: the session emits nothing more
	endReread               // read the state before reopening
)

// errNoProof ends a stream whose first event is not the expected started.
var errNoProof = errors.New("respcoord: the watch did not begin with the Start's own event")

func (w *sessionWatch) run() {
	failures := 0
	policy := w.pool.client.retry
	if w.readFirst && !w.readUntilDone(&failures, false) {
		return
	}
	for {
		how, progressed := w.follow()
		if how != endReread || w.ctx.Err() != nil {
			return
		}
		if progressed {
			failures = 0
		}
		if !w.readUntilDone(&failures, true) {
			return
		}
		if !progressed {
			failures++
			if !sleep(w.ctx, policy.backoff(failures)) {
				return
			}
		}
		w.pool.reconnects.Add(1)
	}
}

// readUntilDone reads the session's state until a read succeeds (backing off
// between failures); false if the watch's context ended first. resume: the
// read resumes a stream (counted in Rereads), rather than beginning a watch
// opened ahead.
func (w *sessionWatch) readUntilDone(failures *int, resume bool) bool {
	for {
		if w.ctx.Err() != nil {
			return false
		}
		err := w.reread(resume)
		if err == nil {
			return true
		}
		w.lastErr = err
		*failures++
		if !sleep(w.ctx, w.pool.client.retry.backoff(*failures)) {
			return false
		}
	}
}

// sleep waits d or until ctx ends; false if ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// follow opens the session's watch from the position and applies it until
// it ends; progressed: it delivered something first.
func (w *sessionWatch) follow() (how ended, progressed bool) {
	if w.ctx.Err() != nil {
		return endStopped, false
	}
	sctx, cancel := context.WithCancelCause(w.ctx)
	defer cancel(nil)
	after := w.position
	stream, err := w.stub.Watch(sctx, &pb.WatchRequest{SessionId: w.session, AfterRevision: &after})
	if err != nil {
		w.lastErr = err
		return w.endedBy(endReread), false
	}
	// The response headers mark the stream established (the server has the
	// Watch); Header blocks until they come or the stream fails.
	if _, err := stream.Header(); err != nil {
		w.lastErr = err
		return w.endedBy(endReread), false
	}
	w.pool.opened.Add(1)
	var proof *time.Timer
	if w.expectStarted != 0 {
		// The proof must come at once: it is replayed history.
		proof = time.AfterFunc(w.pool.client.retry.AttemptTimeout, func() { cancel(errNoProof) })
		defer proof.Stop()
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			// io.EOF: the stream ended with OK without terminated (server
			// shutting down); anything else: broken. Either way, re-read.
			w.lastErr = err
			return w.endedBy(endReread), progressed
		}
		events := msg.GetEvents()
		if w.expectStarted != 0 {
			if len(events) == 0 {
				continue // a bookmark before the replay: keep waiting for the proof
			}
			expected := w.expectStarted
			w.expectStarted = 0
			proof.Stop()
			if !startsWith(events, expected, w.position+1) {
				w.lastErr = errNoProof
				return w.endedBy(endReread), progressed
			}
		}
		if len(events) == 0 {
			continue
		}
		progressed = true
		c := w.pool.client
		c.linger(c.tracks.apply(events))
		for _, e := range events {
			w.position = max(w.position, e.GetRevision())
			if e.GetTerminated() != nil {
				return endOver, true
			}
		}
	}
}

// endedBy is how; endStopped when the watch's own context ended it.
func (w *sessionWatch) endedBy(how ended) ended {
	if w.ctx.Err() != nil {
		return endStopped
	}
	return how
}

// startsWith: events begin with started(response) at revision.
func startsWith(events []*pb.LifecycleEvent, response, revision uint64) bool {
	if len(events) == 0 {
		return false
	}
	first := events[0]
	return first.GetRevision() == revision && first.GetStarted() != nil && first.GetStarted().GetResponseId() == response
}

// reread reads the session's state (GetState, retried under the client's
// policy), applies it to the fencing table, and moves the position to where
// the next stream starts. resume: it resumes a stream (counted in Rereads).
// When a Start registered while the read was out and the read cannot decide
// it (the table says retake), it reads again.
func (w *sessionWatch) reread(resume bool) error {
	// The state read stands in for the proof of the Start from here on.
	w.expectStarted = 0
	c := w.pool.client
	t := c.tracks
	for {
		if resume {
			w.pool.rereads.Add(1)
		}
		ticket := t.ticket()
		reply, err := withRetry(w.ctx, c.retry, true, func(ctx context.Context) (*pb.GetStateResponse, error) {
			return w.stub.GetState(ctx, &pb.GetStateRequest{SessionId: w.session})
		})
		if w.ctx.Err() != nil {
			// Closed meanwhile: the answer is for a watch that no longer is.
			return w.ctx.Err()
		}
		var idle []idleNotice
		var retake bool
		position := uint64(0)
		switch {
		case errors.Is(err, ErrNotFound):
			// Responses registered after the read (a session this client
			// created anew), or a watch opened ahead of the session's first
			// Start, stream from the session's first event.
			idle, retake = t.applyGone(w.session, ticket)
		case err != nil:
			return err
		default:
			state := stateFromWire(reply.GetState())
			if state.Revision < w.position {
				// Revisions start again at 1 when a session is recreated:
				// this is not the session we watched.
				gone, _ := t.applyGone(w.session, ticket)
				c.linger(gone)
			}
			idle, retake = t.applyState(w.session, state, ticket)
			position = state.Revision
		}
		c.linger(idle)
		if !retake {
			w.position = position
			return nil
		}
	}
}

package respcoord

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// DefaultTimeout bounds one Apply of a shared coordinator (the wait for an
// earlier Apply of the same coordinator included) when the caller gives no
// deadline of its own. A realtime session calls Apply on its read loop and its
// VAD tick, so an unreachable coordinator must cost a bounded, short stall and
// an error, never a hang; 2 s covers a retried call to a server that is
// failing over, and is still short of what a caller notices as a dead line.
const DefaultTimeout = 2 * time.Second

// ErrZeroID is returned for a Start whose ID is 0: a shared coordinator
// reports another process's response as Active{ID: 0}, so 0 cannot also name
// one of this process's responses. LocalAI's sessions count from 1.
var ErrZeroID = errors.New("respcoord: response id 0 is reserved for responses of other processes")

// ErrClosed is returned by Apply after Close.
var ErrClosed = errors.New("respcoord: coordinator closed")

// Coordinator serializes a session's Start, Finished, Cancel and Shutdown
// decisions and performs the resulting effects through the sink, one at a
// time and in order.
//
// Made by New, it is LocalAI's in-process coordinator: one lock, the machine
// in Next, nothing outside the process. Made by NewShared, the decisions are
// the respcoord server's, shared by every process that names the same
// session, and stops decided by other processes reach the sink from the
// session watch. Both kinds answer Apply the same way: nil when the event was
// decided (including the events the machine absorbs: a Start after Shutdown,
// a stale Finished, a Cancel with nothing live), an error only when it could
// not be decided.
type Coordinator struct {
	sink EffectSink

	// turn holds one token; an Apply takes it for its whole run, so Applies
	// of one coordinator never overlap, and the wait for it is bounded by
	// the Apply's deadline (a mutex could not be abandoned).
	turn chan struct{}

	// mu guards the fields below, and every sink.Perform runs with it held:
	// that is what keeps effects one at a time and in order when they come
	// both from Apply and from the stop hooks that deliver remote stops (on
	// the client's watch goroutines). Under mu nothing waits for a watch.
	mu    sync.Mutex
	state State // New: the machine's state

	shared *shared // NewShared; nil for New
}

// New returns an idle in-process Coordinator that performs effects via sink:
// LocalAI's coordinator, for a deployment that runs each session in one
// process (and for tests). It never fails and never blocks on anything but
// its own lock and the sink.
func New(sink EffectSink) *Coordinator {
	return &Coordinator{sink: sink, turn: make(chan struct{}, 1), state: Idle{}}
}

// Apply decides one event and performs its effects before returning.
//
// A shared coordinator bounds the call by DefaultTimeout (or the timeout
// given to NewShared); ApplyContext takes the caller's context instead. When
// the server cannot be reached within that time, Apply returns an error that
// wraps the cause (errors.Is(err, context.DeadlineExceeded) and the client's
// errors work on it) and, except for Shutdown, performs nothing: see the
// package documentation for what each event does then.
func (c *Coordinator) Apply(e Event) error {
	return c.ApplyContext(context.Background(), e)
}

// ApplyContext is Apply bounded by ctx as well as by the coordinator's
// timeout: whichever ends first.
func (c *Coordinator) ApplyContext(ctx context.Context, e Event) error {
	switch ev := e.(type) {
	case Start:
		if c.shared != nil && ev.ID == 0 {
			return fmt.Errorf("%v: %w", e, ErrZeroID)
		}
	case Finished, Cancel, Shutdown:
	default:
		// Checked before anything is sent: an event the machine does not
		// know is a programmer error, as in Next.
		c.mu.Lock()
		defer c.mu.Unlock()
		_, _, err := Next(c.currentLocked(), e)
		return err
	}
	if c.shared == nil {
		return c.applyLocal(e)
	}
	ctx, cancel := context.WithTimeout(ctx, c.shared.timeout)
	defer cancel()
	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("respcoord: %v waited for an earlier Apply: %w", e, context.Cause(ctx))
	}
	defer func() { <-c.turn }()
	return c.shared.apply(ctx, c, e)
}

func (c *Coordinator) applyLocal(e Event) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	next, effects, err := Next(c.state, e)
	if err != nil {
		return err
	}
	c.state = next
	for _, eff := range effects {
		c.sink.Perform(eff)
	}
	return nil
}

// State returns the coordinator's current state, without a call to the
// server. For a shared coordinator it is this process's view: Active with
// this process's id while this process runs the live response; Active{ID: 0}
// when the last thing this process learned is that another process's
// response is live; Idle; Terminated once this process has seen the session
// end. See the package documentation for how far that view can lag.
func (c *Coordinator) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.currentLocked()
}

func (c *Coordinator) currentLocked() State {
	if c.shared == nil {
		return c.state
	}
	return c.shared.stateLocked()
}

// perform hands effects to the sink. The caller holds c.mu.
func (c *Coordinator) perform(effects ...Effect) {
	for _, e := range effects {
		c.sink.Perform(e)
	}
}

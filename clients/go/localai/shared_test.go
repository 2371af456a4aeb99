package respcoord

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	client "github.com/respcoord/respcoord/clients/go"
)

// newShared makes a shared coordinator whose recording sink notes server ids.
func newShared(t testing.TB, c *client.Client, session string, opts ...Option) (*Coordinator, *recordingSink) {
	sink := &recordingSink{}
	coord := NewShared(c, session, sink, opts...)
	sink.coord = coord
	t.Cleanup(coord.Close)
	return coord, sink
}

// stepper applies one event and checks exactly which effects it performed
// before Apply returned.
type stepper struct {
	t    *testing.T
	c    *Coordinator
	sink *recordingSink
}

func (s stepper) step(e Event, want ...Effect) {
	s.t.Helper()
	before := len(s.sink.snapshot())
	if err := s.c.Apply(e); err != nil {
		s.t.Fatalf("Apply(%v): %v", e, err)
	}
	got := s.sink.snapshot()[before:]
	if fmt.Sprint(got) != fmt.Sprint(want) {
		s.t.Fatalf("Apply(%v) performed %v, want %v", e, got, want)
	}
}

func (s stepper) state(want State) {
	s.t.Helper()
	if got := s.c.State(); got != want {
		s.t.Fatalf("State() = %v, want %v", got, want)
	}
}

// TestSharedTable walks one process through every cell of Next's table
// against the server: the same effects, performed within Apply, and the same
// nil answers for the events the machine absorbs.
func TestSharedTable(t *testing.T) {
	cl := connect(t, testServer(t))
	session := sessionName(t)
	c, sink := newShared(t, cl, session)
	s := stepper{t, c, sink}
	cancelled := func(id ResponseID) []Effect {
		return []Effect{CancelResponse{ID: id}, EmitTerminal{ID: id, Status: StatusCancelled}}
	}

	if err := c.Apply(Start{ID: 0}); !errors.Is(err, ErrZeroID) {
		t.Fatalf("Apply(Start{ID: 0}) = %v, want ErrZeroID", err)
	}
	s.step(Finished{ID: 1})           // not yet minted
	s.step(Cancel{Source: SourceVAD}) // the session does not exist yet: nothing live
	s.state(Idle{})
	s.step(Start{ID: 1, Source: SourceClient}, StartResponse{ID: 1})
	s.state(Active{ID: 1})
	s.step(Finished{ID: 7}) // unknown
	s.step(Start{ID: 2, Source: SourceVAD}, append(cancelled(1), StartResponse{ID: 2})...)
	s.step(Finished{ID: 1}) // stale
	s.state(Active{ID: 2})
	s.step(Finished{ID: 2}, EmitTerminal{ID: 2, Status: StatusCompleted})
	s.state(Idle{})
	s.step(Finished{ID: 2}) // already finished
	s.step(Start{ID: 3, Source: SourceClient}, StartResponse{ID: 3})
	s.step(Cancel{Source: SourceClient}, cancelled(3)...)
	s.step(Cancel{Source: SourceClient}) // idle
	s.state(Idle{})
	s.step(Start{ID: 4, Source: SourceVAD}, StartResponse{ID: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if st, err := cl.State(ctx, session); err != nil || st.ActiveSource != client.SourceVAD || st.ResponseID != mustServerID(t, c, 4) {
		t.Fatalf("server state %+v (%v): want response %d live from the VAD", st, err, mustServerID(t, c, 4))
	}
	s.step(Shutdown{}, cancelled(4)...)
	s.state(Terminated{})
	s.step(Start{ID: 5, Source: SourceClient}) // refused: nothing starts after Terminated
	s.step(Finished{ID: 4})
	s.step(Cancel{Source: SourceVAD})
	s.step(Shutdown{})
	s.state(Terminated{})

	state, err := cl.State(ctx, session)
	if err != nil {
		t.Fatal(err)
	}
	if state.Phase != client.PhaseTerminated || state.ResponsesStarted != 4 {
		t.Fatalf("server state %+v, want terminated after 4 responses", state)
	}
	events, err := serverRecord(ctx, cl, session)
	if err != nil {
		t.Fatal(err)
	}
	unstarted, err := checkAgainstServer(events, []processLog{{sink.snapshot(), sink.serverIDs()}})
	if err != nil {
		t.Fatal(err)
	}
	if unstarted != 0 {
		t.Fatalf("%d responses started at the server and not in the sink", unstarted)
	}
	if n := sink.overlaps(); n > 0 {
		t.Fatalf("%d overlapping effects", n)
	}
	if a, b := mustServerID(t, c, 1), mustServerID(t, c, 2); b <= a {
		t.Fatalf("server ids %d then %d: not increasing", a, b)
	}
}

func mustServerID(t *testing.T, c *Coordinator, id ResponseID) uint64 {
	t.Helper()
	r, ok := c.ServerID(id)
	if !ok || r == 0 {
		t.Fatalf("ServerID(%d) = %d, %v", id, r, ok)
	}
	return r
}

// TestSharedRandomWalk is LocalAI's random walk (same seeds, 3000 Applies
// each) against the server, then a Shutdown so every started response must
// have its terminal; the sink's log is checked on its own and against the
// server's record of the session.
//
// With -short it walks two of the seeds.
func TestSharedRandomWalk(t *testing.T) {
	cl := connect(t, testServer(t))
	seeds := walkSeeds
	if testing.Short() {
		seeds = seeds[:2]
	}
	for _, seed := range seeds {
		session := sessionName(t) + fmt.Sprint("/", seed)
		c, sink := newShared(t, cl, session)
		if _, err := walk(c, rand.New(rand.NewPCG(seed, 0xA5A5A5A5)), 3000); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if err := c.Apply(Shutdown{}); err != nil {
			t.Fatalf("seed %d: Shutdown: %v", seed, err)
		}
		log := sink.snapshot()
		if starts, terms := countEffects(log); starts < 1000 || terms != starts {
			t.Fatalf("seed %d: %d starts and %d terminals in 3000 steps", seed, starts, terms)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		events, err := serverRecord(ctx, cl, session)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		unstarted, err := checkAgainstServer(events, []processLog{{log, sink.serverIDs()}})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if unstarted != 0 {
			t.Fatalf("seed %d: %d responses started at the server and not in the sink", seed, unstarted)
		}
		if n := sink.overlaps(); n > 0 {
			t.Fatalf("seed %d: %d overlapping effects", seed, n)
		}
		c.Close()
	}
}

// TestSharedDualWriter is LocalAI's dual-writer test against the server: the
// read loop and the VAD hammer one shared coordinator under -race.
func TestSharedDualWriter(t *testing.T) {
	cl := connect(t, testServer(t))
	session := sessionName(t)
	c, sink := newShared(t, cl, session)
	if errs := dualWriter(c, 2000); len(errs) > 0 {
		t.Fatalf("%d Apply errors, first: %v", len(errs), errs[0])
	}
	if err := c.Apply(Shutdown{}); err != nil {
		t.Fatal(err)
	}
	log := sink.snapshot()
	if starts, _ := countEffects(log); starts < 1000 {
		t.Fatalf("only %d starts", starts)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	events, err := serverRecord(ctx, cl, session)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkAgainstServer(events, []processLog{{log, sink.serverIDs()}}); err != nil {
		t.Fatal(err)
	}
	if n := sink.overlaps(); n > 0 {
		t.Fatalf("%d overlapping effects", n)
	}
}

// eventually waits for the sink to hold want after its first n effects: a
// stop decided in another process arrives over the watch, not within an
// Apply of this one.
func eventually(t *testing.T, sink *recordingSink, n int, want ...Effect) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		log := sink.snapshot()
		if len(log) >= n+len(want) {
			if got := log[n:]; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("effects after #%d: %v, want %v", n, got, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("effects after #%d: %v after 5s, want %v", n, log[n:], want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSharedRemoteStops: stops decided by another process (its Start, its
// Cancel, its Shutdown) reach this process's sink as CancelResponse then
// EmitTerminal(cancelled), and a Start after the other process's Shutdown
// starts nothing.
func TestSharedRemoteStops(t *testing.T) {
	target := testServer(t)
	session := sessionName(t)
	a, aSink := newShared(t, connect(t, target), session)
	b, bSink := newShared(t, connect(t, target), session)
	sa, sb := stepper{t, a, aSink}, stepper{t, b, bSink}
	stop := func(id ResponseID) []Effect {
		return []Effect{CancelResponse{ID: id}, EmitTerminal{ID: id, Status: StatusCancelled}}
	}

	sa.step(Start{ID: 1, Source: SourceClient}, StartResponse{ID: 1})
	sb.step(Start{ID: 1, Source: SourceVAD}, StartResponse{ID: 1}) // barge-in from B
	eventually(t, aSink, 1, stop(1)...)
	sa.state(Active{ID: 0}) // B's response is live
	sb.state(Active{ID: 1})
	sa.step(Finished{ID: 1}) // A's body ends after the stop: stale, ignored

	sb.step(Cancel{Source: SourceClient}, stop(1)...)
	sa.step(Start{ID: 2, Source: SourceClient}, StartResponse{ID: 2})
	sb.step(Cancel{Source: SourceVAD}) // cancels A's response; nothing of B's
	eventually(t, aSink, 4, stop(2)...)
	sa.state(Idle{})

	sa.step(Start{ID: 3, Source: SourceClient}, StartResponse{ID: 3})
	sb.step(Shutdown{})
	eventually(t, aSink, 7, stop(3)...)
	sa.state(Terminated{})
	sa.step(Start{ID: 4, Source: SourceClient})
	sb.step(Start{ID: 2, Source: SourceClient})
	sb.state(Terminated{})
}

// TestSharedExpiry: the server's idle expiry stops the live response like a
// Shutdown decided elsewhere.
func TestSharedExpiry(t *testing.T) {
	srv := ownServer(t, "--session-idle-ttl", "1s")
	c, sink := newShared(t, connect(t, srv.addr), sessionName(t))
	s := stepper{t, c, sink}
	s.step(Start{ID: 1, Source: SourceClient}, StartResponse{ID: 1})
	deadline := time.Now().Add(10 * time.Second)
	for len(sink.snapshot()) < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	eventually(t, sink, 1, CancelResponse{ID: 1}, EmitTerminal{ID: 1, Status: StatusCancelled})
	s.state(Terminated{})
	s.step(Start{ID: 2, Source: SourceClient})
}

// slack is what a bounded Apply may take beyond its timeout on a loaded
// machine: scheduling, not waiting. The client's own deadline (10 s) is what
// an unbounded Apply would take.
const slack = 500 * time.Millisecond

// deadTarget is a loopback address nothing listens on.
func deadTarget(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestSharedUnreachable: with no server, every Apply that needs one returns
// an error within its timeout and performs nothing; two Applies queued on one
// coordinator are each bounded too; a Finished for an id that is not live
// needs no server and answers nil.
func TestSharedUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl, err := client.Connect(ctx, deadTarget(t), client.WithLazyConnect())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const timeout = 300 * time.Millisecond
	c, sink := newShared(t, cl, sessionName(t), WithTimeout(timeout))

	for _, e := range []Event{Start{ID: 1, Source: SourceClient}, Cancel{Source: SourceVAD}} {
		began := time.Now()
		err := c.Apply(e)
		took := time.Since(began)
		if err == nil {
			t.Fatalf("Apply(%v) with no server succeeded", e)
		}
		if took > timeout+slack {
			t.Fatalf("Apply(%v) took %v, bound %v", e, took, timeout)
		}
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, client.ErrDeadlineExceeded) {
			t.Fatalf("Apply(%v) = %v: neither a deadline nor unavailable", e, err)
		}
	}
	if err := c.Apply(Finished{ID: 1}); err != nil {
		t.Fatalf("Apply(Finished) of an id that is not live: %v", err)
	}

	var wg sync.WaitGroup
	took := make([]time.Duration, 2)
	for i := range took {
		wg.Add(1)
		go func() {
			defer wg.Done()
			began := time.Now()
			if err := c.Apply(Start{ID: ResponseID(10 + i), Source: SourceVAD}); err == nil {
				t.Errorf("queued Apply %d succeeded with no server", i)
			}
			took[i] = time.Since(began)
		}()
	}
	wg.Wait()
	for i, d := range took {
		if d > timeout+slack {
			t.Fatalf("queued Apply %d took %v, bound %v", i, d, timeout)
		}
	}
	if log := sink.snapshot(); len(log) != 0 {
		t.Fatalf("effects performed with no server: %v", log)
	}
	if c.State() != (Idle{}) {
		t.Fatalf("State() = %v, want Idle", c.State())
	}
}

// TestSharedServerLost: the server dies while this process runs a response.
// A Start and the response's Finished then fail within their bound and
// change nothing; a Shutdown fails too but still stops the response here and
// leaves the coordinator Terminated, so the session's teardown never waits on
// the server.
func TestSharedServerLost(t *testing.T) {
	srv := ownServer(t)
	const timeout = 300 * time.Millisecond
	c, sink := newShared(t, connect(t, srv.addr), sessionName(t), WithTimeout(timeout))
	s := stepper{t, c, sink}
	s.step(Start{ID: 1, Source: SourceClient}, StartResponse{ID: 1})
	srv.kill()

	began := time.Now()
	if err := c.Apply(Start{ID: 2, Source: SourceVAD}); err == nil {
		t.Fatal("Start with the server gone succeeded")
	}
	if took := time.Since(began); took > timeout+slack {
		t.Fatalf("Start took %v, bound %v", took, timeout)
	}
	s.state(Active{ID: 1})
	// The body ends on its own; the Finish cannot be told, twice (the second
	// goes over the raw stub, the client's handle having sent one).
	for i := 0; i < 2; i++ {
		began = time.Now()
		if err := c.Apply(Finished{ID: 1}); err == nil {
			t.Fatal("Finished with the server gone succeeded")
		}
		if took := time.Since(began); took > timeout+slack {
			t.Fatalf("Finished took %v, bound %v", took, timeout)
		}
	}
	s.state(Active{ID: 1})
	if got := sink.snapshot(); len(got) != 1 {
		t.Fatalf("effects after the failed Start and Finisheds: %v", got)
	}
	began = time.Now()
	err := c.Apply(Shutdown{})
	if err == nil {
		t.Fatal("Shutdown with the server gone succeeded")
	}
	if took := time.Since(began); took > timeout+slack {
		t.Fatalf("Shutdown took %v, bound %v", took, timeout)
	}
	eventually(t, sink, 1, CancelResponse{ID: 1}, EmitTerminal{ID: 1, Status: StatusCancelled})
	s.state(Terminated{})
}

// TestSharedClose: Close lets go of the session in this process only. The
// server is not told (the response stays live there, for the other process to
// supersede), the sink gets nothing more, and Apply answers ErrClosed.
func TestSharedClose(t *testing.T) {
	target := testServer(t)
	session := sessionName(t)
	a, aSink := newShared(t, connect(t, target), session)
	b, bSink := newShared(t, connect(t, target), session)
	stepper{t, a, aSink}.step(Start{ID: 1, Source: SourceClient}, StartResponse{ID: 1})
	a.Close()
	if err := a.Apply(Start{ID: 2, Source: SourceClient}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Apply after Close = %v, want ErrClosed", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl := connect(t, target)
	st, err := cl.State(ctx, session)
	if err != nil || st.Phase != client.PhaseActive || st.ResponseID != mustServerID(t, a, 1) {
		t.Fatalf("server state after Close %+v (%v): want A's response still live", st, err)
	}
	stepper{t, b, bSink}.step(Start{ID: 1, Source: SourceVAD}, StartResponse{ID: 1})
	time.Sleep(100 * time.Millisecond) // room for a stop to arrive, if A still watched
	if got := aSink.snapshot(); len(got) != 1 {
		t.Fatalf("A's sink after Close: %v, want only its start", got)
	}
	a.Close() // twice is fine
}

// TestSharedCoordinatorRestart: the in-memory server restarts (on the same
// port) while this process runs a response. The client's watch breaks,
// reconnects, and its state read finds the session gone: the response is
// stopped (CancelResponse, EmitTerminal(cancelled)) from the watch. That is
// not the session's end: the coordinator is Idle, and the next Start runs in
// the session the restarted server creates.
func TestSharedCoordinatorRestart(t *testing.T) {
	srv := ownServer(t)
	c, sink := newShared(t, connect(t, srv.addr), sessionName(t))
	s := stepper{t, c, sink}
	s.step(Start{ID: 1, Source: SourceClient}, StartResponse{ID: 1})
	srv.kill()
	again, err := serve(serverBinary(), srv.addr)
	if err != nil {
		t.Fatalf("restarting on %s: %v", srv.addr, err)
	}
	t.Cleanup(again.kill)
	deadline := time.Now().Add(15 * time.Second)
	for len(sink.snapshot()) < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	eventually(t, sink, 1, CancelResponse{ID: 1}, EmitTerminal{ID: 1, Status: StatusCancelled})
	s.state(Idle{})
	s.step(Start{ID: 2, Source: SourceClient}, StartResponse{ID: 2})
	if a, b := mustServerID(t, c, 1), mustServerID(t, c, 2); b <= a {
		t.Fatalf("server ids %d then %d across the restart: not increasing", a, b)
	}
}

// TestSharedClientClosed: the client closed under a coordinator can no longer
// learn about stops, so this process's live response fails closed: it is
// cancelled and terminated here, before the client's Close returns.
func TestSharedClientClosed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := client.Connect(ctx, testServer(t))
	if err != nil {
		t.Fatal(err)
	}
	c, sink := newShared(t, cl, sessionName(t))
	stepper{t, c, sink}.step(Start{ID: 1, Source: SourceClient}, StartResponse{ID: 1})
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	// Within Close: the stop hook runs on the goroutine that releases it.
	if got, want := sink.snapshot(), []Effect{StartResponse{ID: 1}, CancelResponse{ID: 1}, EmitTerminal{ID: 1, Status: StatusCancelled}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after the client's Close: %v, want %v", got, want)
	}
	if err := c.Apply(Start{ID: 2, Source: SourceClient}); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Start through a closed client = %v, want the client's ErrClosed", err)
	}
}

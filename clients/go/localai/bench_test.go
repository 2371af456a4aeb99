package respcoord

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	client "github.com/respcoord/respcoord/clients/go"
	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

// BenchmarkApplyStartFinished is one Apply(Start) and one Apply(Finished) of
// a shared coordinator against the server: two round trips, as a LocalAI
// response that runs to its end costs.
func BenchmarkApplyStartFinished(b *testing.B) {
	cl := connect(b, testServer(b))
	c, _ := newShared(b, cl, sessionName(b))
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		if err := c.Apply(Start{ID: ResponseID(i), Source: SourceClient}); err != nil {
			b.Fatal(err)
		}
		if err := c.Apply(Finished{ID: ResponseID(i)}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClientStartFinish is the same two calls through the client alone,
// to show what the adapter adds.
func BenchmarkClientStartFinish(b *testing.B) {
	cl := connect(b, testServer(b))
	s, err := cl.Session(sessionName(b))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, err := s.Start(ctx, client.SourceClient)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := r.Finish(ctx, client.TerminalCompleted); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRawGetState is one unary call on the client's connection, the
// floor under every Apply.
func BenchmarkRawGetState(b *testing.B) {
	cl := connect(b, testServer(b))
	ctx := context.Background()
	session := sessionName(b)
	s, _ := cl.Session(session)
	if _, err := s.Shutdown(ctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := cl.Raw().GetState(ctx, &pb.GetStateRequest{SessionId: session}); err != nil {
			b.Fatal(err)
		}
	}
}

// instantSession answers at once, in memory: BenchmarkAdapterOnly measures
// what the drop-in itself costs an Apply (the turn, the deadline, the effect
// lock, the stop hook), without a server or a network in it.
type instantSession struct {
	mu   sync.Mutex
	next uint64
	last *instantResponse
}

type instantResponse struct {
	n     uint64
	done  chan struct{}
	mu    sync.Mutex
	why   stopKind
	hooks []*instantHook
}

type instantHook struct {
	fn      func(stopKind)
	claimed atomic.Bool
}

func (h *instantHook) run(why stopKind) {
	if h.claimed.CompareAndSwap(false, true) {
		h.fn(why)
	}
}

func (s *instantSession) start(context.Context, Source) (remoteResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.last = &instantResponse{n: s.next, done: make(chan struct{})}
	return s.last, nil
}

// latest is the response the last start returned, nil before the first.
func (s *instantSession) latest() *instantResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}
func (s *instantSession) cancel(context.Context, Source) (bool, error) { return false, nil }
func (s *instantSession) shutdown(context.Context) error               { return nil }

func (r *instantResponse) id() uint64               { return r.n }
func (r *instantResponse) stopped() <-chan struct{} { return r.done }
func (r *instantResponse) reason() stopKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.why
}
func (r *instantResponse) stop(why stopKind) {
	r.mu.Lock()
	select {
	case <-r.done:
		r.mu.Unlock()
		return
	default:
	}
	r.why = why
	close(r.done)
	hooks := r.hooks
	r.hooks = nil
	r.mu.Unlock()
	for _, h := range hooks {
		h.run(why)
	}
}
func (r *instantResponse) onStop(fn func(stopKind)) func() bool {
	h := &instantHook{fn: fn}
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.done:
		go h.run(r.why)
	default:
		r.hooks = append(r.hooks, h)
	}
	return func() bool { return h.claimed.CompareAndSwap(false, true) }
}
func (r *instantResponse) finish(context.Context) (bool, error) {
	r.stop(stopFinished)
	return true, nil
}
func (r *instantResponse) release() { r.stop(stopLost) }

// countingSink counts; it does not yield as recordingSink does.
type countingSink struct{ starts, terminals int }

func (s *countingSink) Perform(e Effect) {
	switch e.(type) {
	case StartResponse:
		s.starts++
	case EmitTerminal:
		s.terminals++
	}
}

func BenchmarkAdapterOnly(b *testing.B) {
	sink := &countingSink{}
	c := New(sink)
	c.shared = &shared{
		session: "bench",
		remote:  &instantSession{},
		timeout: DefaultTimeout,
		ids:     map[ResponseID]uint64{},
	}
	defer c.Close()
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		if err := c.Apply(Start{ID: ResponseID(i), Source: SourceClient}); err != nil {
			b.Fatal(err)
		}
		if err := c.Apply(Finished{ID: ResponseID(i)}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	c.mu.Lock()
	defer c.mu.Unlock()
	if sink.starts != b.N || sink.terminals != b.N {
		b.Fatalf("%d starts and %d terminals for %d rounds", sink.starts, sink.terminals, b.N)
	}
}

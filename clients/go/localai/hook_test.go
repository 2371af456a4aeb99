package respcoord

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	client "github.com/respcoord/respcoord/clients/go"
)

// instantShared is a shared coordinator over an in-memory session: the test
// stops its responses itself, as the client's watch would.
func instantShared(t *testing.T) (*Coordinator, *recordingSink, *instantSession) {
	sink := &recordingSink{}
	remote := &instantSession{}
	c := New(sink)
	c.shared = &shared{session: "instant", remote: remote, timeout: DefaultTimeout, ids: map[ResponseID]uint64{}}
	t.Cleanup(c.Close)
	return c, sink, remote
}

// A stop decided elsewhere is performed by the goroutine that applies it,
// before that goroutine goes on: no goroutine between the stop and the sink.
func TestSharedStopIsPerformedByTheStoppingGoroutine(t *testing.T) {
	c, sink, remote := instantShared(t)
	s := stepper{t, c, sink}
	s.step(Start{ID: 1, Source: SourceClient}, StartResponse{ID: 1})
	remote.latest().stop(stopOther)
	if got, want := sink.snapshot(), []Effect{StartResponse{ID: 1}, CancelResponse{ID: 1}, EmitTerminal{ID: 1, Status: StatusCancelled}}; len(got) != 3 || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("after the stop returned: %v, want %v", got, want)
	}
	s.state(Active{ID: 0})
	s.step(Start{ID: 2, Source: SourceVAD}, StartResponse{ID: 2})
	remote.latest().stop(stopSessionOver)
	s.state(Terminated{})
	if n := len(sink.snapshot()); n != 6 {
		t.Fatalf("%d effects, want 6", n)
	}
	// The own Finish runs the hook too (on Apply's goroutine): it performs
	// nothing, Apply(Finished) performs the terminal.
	c2, sink2, _ := instantShared(t)
	s2 := stepper{t, c2, sink2}
	s2.step(Start{ID: 1, Source: SourceClient}, StartResponse{ID: 1})
	s2.step(Finished{ID: 1}, EmitTerminal{ID: 1, Status: StatusCompleted})
	s2.state(Idle{})
}

// Stops applied on other goroutines while Apply runs (Start, Finished, Cancel
// releasing handles under the coordinator's lock, the hook waiting for that
// lock): no deadlock, effects one at a time, the invariants hold, and every
// response gets exactly one terminal.
func TestSharedStopsRacingApplies(t *testing.T) {
	c, sink, remote := instantShared(t)
	done := make(chan struct{})
	var stoppers sync.WaitGroup
	for range 2 {
		stoppers.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if r := remote.latest(); r != nil {
					r.stop(stopOther)
				}
				runtime.Gosched()
			}
		})
	}
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for i := 1; i <= 3000; i++ {
			id := ResponseID(i)
			var e Event = Start{ID: id, Source: SourceClient}
			switch i % 4 {
			case 1:
				e = Finished{ID: id - 1}
			case 2:
				e = Cancel{Source: SourceVAD}
			}
			if err := c.Apply(e); err != nil {
				t.Error(err)
				return
			}
		}
		if err := c.Apply(Shutdown{}); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		// Not t.Fatal: the cleanup's Close would wait for the deadlocked lock.
		panic("Applies racing stops deadlocked")
	}
	close(done)
	stoppers.Wait()
	log := sink.snapshot()
	if err := checkInvariants(log, true); err != nil {
		t.Fatal(err)
	}
	if starts, terminals := countEffects(log); starts < 1000 || starts != terminals {
		t.Fatalf("%d starts, %d terminals", starts, terminals)
	}
	if n := sink.overlaps(); n > 0 {
		t.Fatalf("%d overlapping effects", n)
	}
}

// stackSink records, for each CancelResponse, the stack it was performed on.
type stackSink struct {
	recordingSink
	stacks chan string
}

func (s *stackSink) Perform(e Effect) {
	if _, ok := e.(CancelResponse); ok {
		buf := make([]byte, 64<<10)
		s.stacks <- string(buf[:runtime.Stack(buf, false)])
	}
	s.recordingSink.Perform(e)
}

// Against the server: another process's Start reaches this process's sink
// on the client's session watch goroutine itself (the stop hook), not on a
// goroutine of the coordinator's.
func TestSharedRemoteStopIsPerformedOnTheWatch(t *testing.T) {
	target := testServer(t)
	session := sessionName(t)
	sink := &stackSink{stacks: make(chan string, 4)}
	a := NewShared(connect(t, target), session, sink)
	t.Cleanup(a.Close)
	b, bSink := newShared(t, connect(t, target), session)
	if err := a.Apply(Start{ID: 1, Source: SourceClient}); err != nil {
		t.Fatal(err)
	}
	stepper{t, b, bSink}.step(Start{ID: 1, Source: SourceVAD}, StartResponse{ID: 1})
	var stack string
	select {
	case stack = <-sink.stacks:
	case <-time.After(10 * time.Second):
		t.Fatal("the stop never reached A")
	}
	for _, frame := range []string{"(*sessionWatch).follow", "(*shared).onStop"} {
		if !strings.Contains(stack, frame) {
			t.Fatalf("CancelResponse performed without %s on the stack:\n%s", frame, stack)
		}
	}
	eventually(t, &sink.recordingSink, 0, StartResponse{ID: 1}, CancelResponse{ID: 1}, EmitTerminal{ID: 1, Status: StatusCancelled})
	if got := a.State(); got != (Active{ID: 0}) {
		t.Fatalf("A's state %v", got)
	}
}

// A Cancel whose reply says the session is terminated (shut down by another
// process while this one had nothing live, so no watch told it) makes the
// coordinator Terminated at once; the next Start is absorbed without a call.
func TestSharedCancelLearnsTheSessionIsTerminated(t *testing.T) {
	target := testServer(t)
	session := sessionName(t)
	cl := connect(t, target)
	a, aSink := newShared(t, cl, session)
	b, bSink := newShared(t, connect(t, target), session)
	sa, sb := stepper{t, a, aSink}, stepper{t, b, bSink}
	sa.step(Start{ID: 1, Source: SourceClient}, StartResponse{ID: 1})
	sa.step(Finished{ID: 1}, EmitTerminal{ID: 1, Status: StatusCompleted})
	sb.step(Shutdown{})
	time.Sleep(50 * time.Millisecond) // nothing reaches A: it watches nothing
	sa.state(Idle{})
	sa.step(Cancel{Source: SourceVAD})
	sa.state(Terminated{})
	sa.step(Start{ID: 2, Source: SourceClient})
	sa.state(Terminated{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := cl.State(ctx, session)
	if err != nil || st.Phase != client.PhaseTerminated || st.ResponsesStarted != 1 {
		t.Fatalf("server state %+v (%v): want terminated after 1 response", st, err)
	}
}

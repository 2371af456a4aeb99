package respcoord

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// walkSeeds are LocalAI's seeds for its random walk, so a failure reproduces.
var walkSeeds = []uint64{1, 2, 3, 42, 1337, 0xC0FFEE}

// walk applies steps random events to c, as LocalAI's random-walk test does:
// Starts from either source with fresh ids, Finished for any plausible id
// (stale, current, or not yet minted), and Cancels. Every Apply must succeed:
// each of these events is decidable, and the machine absorbs the ones that
// change nothing. It returns the last id minted.
func walk(c *Coordinator, r *rand.Rand, steps int) (ResponseID, error) {
	var next uint64
	for i := 0; i < steps; i++ {
		var e Event
		switch r.IntN(4) {
		case 0:
			next++
			e = Start{ID: ResponseID(next), Source: SourceClient}
		case 1:
			next++
			e = Start{ID: ResponseID(next), Source: SourceVAD}
		case 2:
			e = Finished{ID: ResponseID(r.Uint64N(next + 3))}
		case 3:
			e = Cancel{Source: SourceClient}
		}
		if err := c.Apply(e); err != nil {
			return ResponseID(next), fmt.Errorf("step %d %v: %w", i, e, err)
		}
	}
	return ResponseID(next), nil
}

// dualWriter hammers c from two goroutines, the read loop and the VAD, as
// LocalAI's dual-writer test does: each Starts, Finishes whatever State says
// is live, and Cancels, in turn. Apply errors are collected, not ignored.
func dualWriter(c *Coordinator, perGoroutine int) []error {
	var (
		idMu   sync.Mutex
		nextID ResponseID
		errMu  sync.Mutex
		errs   []error
		wg     sync.WaitGroup
	)
	mint := func() ResponseID {
		idMu.Lock()
		defer idMu.Unlock()
		nextID++
		return nextID
	}
	drive := func(src Source) {
		defer wg.Done()
		for i := 0; i < perGoroutine; i++ {
			var err error
			switch i % 3 {
			case 0:
				err = c.Apply(Start{ID: mint(), Source: src})
			case 1:
				if a, ok := c.State().(Active); ok {
					err = c.Apply(Finished{ID: a.ID})
				}
			case 2:
				err = c.Apply(Cancel{Source: src})
			}
			if err != nil {
				errMu.Lock()
				errs = append(errs, err)
				errMu.Unlock()
			}
		}
	}
	wg.Add(2)
	go drive(SourceClient)
	go drive(SourceVAD)
	wg.Wait()
	return errs
}

// TestLocalRandomWalk is LocalAI's random-walk test against New: the
// in-process coordinator of this package must hold the invariants too.
func TestLocalRandomWalk(t *testing.T) {
	for _, seed := range walkSeeds {
		sink := &recordingSink{}
		c := New(sink)
		if _, err := walk(c, rand.New(rand.NewPCG(seed, 0xA5A5A5A5)), 3000); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		log := sink.snapshot()
		if err := checkInvariants(log, false); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if starts, terms := countEffects(log); starts < 1000 || terms < starts-1 {
			t.Fatalf("seed %d: only %d starts and %d terminals in 3000 steps", seed, starts, terms)
		}
	}
}

func TestLocalDualWriter(t *testing.T) {
	sink := &recordingSink{}
	c := New(sink)
	if errs := dualWriter(c, 2000); len(errs) > 0 {
		t.Fatalf("%d Apply errors, first: %v", len(errs), errs[0])
	}
	if err := checkInvariants(sink.snapshot(), false); err != nil {
		t.Fatal(err)
	}
	if n := sink.overlaps(); n > 0 {
		t.Fatalf("%d effects performed while another was being performed", n)
	}
}

func TestLocalShutdownRefusesLaterStarts(t *testing.T) {
	sink := &recordingSink{}
	c := New(sink)
	for _, e := range []Event{Start{ID: 1}, Shutdown{}, Start{ID: 2}, Finished{ID: 1}, Cancel{}} {
		if err := c.Apply(e); err != nil {
			t.Fatalf("Apply(%v): %v", e, err)
		}
	}
	want := []Effect{StartResponse{ID: 1}, CancelResponse{ID: 1}, EmitTerminal{ID: 1, Status: StatusCancelled}}
	if got := sink.snapshot(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("effects %v, want %v", got, want)
	}
	if c.State() != (Terminated{}) {
		t.Fatalf("state %v, want Terminated", c.State())
	}
	if err := c.Apply(unknownEvent{}); err == nil {
		t.Fatal("Apply(unknownEvent) succeeded")
	}
}

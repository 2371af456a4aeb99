package respcoord

import (
	"fmt"
	"runtime"
	"sync"
)

// recordingSink keeps the ordered effects a coordinator performed. It also
// checks, as each effect arrives, that no two Performs overlap: the
// coordinator promises effects one at a time, and a sink that saw two at once
// would record them in an order nobody decided.
//
// With coord set (a shared coordinator), it also notes the server's id of
// each response as it starts, calling ServerID from Perform as a sink may.
type recordingSink struct {
	mu      sync.Mutex
	log     []Effect
	inside  bool
	overlap int
	coord   *Coordinator
	server  map[ResponseID]uint64
}

func (s *recordingSink) Perform(e Effect) {
	var server uint64
	if st, ok := e.(StartResponse); ok && s.coord != nil {
		server, _ = s.coord.ServerID(st.ID)
	}
	s.mu.Lock()
	if s.inside {
		s.overlap++
	}
	s.inside = true
	s.log = append(s.log, e)
	if server != 0 {
		if s.server == nil {
			s.server = map[ResponseID]uint64{}
		}
		s.server[e.(StartResponse).ID] = server
	}
	s.mu.Unlock()
	runtime.Gosched() // widen the window in which an overlapping Perform would be seen

	s.mu.Lock()
	s.inside = false
	s.mu.Unlock()
}

func (s *recordingSink) snapshot() []Effect {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Effect(nil), s.log...)
}

func (s *recordingSink) serverIDs() map[ResponseID]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[ResponseID]uint64, len(s.server))
	for k, v := range s.server {
		out[k] = v
	}
	return out
}

func (s *recordingSink) overlaps() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.overlap
}

// checkInvariants replays an effect log and returns the first violation of
// LocalAI's three safety properties, in the order the log gives:
//
//  1. at most one live response after every effect (started and not yet
//     terminated);
//  2. exactly one terminal per started response: each id started at most
//     once and terminated at most once, and (when complete is set) every
//     started id terminated by the end of the log;
//  3. no resurrection: an id is never started after its terminal, and never
//     terminated or cancelled without having been started.
//
// Cancel must come before the terminal of the same id, as LocalAI's sink
// relies on (it cancels the body's context, then reports response.done).
func checkInvariants(log []Effect, complete bool) error {
	started := map[ResponseID]bool{}
	terminated := map[ResponseID]bool{}
	live := map[ResponseID]bool{}
	for i, eff := range log {
		switch e := eff.(type) {
		case StartResponse:
			if terminated[e.ID] {
				return fmt.Errorf("effect #%d %v: started after its terminal", i, e)
			}
			if started[e.ID] {
				return fmt.Errorf("effect #%d %v: started twice", i, e)
			}
			started[e.ID] = true
			live[e.ID] = true
		case CancelResponse:
			if !live[e.ID] {
				return fmt.Errorf("effect #%d %v: cancels a response that is not live", i, e)
			}
		case EmitTerminal:
			if !started[e.ID] {
				return fmt.Errorf("effect #%d %v: terminal of a response never started", i, e)
			}
			if terminated[e.ID] {
				return fmt.Errorf("effect #%d %v: second terminal", i, e)
			}
			terminated[e.ID] = true
			delete(live, e.ID)
		default:
			return fmt.Errorf("effect #%d: unknown effect %v", i, eff)
		}
		if len(live) > 1 {
			return fmt.Errorf("effect #%d %v: %d live responses", i, eff, len(live))
		}
	}
	if complete {
		for id := range live {
			return fmt.Errorf("response %d started and never terminated", id)
		}
	}
	return nil
}

// countEffects counts the StartResponse and EmitTerminal effects of a log, so
// a test can show its walk did real work rather than pass on an empty log.
func countEffects(log []Effect) (starts, terminals int) {
	for _, e := range log {
		switch e.(type) {
		case StartResponse:
			starts++
		case EmitTerminal:
			terminals++
		}
	}
	return starts, terminals
}

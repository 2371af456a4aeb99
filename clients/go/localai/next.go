package respcoord

import "fmt"

// Next is machine M3 for one process: the total, pure transition function a
// coordinator made by New runs, the same table LocalAI's package has. A
// coordinator made by NewShared does not run it; the server does, for every
// process on the session, and the Coordinator translates its answers into the
// same effects.
//
// For every (state, event) pair Next returns the next state and the effects
// in the order they must be performed. The only error is an Event or State
// this package does not define (a programmer error to surface, not swallow).
// Supersede (Active + Start) cancels and terminates the old response before
// the new one starts, in one transition, so the old body's later Finished is
// stale and each id gets exactly one terminal.
func Next(s State, e Event) (State, []Effect, error) {
	switch st := s.(type) {
	case Idle:
		switch ev := e.(type) {
		case Start:
			return Active{ID: ev.ID}, []Effect{StartResponse{ID: ev.ID}}, nil
		case Finished, Cancel:
			return Idle{}, nil, nil
		case Shutdown:
			return Terminated{}, nil, nil
		}
	case Active:
		stop := []Effect{CancelResponse{ID: st.ID}, EmitTerminal{ID: st.ID, Status: StatusCancelled}}
		switch ev := e.(type) {
		case Start:
			return Active{ID: ev.ID}, append(stop, StartResponse{ID: ev.ID}), nil
		case Finished:
			if ev.ID != st.ID {
				return st, nil, nil
			}
			return Idle{}, []Effect{EmitTerminal{ID: st.ID, Status: StatusCompleted}}, nil
		case Cancel:
			return Idle{}, stop, nil
		case Shutdown:
			return Terminated{}, stop, nil
		}
	case Terminated:
		switch e.(type) {
		case Start, Finished, Cancel, Shutdown:
			return Terminated{}, nil, nil
		}
	}
	return s, nil, fmt.Errorf("respcoord: unhandled transition %v <- %v", s, e)
}

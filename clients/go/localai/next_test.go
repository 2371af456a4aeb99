package respcoord

import (
	"reflect"
	"testing"
)

// unknownEvent is an Event this package does not define, to reach Next's
// error path the way a future variant added without updating Next would.
type unknownEvent struct{}

func (unknownEvent) isEvent()       {}
func (unknownEvent) String() string { return "unknownEvent" }

// TestNextTable pins every (state, event) cell of the in-process machine. The
// shared coordinator is checked against the same cells in shared_test.go, so
// a cell that changes here has to change there.
func TestNextTable(t *testing.T) {
	cancelled := func(id ResponseID) []Effect {
		return []Effect{CancelResponse{ID: id}, EmitTerminal{ID: id, Status: StatusCancelled}}
	}
	cases := []struct {
		name  string
		state State
		event Event
		want  State
		effs  []Effect
	}{
		{"idle+start", Idle{}, Start{ID: 1, Source: SourceClient}, Active{ID: 1}, []Effect{StartResponse{ID: 1}}},
		{"idle+cancel", Idle{}, Cancel{Source: SourceVAD}, Idle{}, nil},
		{"idle+finished", Idle{}, Finished{ID: 7}, Idle{}, nil},
		{"idle+shutdown", Idle{}, Shutdown{}, Terminated{}, nil},
		{"active+start supersedes", Active{ID: 1}, Start{ID: 2, Source: SourceVAD}, Active{ID: 2},
			append(cancelled(1), StartResponse{ID: 2})},
		{"active+finished current", Active{ID: 3}, Finished{ID: 3}, Idle{},
			[]Effect{EmitTerminal{ID: 3, Status: StatusCompleted}}},
		{"active+finished stale", Active{ID: 3}, Finished{ID: 2}, Active{ID: 3}, nil},
		{"active+cancel", Active{ID: 5}, Cancel{Source: SourceClient}, Idle{}, cancelled(5)},
		{"active+shutdown", Active{ID: 6}, Shutdown{}, Terminated{}, cancelled(6)},
		{"terminated+start refused", Terminated{}, Start{ID: 9}, Terminated{}, nil},
		{"terminated+finished", Terminated{}, Finished{ID: 9}, Terminated{}, nil},
		{"terminated+cancel", Terminated{}, Cancel{}, Terminated{}, nil},
		{"terminated+shutdown", Terminated{}, Shutdown{}, Terminated{}, nil},
	}
	for _, c := range cases {
		got, effs, err := Next(c.state, c.event)
		if err != nil {
			t.Fatalf("%s: Next(%v, %v): %v", c.name, c.state, c.event, err)
		}
		if got != c.want || !reflect.DeepEqual(effs, c.effs) {
			t.Errorf("%s: Next(%v, %v) = %v %v, want %v %v", c.name, c.state, c.event, got, effs, c.want, c.effs)
		}
	}
}

func TestNextRefusesUnknownEvent(t *testing.T) {
	for _, s := range []State{Idle{}, Active{ID: 1}, Terminated{}} {
		got, effs, err := Next(s, unknownEvent{})
		if err == nil {
			t.Fatalf("Next(%v, unknownEvent) = %v %v, want an error", s, got, effs)
		}
		if got != s || effs != nil {
			t.Errorf("Next(%v, unknownEvent) changed something: %v %v", s, got, effs)
		}
	}
}

func TestStringers(t *testing.T) {
	cases := []struct{ got, want string }{
		{SourceClient.String(), "client"},
		{SourceVAD.String(), "vad"},
		{Source(99).String(), "Source(99)"},
		{StatusCompleted.String(), "completed"},
		{StatusCancelled.String(), "cancelled"},
		{Status(99).String(), "Status(99)"},
		{Idle{}.String(), "Idle"},
		{Active{ID: 7}.String(), "Active(7)"},
		{Terminated{}.String(), "Terminated"},
		{Start{ID: 1, Source: SourceVAD}.String(), "Start(1,vad)"},
		{Finished{ID: 2}.String(), "Finished(2)"},
		{Cancel{Source: SourceClient}.String(), "Cancel(client)"},
		{Shutdown{}.String(), "Shutdown"},
		{CancelResponse{ID: 3}.String(), "CancelResponse(3)"},
		{StartResponse{ID: 4}.String(), "StartResponse(4)"},
		{EmitTerminal{ID: 5, Status: StatusCompleted}.String(), "EmitTerminal(5,completed)"},
	}

	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("String() = %q, want %q", c.got, c.want)
		}
	}
}

package respcoord

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	client "github.com/respcoord/respcoord/clients/go"
	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

// connect returns a client of its own (its own connections, as a separate
// process would have), closed when the test ends.
func connect(t testing.TB, target string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Connect(ctx, target)
	if err != nil {
		t.Fatalf("connect %s: %v", target, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// sessionName is a session id no other test uses, in this run or an earlier
// one against the same server.
func sessionName(t testing.TB) string {
	return fmt.Sprintf("localai/%s/%d", t.Name(), time.Now().UnixNano())
}

// serverRecord reads a session's whole event history back from the server,
// revision 1 to the current one: the coordinator's own record of what it
// decided, to check the sinks against.
func serverRecord(ctx context.Context, c *client.Client, session string) ([]*pb.LifecycleEvent, error) {
	state, err := c.State(ctx, session)
	if err != nil {
		return nil, fmt.Errorf("reading the state of %q: %w", session, err)
	}
	if state.Revision == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	from := uint64(0)
	stream, err := c.Raw().Watch(ctx, &pb.WatchRequest{SessionId: session, AfterRevision: &from})
	if err != nil {
		return nil, fmt.Errorf("watching %q: %w", session, err)
	}
	var events []*pb.LifecycleEvent
	for uint64(len(events)) < state.Revision {
		msg, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading the events of %q after %d: %w", session, len(events), err)
		}
		events = append(events, msg.GetEvents()...)
	}
	if uint64(len(events)) < state.Revision {
		return nil, fmt.Errorf("%q: %d events read back, the state says %d", session, len(events), state.Revision)
	}
	return events[:state.Revision], nil
}

// processLog is one process's sink log and the server ids of its responses.
type processLog struct {
	effects []Effect
	server  map[ResponseID]uint64
}

// checkAgainstServer checks the union of several processes' sink logs
// against the server's record of the session:
//
//   - every StartResponse names a response the server started, and no
//     response is started by two sinks (or twice by one);
//   - every EmitTerminal names a response the server ended, with the status
//     it ended with (completed for COMPLETED, cancelled for CANCELLED), and
//     every response a sink started has its terminal in that sink;
//   - laid out in the server's order (each effect at the revision of the
//     event it stands for), the union holds LocalAI's invariants: at most one
//     live response, one terminal each, none started after its terminal.
//
// It returns how many responses the server started that no sink started:
// Starts a coordinator absorbed because the session was shut down or expired
// before their reply was handled (none when nothing ends the session early).
func checkAgainstServer(events []*pb.LifecycleEvent, logs []processLog) (unstarted int, err error) {
	type owner struct {
		proc  int
		local ResponseID
	}
	owners := map[uint64]owner{}
	terminal := map[owner]Status{}
	for p, l := range logs {
		for i, e := range l.effects {
			switch e := e.(type) {
			case StartResponse:
				r, ok := l.server[e.ID]
				if !ok {
					return 0, fmt.Errorf("process %d effect #%d %v: no server id noted", p, i, e)
				}
				if prev, dup := owners[r]; dup {
					return 0, fmt.Errorf("server response %d started by process %d (id %d) and process %d (id %d)", r, prev.proc, prev.local, p, e.ID)
				}
				owners[r] = owner{p, e.ID}
			case EmitTerminal:
				terminal[owner{p, e.ID}] = e.Status
			}
		}
		if err := checkInvariants(l.effects, true); err != nil {
			return 0, fmt.Errorf("process %d: %w", p, err)
		}
	}
	tag := func(o owner) ResponseID { return ResponseID(uint64(o.proc)<<48 | uint64(o.local)) }
	var union []Effect
	started := map[uint64]bool{}
	for _, ev := range events {
		switch k := ev.GetKind().(type) {
		case *pb.LifecycleEvent_Started:
			r := k.Started.GetResponseId()
			started[r] = true
			if o, ok := owners[r]; ok {
				union = append(union, StartResponse{ID: tag(o)})
			} else {
				unstarted++
			}
		case *pb.LifecycleEvent_CancelRequested:
			if o, ok := owners[k.CancelRequested.GetResponseId()]; ok {
				union = append(union, CancelResponse{ID: tag(o)})
			}
		case *pb.LifecycleEvent_Ended:
			r := k.Ended.GetResponseId()
			o, ok := owners[r]
			if !ok {
				continue
			}
			want := StatusCancelled
			if k.Ended.GetStatus() == pb.TerminalStatus_TERMINAL_STATUS_COMPLETED {
				want = StatusCompleted
			}
			got, ok := terminal[o]
			if !ok {
				return 0, fmt.Errorf("server ended response %d (%v) but process %d's sink has no terminal for its id %d", r, k.Ended.GetStatus(), o.proc, o.local)
			}
			if got != want {
				return 0, fmt.Errorf("response %d (process %d id %d): sink terminal %v, server %v", r, o.proc, o.local, got, k.Ended.GetStatus())
			}
			delete(terminal, o)
			union = append(union, EmitTerminal{ID: tag(o), Status: want})
		}
	}
	for r, o := range owners {
		if !started[r] {
			return 0, fmt.Errorf("process %d started id %d as server response %d, which the server never started", o.proc, o.local, r)
		}
	}
	for o, st := range terminal {
		return 0, fmt.Errorf("process %d emitted a %v terminal for id %d, which the server did not end", o.proc, st, o.local)
	}
	if err := checkInvariants(union, true); err != nil {
		return 0, fmt.Errorf("the union in the server's order: %w", err)
	}
	return unstarted, nil
}

package respcoord_test

// The client's own behaviour against the real respcoord binary (memory
// backend) on loopback: Run's outcomes, Finish at most once, Close, local
// refusals, the watch pool.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	respcoord "github.com/respcoord/respcoord/clients/go"
	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

// served is a client on a fresh respcoord binary.
func served(t *testing.T, opts ...respcoord.Option) *respcoord.Client {
	t.Helper()
	server := startBinary(t, freePort(t))
	return connect(t, server.target(), opts...)
}

func TestConnectFailsFastWhenNothingListens(t *testing.T) {
	began := time.Now()
	_, err := respcoord.Connect(context.Background(), fmt.Sprintf("127.0.0.1:%d", freePort(t)), respcoord.WithConnectTimeout(300*time.Millisecond))
	if !errors.Is(err, respcoord.ErrUnavailable) || time.Since(began) > 5*time.Second {
		t.Fatalf("%v after %s; want ErrUnavailable, fast", err, time.Since(began))
	}
}

func TestRunReportsEachOutcome(t *testing.T) {
	c := served(t)
	s := session(t, c, "run-outcomes")
	boom := errors.New("the model failed")
	failed, err := s.Run(bg(), respcoord.SourceClient, func(context.Context, respcoord.Fence) error { return boom })
	if err != nil || failed.Kind != respcoord.RunFailed || !errors.Is(failed.BodyErr, boom) || failed.Finish.Outcome != respcoord.FinishApplied {
		t.Fatalf("failed body: %+v, %v", failed, err)
	}
	if st := state(t, s); st.Phase != respcoord.PhaseIdle || st.Revision != 2 {
		t.Fatalf("after a failed body: %+v", st)
	}
	// A body that ignores its stop and returns nil afterwards is still Stopped: no Finish.
	stoppedRun, err := s.Run(bg(), respcoord.SourceClient, func(ctx context.Context, fence respcoord.Fence) error {
		if _, err := s.CancelIf(bg(), respcoord.SourceClient, fence.ID()); err != nil {
			return err
		}
		<-ctx.Done()
		var stop *respcoord.StoppedError
		if !errors.As(context.Cause(ctx), &stop) || stop.Reason != respcoord.StopCancelled || fence.IsCurrent() {
			return fmt.Errorf("cause %v, fence current %v", context.Cause(ctx), fence.IsCurrent())
		}
		return nil
	})
	if err != nil || stoppedRun.Kind != respcoord.RunStopped || stoppedRun.Reason != respcoord.StopCancelled {
		t.Fatalf("stopped body: %+v, %v", stoppedRun, err)
	}
}

func TestRunEndedByTheCallersContextReleasesTheResponse(t *testing.T) {
	c := served(t)
	s := session(t, c, "run-caller")
	ctx, cancel := context.WithCancel(bg())
	var fence respcoord.Fence
	_, err := s.Run(ctx, respcoord.SourceClient, func(bctx context.Context, f respcoord.Fence) error {
		fence = f
		cancel()
		<-bctx.Done()
		return bctx.Err()
	})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, respcoord.ErrCancelled) {
		t.Fatalf("%v; want the caller's cancellation", err)
	}
	if fence.IsCurrent() || fence.StopReason() != respcoord.StopReleased {
		t.Fatalf("fence: current %v, reason %q", fence.IsCurrent(), fence.StopReason())
	}
	// Released sends nothing: the coordinator still has it live.
	if st := state(t, s); st.Phase != respcoord.PhaseActive || st.ResponseID != fence.ID() {
		t.Fatalf("%+v", st)
	}
}

func TestAPanickingBodyReleasesItsResponse(t *testing.T) {
	// Linger 0: the session's watch closes with the released response.
	c := served(t, respcoord.WithWatchLinger(0))
	s := session(t, c, "run-panic")
	var fence respcoord.Fence
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not reach the caller")
			}
		}()
		_, _ = s.Run(bg(), respcoord.SourceClient, func(_ context.Context, f respcoord.Fence) error {
			fence = f
			panic("a bug in the body")
		})
	}()
	if fence.IsCurrent() || fence.StopReason() != respcoord.StopReleased {
		t.Fatalf("fence: current %v, reason %q", fence.IsCurrent(), fence.StopReason())
	}
	until(t, "the session's watch closes", func() bool { return c.WatchStatus().Open == 0 })
}

func TestFinishIsSentAtMostOnce(t *testing.T) {
	c := served(t)
	r := start(t, session(t, c, "finish-once"), respcoord.SourceClient)
	first, err := r.Finish(bg(), respcoord.TerminalCompleted)
	if err != nil || first.Outcome != respcoord.FinishApplied || first.State.Phase != respcoord.PhaseIdle {
		t.Fatalf("%+v, %v", first, err)
	}
	if r.IsCurrent() || r.StopReason() != respcoord.StopFinished {
		t.Fatalf("after Finish: current %v, reason %q", r.IsCurrent(), r.StopReason())
	}
	if _, err := r.Finish(bg(), respcoord.TerminalCompleted); !errors.Is(err, respcoord.ErrAlreadyFinished) {
		t.Fatalf("second Finish: %v", err)
	}
	r2 := start(t, session(t, c, "finish-once"), respcoord.SourceClient)
	if _, err := r2.Finish(bg(), respcoord.Terminal(2)); !errors.Is(err, respcoord.ErrInvalidArgument) {
		t.Fatalf("Finish(CANCELLED): %v", err)
	}
	ok, err := r2.Cancel(bg(), respcoord.SourceClient)
	if err != nil || !ok {
		t.Fatalf("Cancel: %v, %v", ok, err)
	}
	ok, err = r2.Cancel(bg(), respcoord.SourceClient)
	if err != nil || ok {
		t.Fatalf("a second Cancel: %v, %v; want false", ok, err)
	}
	if reason := stopped(t, "the cancel reaches the handle", r2); reason != respcoord.StopCancelled {
		t.Fatalf("%q", reason)
	}
	if cause := context.Cause(r2.Context()); !errors.Is(cause, respcoord.ErrStopped) {
		t.Fatalf("context cause %v", cause)
	}
}

func TestMalformedRequestsAreRefusedBeforeAnythingIsSent(t *testing.T) {
	c := served(t)
	var e *respcoord.Error
	if _, err := c.Session("tab\there"); !errors.As(err, &e) || e.Field != "session_id" || e.Attempts != 0 {
		t.Fatalf("Session: %v", err)
	}
	s := session(t, c, "refused")
	if _, err := s.Start(bg(), respcoord.SourceClient, respcoord.WithRequestID("")); !errors.As(err, &e) || e.Field != "request_id" {
		t.Fatalf("empty request id: %v", err)
	}
	if _, err := s.Start(bg(), respcoord.Source(9)); !errors.As(err, &e) || e.Field != "source" {
		t.Fatalf("unknown source: %v", err)
	}
	if _, err := s.CancelIf(bg(), respcoord.SourceClient, 0); !errors.As(err, &e) || e.Field != "if_response_id" {
		t.Fatalf("CancelIf 0: %v", err)
	}
	ctx, cancel := context.WithCancel(bg())
	cancel()
	if _, err := s.Start(ctx, respcoord.SourceClient); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start with a cancelled context: %v", err)
	}
	// Nothing reached the coordinator: the session does not exist.
	if _, err := s.State(bg()); !errors.Is(err, respcoord.ErrNotFound) || !errors.As(err, &e) || e.Code != codes.NotFound {
		t.Fatalf("State: %v", err)
	}
	// The coordinator's own INVALID_ARGUMENT names its field too.
	if _, err := s.Start(bg(), respcoord.SourceClient, respcoord.WithRequestID(string(make([]byte, 129)))); !errors.As(err, &e) || e.Field != "request_id" {
		t.Fatalf("long request id: %v", err)
	}
}

func TestCloseFailsEveryFenceClosedAndLaterCalls(t *testing.T) {
	c := served(t)
	r := start(t, session(t, c, "close"), respcoord.SourceClient)
	fence := r.Fence()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if fence.IsCurrent() || fence.StopReason() != respcoord.StopReleased || r.IsCurrent() {
		t.Fatalf("after Close: current %v, reason %q", fence.IsCurrent(), fence.StopReason())
	}
	if _, err := session(t, c, "close").Start(bg(), respcoord.SourceClient); !errors.Is(err, respcoord.ErrClosed) {
		t.Fatalf("Start after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	if c.WatchStatus().Open != 0 {
		t.Fatalf("%+v", c.WatchStatus())
	}
	var zero respcoord.Fence
	if zero.IsCurrent() || zero.ID() != 0 {
		t.Fatal("the zero Fence must fail closed")
	}
}

func TestTheWatchPoolAddsAConnectionWhenEveryOneIsFull(t *testing.T) {
	c := served(t, respcoord.WithStreamsPerConnection(2), respcoord.WithWatchLinger(200*time.Millisecond))
	var responses []*respcoord.Response
	for i := range 5 {
		responses = append(responses, start(t, session(t, c, fmt.Sprintf("pool-%d", i)), respcoord.SourceClient))
	}
	until(t, "every watch is established", func() bool { return c.WatchStatus().Opened == 5 })
	if st := c.WatchStatus(); st.Open != 5 || st.Connections != 3 {
		t.Fatalf("%+v; want 5 watches on 3 connections", st)
	}
	for _, r := range responses {
		r.Release()
	}
	until(t, "each watch closes the linger after its last release", func() bool { return c.WatchStatus().Open == 0 })
}

func TestShutdownRecordsItsSourceOnTheCancel(t *testing.T) {
	c := served(t)
	s := session(t, c, "shutdown-source")
	r := start(t, s, respcoord.SourceClient)
	if _, err := s.ShutdownFrom(bg(), respcoord.Source(7)); !errors.Is(err, respcoord.ErrInvalidArgument) {
		t.Fatalf("unknown source: %v", err)
	}
	shut, err := s.ShutdownFrom(bg(), respcoord.SourceVAD)
	if err != nil || shut.CancelledID != r.ID() || shut.State.Phase != respcoord.PhaseTerminated {
		t.Fatalf("ShutdownFrom: %+v, %v; want %d, terminated", shut, err, r.ID())
	}
	if reason := stopped(t, "the shutdown reaches the handle", r); reason != respcoord.StopShutdown {
		t.Fatalf("%q", reason)
	}
	// The session's history, from its first event: started, cancel_requested (VAD), ended, terminated.
	ctx, cancel := context.WithTimeout(bg(), patience)
	defer cancel()
	from := uint64(0)
	stream, err := c.Raw().Watch(ctx, &pb.WatchRequest{SessionId: s.ID(), AfterRevision: &from})
	if err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatalf("the history ended without cancel_requested: %v", err)
		}
		for _, e := range msg.GetEvents() {
			if cr := e.GetCancelRequested(); cr != nil {
				if cr.GetSource() != pb.Source_SOURCE_VAD || cr.GetReason() != pb.CancelReason_CANCEL_REASON_SHUTDOWN {
					t.Fatalf("cancel_requested: %v", cr)
				}
				return
			}
		}
	}
}

func TestOnStopRunsOnceForEachKindOfStop(t *testing.T) {
	server := startBinary(t, freePort(t))
	a, b := connect(t, server.target()), connect(t, server.target())
	sa, sb := session(t, a, "on-stop"), session(t, b, "on-stop")
	type seen struct {
		reason  respcoord.StopReason
		current bool
		done    bool
	}
	hook := func(r *respcoord.Response) <-chan seen {
		ch := make(chan seen, 2)
		r.OnStop(func(reason respcoord.StopReason) {
			done := false
			select {
			case <-r.Done():
				done = true
			default:
			}
			ch <- seen{reason, r.IsCurrent(), done}
		})
		return ch
	}
	want := func(what string, ch <-chan seen, reason respcoord.StopReason) {
		t.Helper()
		got := within(t, what, ch, patience)
		if got != (seen{reason, false, true}) {
			t.Fatalf("%s: %+v; want %q with the fence closed and Done closed", what, got, reason)
		}
		select {
		case again := <-ch:
			t.Fatalf("%s: the hook ran again: %+v", what, again)
		case <-time.After(20 * time.Millisecond):
		}
	}

	// Stops decided elsewhere reach the hook from a's session watch.
	first := start(t, sa, respcoord.SourceClient)
	superseded := hook(first)
	second := start(t, sb, respcoord.SourceVAD)
	want("superseded by another client's Start", superseded, respcoord.StopSuperseded)
	third := start(t, sa, respcoord.SourceClient)
	cancelled := hook(third)
	if res, err := sb.Cancel(bg(), respcoord.SourceClient); err != nil || res.CancelledID != third.ID() {
		t.Fatalf("Cancel: %+v, %v", res, err)
	}
	want("cancelled by another client", cancelled, respcoord.StopCancelled)
	if second.IsCurrent() {
		t.Fatal("second is still current")
	}

	// Registered after the stop: at once, on a goroutine of its own.
	want("registered after the stop", hook(first), respcoord.StopSuperseded)

	// Finish runs it synchronously, before it returns; a stop hook kept
	// from running by its stop function never runs.
	fourth := start(t, sa, respcoord.SourceClient)
	finished := hook(fourth)
	unhooked := false
	stop := fourth.OnStop(func(respcoord.StopReason) { unhooked = true })
	if !stop() {
		t.Fatal("stop of a registered hook did not keep it from running")
	}
	if res, err := fourth.Finish(bg(), respcoord.TerminalCompleted); err != nil || res.Outcome != respcoord.FinishApplied {
		t.Fatalf("Finish: %+v, %v", res, err)
	}
	select {
	case got := <-finished:
		if got != (seen{respcoord.StopFinished, false, true}) {
			t.Fatalf("Finish: %+v", got)
		}
	default:
		t.Fatal("Finish returned before its stop hook ran")
	}
	if unhooked {
		t.Fatal("an unregistered hook ran")
	}

	// Shutdown from elsewhere; Release of an already stopped response
	// does not run it again.
	fifth := start(t, sa, respcoord.SourceClient)
	shut := hook(fifth)
	if res, err := sb.Shutdown(bg()); err != nil || res.CancelledID != fifth.ID() || res.State.Phase != respcoord.PhaseTerminated {
		t.Fatalf("Shutdown: %+v, %v", res, err)
	}
	want("shut down by another client", shut, respcoord.StopShutdown)
	fifth.Release()

	// A hook may call the client: here, Release of the response whose stop
	// it reports and a Start on another session.
	c := served(t)
	s := session(t, c, "on-stop-reentrant")
	r := start(t, s, respcoord.SourceClient)
	restarted := make(chan *respcoord.Response, 1)
	r.OnStop(func(respcoord.StopReason) {
		r.Release()
		next, err := session(t, c, "on-stop-reentrant-2").Start(bg(), respcoord.SourceClient)
		if err != nil {
			t.Error(err)
		}
		restarted <- next
	})
	if res, err := s.Cancel(bg(), respcoord.SourceClient); err != nil || res.CancelledID != r.ID() {
		t.Fatalf("Cancel: %+v, %v", res, err)
	}
	if next := within(t, "the hook's Start", restarted, patience); next == nil || !next.IsCurrent() {
		t.Fatal("the hook could not start a response")
	}
}

func TestCancelAndShutdownReportTheSessionState(t *testing.T) {
	c := served(t)
	s := session(t, c, "cancel-state")
	r := start(t, s, respcoord.SourceClient)
	nothing, err := s.CancelIf(bg(), respcoord.SourceClient, r.ID()+1)
	if err != nil || nothing.CancelledID != 0 || nothing.State.Phase != respcoord.PhaseActive || nothing.State.ResponseID != r.ID() {
		t.Fatalf("CancelIf of another id: %+v, %v; want 0 with %d active", nothing, err, r.ID())
	}
	cancelled, err := s.CancelIf(bg(), respcoord.SourceClient, r.ID())
	if err != nil || cancelled.CancelledID != r.ID() || cancelled.State.Phase != respcoord.PhaseIdle || cancelled.State.SessionID != s.ID() {
		t.Fatalf("CancelIf: %+v, %v; want %d, idle", cancelled, err, r.ID())
	}
	idle, err := s.Cancel(bg(), respcoord.SourceClient)
	if err != nil || idle.CancelledID != 0 || idle.State.Phase != respcoord.PhaseIdle || idle.State.Revision != cancelled.State.Revision {
		t.Fatalf("Cancel with nothing live: %+v, %v", idle, err)
	}
	shut, err := s.Shutdown(bg())
	if err != nil || shut.CancelledID != 0 || shut.State.Phase != respcoord.PhaseTerminated {
		t.Fatalf("Shutdown: %+v, %v", shut, err)
	}
	// A terminated session answers a Cancel, a CancelIf and another
	// Shutdown with nothing cancelled and its phase: no error says it.
	for name, call := range map[string]func() (respcoord.CancelResult, error){
		"Cancel":   func() (respcoord.CancelResult, error) { return s.Cancel(bg(), respcoord.SourceVAD) },
		"CancelIf": func() (respcoord.CancelResult, error) { return s.CancelIf(bg(), respcoord.SourceVAD, r.ID()) },
		"Shutdown": func() (respcoord.CancelResult, error) { return s.Shutdown(bg()) },
	} {
		res, err := call()
		if err != nil || res.CancelledID != 0 || res.State.Phase != respcoord.PhaseTerminated {
			t.Fatalf("%s on a terminated session: %+v, %v", name, res, err)
		}
	}
}

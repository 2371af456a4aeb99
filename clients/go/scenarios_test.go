package respcoord_test

// The shared client scenarios (clients/scenarios/scenarios.json), each
// implemented under its id with its params read from the file, against the
// real servers on loopback. RESPCOORD_TEST_BACKEND=nats runs the fixture on
// the NATS backend (the scenarios on the real binary then skip: it runs on
// its default memory backend).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	respcoord "github.com/respcoord/respcoord/clients/go"
	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

type scenario struct {
	ID     string         `json:"id"`
	Server string         `json:"server"`
	Title  string         `json:"title"`
	Params map[string]any `json:"params"`
	Steps  []string       `json:"steps"`
	Expect []string       `json:"expect"`
}

func loadScenarios(t testing.TB) []scenario {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "clients", "scenarios", "scenarios.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Scenarios []scenario `json:"scenarios"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	return file.Scenarios
}

func (s scenario) number(t testing.TB, name string) int {
	t.Helper()
	v, ok := s.Params[name].(float64)
	if !ok {
		t.Fatalf("scenario %s: no number param %s", s.ID, name)
	}
	return int(v)
}

// lingerOf is the scenario's `linger_ms` as a client option.
func (s scenario) lingerOf(t testing.TB) respcoord.Option {
	t.Helper()
	return respcoord.WithWatchLinger(time.Duration(s.number(t, "linger_ms")) * time.Millisecond)
}

func (s scenario) text(t testing.TB, name string) string {
	t.Helper()
	v, ok := s.Params[name].(string)
	if !ok {
		t.Fatalf("scenario %s: no string param %s", s.ID, name)
	}
	return v
}

// connect connects a client that the test closes when it ends.
func connect(t testing.TB, target string, opts ...respcoord.Option) *respcoord.Client {
	t.Helper()
	c, err := respcoord.Connect(context.Background(), target, opts...)
	if err != nil {
		t.Fatalf("connect %s: %v", target, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func session(t testing.TB, c *respcoord.Client, id string) *respcoord.Session {
	t.Helper()
	s, err := c.Session(id)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func start(t testing.TB, s *respcoord.Session, source respcoord.Source, opts ...respcoord.StartOption) *respcoord.Response {
	t.Helper()
	r, err := s.Start(context.Background(), source, opts...)
	if err != nil {
		t.Fatalf("start on %s: %v", s.ID(), err)
	}
	return r
}

func state(t testing.TB, s *respcoord.Session) respcoord.SessionState {
	t.Helper()
	st, err := s.State(context.Background())
	if err != nil {
		t.Fatalf("state of %s: %v", s.ID(), err)
	}
	return st
}

// stopped waits for r to stop and returns why.
func stopped(t testing.TB, what string, r *respcoord.Response) respcoord.StopReason {
	t.Helper()
	within(t, what, r.Done(), patience)
	return r.StopReason()
}

type ran struct {
	result respcoord.RunResult
	err    error
}

// runEndless runs a body that never ends by itself on s: it hands out its
// fence and returns when its context is done.
func runEndless(s *respcoord.Session) (fences <-chan respcoord.Fence, done <-chan ran) {
	fenceCh := make(chan respcoord.Fence, 1)
	doneCh := make(chan ran, 1)
	go func() {
		result, err := s.Run(context.Background(), respcoord.SourceClient, func(ctx context.Context, fence respcoord.Fence) error {
			fenceCh <- fence
			<-ctx.Done()
			return context.Cause(ctx)
		})
		doneCh <- ran{result, err}
	}()
	return fenceCh, doneCh
}

func check(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Fatalf(format, args...)
	}
}

func bg() context.Context { return context.Background() }

var implementations = map[string]func(t *testing.T, s scenario){
	"superseded_by_another_gateway": func(t *testing.T, _ scenario) {
		server := startFixture(t)
		a, b := connect(t, server.Grpc), connect(t, server.Grpc)
		fences, runs := runEndless(session(t, a, "superseded"))
		aFence := within(t, "A's body starts", fences, patience)
		bResponse := start(t, session(t, b, "superseded"), respcoord.SourceVAD)
		check(t, bResponse.Superseded() == aFence.ID(), "B's Start reports A's response as superseded: %d, want %d", bResponse.Superseded(), aFence.ID())
		out := within(t, "A's run returns", runs, patience)
		check(t, out.err == nil, "A's run: %v", out.err)
		want := respcoord.RunResult{Kind: respcoord.RunStopped, ResponseID: aFence.ID(), Reason: respcoord.StopSuperseded}
		check(t, out.result == want, "A's run: %+v, want %+v", out.result, want)
		check(t, server.finishes(t, aFence.ID()) == 0, "no Finish for A's response")
		check(t, !aFence.IsCurrent() && aFence.StopReason() == respcoord.StopSuperseded, "A's fence: current %v, reason %q", aFence.IsCurrent(), aFence.StopReason())
		check(t, bResponse.IsCurrent(), "B's response is still current")
		cancelled, err := session(t, a, "superseded").Cancel(bg(), respcoord.SourceClient)
		check(t, err == nil && cancelled.CancelledID == bResponse.ID(), "A's Cancel: %+v, %v; want %d", cancelled, err, bResponse.ID())
		check(t, stopped(t, "B's response stops", bResponse) == respcoord.StopCancelled, "B's response: %q", bResponse.StopReason())
		check(t, !bResponse.IsCurrent(), "B's response is not current")
	},

	"cancelled_and_shut_down_by_another_gateway": func(t *testing.T, _ scenario) {
		server := startFixture(t)
		a, b := connect(t, server.Grpc), connect(t, server.Grpc)
		first := start(t, session(t, a, "teardown"), respcoord.SourceClient)
		cancelled, err := session(t, b, "teardown").Cancel(bg(), respcoord.SourceClient)
		check(t, err == nil && cancelled.CancelledID == first.ID() && cancelled.State.Phase == respcoord.PhaseIdle, "B's Cancel: %+v, %v; want %d, idle", cancelled, err, first.ID())
		check(t, stopped(t, "the cancel reaches A", first) == respcoord.StopCancelled, "first: %q", first.StopReason())
		finished, err := first.Finish(bg(), respcoord.TerminalCompleted)
		check(t, err == nil && finished == respcoord.FinishResult{Outcome: respcoord.FinishNotSent, Reason: respcoord.StopCancelled}, "A's Finish: %+v, %v", finished, err)
		check(t, server.finishes(t, first.ID()) == 0, "no Finish reached the server")
		second := start(t, session(t, a, "teardown"), respcoord.SourceClient)
		shut, err := session(t, b, "teardown").Shutdown(bg())
		check(t, err == nil && shut.CancelledID == second.ID() && shut.State.Phase == respcoord.PhaseTerminated, "B's Shutdown: %+v, %v; want %d, terminated", shut, err, second.ID())
		check(t, stopped(t, "the shutdown reaches A", second) == respcoord.StopShutdown, "second: %q", second.StopReason())
		_, err = session(t, a, "teardown").Start(bg(), respcoord.SourceClient)
		var rerr *respcoord.Error
		check(t, errors.Is(err, respcoord.ErrSessionTerminated) && errors.As(err, &rerr) && rerr.Code == codes.FailedPrecondition, "Start after shutdown: %v", err)
		check(t, status.Code(err) == codes.FailedPrecondition, "the status is the cause: %v", status.Code(err))
		quick, err := session(t, a, "teardown-2").Run(bg(), respcoord.SourceClient, func(context.Context, respcoord.Fence) error { return nil })
		check(t, err == nil && quick.Kind == respcoord.RunCompleted && quick.FinishErr == nil && quick.Finish.Outcome == respcoord.FinishApplied, "quick run: %+v, %v", quick, err)
		st := state(t, session(t, a, "teardown-2"))
		check(t, st.Phase == respcoord.PhaseIdle && st.Revision == 2, "teardown-2: %+v", st)
	},

	"finish_vs_cancel_race": func(t *testing.T, s scenario) {
		rounds, maxDelay := s.number(t, "rounds"), s.number(t, "max_delay_micros")
		server := startFixture(t)
		a, b := connect(t, server.Grpc), connect(t, server.Grpc)
		// The recording: a raw watch-all positioned before the first round.
		rec := connect(t, server.Grpc)
		listed, err := rec.Raw().ListSessions(bg(), &pb.ListSessionsRequest{PageSize: 1})
		check(t, err == nil, "ListSessions: %v", err)
		wctx, stopWatch := context.WithCancel(bg())
		defer stopWatch()
		afterSeq := listed.GetSeq()
		stream, err := rec.Raw().Watch(wctx, &pb.WatchRequest{AfterSeq: &afterSeq})
		check(t, err == nil, "Watch: %v", err)
		var mu sync.Mutex
		started, ended := map[uint64]int{}, map[uint64]int{}
		endedTotal := 0
		allEnded := make(chan error, 1)
		go func() {
			for {
				msg, err := stream.Recv()
				if err != nil {
					allEnded <- err
					return
				}
				mu.Lock()
				for _, e := range msg.GetEvents() {
					if !strings.HasPrefix(e.GetSessionId(), "race-") {
						continue
					}
					if st := e.GetStarted(); st != nil {
						started[st.GetResponseId()]++
					} else if en := e.GetEnded(); en != nil {
						ended[en.GetResponseId()]++
						endedTotal++
						if endedTotal == rounds {
							allEnded <- nil
						}
					}
				}
				mu.Unlock()
			}
		}()
		r := rng(0x5eed)
		tally := map[string]int{}
		for round := range rounds {
			name := fmt.Sprintf("race-%d", round)
			bodyDelay := time.Duration(r.below(uint32(maxDelay))) * time.Microsecond
			cancelDelay := time.Duration(r.below(uint32(maxDelay))) * time.Microsecond
			ids := make(chan uint64, 1)
			runs := make(chan ran, 1)
			go func() {
				result, err := session(t, a, name).Run(bg(), respcoord.SourceClient, func(ctx context.Context, fence respcoord.Fence) error {
					ids <- fence.ID()
					select {
					case <-time.After(bodyDelay):
					case <-ctx.Done():
					}
					return nil
				})
				runs <- ran{result, err}
			}()
			id := within(t, "A's response starts", ids, patience)
			time.Sleep(cancelDelay)
			if _, err := session(t, b, name).CancelIf(bg(), respcoord.SourceClient, id); err != nil {
				t.Fatalf("round %d: B's cancel: %v", round, err)
			}
			out := within(t, "A's run returns", runs, patience)
			check(t, out.err == nil && out.result.FinishErr == nil, "round %d: %+v, %v", round, out.result, out.err)
			finishes := server.finishes(t, id)
			switch {
			case out.result.Kind == respcoord.RunCompleted && (out.result.Finish.Outcome == respcoord.FinishApplied || out.result.Finish.Outcome == respcoord.FinishStale):
				tally[out.result.Finish.Outcome.String()]++
				check(t, finishes == 1, "round %d: %s means exactly 1 Finish, got %d", round, out.result.Finish.Outcome, finishes)
			case out.result.Kind == respcoord.RunCompleted && out.result.Finish.Outcome == respcoord.FinishNotSent:
				tally["not_sent"]++
				check(t, finishes == 0, "round %d: not_sent means no Finish, got %d", round, finishes)
			case out.result.Kind == respcoord.RunStopped:
				tally["stopped"]++
				check(t, finishes == 0, "round %d: stopped means no Finish, got %d", round, finishes)
			default:
				t.Fatalf("round %d: unexpected outcome %+v", round, out.result)
			}
		}
		check(t, within(t, "every response's end is recorded", allEnded, patience) == nil, "the recording broke")
		mu.Lock()
		defer mu.Unlock()
		check(t, len(started) == rounds && endedTotal == rounds, "started %d, ended %d; want %d each", len(started), endedTotal, rounds)
		for id, n := range started {
			check(t, n == 1 && ended[id] == 1, "response %d: %d started, %d ended", id, n, ended[id])
		}
		t.Logf("finish vs cancel race (go, %d rounds): %v", rounds, tally)
	},

	"lost_start_reply_is_replayed": func(t *testing.T, _ scenario) {
		server := startFixture(t)
		a := connect(t, server.Grpc)
		sess := session(t, a, "lost-reply")
		server.loseNextStartReply(t)
		before := server.starts(t)
		first := start(t, sess, respcoord.SourceClient)
		check(t, server.starts(t)-before == 2, "the first call reached the server %d times, want 2", server.starts(t)-before)
		check(t, first.Replayed() && first.IsCurrent(), "first: replayed %v, current %v", first.Replayed(), first.IsCurrent())
		st := state(t, sess)
		check(t, st.ResponsesStarted == 1 && st.ResponseID == first.ID(), "state: %+v", st)
		turn := start(t, sess, respcoord.SourceClient, respcoord.WithRequestID("turn-7"))
		check(t, turn.Superseded() == first.ID(), "the first turn-7 Start supersedes: %d", turn.Superseded())
		check(t, stopped(t, "the first response stops", first) == respcoord.StopSuperseded, "first: %q", first.StopReason())
		again := start(t, sess, respcoord.SourceClient, respcoord.WithRequestID("turn-7"))
		check(t, again.Replayed() && again.ID() == turn.ID(), "again: replayed %v, id %d; want %d", again.Replayed(), again.ID(), turn.ID())
		check(t, turn.IsCurrent() && again.IsCurrent(), "both handles are current")
		finished, err := again.Finish(bg(), respcoord.TerminalCompleted)
		check(t, err == nil && finished.Outcome == respcoord.FinishApplied, "Finish: %+v, %v", finished, err)
	},

	"coordinator_down_then_back": func(t *testing.T, _ scenario) {
		port := freePort(t)
		target := fmt.Sprintf("127.0.0.1:%d", port)
		a := connect(t, target, respcoord.WithLazyConnect(), respcoord.WithRetryPolicy(respcoord.RetryPolicy{Deadline: 20 * time.Second}))
		starts := make(chan ran, 1)
		var response *respcoord.Response
		go func() {
			r, err := session(t, a, "down-then-back").Start(bg(), respcoord.SourceClient)
			response = r
			starts <- ran{err: err}
		}()
		time.Sleep(300 * time.Millisecond)
		startFixture(t, "--listen", target)
		out := within(t, "the Start succeeds", starts, 30*time.Second)
		check(t, out.err == nil && response.IsCurrent(), "Start: %v", out.err)
		check(t, state(t, session(t, a, "down-then-back")).ResponsesStarted == 1, "one response started")
	},

	"watch_broken_and_resumed": func(t *testing.T, s scenario) {
		server := startFixture(t)
		a, b := connect(t, server.Proxy, s.lingerOf(t)), connect(t, server.Grpc)
		response := start(t, session(t, a, "broken-watch"), respcoord.SourceClient)
		until(t, "A's session watch is open", func() bool { return a.WatchStatus().Opened == 1 })
		before := a.WatchStatus()
		check(t, before.Open == 1, "one session watch: %+v", before)
		// Cut A off; once its watch noticed (a state read is under way or
		// done), supersede its response.
		server.cut(t)
		until(t, "A's watch notices the cut", func() bool { return a.WatchStatus().Rereads > before.Rereads })
		bargeIn := start(t, session(t, b, "broken-watch"), respcoord.SourceVAD)
		check(t, bargeIn.Superseded() == response.ID(), "B supersedes A's response")
		check(t, stopped(t, "A learns after resuming", response) == respcoord.StopSuperseded, "A: %q", response.StopReason())
		after := a.WatchStatus()
		check(t, after.Rereads >= before.Rereads+1, "rereads %d -> %d", before.Rereads, after.Rereads)
		until(t, "the watch closes with its last response", func() bool { return a.WatchStatus().Open == 0 })
	},

	"coordinator_restart_mid_run": func(t *testing.T, _ scenario) {
		if onNATS() {
			t.Skip("runs the real binary on its default memory backend")
		}
		port := freePort(t)
		first := startBinary(t, port)
		retry := respcoord.WithRetryPolicy(respcoord.RetryPolicy{Deadline: 20 * time.Second})
		a := connect(t, first.target(), retry)
		fences, runs := runEndless(session(t, a, "restart"))
		oldFence := within(t, "A's body starts", fences, patience)
		first.kill()
		startBinary(t, port)
		out := within(t, "A's run returns", runs, 30*time.Second)
		want := respcoord.RunResult{Kind: respcoord.RunStopped, ResponseID: oldFence.ID(), Reason: respcoord.StopGone}
		check(t, out.err == nil && out.result == want, "A's run: %+v, %v; want %+v", out.result, out.err, want)
		check(t, !oldFence.IsCurrent(), "the old fence is closed")
		check(t, a.WatchStatus().Rereads >= 1, "the watch read the state (NOT_FOUND): %+v", a.WatchStatus())
		renewed := start(t, session(t, a, "restart"), respcoord.SourceClient)
		check(t, renewed.ID() > oldFence.ID(), "new id %d > old %d", renewed.ID(), oldFence.ID())
		check(t, state(t, session(t, a, "restart")).ResponsesStarted == 1, "one response since the restart")
		b := connect(t, first.target())
		start(t, session(t, b, "restart"), respcoord.SourceVAD)
		check(t, stopped(t, "a new session watch works after the restart", renewed) == respcoord.StopSuperseded, "renewed: %q", renewed.StopReason())
	},

	"bearer_token_on_every_call": func(t *testing.T, s scenario) {
		token := s.text(t, "token")
		tokens := filepath.Join(t.TempDir(), "tokens")
		check(t, os.WriteFile(tokens, []byte(token+"\n"), 0o600) == nil, "write tokens")
		server := startFixture(t, "--auth-tokens", tokens)
		anonymous := connect(t, server.Grpc)
		_, err := anonymous.State(bg(), "token-1")
		check(t, errors.Is(err, respcoord.ErrUnauthenticated), "anonymous GetState: %v", err)
		a := connect(t, server.Grpc, respcoord.WithToken(token))
		b := connect(t, server.Grpc, respcoord.WithToken(token))
		response := start(t, session(t, a, "token-1"), respcoord.SourceClient)
		start(t, session(t, b, "token-1"), respcoord.SourceVAD)
		check(t, stopped(t, "A's authorized watch sees the supersede", response) == respcoord.StopSuperseded, "A: %q", response.StopReason())
	},

	"mutual_tls_with_scoped_token": func(t *testing.T, s scenario) {
		if onNATS() {
			t.Skip("runs the real binary on its default memory backend")
		}
		token, prefix := s.text(t, "token"), s.text(t, "scope")
		name, outside, domain := s.text(t, "session"), s.text(t, "outside"), s.text(t, "domain")
		dir := t.TempDir()
		certs(t, dir)
		tokens := filepath.Join(dir, "tokens")
		check(t, os.WriteFile(tokens, []byte(token+" "+prefix+"\n"), 0o600) == nil, "write tokens")
		port := freePort(t)
		server := startBinary(t, port,
			"--tls-cert", filepath.Join(dir, "server.pem"),
			"--tls-key", filepath.Join(dir, "server-key.pem"),
			"--tls-client-ca", filepath.Join(dir, "client-ca.pem"),
			"--auth-tokens", tokens)
		tls := respcoord.TLS{
			CAFile:     filepath.Join(dir, "server-ca.pem"),
			CertFile:   filepath.Join(dir, "gateway.pem"),
			KeyFile:    filepath.Join(dir, "gateway-key.pem"),
			ServerName: domain,
		}
		a := connect(t, server.target(), respcoord.WithTLS(tls), respcoord.WithToken(token))
		b := connect(t, server.target(), respcoord.WithTLS(tls), respcoord.WithToken(token))
		response := start(t, session(t, a, name), respcoord.SourceClient)
		start(t, session(t, b, name), respcoord.SourceVAD)
		check(t, stopped(t, "the supersede arrives over mutual TLS", response) == respcoord.StopSuperseded, "A: %q", response.StopReason())
		_, err := a.State(bg(), outside)
		check(t, errors.Is(err, respcoord.ErrPermissionDenied), "GetState outside the scope: %v", err)
		noCert := connect(t, server.target(),
			respcoord.WithTLS(respcoord.TLS{CAFile: tls.CAFile, ServerName: domain}),
			respcoord.WithToken(token), respcoord.WithLazyConnect(),
			respcoord.WithRetryPolicy(respcoord.RetryPolicy{Deadline: 3 * time.Second}))
		_, err = noCert.State(bg(), name)
		check(t, errors.Is(err, respcoord.ErrUnavailable), "GetState without a client certificate: %v", err)
	},

	"cancel_propagation_latency": func(t *testing.T, s scenario) {
		rounds, warmup, sessions := s.number(t, "rounds"), s.number(t, "warmup_rounds"), s.number(t, "sessions")
		if onNATS() {
			// On NATS the scenario checks the other backend, not the
			// latency of a warm gateway: no warm-up there.
			warmup = 0
		}
		server := startFixture(t)
		a, b := connect(t, server.Grpc), connect(t, server.Grpc)
		// A serves these sessions: it opens their watches ahead.
		for i := range sessions {
			session(t, a, fmt.Sprintf("latency-%d", i)).OpenWatch()
		}
		until(t, "A's watches are open", func() bool { return a.WatchStatus().Opened == sessions })
		samples := make([]time.Duration, 0, warmup+rounds)
		for round := range warmup + rounds {
			name := fmt.Sprintf("latency-%d", round%sessions)
			fences, runs := runEndless(session(t, a, name))
			id := within(t, "A's body starts", fences, patience).ID()
			began := time.Now()
			calls := make(chan error, 1)
			go func() {
				if round%2 == 0 {
					_, err := session(t, b, name).CancelIf(bg(), respcoord.SourceClient, id)
					calls <- err
					return
				}
				r, err := session(t, b, name).Start(bg(), respcoord.SourceVAD)
				if err == nil {
					r.Release()
				}
				calls <- err
			}()
			out := within(t, "A's run returns", runs, patience)
			samples = append(samples, time.Since(began))
			check(t, within(t, "B's call returns", calls, patience) == nil, "round %d: B's call failed", round)
			check(t, out.err == nil && out.result.Kind == respcoord.RunStopped, "round %d: %+v, %v", round, out.result, out.err)
		}
		st := a.WatchStatus()
		check(t, st.Opened == sessions, "%d watches opened in all, every later round reusing its session's: %+v", sessions, st)
		line := fmt.Sprintf("cancel propagation (go, B's call to A's run returning): first %d rounds %s", rounds, latencySummary(samples[:rounds]))
		if warmup > 0 {
			line += fmt.Sprintf("; last %d of %d %s", rounds, warmup+rounds, latencySummary(samples[len(samples)-rounds:]))
		}
		fmt.Println(line)
		t.Log(line)
	},

	"session_watch_follows_live_responses": func(t *testing.T, s scenario) {
		server := startFixture(t)
		a, b := connect(t, server.Grpc, s.lingerOf(t)), connect(t, server.Grpc)
		x, y := session(t, a, "follow-x"), session(t, a, "follow-y")
		st := a.WatchStatus()
		check(t, st.Open == 0 && st.Opened == 0, "handles alone: %+v", st)
		onX := start(t, x, respcoord.SourceClient)
		check(t, a.WatchStatus().Open == 1, "one live response, one watch: %+v", a.WatchStatus())
		onY := start(t, y, respcoord.SourceClient)
		check(t, a.WatchStatus().Open == 2, "two live responses, two watches: %+v", a.WatchStatus())
		until(t, "both watches are open", func() bool { return a.WatchStatus().Opened == 2 })
		finished, err := onX.Finish(bg(), respcoord.TerminalCompleted)
		check(t, err == nil && finished.Outcome == respcoord.FinishApplied, "X's Finish: %+v, %v", finished, err)
		start(t, session(t, b, "follow-y"), respcoord.SourceVAD)
		check(t, stopped(t, "Y's response is superseded", onY) == respcoord.StopSuperseded, "Y: %q", onY.StopReason())
		st = a.WatchStatus()
		check(t, st.Open == 2 && st.Opened == 2, "right after X's Finish and Y's stop, both watches linger: %+v", st)
		until(t, "no watch once the linger is over", func() bool { return a.WatchStatus().Open == 0 })
		check(t, a.WatchStatus().Opened == 2, "still 2 opened: %+v", a.WatchStatus())
		// Traffic on a session A has nothing live in reaches A not at all.
		z := session(t, b, "follow-z")
		for range 5 {
			start(t, z, respcoord.SourceVAD)
		}
		st = a.WatchStatus()
		check(t, st.Open == 0 && st.Opened == 2, "no watch of Z, nor of everything: %+v", st)
	},

	"stop_between_start_reply_and_watch": func(t *testing.T, _ scenario) {
		server := startFixture(t)
		a, b := connect(t, server.Grpc), connect(t, server.Grpc)
		server.holdNextWatch(t)
		response := start(t, session(t, a, "between"), respcoord.SourceClient)
		until(t, "A's session watch reaches the hold", func() bool { return server.heldWatches(t) == 1 })
		start(t, session(t, b, "between"), respcoord.SourceVAD)
		time.Sleep(50 * time.Millisecond)
		check(t, response.IsCurrent(), "nothing has told A yet")
		server.releaseWatches(t)
		check(t, stopped(t, "the watch replays the supersede", response) == respcoord.StopSuperseded, "A: %q", response.StopReason())
		check(t, a.WatchStatus().Rereads == 0, "replayed from the Start reply's revision, no state read: %+v", a.WatchStatus())
	},

	"hundreds_of_sessions_on_one_client": func(t *testing.T, s scenario) {
		sessions := s.number(t, "sessions")
		server := startFixture(t)
		a, b := connect(t, server.Grpc, s.lingerOf(t)), connect(t, server.Grpc)
		responses := make([]*respcoord.Response, 0, sessions)
		for i := range sessions {
			responses = append(responses, start(t, session(t, a, fmt.Sprintf("many-%d", i)), respcoord.SourceClient))
		}
		check(t, a.WatchStatus().Open == sessions, "%d session watches: %+v", sessions, a.WatchStatus())
		for i := range sessions {
			start(t, session(t, b, fmt.Sprintf("many-%d", i)), respcoord.SourceVAD)
		}
		for _, r := range responses {
			check(t, stopped(t, "every response is superseded", r) == respcoord.StopSuperseded, "response %d: %q", r.ID(), r.StopReason())
		}
		until(t, "no watch once the linger after the last response is over", func() bool { return a.WatchStatus().Open == 0 })
		st := a.WatchStatus()
		check(t, st.Connections == 1, "%d streams fit one pooled connection: %+v", sessions, st)
	},

	"watch_lingers_across_responses": func(t *testing.T, s scenario) {
		server := startFixture(t)
		a, b := connect(t, server.Grpc, s.lingerOf(t)), connect(t, server.Grpc)
		l := session(t, a, "linger")
		first := start(t, l, respcoord.SourceClient)
		until(t, "L's watch is open", func() bool { return a.WatchStatus().Opened == 1 })
		finished, err := first.Finish(bg(), respcoord.TerminalCompleted)
		check(t, err == nil && finished.Outcome == respcoord.FinishApplied, "the first Finish: %+v, %v", finished, err)
		st := a.WatchStatus()
		check(t, st.Open == 1 && st.Opened == 1, "after the first Finish: %+v", st)
		second := start(t, l, respcoord.SourceClient)
		st = a.WatchStatus()
		check(t, st.Open == 1 && st.Opened == 1, "after the second Start, no new Watch call: %+v", st)
		start(t, session(t, b, "linger"), respcoord.SourceVAD)
		check(t, stopped(t, "the second response is superseded", second) == respcoord.StopSuperseded, "second: %q", second.StopReason())
		st = a.WatchStatus()
		check(t, st.Opened == 1 && st.Rereads == 0, "one watch all along, no state re-read: %+v", st)
	},

	"open_watch_before_first_start": func(t *testing.T, s scenario) {
		server := startFixture(t)
		a, b := connect(t, server.Grpc, s.lingerOf(t)), connect(t, server.Grpc)
		w := session(t, a, "ahead")
		w.OpenWatch()
		check(t, a.WatchStatus().Open == 1, "right after OpenWatch: %+v", a.WatchStatus())
		until(t, "W's watch stream is open", func() bool { return a.WatchStatus().Opened == 1 })
		response := start(t, w, respcoord.SourceClient)
		check(t, a.WatchStatus().Opened == 1, "the Start needed no Watch call: %+v", a.WatchStatus())
		start(t, session(t, b, "ahead"), respcoord.SourceVAD)
		check(t, stopped(t, "the response is superseded", response) == respcoord.StopSuperseded, "A: %q", response.StopReason())
		check(t, a.WatchStatus().Opened == 1, "still one watch: %+v", a.WatchStatus())
	},

	"stop_right_after_start_reply": func(t *testing.T, s scenario) {
		rounds := s.number(t, "rounds")
		server := startFixture(t)
		a, b := connect(t, server.Grpc), connect(t, server.Grpc)
		run := time.Now().UnixNano()
		var ahead, cold []time.Duration
		for round := range rounds {
			sess := session(t, a, fmt.Sprintf("quick-%d-%d", run, round))
			if round%2 == 0 {
				opened := a.WatchStatus().Opened
				sess.OpenWatch()
				until(t, "the watch opened ahead is open", func() bool { return a.WatchStatus().Opened > opened })
			}
			response := start(t, sess, respcoord.SourceClient)
			other := session(t, b, sess.ID())
			began := time.Now()
			calls := make(chan error, 1)
			go func() {
				_, err := other.CancelIf(bg(), respcoord.SourceClient, response.ID())
				calls <- err
			}()
			within(t, "A's response stops", response.Done(), patience)
			took := time.Since(began)
			check(t, within(t, "B's cancel returns", calls, patience) == nil, "round %d: B's cancel failed", round)
			check(t, response.StopReason() == respcoord.StopCancelled, "round %d: %q", round, response.StopReason())
			if round%2 == 0 {
				ahead = append(ahead, took)
			} else {
				cold = append(cold, took)
			}
		}
		line := fmt.Sprintf("stop after start (go, %d rounds, B's cancel right after A's Start reply to A's response stopped): watch opened ahead %s; not ahead %s",
			rounds, latencySummary(ahead), latencySummary(cold))
		fmt.Println(line)
		t.Log(line)
	},
}

func TestEveryScenarioIsImplementedAndNothingElse(t *testing.T) {
	var ids, missing, extra []string
	for _, s := range loadScenarios(t) {
		ids = append(ids, s.ID)
		if implementations[s.ID] == nil {
			missing = append(missing, s.ID)
		}
	}
	for id := range implementations {
		if !slices.Contains(ids, id) {
			extra = append(extra, id)
		}
	}
	if len(missing) > 0 || len(extra) > 0 {
		t.Fatalf("scenarios without a Go implementation: %v; implementations of scenarios not in the file: %v", missing, extra)
	}
}

func TestScenarios(t *testing.T) {
	for _, s := range loadScenarios(t) {
		t.Run(s.ID, func(t *testing.T) {
			implementation := implementations[s.ID]
			if implementation == nil {
				t.Fatalf("no implementation for %s", s.ID)
			}
			implementation(t, s)
		})
	}
}

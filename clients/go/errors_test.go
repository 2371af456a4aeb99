package respcoord

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestEveryCodeMapsToItsSentinelKeepingTheStatus(t *testing.T) {
	sentinels := map[codes.Code]error{
		codes.Canceled: ErrCancelled, codes.Unknown: ErrInternal, codes.InvalidArgument: ErrInvalidArgument,
		codes.DeadlineExceeded: ErrDeadlineExceeded, codes.NotFound: ErrNotFound, codes.AlreadyExists: ErrInternal,
		codes.PermissionDenied: ErrPermissionDenied, codes.ResourceExhausted: ErrResourceExhausted,
		codes.FailedPrecondition: ErrSessionTerminated, codes.Aborted: ErrAborted, codes.OutOfRange: ErrOutOfRange,
		codes.Unimplemented: ErrInternal, codes.Internal: ErrInternal, codes.Unavailable: ErrUnavailable,
		codes.DataLoss: ErrInternal, codes.Unauthenticated: ErrUnauthenticated,
	}
	all := []error{ErrCancelled, ErrInternal, ErrInvalidArgument, ErrDeadlineExceeded, ErrNotFound, ErrPermissionDenied,
		ErrResourceExhausted, ErrSessionTerminated, ErrAborted, ErrOutOfRange, ErrUnavailable, ErrUnauthenticated}
	for code := codes.Canceled; code <= codes.Unauthenticated; code++ {
		sent := status.Error(code, "details")
		err := fmt.Errorf("wrapped: %w", fromStatus(sent, 2))
		for _, s := range all {
			if errors.Is(err, s) != (s == sentinels[code]) {
				t.Errorf("%s: errors.Is(err, %v) = %v", code, s, errors.Is(err, s))
			}
		}
		var e *Error
		if !errors.As(err, &e) || e.Code != code || e.Attempts != 2 {
			t.Errorf("%s: errors.As: %+v", code, e)
		}
		if status.Code(err) != code || !errors.Is(err, sent) {
			t.Errorf("%s: the status is not the cause (status.Code %s)", code, status.Code(err))
		}
	}
}

func TestInvalidArgumentNamesTheFieldFromTheServersMessage(t *testing.T) {
	e := fromStatus(status.Error(codes.InvalidArgument, "session_id: contains the control character U+0009"), 1)
	if e.Field != "session_id" || e.Message != "contains the control character U+0009" {
		t.Fatalf("%+v", e)
	}
	e = fromStatus(status.Error(codes.InvalidArgument, "no field here"), 1)
	if e.Field != "request" || e.Message != "no field here" {
		t.Fatalf("%+v", e)
	}
}

func TestAContextErrorIsCancelledAndKeepsTheContextsCause(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	why := errors.New("the caller hung up")
	cancel(why)
	err := contextError(ctx, 0)
	if !errors.Is(err, ErrCancelled) || !errors.Is(err, why) || status.Code(err) != codes.Canceled {
		t.Fatalf("%v", err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 0)
	defer dcancel()
	<-dctx.Done()
	err = contextError(dctx, 3)
	if !errors.Is(err, ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v", err)
	}
}

func TestStoppedErrorIsErrStopped(t *testing.T) {
	err := fmt.Errorf("body: %w", &StoppedError{ResponseID: 3, Reason: StopSuperseded})
	var se *StoppedError
	if !errors.Is(err, ErrStopped) || !errors.As(err, &se) || se.Reason != StopSuperseded {
		t.Fatalf("%v", err)
	}
}

func TestBackoffDoublesWithJitterUpToTheCap(t *testing.T) {
	p := RetryPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: 400 * time.Millisecond}.withDefaults()
	for attempt, ceiling := range map[int]time.Duration{1: 100, 2: 200, 3: 400, 4: 400, 40: 400} {
		ceiling *= time.Millisecond
		for range 50 {
			if d := p.backoff(attempt); d < ceiling/2 || d > ceiling {
				t.Fatalf("attempt %d: %s outside [%s, %s]", attempt, d, ceiling/2, ceiling)
			}
		}
	}
}

var fast = RetryPolicy{AttemptTimeout: time.Second, Deadline: 5 * time.Second, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}

func TestTransportFailuresAreRetriedFinalAnswersAreNot(t *testing.T) {
	var n atomic.Int32
	value, err := withRetry(context.Background(), fast, true, func(context.Context) (int, error) {
		if n.Add(1) < 3 {
			return 0, status.Error(codes.Unavailable, "down")
		}
		return 7, nil
	})
	if err != nil || value != 7 || n.Load() != 3 {
		t.Fatalf("%d, %v after %d attempts", value, err, n.Load())
	}
	n.Store(0)
	_, err = withRetry(context.Background(), fast, true, func(context.Context) (int, error) {
		n.Add(1)
		return 0, status.Error(codes.NotFound, "no session")
	})
	if !errors.Is(err, ErrNotFound) || n.Load() != 1 {
		t.Fatalf("%v after %d attempts", err, n.Load())
	}
	n.Store(0)
	_, err = withRetry(context.Background(), fast, false, func(context.Context) (int, error) {
		n.Add(1)
		return 0, status.Error(codes.Unavailable, "down")
	})
	if !errors.Is(err, ErrUnavailable) || n.Load() != 1 {
		t.Fatalf("not idempotent: %v after %d attempts", err, n.Load())
	}
	n.Store(0)
	capped := fast
	capped.MaxAttempts = 4
	_, err = withRetry(context.Background(), capped, true, func(context.Context) (int, error) {
		n.Add(1)
		return 0, status.Error(codes.Unavailable, "down")
	})
	var e *Error
	if !errors.As(err, &e) || e.Attempts != 4 || n.Load() != 4 {
		t.Fatalf("capped: %v after %d attempts", err, n.Load())
	}
}

func TestTheDeadlineBoundsAllAttemptsAndTheLastRealFailureIsReturned(t *testing.T) {
	p := RetryPolicy{AttemptTimeout: time.Second, Deadline: 60 * time.Millisecond, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
	began := time.Now()
	_, err := withRetry(context.Background(), p, true, func(context.Context) (int, error) {
		return 0, status.Error(codes.Unavailable, "down")
	})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("%v; want the last real failure, not a made-up deadline", err)
	}
	if took := time.Since(began); took > time.Second {
		t.Fatalf("took %s", took)
	}
}

func TestTheCallersContextEndsTheRetriesAtOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var n atomic.Int32
	_, err := withRetry(ctx, fast, true, func(context.Context) (int, error) { n.Add(1); return 0, nil })
	if !errors.Is(err, context.Canceled) || n.Load() != 0 {
		t.Fatalf("already cancelled: %v after %d attempts", err, n.Load())
	}
	ctx, cancel = context.WithCancel(context.Background())
	slow := RetryPolicy{AttemptTimeout: time.Second, Deadline: time.Minute, InitialBackoff: time.Minute, MaxBackoff: time.Minute}
	time.AfterFunc(20*time.Millisecond, cancel)
	began := time.Now()
	_, err = withRetry(ctx, slow, true, func(context.Context) (int, error) { return 0, status.Error(codes.Unavailable, "down") })
	if !errors.Is(err, ErrCancelled) || time.Since(began) > 5*time.Second {
		t.Fatalf("cancelled during the backoff: %v after %s", err, time.Since(began))
	}
}

func TestTargetsAndTLSSettings(t *testing.T) {
	for _, c := range []struct {
		target  string
		tls     bool
		address string
		useTLS  bool
		option  string
	}{
		{"127.0.0.1:1", false, "127.0.0.1:1", false, ""},
		{"127.0.0.1:1", true, "127.0.0.1:1", true, ""},
		{"https://h:1", false, "h:1", true, ""},
		{" http://h:1 ", false, "h:1", false, ""},
		{"http://h:1", true, "", false, "target"},
		{"unix://x", false, "", false, "target"},
		{"  ", false, "", false, "target"},
	} {
		address, useTLS, err := parseTarget(c.target, c.tls)
		var ce *ConfigError
		if c.option != "" {
			if !errors.As(err, &ce) || ce.Option != c.option {
				t.Errorf("%q: %v; want a config error about %s", c.target, err, c.option)
			}
			continue
		}
		if err != nil || address != c.address || useTLS != c.useTLS {
			t.Errorf("%q: %q %v %v", c.target, address, useTLS, err)
		}
	}
	for _, c := range []struct {
		opts   []Option
		option string
	}{
		{[]Option{WithTLS(TLS{CertFile: "a.pem"})}, "tls.cert"},
		{[]Option{WithTLS(TLS{CAFile: "/nonexistent/ca.pem"})}, "tls.ca"},
		{[]Option{WithToken("  ")}, "token"},
		{[]Option{WithToken("tab\there")}, "token"},
		{[]Option{WithWatchLinger(-time.Second)}, "watch_linger"},
	} {
		_, err := Connect(context.Background(), "127.0.0.1:1", append(c.opts, WithLazyConnect())...)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Option != c.option {
			t.Errorf("%v; want a config error about %s", err, c.option)
		}
	}
}

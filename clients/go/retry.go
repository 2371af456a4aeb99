package respcoord

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RetryPolicy bounds how a call is tried again. Only idempotent calls are
// retried: Start (its request id makes a retry a replay), Finish, a Cancel
// with an if-response id, Shutdown, GetState. A Cancel of whatever is live
// is sent once: a blind retry could cancel a response started in between.
type RetryPolicy struct {
	// AttemptTimeout bounds one attempt (sent to the server as grpc-timeout).
	AttemptTimeout time.Duration
	// Deadline bounds all attempts of one call, backoff included.
	Deadline time.Duration
	// InitialBackoff is the first pause; it doubles per attempt up to
	// MaxBackoff. Each pause is drawn from [backoff/2, backoff], so gateways
	// that lost the coordinator together do not come back in step.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// MaxAttempts caps the attempts; 0 means no cap (Deadline still holds).
	MaxAttempts int
}

// DefaultRetryPolicy is the policy of Connect without WithRetryPolicy, the
// same as the other clients': 2 s per attempt, 10 s per call, backoff from
// 25 ms to 1 s.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{
		AttemptTimeout: 2 * time.Second,
		Deadline:       10 * time.Second,
		InitialBackoff: 25 * time.Millisecond,
		MaxBackoff:     time.Second,
	}
}

// withDefaults fills the zero fields from DefaultRetryPolicy.
func (p RetryPolicy) withDefaults() RetryPolicy {
	d := DefaultRetryPolicy()
	if p.AttemptTimeout <= 0 {
		p.AttemptTimeout = d.AttemptTimeout
	}
	if p.Deadline <= 0 {
		p.Deadline = d.Deadline
	}
	if p.InitialBackoff <= 0 {
		p.InitialBackoff = d.InitialBackoff
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = d.MaxBackoff
	}
	if p.MaxBackoff < p.InitialBackoff {
		p.MaxBackoff = p.InitialBackoff
	}
	return p
}

// backoff is the jittered pause after attempt number attempt (from 1).
func (p RetryPolicy) backoff(attempt int) time.Duration {
	doublings := min(max(attempt-1, 0), 20)
	ceiling := min(p.InitialBackoff<<doublings, p.MaxBackoff)
	half := ceiling / 2
	return half + time.Duration(rand.Int64N(int64(half)+1))
}

// RetryableCode is the retry class of a status code (rules.json "retry"):
// true when a failed attempt may be tried again because the transport failed
// or the attempt ran out of time (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED,
// UNKNOWN, CANCELLED); false for an answer about the request itself, which
// is final. INTERNAL is final here; see Retryable for the INTERNAL grpc-go
// makes from a lost stream.
func RetryableCode(code codes.Code) bool {
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Unknown, codes.Canceled:
		return true
	default:
		return false
	}
}

// transportInternal are the words grpc-go uses for the INTERNAL it makes
// itself when a stream ends without a grpc-status: the server reset it
// (RST_STREAM, e.g. a replica killed mid-call) or its connection ended. Such
// an INTERNAL is not the coordinator's answer, so it is retried.
var transportInternal = []string{
	"stream terminated by RST_STREAM",
	"server closed the stream without sending trailers",
	"unexpected EOF",
}

// Retryable says whether a failed attempt that returned err may be tried
// again: RetryableCode of its status code, and also an INTERNAL that grpc-go
// made from a lost stream (rules.json "internal_from_the_transport").
func Retryable(err error) bool {
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	if s.Code() == codes.Internal {
		for _, words := range transportInternal {
			if strings.Contains(s.Message(), words) {
				return true
			}
		}
		return false
	}
	return RetryableCode(s.Code())
}

// withRetry runs attempt until it succeeds, fails for good, or the policy
// runs out, and returns the *Error of the last failure. Each attempt gets a
// context bounded by the attempt timeout and the call's deadline; the
// caller's ctx ends it at once (CANCELLED or DEADLINE_EXCEEDED, with the
// context's cause).
func withRetry[T any](ctx context.Context, p RetryPolicy, retry bool, attempt func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	end := time.Now().Add(p.Deadline)
	var last *Error
	for attempts := 1; ; attempts++ {
		if ctx.Err() != nil {
			return zero, contextError(ctx, attempts-1)
		}
		left := time.Until(end)
		if last != nil && left <= 0 {
			return zero, last
		}
		actx, cancel := context.WithTimeout(ctx, min(p.AttemptTimeout, max(left, time.Millisecond)))
		value, err := attempt(actx)
		cancel()
		if err == nil {
			return value, nil
		}
		if ctx.Err() != nil {
			return zero, contextError(ctx, attempts)
		}
		mapped := fromStatus(err, attempts)
		var local *Error
		if errors.As(err, &local) || !retry || !Retryable(err) || (p.MaxAttempts > 0 && attempts >= p.MaxAttempts) {
			return zero, mapped
		}
		pause := p.backoff(attempts)
		if time.Now().Add(pause).After(end) {
			return zero, mapped
		}
		last = mapped
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			return zero, contextError(ctx, attempts)
		case <-timer.C:
		}
	}
}

package respcoord

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is every error a call of this package returns, whether the
// coordinator answered it, the transport failed, or the client refused the
// request before sending it. Test it with errors.Is against the sentinels
// below (ErrNotFound, ...), or errors.As into *Error to read the code and
// field. Its cause is the gRPC status error (so status.FromError and
// status.Code see the code), or, for a call the caller's context ended, the
// context's cause.
type Error struct {
	// Code is the gRPC status code this error came from or stands for.
	Code codes.Code
	// Field names the offending field (wire name, e.g. "session_id") of an
	// INVALID_ARGUMENT, refused locally or by the coordinator; empty otherwise.
	Field string
	// Message is the status message (or the local reason).
	Message string
	// Attempts is how many attempts the call made (0 when refused locally).
	Attempts int
	cause    error
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("respcoord: %s: %s: %s", e.Code, e.Field, e.Message)
	}
	return fmt.Sprintf("respcoord: %s: %s", e.Code, e.Message)
}

// Unwrap returns the cause: the gRPC status error, or the caller's context
// cause for a call cancelled by its context.
func (e *Error) Unwrap() error { return e.cause }

// GRPCStatus makes status.FromError and status.Code report this error's code
// and message, whatever its cause.
func (e *Error) GRPCStatus() *status.Status {
	if s, ok := status.FromError(e.cause); ok && s.Code() == e.Code {
		return s
	}
	return status.New(e.Code, e.Message)
}

// Is matches the code sentinels (ErrNotFound, ...): errors.Is(err,
// ErrNotFound) is true for every *Error with code NOT_FOUND.
func (e *Error) Is(target error) bool {
	var s *codeError
	if errors.As(target, &s) {
		return s.matches(e.Code)
	}
	return false
}

// codeError is the type of the code sentinels.
type codeError struct {
	text  string
	codes []codes.Code
}

func (s *codeError) Error() string { return s.text }

func (s *codeError) matches(code codes.Code) bool {
	for _, c := range s.codes {
		if c == code {
			return true
		}
	}
	return false
}

// The code sentinels, one per answer a gateway acts on differently.
var (
	// ErrInvalidArgument: bad input, refused locally or by the coordinator
	// (INVALID_ARGUMENT); Error.Field names the field.
	ErrInvalidArgument error = &codeError{"respcoord: invalid argument", []codes.Code{codes.InvalidArgument}}
	// ErrNotFound: the session does not exist (NOT_FOUND).
	ErrNotFound error = &codeError{"respcoord: session not found", []codes.Code{codes.NotFound}}
	// ErrSessionTerminated: the session was shut down or expired; nothing
	// starts on it any more (FAILED_PRECONDITION).
	ErrSessionTerminated error = &codeError{"respcoord: session terminated", []codes.Code{codes.FailedPrecondition}}
	// ErrPermissionDenied: a known caller outside its token's scope.
	ErrPermissionDenied error = &codeError{"respcoord: permission denied", []codes.Code{codes.PermissionDenied}}
	// ErrUnauthenticated: no token, or one the coordinator does not know.
	ErrUnauthenticated error = &codeError{"respcoord: unauthenticated", []codes.Code{codes.Unauthenticated}}
	// ErrUnavailable: the coordinator could not be reached (after the retries).
	ErrUnavailable error = &codeError{"respcoord: unavailable", []codes.Code{codes.Unavailable}}
	// ErrDeadlineExceeded: the call ran out of time (after the retries).
	ErrDeadlineExceeded error = &codeError{"respcoord: deadline exceeded", []codes.Code{codes.DeadlineExceeded}}
	// ErrResourceExhausted: a coordinator limit (sessions, watchers, calls).
	ErrResourceExhausted error = &codeError{"respcoord: resource exhausted", []codes.Code{codes.ResourceExhausted}}
	// ErrOutOfRange: a watch position the coordinator no longer retains.
	ErrOutOfRange error = &codeError{"respcoord: out of range", []codes.Code{codes.OutOfRange}}
	// ErrAborted: the backend lost a compare-and-set race too often (after the retries).
	ErrAborted error = &codeError{"respcoord: aborted", []codes.Code{codes.Aborted}}
	// ErrCancelled: the call was cancelled, usually by the caller's context
	// (then errors.Is(err, context.Canceled) holds too).
	ErrCancelled error = &codeError{"respcoord: cancelled", []codes.Code{codes.Canceled}}
	// ErrInternal: any other code (UNKNOWN, INTERNAL, UNIMPLEMENTED,
	// DATA_LOSS, ALREADY_EXISTS); Error.Code says which.
	ErrInternal error = &codeError{"respcoord: internal", []codes.Code{codes.Unknown, codes.Internal, codes.Unimplemented, codes.DataLoss, codes.AlreadyExists}}
)

// Local errors, never from the wire.
var (
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("respcoord: client closed")
	// ErrAlreadyFinished: Finish was called a second time on one response.
	ErrAlreadyFinished = errors.New("respcoord: response already finished")
	// ErrStopped matches every *StoppedError.
	ErrStopped = errors.New("respcoord: response stopped")
)

// StoppedError is the cause of a response's context once the response stops
// (context.Cause(ctx) in Run's body): which response, and why.
type StoppedError struct {
	ResponseID uint64
	Reason     StopReason
}

func (e *StoppedError) Error() string {
	return fmt.Sprintf("respcoord: response %d stopped: %s", e.ResponseID, e.Reason)
}

// Is makes errors.Is(err, ErrStopped) true.
func (e *StoppedError) Is(target error) bool { return target == ErrStopped }

// ConfigError is a bad connection setting (target, TLS files, token), found
// by Connect before anything is dialled.
type ConfigError struct {
	// Option names the setting, e.g. "target", "tls.ca", "token".
	Option string
	Reason string
	Err    error
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("respcoord: config: %s: %s", e.Option, e.Reason)
}

func (e *ConfigError) Unwrap() error { return e.Err }

// fieldMessage is how the coordinator words an INVALID_ARGUMENT: "field: reason".
var fieldMessage = regexp.MustCompile(`(?s)^([a-z_][a-z0-9_.]*): (.*)$`)

// fromStatus is the one mapping from a gRPC status to an *Error.
func fromStatus(err error, attempts int) *Error {
	var mine *Error
	if errors.As(err, &mine) {
		return mine
	}
	s, _ := status.FromError(err)
	e := &Error{Code: s.Code(), Message: s.Message(), Attempts: attempts, cause: err}
	if s.Code() == codes.InvalidArgument {
		if m := fieldMessage.FindStringSubmatch(s.Message()); m != nil {
			e.Field, e.Message = m[1], m[2]
		} else {
			e.Field = "request"
		}
	}
	return e
}

// invalidArgument is a request refused locally, worded as the coordinator
// would refuse it; its cause is that status.
func invalidArgument(field, reason string) *Error {
	return &Error{
		Code:    codes.InvalidArgument,
		Field:   field,
		Message: reason,
		cause:   status.Error(codes.InvalidArgument, field+": "+reason),
	}
}

// contextError is a call ended by the caller's context: CANCELLED or
// DEADLINE_EXCEEDED, whose cause is the context's cause, so
// errors.Is(err, context.Canceled) holds.
func contextError(ctx context.Context, attempts int) *Error {
	cause := context.Cause(ctx)
	code := codes.Canceled
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		code = codes.DeadlineExceeded
	}
	return &Error{Code: code, Message: "the caller's context ended the call: " + cause.Error(), Attempts: attempts, cause: cause}
}

package cronoq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors for the failures a caller typically handles, matched with errors.Is against
// any error a Client call or RunWorker returns. Each stands for one gRPC status code; an *Error
// with another code matches none of them.
var (
	// ErrNotFound: the task, pool or dependency named in the call does not exist, or is hidden
	// from the caller's token, which the server deliberately reports the same way (NOT_FOUND).
	ErrNotFound = errors.New("cronoq: not found")
	// ErrTimeout: the call ran out of time (DEADLINE_EXCEEDED). For Wait it means the task is
	// still running: waiting again is the remedy, the task itself is unaffected. These errors
	// also match context.DeadlineExceeded, whichever deadline passed: the context's, Wait's
	// timeout or a limit of the server. ctx.Err() tells whether it was the caller's own.
	ErrTimeout = errors.New("cronoq: timed out")
	// ErrUnavailable: the server cannot be reached, is shutting down or is not the leader
	// (UNAVAILABLE); the same call may succeed later.
	ErrUnavailable = errors.New("cronoq: server unavailable")
	// ErrResourceExhausted: a pool's queue is full or the server is overloaded
	// (RESOURCE_EXHAUSTED); the same call may succeed later.
	ErrResourceExhausted = errors.New("cronoq: resource exhausted")
	// ErrUnauthenticated: the token is missing or not known to the server (UNAUTHENTICATED).
	ErrUnauthenticated = errors.New("cronoq: unauthenticated")
	// ErrPermissionDenied: the token's role or pools do not allow the call (PERMISSION_DENIED).
	ErrPermissionDenied = errors.New("cronoq: permission denied")
)

// sentinel is the one place that maps gRPC codes to the sentinel errors.
func sentinel(code codes.Code) error {
	switch code {
	case codes.NotFound:
		return ErrNotFound
	case codes.DeadlineExceeded:
		return ErrTimeout
	case codes.Unavailable:
		return ErrUnavailable
	case codes.ResourceExhausted:
		return ErrResourceExhausted
	case codes.Unauthenticated:
		return ErrUnauthenticated
	case codes.PermissionDenied:
		return ErrPermissionDenied
	}
	return nil
}

// Error is a failed call: the gRPC status code and the server's message. errors.Is matches it
// against the sentinel error of its code, against context.DeadlineExceeded when it is a
// timeout and against context.Canceled when the caller cancelled the call's context.
type Error struct {
	Code    codes.Code
	Message string
	// ctxErr is the context error the failure also stands for, if any.
	ctxErr error
}

func (e *Error) Error() string {
	return fmt.Sprintf("cronoq: %s: %s", e.Code, e.Message)
}

// Is reports whether target is the sentinel error of e's code.
func (e *Error) Is(target error) bool {
	s := sentinel(e.Code)
	return s != nil && s == target
}

// Unwrap returns the context error the failure also stands for, or nil.
func (e *Error) Unwrap() error { return e.ctxErr }

// GRPCStatus lets status.FromError and status.Code see through an *Error.
func (e *Error) GRPCStatus() *status.Status {
	return status.New(e.Code, e.Message)
}

// Timeout reports whether the call ran out of time: errors.Is(e, ErrTimeout).
func (e *Error) Timeout() bool { return e.Is(ErrTimeout) }

// Retryable reports whether the same call may succeed later unchanged: ErrUnavailable or
// ErrResourceExhausted.
func (e *Error) Retryable() bool { return e.Is(ErrUnavailable) || e.Is(ErrResourceExhausted) }

// NotFound reports whether the named task, pool or dependency does not exist:
// errors.Is(e, ErrNotFound).
func (e *Error) NotFound() bool { return e.Is(ErrNotFound) }

// toError turns the failure of a call made with ctx into an *Error. gRPC statuses do not wrap
// context errors, so they are attached here for errors.Is. A timeout always stands for
// context.DeadlineExceeded: whether the caller's deadline or the server's own bound ended it
// cannot be told reliably, since the server also enforces the caller's deadline and may answer
// just before the context expires locally. Errors that carry no gRPC status (which grpc-go
// does not produce for RPCs) become codes.Unknown so callers always get one type.
func toError(ctx context.Context, err error) *Error {
	s := status.Convert(err)
	e := &Error{Code: s.Code(), Message: s.Message()}
	switch e.Code {
	case codes.DeadlineExceeded:
		e.ctxErr = context.DeadlineExceeded
	case codes.Canceled:
		e.ctxErr = ctx.Err()
	}
	return e
}

// Handler outcomes. A handler returns one of these (possibly wrapped further with %w) to tell
// RunWorker which outcome to report; any other error is a retryable failure.

// permanentError marks a failure that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as a failure that retrying cannot fix: the task ends failed without
// using its remaining attempts. Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// retryAfterError is a retryable failure with a lower bound on the delay before the next
// attempt.
type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfter marks err as a retryable failure whose next attempt must not start sooner than d
// (for example the Retry-After of a rate-limited upstream). The pool's backoff still applies
// when it is longer. RetryAfter(nil, d) returns nil.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{err: err, after: d}
}

// rejectError hands a lease back unrun.
type rejectError struct{ reason string }

func (e *rejectError) Error() string { return "rejected: " + e.reason }

// Reject hands the lease back without running it, so the server offers the same attempt to
// another worker of the pool (no attempt is used). When no other worker can take it, the
// server counts the attempt as a retryable failure.
func Reject(reason string) error {
	if reason == "" {
		reason = "rejected by the handler"
	}
	return &rejectError{reason}
}

// cancelTaskError ends the task as cancelled.
type cancelTaskError struct{ reason string }

func (e *cancelTaskError) Error() string { return "task cancelled by the handler: " + e.reason }

// CancelTask ends the task as cancelled, with no further attempts: for work that has become
// pointless rather than failed. The reason is only for logs; the protocol does not carry it.
func CancelTask(reason string) error {
	return &cancelTaskError{reason}
}

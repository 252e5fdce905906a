package cronoq

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is a failed call: the gRPC status code and the server's message.
type Error struct {
	Code    codes.Code
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("cronoq: %s: %s", e.Code, e.Message)
}

// GRPCStatus lets status.FromError and status.Code see through an *Error.
func (e *Error) GRPCStatus() *status.Status {
	return status.New(e.Code, e.Message)
}

// Timeout reports whether the call ran out of time. For Wait it means the task is still
// running: waiting again is the remedy, the task itself is unaffected.
func (e *Error) Timeout() bool { return e.Code == codes.DeadlineExceeded }

// Retryable reports whether the same call may succeed later unchanged: the server is not the
// leader or is shutting down (UNAVAILABLE), or a queue is full (RESOURCE_EXHAUSTED).
func (e *Error) Retryable() bool {
	return e.Code == codes.Unavailable || e.Code == codes.ResourceExhausted
}

// NotFound reports whether the task, pool or dependency named in the call does not exist (or
// is hidden from the caller's token, which the server deliberately reports the same way).
func (e *Error) NotFound() bool { return e.Code == codes.NotFound }

// toError turns a gRPC failure into an *Error. Errors that carry no gRPC status (which grpc-go
// does not produce for RPCs) become codes.Unknown so callers always get one type.
func toError(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	s, _ := status.FromError(err)
	return &Error{Code: s.Code(), Message: s.Message()}
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

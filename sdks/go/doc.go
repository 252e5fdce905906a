// Package cronoq is the Go client for a cronoq server: it submits, inspects, waits for and
// watches tasks over the cronoq.v1 gRPC API, and runs remote workers with RunWorker.
//
// A Client is cheap to create and safe for concurrent use; its connection is opened lazily by
// gRPC on the first call, so Dial fails only for a malformed target. Calls the SDK does not
// wrap (recurring schedules, snapshots, worker listings) are made with the generated stubs in
// the cronoqpb package over Client.Conn.
//
// Every failed call returns a *Error carrying the gRPC status code and the server's message.
// The failures callers usually act on are matched with errors.Is against sentinel errors, one
// per code: ErrNotFound, ErrTimeout, ErrUnavailable, ErrResourceExhausted, ErrUnauthenticated
// and ErrPermissionDenied. A timeout also matches context.DeadlineExceeded, and a call whose
// context was cancelled matches context.Canceled; errors.As still gives the *Error.
//
//	res, err := c.Wait(ctx, cronoq.ID(id), 30*time.Second)
//	if errors.Is(err, cronoq.ErrTimeout) {
//		// The task is still running; wait again later.
//	}
//
// RunWorker implements worker protocol version 3: it registers for one pool, runs the handler
// for each lease within the granted slots, heartbeats the running leases, reports exactly one
// outcome per lease, follows shard redirects safely and reconnects with backoff.
//
// Tasks carry their W3C trace context in the tags "traceparent" and "tracestate". Submit sets
// them (from Task.Traceparent, or from its context) and, with an OpenTelemetry SDK installed
// as the global TracerProvider and TextMapPropagator, records a "cronoq.submit" span; the
// worker runs each handler in a "cronoq.run" span continuing the task's trace, and
// Lease.Traceparent and Lease.Tracestate return the tags. Without an SDK nothing is recorded
// and no tag is added.
package cronoq

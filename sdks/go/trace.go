package cronoq

import (
	"context"
	"math"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	pb "github.com/synaptiai/cronoq/sdks/go/cronoqpb"
)

// The task tags that carry a task's W3C trace context (https://www.w3.org/TR/trace-context/).
// The server keeps them with the task and hands them to every attempt.
const (
	TagTraceparent = "traceparent"
	TagTracestate  = "tracestate"
)

// Span names and the instrumentation scope of the spans this package records through the
// global OpenTelemetry TracerProvider.
const (
	SpanSubmit = "cronoq.submit"
	SpanRun    = "cronoq.run"
	// TracerName is the instrumentation scope of those spans.
	TracerName = "github.com/synaptiai/cronoq/sdks/go"
)

// tracer is looked up on every call, so that a TracerProvider installed (or replaced) after
// the first call is used. Without an OpenTelemetry SDK it is the API's no-op tracer.
func tracer() trace.Tracer { return otel.GetTracerProvider().Tracer(TracerName) }

// idAttr is a task id as an int64 attribute, or as a string beyond int64's range.
func idAttr(key string, id uint64) attribute.KeyValue {
	if id > math.MaxInt64 {
		return attribute.String(key, strconv.FormatUint(id, 10))
	}
	return attribute.Int64(key, int64(id))
}

// startSubmit starts the cronoq.submit span (a no-op span without an OpenTelemetry SDK) and
// returns the context that carries it and the tags to send: the caller's own traceparent tag wins, then Task.Traceparent, then
// the trace context of the span just started, as the global propagator injects it.
func startSubmit(ctx context.Context, t *Task) (context.Context, trace.Span, map[string]string) {
	ctx, span := tracer().Start(ctx, SpanSubmit,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("cronoq.pool", t.Pool), attribute.String("cronoq.task.kind", t.Kind)))
	if _, ok := t.Tags[TagTraceparent]; ok {
		return ctx, span, t.Tags
	}
	traceparent, tracestate := t.Traceparent, t.Tracestate
	if traceparent == "" {
		carrier := propagation.MapCarrier{}
		otel.GetTextMapPropagator().Inject(ctx, carrier)
		traceparent, tracestate = carrier[TagTraceparent], carrier[TagTracestate]
	}
	if traceparent == "" {
		return ctx, span, t.Tags
	}
	// A copy: the caller's map may be shared between tasks.
	tags := make(map[string]string, len(t.Tags)+2)
	for k, v := range t.Tags {
		tags[k] = v
	}
	tags[TagTraceparent] = traceparent
	if tracestate != "" {
		tags[TagTracestate] = tracestate
	} else {
		delete(tags, TagTracestate)
	}
	return ctx, span, tags
}

// endSpan ends a span, with status ERROR and the error recorded when err is not nil.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(otelcodes.Error, err.Error())
	}
	span.End()
}

// startRun starts the cronoq.run span of one attempt, a child of the trace context in the
// task's tags as the global propagator extracts it, and returns the handler's context, which
// carries the span.
func startRun(ctx context.Context, l *Lease) (context.Context, trace.Span) {
	if tp := l.Traceparent(); tp != "" {
		carrier := propagation.MapCarrier{TagTraceparent: tp}
		if ts := l.Tracestate(); ts != "" {
			carrier[TagTracestate] = ts
		}
		ctx = otel.GetTextMapPropagator().Extract(ctx, carrier)
	}
	attrs := []attribute.KeyValue{
		idAttr("cronoq.task.id", l.TaskID),
		attribute.String("cronoq.task.kind", l.Kind),
		attribute.String("cronoq.pool", l.Pool),
		attribute.Int64("cronoq.attempt", int64(l.Attempt)),
	}
	if l.Priority != 0 {
		attrs = append(attrs, attribute.String("cronoq.priority", l.Priority.String()))
	}
	return tracer().Start(ctx, SpanRun, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}

// endRun sets the attempt's outcome on its span, from the message that reports it (nil when
// the attempt was given up and nothing is reported), and ends the span: status ERROR for a
// failure and for an attempt given up.
func endRun(span trace.Span, msg *pb.WorkerMessage, err, cause error) {
	name, failed := outcomeName(msg)
	span.SetAttributes(attribute.String("cronoq.outcome", name))
	switch {
	case msg == nil:
		if cause == nil {
			cause = ErrDisconnected
		}
		span.SetStatus(otelcodes.Error, cause.Error())
	case failed && err != nil:
		span.RecordError(err)
		span.SetStatus(otelcodes.Error, err.Error())
	case failed:
		span.SetStatus(otelcodes.Error, msg.GetFail().GetMessage())
	}
	span.End()
}

// outcomeName is the cronoq.outcome attribute of the message that reports an attempt:
// succeeded, failed (retryable), failed_permanent, cancelled (CancelTask), rejected (Reject),
// or aborted for none, when the attempt was given up (the server aborted it, or the stream
// ended). failed says whether the attempt failed.
func outcomeName(msg *pb.WorkerMessage) (name string, failed bool) {
	switch m := msg.GetMsg().(type) {
	case *pb.WorkerMessage_Complete:
		return "succeeded", false
	case *pb.WorkerMessage_Fail:
		if m.Fail.GetPermanent() {
			return "failed_permanent", true
		}
		return "failed", true
	case *pb.WorkerMessage_Cancelled:
		return "cancelled", false
	case *pb.WorkerMessage_Nack:
		return "rejected", false
	default:
		return "aborted", true
	}
}

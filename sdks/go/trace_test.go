package cronoq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os/exec"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/synaptiai/cronoq/sdks/go/cronoqpb"
)

const (
	remoteTraceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	remoteTracestate  = "vendor=abc,other=1"
)

// withOTel installs an OpenTelemetry SDK recording into memory and the W3C propagator as the
// globals for the test, and puts no-op ones back after it.
func withOTel(t *testing.T) *tracetest.SpanRecorder {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
		_ = tp.Shutdown(context.Background())
	})
	return rec
}

// fakeTasks is an in-process Tasks server that records the submitted specs.
type fakeTasks struct {
	pb.UnimplementedTasksServer
	mu    sync.Mutex
	specs []*pb.TaskSpec
	fail  bool
}

func (f *fakeTasks) Submit(_ context.Context, r *pb.SubmitRequest) (*pb.SubmitResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return nil, status.Error(codes.ResourceExhausted, "pool is full")
	}
	f.specs = append(f.specs, r.GetTask())
	return &pb.SubmitResponse{Id: uint64(41 + len(f.specs))}, nil
}

func (f *fakeTasks) last(t *testing.T) *pb.TaskSpec {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.specs) == 0 {
		t.Fatal("nothing submitted")
	}
	return f.specs[len(f.specs)-1]
}

func startFakeTasks(t *testing.T) (*fakeTasks, *Client) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	f := &fakeTasks{}
	pb.RegisterTasksServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	c, err := Dial(lis.Addr().String(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return f, c
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func spanNamed(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d ended spans named %s, want 1", len(found), name)
	}
	return found[0]
}

func traceparentOf(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

func TestSubmitWithoutOTelAddsNoTags(t *testing.T) {
	f, c := startFakeTasks(t)
	ctx := testContext(t)
	tags := map[string]string{"a": "b"}
	if _, err := c.Submit(ctx, Task{Pool: "p", Tags: tags}); err != nil {
		t.Fatal(err)
	}
	if got := f.last(t).GetTags(); !maps.Equal(got, tags) {
		t.Errorf("tags %v, want %v", got, tags)
	}
	// A span context in ctx is not enough: without a propagator nothing is injected.
	ctx = trace.ContextWithRemoteSpanContext(ctx, remoteSpanContext(t))
	if _, err := c.Submit(ctx, Task{Pool: "p"}); err != nil {
		t.Fatal(err)
	}
	if got := f.last(t).GetTags(); len(got) != 0 {
		t.Errorf("tags %v, want none", got)
	}
}

func remoteSpanContext(t *testing.T) trace.SpanContext {
	t.Helper()
	ctx := propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": remoteTraceparent, "tracestate": remoteTracestate})
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		t.Fatal("invalid test traceparent")
	}
	return sc
}

func TestSubmitExplicitTraceContext(t *testing.T) {
	f, c := startFakeTasks(t)
	ctx := testContext(t)
	tags := map[string]string{"a": "b"}
	_, err := c.Submit(ctx, Task{Pool: "p", Tags: tags, Traceparent: remoteTraceparent, Tracestate: remoteTracestate})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": "b", TagTraceparent: remoteTraceparent, TagTracestate: remoteTracestate}
	if got := f.last(t).GetTags(); !maps.Equal(got, want) {
		t.Errorf("tags %v, want %v", got, want)
	}
	if len(tags) != 1 {
		t.Errorf("the caller's tags were changed: %v", tags)
	}

	// The explicit context wins over OpenTelemetry's, and the caller's own tag over both.
	withOTel(t)
	if _, err := c.Submit(ctx, Task{Pool: "p", Traceparent: remoteTraceparent}); err != nil {
		t.Fatal(err)
	}
	if got := f.last(t).GetTags(); !maps.Equal(got, map[string]string{TagTraceparent: remoteTraceparent}) {
		t.Errorf("tags %v, want only the explicit traceparent", got)
	}
	own := map[string]string{TagTraceparent: "00-11111111111111111111111111111111-2222222222222222-01"}
	if _, err := c.Submit(ctx, Task{Pool: "p", Tags: own, Traceparent: remoteTraceparent, Tracestate: remoteTracestate}); err != nil {
		t.Fatal(err)
	}
	if got := f.last(t).GetTags(); !maps.Equal(got, own) {
		t.Errorf("tags %v, want the caller's %v", got, own)
	}
}

func TestSubmitSpan(t *testing.T) {
	f, c := startFakeTasks(t)
	rec := withOTel(t)
	ctx, parent := otel.Tracer("test").Start(testContext(t), "caller")
	sub, err := c.Submit(ctx, Task{Pool: "p", Kind: "resize", Tags: map[string]string{"a": "b"}})
	parent.End()
	if err != nil {
		t.Fatal(err)
	}
	span := spanNamed(t, rec, SpanSubmit)
	if span.SpanKind() != trace.SpanKindProducer || span.Parent().SpanID() != parent.SpanContext().SpanID() ||
		span.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("span kind %v, parent %v; want a producer child of %v", span.SpanKind(), span.Parent(), parent.SpanContext())
	}
	a := attrs(span)
	if a["cronoq.pool"].AsString() != "p" || a["cronoq.task.kind"].AsString() != "resize" ||
		a["cronoq.task.id"].AsInt64() != int64(sub.ID) {
		t.Errorf("attributes %v, task %d", a, sub.ID)
	}
	tags := f.last(t).GetTags()
	if tags[TagTraceparent] != traceparentOf(span.SpanContext()) || tags["a"] != "b" {
		t.Errorf("tags %v, want the submit span's traceparent %s", tags, traceparentOf(span.SpanContext()))
	}
	if _, ok := tags[TagTracestate]; ok {
		t.Errorf("an empty tracestate was sent: %v", tags)
	}

	// A failed submit ends its span with status ERROR.
	f.fail = true
	if _, err := c.Submit(testContext(t), Task{Pool: "full"}); err == nil {
		t.Fatal("the submit did not fail")
	}
	var failed sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == SpanSubmit && attrs(s)["cronoq.pool"].AsString() == "full" {
			failed = s
		}
	}
	if failed == nil || failed.Status().Code != otelcodes.Error || failed.Parent().IsValid() {
		t.Errorf("failed submit's span %v", failed)
	}
}

func TestLeaseTraceAccessors(t *testing.T) {
	l := &Lease{Tags: map[string]string{TagTraceparent: remoteTraceparent, TagTracestate: remoteTracestate}}
	if l.Traceparent() != remoteTraceparent || l.Tracestate() != remoteTracestate {
		t.Errorf("Traceparent %q, Tracestate %q", l.Traceparent(), l.Tracestate())
	}
	l = &Lease{}
	if l.Traceparent() != "" || l.Tracestate() != "" {
		t.Errorf("Traceparent %q, Tracestate %q without tags", l.Traceparent(), l.Tracestate())
	}
}

// TestRunSpan hands a fake worker leases with a trace context and checks the spans of their
// attempts and of the handler's own work.
func TestRunSpan(t *testing.T) {
	rec := withOTel(t)
	send := make(chan *pb.ServerMessage, 10)
	got := make(chan *pb.WorkerMessage, 10)
	f := startFake(t, "127.0.0.1", nil, interactive(&pb.Registered{Slots: 2, ProtocolVersion: 3}, send, got))
	type seen struct{ traceparent, tracestate string }
	leases := make(chan seen, 2)
	runFake(t, WorkerOptions{Target: f.addr, Slots: 2}, nil, func(ctx context.Context, l *Lease) ([]byte, error) {
		leases <- seen{l.Traceparent(), l.Tracestate()}
		_, child := otel.Tracer("test").Start(ctx, "handler work")
		child.End()
		if string(l.Payload) == "fail" {
			return nil, Permanent(errors.New("bad input"))
		}
		return l.Payload, nil
	})
	tags := map[string]string{TagTraceparent: remoteTraceparent, TagTracestate: remoteTracestate}
	send <- &pb.ServerMessage{Msg: &pb.ServerMessage_Lease{Lease: &pb.Lease{
		Lease: 1, TaskId: 7, Attempt: 2, Payload: []byte("ok"), Kind: "resize", Pool: "p",
		Priority: pb.Priority_PRIORITY_HIGH, Tags: tags}}}
	if m := next(t, got); m.GetComplete() == nil {
		t.Fatalf("got %v, want a complete", m)
	}
	if s := <-leases; s.traceparent != remoteTraceparent || s.tracestate != remoteTracestate {
		t.Errorf("the handler saw %+v", s)
	}
	run := spanNamed(t, rec, SpanRun)
	remote := remoteSpanContext(t)
	if run.SpanKind() != trace.SpanKindConsumer || run.Parent().SpanID() != remote.SpanID() ||
		run.SpanContext().TraceID() != remote.TraceID() || !run.Parent().IsRemote() ||
		run.SpanContext().TraceState().Get("vendor") != "abc" {
		t.Errorf("run span kind %v, parent %v, context %v", run.SpanKind(), run.Parent(), run.SpanContext())
	}
	want := map[attribute.Key]attribute.Value{
		"cronoq.task.id":   attribute.Int64Value(7),
		"cronoq.task.kind": attribute.StringValue("resize"),
		"cronoq.pool":      attribute.StringValue("p"),
		"cronoq.attempt":   attribute.Int64Value(2),
		"cronoq.priority":  attribute.StringValue("high"),
		"cronoq.outcome":   attribute.StringValue("succeeded"),
	}
	if a := attrs(run); !maps.Equal(a, want) {
		t.Errorf("run span attributes %v, want %v", a, want)
	}
	if run.Status().Code == otelcodes.Error {
		t.Errorf("run span status %v", run.Status())
	}
	child := spanNamed(t, rec, "handler work")
	if child.Parent().SpanID() != run.SpanContext().SpanID() {
		t.Errorf("the handler's span has parent %v, want the run span", child.Parent())
	}

	// A failure: status ERROR; and a task without a trace context starts a trace of its own.
	send <- leaseMsg(2, "fail")
	if m := next(t, got); m.GetFail() == nil {
		t.Fatalf("got %v, want a fail", m)
	}
	if s := <-leases; s.traceparent != "" || s.tracestate != "" {
		t.Errorf("the handler saw %+v without tags", s)
	}
	var failed sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == SpanRun && attrs(s)["cronoq.task.id"].AsInt64() == 2 {
			failed = s
		}
	}
	if failed == nil || failed.Parent().IsValid() || failed.Status().Code != otelcodes.Error ||
		attrs(failed)["cronoq.outcome"].AsString() != "failed_permanent" {
		t.Errorf("failed run span %v", failed)
	}
	if _, ok := attrs(failed)["cronoq.priority"]; ok {
		t.Error("a priority attribute for a lease without one")
	}
}

// TestTraceThroughTheServer submits a task under a span to the real server and checks that
// the attempt's span continues the trace below the submit span.
func TestTraceThroughTheServer(t *testing.T) {
	rec := withOTel(t)
	c := dialShared(t, clientToken)
	ctx := testContext(t)
	seen := make(chan string, 1)
	startWorker(t, WorkerOptions{Pool: "trace"}, nil, func(ctx context.Context, l *Lease) ([]byte, error) {
		seen <- l.Traceparent()
		return nil, nil
	})
	ctx, parent := otel.Tracer("test").Start(ctx, "caller")
	sub, err := c.Submit(ctx, Task{Pool: "trace", Kind: "k"})
	parent.End()
	if err != nil {
		t.Fatal(err)
	}
	if res, err := c.Wait(ctx, ID(sub.ID), patience); err != nil || !res.OK() {
		t.Fatalf("wait: %+v, %v", res, err)
	}
	submit := spanNamed(t, rec, SpanSubmit)
	if tp := <-seen; tp != traceparentOf(submit.SpanContext()) {
		t.Errorf("the worker saw traceparent %q, want the submit span's %q", tp, traceparentOf(submit.SpanContext()))
	}
	run := spanNamed(t, rec, SpanRun)
	if run.Parent().SpanID() != submit.SpanContext().SpanID() || run.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("run span parent %v, want the submit span %v", run.Parent(), submit.SpanContext())
	}
	if a := attrs(run); a["cronoq.task.id"].AsInt64() != int64(sub.ID) || a["cronoq.priority"].AsString() != "normal" ||
		a["cronoq.attempt"].AsInt64() != 1 || a["cronoq.pool"].AsString() != "trace" {
		t.Errorf("run span attributes %v", a)
	}
}

// TestOtelWorkerBuilds builds the cross-language test's program (tests/integration runs it).
func TestOtelWorkerBuilds(t *testing.T) {
	build := exec.Command("go", "build", "-buildvcs=false", "-o", t.TempDir(), "./examples/otelworker")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building examples/otelworker: %v\n%s", err, out)
	}
}

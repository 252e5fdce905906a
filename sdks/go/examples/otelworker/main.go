// Command otelworker serves every kind of task of one pool with OpenTelemetry tracing: each
// attempt runs in the SDK's cronoq.run span, a child of the trace context the task carries in
// its traceparent and tracestate tags, and the handler adds a child span "work" (attribute
// payload.size) and returns the payload as the task's output. Spans go to an OTLP/HTTP
// (protobuf) collector as the standard variables say: OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (default http://localhost:4318), and OTEL_SERVICE_NAME
// (default otelworker). It prints "ready" once registered with the server; SIGTERM or Ctrl-C
// drains the worker, flushes the spans and exits 0.
//
//	otelworker --target http://127.0.0.1:7070 --pool default --token "$CRONOQ_WORKER_TOKEN"
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	cronoq "github.com/synaptiai/cronoq/sdks/go"
)

func main() {
	target := flag.String("target", os.Getenv("CRONOQ_TARGET"), "the server, http://host:port (default $CRONOQ_TARGET)")
	pool := flag.String("pool", "default", "the pool to serve")
	token := flag.String("token", os.Getenv("CRONOQ_WORKER_TOKEN"), "the worker token (default $CRONOQ_WORKER_TOKEN)")
	slots := flag.Int("slots", 4, "attempts run at once")
	flag.Parse()
	if err := run(*target, *pool, *token, *slots); err != nil {
		log.Fatal(err)
	}
}

func run(target, pool, token string, slots int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	tp, err := tracerProvider(ctx)
	if err != nil {
		return err
	}
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})

	logs := slog.NewTextHandler(os.Stderr, nil)
	err = cronoq.RunWorker(ctx, cronoq.WorkerOptions{
		Target: target,
		Pool:   pool,
		Token:  token,
		Slots:  slots,
		Logger: slog.New(&readyOnRegistration{Handler: logs, once: new(sync.Once)}),
	}, work)

	// The simple span processor has exported every ended span already; Shutdown also closes
	// the exporter. Its own context, since ctx has ended on SIGTERM.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if serr := tp.Shutdown(shutdownCtx); serr != nil && err == nil {
		err = fmt.Errorf("flushing the spans: %w", serr)
	}
	return err
}

// tracerProvider exports each span when it ends, over OTLP/HTTP with protobuf, sampling all.
func tracerProvider(ctx context.Context) (*sdktrace.TracerProvider, error) {
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("the OTLP exporter: %w", err)
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override the default name.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "otelworker")),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("the resource: %w", err)
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(exporter)),
		sdktrace.WithResource(res),
	), nil
}

// work runs inside the attempt's cronoq.run span, which ctx carries.
func work(ctx context.Context, l *cronoq.Lease) ([]byte, error) {
	_, span := otel.Tracer("otelworker").Start(ctx, "work")
	defer span.End()
	span.SetAttributes(attribute.Int("payload.size", len(l.Payload)))
	return l.Payload, nil
}

// readyOnRegistration logs through Handler and prints "ready" to stdout the first time the
// worker logs its registration with the server.
type readyOnRegistration struct {
	slog.Handler
	once *sync.Once
}

func (h *readyOnRegistration) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "cronoq worker registered" {
		h.once.Do(func() { fmt.Println("ready") })
	}
	return h.Handler.Handle(ctx, r)
}

func (h *readyOnRegistration) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &readyOnRegistration{Handler: h.Handler.WithAttrs(attrs), once: h.once}
}

func (h *readyOnRegistration) WithGroup(name string) slog.Handler {
	return &readyOnRegistration{Handler: h.Handler.WithGroup(name), once: h.once}
}

package cronoq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"iter"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/synaptiai/cronoq/sdks/go/cronoqpb"
)

// waitMargin is added to a Wait's timeout for the call's own deadline, so the server's answer
// (DEADLINE_EXCEEDED with its own message) normally arrives before the client gives up.
const waitMargin = 5 * time.Second

// Options configures a Client.
type Options struct {
	// Token is sent as "authorization: Bearer <Token>" on every call; empty sends none.
	Token string
	// TLS forces TLS even for an http:// or bare host:port target. An https:// target always
	// uses TLS.
	TLS bool
	// TLSConfig is used for TLS connections (and implies TLS); nil means the system roots.
	TLSConfig *tls.Config
	// DialOptions are passed to grpc.NewClient after the SDK's own options, for example to
	// raise the 4 MiB receive limit for large outputs.
	DialOptions []grpc.DialOption
}

// Client calls the Tasks service of one cronoq server. It is safe for concurrent use.
type Client struct {
	conn  *grpc.ClientConn
	tasks pb.TasksClient
}

// Dial returns a Client for target, which is http://host:port, https://host:port or a plain
// gRPC target such as host:port. No connection is made until the first call.
func Dial(target string, opts Options) (*Client, error) {
	addr, secure := parseTarget(target)
	secure = secure || opts.TLS || opts.TLSConfig != nil
	conn, err := newConn(addr, secure, opts.TLSConfig, opts.Token, opts.DialOptions)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, tasks: pb.NewTasksClient(conn)}, nil
}

// parseTarget strips an http://, https:// or grpc:// scheme and trailing slashes, so the URL
// form users know from the HTTP API works as a gRPC target; https:// asks for TLS.
func parseTarget(target string) (addr string, secure bool) {
	for _, scheme := range []string{"http://", "https://", "grpc://"} {
		if rest, ok := strings.CutPrefix(target, scheme); ok {
			return strings.TrimRight(rest, "/"), scheme == "https://"
		}
	}
	return target, false
}

// bearer attaches the token to every call. It does not require transport security because
// plain http to a local server is a normal setup; the worker's redirect rules guard against
// leaking the token to other hosts.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

func newConn(addr string, secure bool, cfg *tls.Config, token string, extra []grpc.DialOption) (*grpc.ClientConn, error) {
	if addr == "" {
		return nil, errors.New("cronoq: empty target")
	}
	creds := insecure.NewCredentials()
	if secure {
		if cfg == nil {
			cfg = &tls.Config{}
		}
		creds = credentials.NewTLS(cfg)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(token)))
	}
	conn, err := grpc.NewClient(addr, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("cronoq: target %q: %w", addr, err)
	}
	return conn, nil
}

// Conn is the underlying connection, for the generated cronoqpb stubs (Admin calls, batches).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Close closes the connection. Calls in flight fail with codes.Canceled.
func (c *Client) Close() error { return c.conn.Close() }

// Submit submits one task.
//
// The task carries a W3C trace context in its tags "traceparent" and "tracestate": the
// caller's own traceparent tag wins, then Task.Traceparent and Task.Tracestate, then the trace
// context of ctx. With an OpenTelemetry SDK installed (the global TracerProvider and
// TextMapPropagator) Submit records a span "cronoq.submit" (kind producer, attributes
// cronoq.pool, cronoq.task.kind and cronoq.task.id) and the task's trace context is that
// span's, so the attempts' spans hang below it. Without one, no span is recorded and no tag is
// added.
func (c *Client) Submit(ctx context.Context, t Task) (sub Submitted, err error) {
	ctx, span, tags := startSubmit(ctx, &t)
	defer func() { endSpan(span, err) }()
	spec := t.wire()
	spec.Tags = tags
	r, err := c.tasks.Submit(ctx, &pb.SubmitRequest{Task: spec})
	if err != nil {
		return Submitted{}, toError(ctx, err)
	}
	span.SetAttributes(idAttr("cronoq.task.id", r.GetId()))
	return Submitted{ID: r.GetId(), Duplicate: r.GetDuplicate()}, nil
}

// Wait blocks until the task ends and returns how it ended. A positive timeout bounds the
// wait: when it passes first, Wait returns an error matching ErrTimeout (and, like every
// timeout, context.DeadlineExceeded) and the task keeps running. With timeout 0 the server's
// own maximum wait applies.
func (c *Client) Wait(ctx context.Context, ref Ref, timeout time.Duration) (Result, error) {
	req := &pb.WaitRequest{Task: ref.wire()}
	if timeout > 0 {
		req.TimeoutS = seconds(timeout)
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout+waitMargin)
		defer cancel()
	}
	r, err := c.tasks.Wait(ctx, req)
	if err != nil {
		e := toError(ctx, err)
		if e.Timeout() && timeout > 0 {
			e.Message = fmt.Sprintf("task %s is still running after %s", ref, timeout)
		}
		return Result{}, e
	}
	return result(r), nil
}

// Get returns the current state of a task.
func (c *Client) Get(ctx context.Context, ref Ref) (TaskInfo, error) {
	r, err := c.tasks.Get(ctx, &pb.GetRequest{Task: ref.wire()})
	if err != nil {
		return TaskInfo{}, toError(ctx, err)
	}
	return taskInfo(r), nil
}

// Cancel cancels a task. It returns false when the task had already ended.
func (c *Client) Cancel(ctx context.Context, ref Ref) (bool, error) {
	r, err := c.tasks.Cancel(ctx, &pb.CancelRequest{Task: ref.wire()})
	if err != nil {
		return false, toError(ctx, err)
	}
	return r.GetCancelled(), nil
}

// List returns one page of tasks. Pass the page's NextAfter as ListOptions.After to get the
// next one; it is 0 on the last page.
func (c *Client) List(ctx context.Context, opts ListOptions) (TaskPage, error) {
	req := &pb.ListTasksRequest{Pools: opts.Pools, After: opts.After, Limit: opts.Limit}
	for _, s := range opts.Statuses {
		req.Statuses = append(req.Statuses, pb.TaskStatus(s))
	}
	r, err := c.tasks.ListTasks(ctx, req)
	if err != nil {
		return TaskPage{}, toError(ctx, err)
	}
	page := TaskPage{NextAfter: r.GetNextAfter(), UnavailableShards: r.GetUnavailableShards()}
	for _, t := range r.GetTasks() {
		page.Tasks = append(page.Tasks, taskInfo(t))
	}
	return page, nil
}

// Watch streams status events as they happen: only terminal ones unless AllTransitions is
// set. The stream opens when the loop starts and closes when the loop ends. It ends quietly
// when ctx ends or the server closes it normally; any other failure is yielded once as an
// *Error (for example ErrUnavailable on a server shutdown, or codes.DataLoss when the
// consumer fell too far behind) and ends the stream.
//
//	for ev, err := range c.Watch(ctx, cronoq.WatchOptions{Pools: []string{"default"}}) {
//		if err != nil {
//			return err
//		}
//		fmt.Println(ev.ID, ev.Status)
//	}
func (c *Client) Watch(ctx context.Context, opts WatchOptions) iter.Seq2[Event, error] {
	req := &pb.WatchRequest{
		Pools:          opts.Pools,
		Ids:            opts.IDs,
		Keys:           opts.Keys,
		AllTransitions: opts.AllTransitions,
	}
	return func(yield func(Event, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := c.tasks.Watch(ctx, req)
		for err == nil {
			var ev *pb.StatusEvent
			if ev, err = stream.Recv(); err != nil {
				break
			}
			if !yield(Event{
				ID:      ev.GetId(),
				Pool:    ev.GetPool(),
				Key:     ev.GetKey(),
				Status:  Status(ev.GetStatus()),
				Attempt: ev.GetAttempt(),
				At:      time.Unix(0, ev.GetAtUnixNs()),
				Message: ev.GetMessage(),
			}, nil) {
				return
			}
		}
		if err == io.EOF || status.Code(err) == codes.Canceled || ctx.Err() != nil {
			return
		}
		yield(Event{}, toError(ctx, err))
	}
}

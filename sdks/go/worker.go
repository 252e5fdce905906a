package cronoq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/synaptiai/cronoq/sdks/go/cronoqpb"
)

// MaxRedirects is how many shard redirects RunWorker follows in a row before giving up; more
// means the shards disagree about who serves the pool.
const MaxRedirects = 3

const (
	protocolVersion = 3
	// messageOverhead is room left for the rest of a Complete message when checking an output
	// against the server's message limit.
	messageOverhead = 1024
	// endpointKey is the metadata key of a shard refusal naming the pool's shard.
	endpointKey = "cronoq-shard-endpoint"
	// minHeartbeat keeps a tiny lease TTL from turning into a busy loop.
	minHeartbeat = 10 * time.Millisecond
	// outcomeGrace is how long a handler cancelled by the drain timeout may still take to
	// return with an outcome that is reported.
	outcomeGrace = 5 * time.Second
	// closeWait bounds the wait for the server to end the stream after the worker half-closed.
	closeWait = 5 * time.Second
)

// Handler runs one lease. Its context ends when the server aborts the attempt, when the
// connection to the server ends, or when the drain timeout passes; context.Cause says which.
// With an OpenTelemetry SDK installed (the global TracerProvider and TextMapPropagator), the
// context carries the attempt's cronoq.run span, a child of the task's trace context (its
// traceparent and tracestate tags), so spans the handler starts from it are its children.
// It returns the task's output, or an error: see Permanent, RetryAfter, Reject and
// CancelTask. Any other error, and a panic, is a retryable failure.
type Handler func(ctx context.Context, l *Lease) ([]byte, error)

// Lease is one attempt of one task given to this worker.
//
// (TaskID, Attempt) is a fencing token: attempt numbers never repeat for a task, also across
// server failovers, so recording the pair with a side effect lets only the newest attempt
// write.
type Lease struct {
	// ID names the lease in the protocol; it changes with every attempt.
	ID          uint64
	TaskID      uint64
	Attempt     uint32
	Payload     []byte
	ContentType string
	Kind        string
	Key         string
	Pool        string
	Priority    Priority
	Tags        map[string]string
	// Timeout is the per-attempt timeout, 0 when none; the server aborts the attempt then.
	Timeout time.Duration
	// Deadline is the task's soft deadline, zero when none.
	Deadline time.Time
}

// Traceparent is the task's W3C trace context: its tag "traceparent", empty without one. The
// handler's context already carries the cronoq.run span that continues that trace when an
// OpenTelemetry SDK is installed.
func (l *Lease) Traceparent() string { return l.Tags[TagTraceparent] }

// Tracestate is the task's W3C tracestate: its tag "tracestate", empty without one.
func (l *Lease) Tracestate() string { return l.Tags[TagTracestate] }

// Handler context causes, so a handler can tell why it was stopped.
var (
	// ErrAborted: the server abandoned the attempt (timeout, cancellation, lease expiry).
	ErrAborted = errors.New("cronoq: attempt aborted by the server")
	// ErrDisconnected: the stream to the server ended; the server retries the attempt.
	ErrDisconnected = errors.New("cronoq: worker disconnected")
	// ErrDrainTimeout: the worker was stopping and the drain timeout passed.
	ErrDrainTimeout = errors.New("cronoq: drain timeout passed")
)

// WorkerOptions configures RunWorker.
type WorkerOptions struct {
	// Target is the server: http://host:port, https://host:port or host:port.
	Target string
	// Pool is the pool to serve.
	Pool string
	// Slots is how many leases may run at once (default 1); the server may grant fewer.
	Slots int
	// Token is the worker token, sent as a bearer token.
	Token string
	// Name identifies the worker in listings; default: the host name.
	Name string
	// Labels are matched against the labels tasks require.
	Labels map[string]string
	// DrainTimeout is how long running handlers may finish after ctx ends (default 30 s).
	DrainTimeout time.Duration
	// InsecureRedirectHTTP allows following a shard redirect to a plain http:// endpoint on a
	// non-loopback host although that sends the token in clear text.
	InsecureRedirectHTTP bool
	// TLS forces TLS for a target without https://.
	TLS bool
	// TLSConfig is used for TLS connections (and implies TLS); nil means the system roots.
	// Its ServerName is not used for redirect endpoints, since it names Target.
	TLSConfig *tls.Config
	// DialOptions are passed to grpc.NewClient after the SDK's own options.
	DialOptions []grpc.DialOption
	// MinBackoff and MaxBackoff bound the reconnect delay, which doubles after each failed
	// session (defaults 200 ms and 10 s).
	MinBackoff, MaxBackoff time.Duration
	// Logger receives connection events; nil means slog.Default().
	Logger *slog.Logger
}

// RunWorker serves the pool until ctx ends, then drains: it takes no new leases, lets running
// handlers finish for up to DrainTimeout, cancels the rest and returns nil. A handler
// cancelled that way that returns within 5 more seconds still has its outcome reported. The
// connection is re-established with backoff whenever it drops (at once when the server
// announces a leadership change). RunWorker returns an error only for failures retrying
// cannot fix: a rejected token, an unknown pool, an invalid registration or an unsafe or
// endless shard redirect.
func RunWorker(ctx context.Context, opts WorkerOptions, handler Handler) error {
	return runWorker(ctx, opts, handler, time.After)
}

// runWorker is RunWorker with the clock its timing rules (reconnect delays, heartbeats, the
// drain's limits) wait on, so the tests can check those rules without waiting in real time.
func runWorker(ctx context.Context, opts WorkerOptions, handler Handler, after func(time.Duration) <-chan time.Time) error {
	if opts.Target == "" || opts.Pool == "" || handler == nil {
		return errors.New("cronoq: RunWorker needs a Target, a Pool and a handler")
	}
	if opts.Slots < 0 {
		return errors.New("cronoq: Slots must not be negative")
	}
	if opts.Slots == 0 {
		opts.Slots = 1
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 30 * time.Second
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 200 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(10*time.Second, opts.MinBackoff)
	}
	if opts.Name == "" {
		opts.Name, _ = os.Hostname()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	w := &worker{opts: opts, handler: handler, log: opts.Logger.With("pool", opts.Pool), after: after}
	return w.run(ctx)
}

type worker struct {
	opts    WorkerOptions
	handler Handler
	log     *slog.Logger
	after   func(time.Duration) <-chan time.Time // time.After outside the tests
}

// sessionEnd is how one stream ended.
type sessionEnd struct {
	err        error // the stream's gRPC error; nil for a normal end
	header     metadata.MD
	trailer    metadata.MD
	notLeader  bool
	registered bool
}

func (w *worker) run(ctx context.Context) error {
	endpoint := w.opts.Target
	redirects := 0
	delay := w.opts.MinBackoff
	for ctx.Err() == nil {
		end := w.session(ctx, endpoint)
		code := status.Code(end.err)
		if target, ok := redirectTarget(end); ok {
			if ctx.Err() != nil {
				return nil
			}
			if err := w.checkRedirect(endpoint, target, redirects, end.err); err != nil {
				return err
			}
			redirects++
			w.log.Info("cronoq worker redirected", "endpoint", target)
			endpoint = target
			continue
		}
		redirects = 0
		if end.err != nil && fatal(code) {
			return toError(ctx, end.err)
		}
		if ctx.Err() != nil {
			return nil
		}
		if code == codes.Unavailable && endpoint != w.opts.Target {
			endpoint = w.opts.Target
		}
		if end.registered || end.notLeader {
			delay = w.opts.MinBackoff
		}
		wait := delay
		if end.notLeader {
			wait = 0
		}
		w.log.Info("cronoq worker reconnecting", "after", wait, "err", end.err)
		select {
		case <-ctx.Done():
			return nil
		case <-w.after(wait):
		}
		if !end.notLeader {
			delay = min(2*delay, w.opts.MaxBackoff)
		}
	}
	return nil
}

// fatal lists the codes that no retry can fix; FAILED_PRECONDITION arrives here only when it
// was not a redirect.
func fatal(code codes.Code) bool {
	switch code {
	case codes.Unauthenticated, codes.PermissionDenied, codes.NotFound,
		codes.InvalidArgument, codes.Unimplemented, codes.FailedPrecondition:
		return true
	}
	return false
}

// redirectTarget reads a shard refusal: FAILED_PRECONDITION naming the pool's shard endpoint,
// in the initial metadata or else in the trailers.
func redirectTarget(end sessionEnd) (string, bool) {
	if status.Code(end.err) != codes.FailedPrecondition {
		return "", false
	}
	for _, md := range []metadata.MD{end.header, end.trailer} {
		if v := md.Get(endpointKey); len(v) > 0 {
			return v[0], true
		}
	}
	return "", false
}

// checkRedirect applies the safety rules before following a shard redirect: only http(s)
// URLs naming a bare host and port, never from TLS down to plain text, the token over plain
// text only to loopback unless explicitly allowed, and no endless chains.
func (w *worker) checkRedirect(current, target string, redirects int, cause error) error {
	refuse := func(why string) error {
		return &Error{Code: codes.FailedPrecondition, Message: fmt.Sprintf(
			"refusing shard redirect to %q: %s (%s)", target, why, status.Convert(cause).Message())}
	}
	if redirects >= MaxRedirects {
		return refuse(fmt.Sprintf("%d redirects in a row", redirects+1))
	}
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return refuse("not an http:// or https:// endpoint")
	}
	if u.User != nil || u.Host == "" || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" {
		return refuse("not a plain host and port")
	}
	if u.Scheme == "http" {
		if w.secure(current) {
			return refuse("would move from TLS to plain http")
		}
		if w.opts.Token != "" && !loopback(u.Hostname()) {
			if !w.opts.InsecureRedirectHTTP {
				return refuse("would send the token over plain http to another host")
			}
			w.log.Warn("cronoq worker sends its token over plain http", "endpoint", target)
		}
	}
	return nil
}

func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (w *worker) secure(endpoint string) bool {
	_, https := parseTarget(endpoint)
	return https || w.opts.TLS || w.opts.TLSConfig != nil
}

func (w *worker) dial(endpoint string) (*grpc.ClientConn, error) {
	addr, _ := parseTarget(endpoint)
	cfg := w.opts.TLSConfig
	if cfg != nil && endpoint != w.opts.Target {
		cfg = cfg.Clone()
		cfg.ServerName = ""
	}
	return newConn(addr, w.secure(endpoint), cfg, w.opts.Token, w.opts.DialOptions)
}

// session runs one Work stream until it ends. When ctx ends meanwhile, it drains and ends
// the stream itself.
func (w *worker) session(ctx context.Context, endpoint string) sessionEnd {
	conn, err := w.dial(endpoint)
	if err != nil {
		return sessionEnd{err: status.Error(codes.InvalidArgument, err.Error())}
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := pb.NewWorkersClient(conn).Work(sctx)
	if err != nil {
		return sessionEnd{err: err}
	}
	s := &session{
		w:       w,
		ctx:     ctx,
		stream:  stream,
		runs:    make(map[uint64]*run),
		granted: w.opts.Slots,
		over:    make(chan struct{}),
		emptied: make(chan struct{}, 1),
	}
	// A failed send shows up as the stream's error in Recv.
	_ = s.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{
		Pool:            w.opts.Pool,
		Slots:           uint32(w.opts.Slots),
		WorkerName:      w.opts.Name,
		ProtocolVersion: protocolVersion,
		Labels:          w.opts.Labels,
	}}})

	var drainer sync.WaitGroup
	drainer.Go(func() {
		select {
		case <-ctx.Done():
			s.drain(cancel)
		case <-s.over:
		}
	})
	end := s.receive()
	close(s.over)
	s.abandon(ErrDisconnected)
	drainer.Wait()
	if end.err != nil {
		end.header, _ = stream.Header()
		end.trailer = stream.Trailer()
	}
	return end
}

// run is one lease being handled.
type run struct {
	lease  *Lease
	cancel context.CancelCauseFunc
	gone   chan struct{} // closed when the lease leaves the running set
}

// session is the state of one Work stream. mu guards everything below it.
type session struct {
	w      *worker
	ctx    context.Context // RunWorker's: its end starts the drain
	stream grpc.BidiStreamingClient[pb.WorkerMessage, pb.ServerMessage]
	sendMu sync.Mutex // grpc-go streams allow one sender at a time
	over   chan struct{}
	// emptied gets a token whenever the last running lease leaves, for the drain to notice.
	emptied chan struct{}
	// reporting counts outcomes being sent, so the half-close waits for them.
	reporting sync.WaitGroup

	mu         sync.Mutex
	runs       map[uint64]*run
	granted    int
	ttl        time.Duration
	maxMessage int
	registered bool
	draining   bool
	closed     bool // outcomes are no longer reported
}

func (s *session) send(m *pb.WorkerMessage) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.stream.Send(m)
}

func (s *session) receive() sessionEnd {
	var end sessionEnd
	for {
		msg, err := s.stream.Recv()
		if err != nil {
			if err != io.EOF {
				end.err = err
			}
			return end
		}
		switch m := msg.GetMsg().(type) {
		case *pb.ServerMessage_Registered:
			end.registered = true
			s.onRegistered(m.Registered)
		case *pb.ServerMessage_Lease:
			s.lease(m.Lease)
		case *pb.ServerMessage_Abort:
			s.mu.Lock()
			if r, ok := s.runs[m.Abort.GetLease()]; ok {
				// The server already freed the slot; so does the worker, at once.
				s.remove(r)
				r.cancel(fmt.Errorf("%w: %s", ErrAborted, m.Abort.GetReason()))
			}
			s.mu.Unlock()
		case *pb.ServerMessage_Shutdown:
			s.w.log.Info("cronoq worker told to shut down", "reason", m.Shutdown.GetReason(),
				"not_leader", m.Shutdown.GetNotLeader())
			end.notLeader = m.Shutdown.GetNotLeader()
			return end
		}
	}
}

func (s *session) onRegistered(r *pb.Registered) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.registered = true
	if r.GetSlots() > 0 {
		s.granted = int(r.GetSlots())
	}
	if r.LeaseTtlS != nil {
		s.ttl = time.Duration(r.GetLeaseTtlS() * float64(time.Second))
	}
	s.maxMessage = int(r.GetMaxMessageBytes())
	s.w.log.Info("cronoq worker registered", "worker_id", r.GetWorkerId(), "slots", s.granted)
	if s.draining {
		// The drain began before the registration; stop the leases now that it can be asked.
		go s.send(setSlots(0))
	}
}

func setSlots(n uint32) *pb.WorkerMessage {
	return &pb.WorkerMessage{Msg: &pb.WorkerMessage_SetSlots{SetSlots: &pb.SetSlots{Slots: n}}}
}

func nack(lease uint64, reason string) *pb.WorkerMessage {
	return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Nack{Nack: &pb.Nack{Lease: lease, Reason: reason}}}
}

// lease admits or hands back one lease.
func (s *session) lease(m *pb.Lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.draining || s.closed:
		go s.send(nack(m.GetLease(), "worker is stopping"))
		return
	case len(s.runs) >= s.granted:
		go s.send(nack(m.GetLease(), "worker has no free slot"))
		return
	}
	l := &Lease{
		ID:          m.GetLease(),
		TaskID:      m.GetTaskId(),
		Attempt:     m.GetAttempt(),
		Payload:     m.GetPayload(),
		ContentType: m.GetContentType(),
		Kind:        m.GetKind(),
		Key:         m.GetKey(),
		Pool:        m.GetPool(),
		Priority:    Priority(m.GetPriority()),
		Tags:        m.GetTags(),
		Timeout:     time.Duration(m.GetTimeoutS() * float64(time.Second)),
	}
	if m.DeadlineUnixNs != nil {
		l.Deadline = time.Unix(0, m.GetDeadlineUnixNs())
	}
	ttl := s.ttl
	if m.LeaseTtlS != nil {
		ttl = time.Duration(m.GetLeaseTtlS() * float64(time.Second))
	}
	// The handler's context keeps RunWorker's values but not its cancellation: ending ctx
	// drains the worker instead of killing running attempts.
	hctx, cancel := context.WithCancelCause(context.WithoutCancel(s.ctx))
	r := &run{lease: l, cancel: cancel, gone: make(chan struct{})}
	s.runs[l.ID] = r
	go s.heartbeat(r, ttl)
	go s.handle(hctx, r)
}

// heartbeat keeps the lease alive every ttl/3 while it is running: also after the drain
// timeout cancelled its handler, so that an outcome reported within outcomeGrace still finds
// the lease alive.
func (s *session) heartbeat(r *run, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	every := max(ttl/3, minHeartbeat)
	msg := &pb.WorkerMessage{Msg: &pb.WorkerMessage_Heartbeat{Heartbeat: &pb.Heartbeat{Lease: r.lease.ID}}}
	for {
		select {
		case <-r.gone:
			return
		case <-s.w.after(every):
			if s.send(msg) != nil {
				return
			}
		}
	}
}

func (s *session) handle(ctx context.Context, r *run) {
	ctx, span := startRun(ctx, r.lease)
	out, err := s.call(ctx, r.lease)
	cause := context.Cause(ctx)
	s.mu.Lock()
	current := !s.closed && s.runs[r.lease.ID] == r
	if current {
		s.remove(r)
		s.reporting.Add(1)
	}
	maxMessage := s.maxMessage
	s.mu.Unlock()
	r.cancel(context.Canceled)
	if !current {
		// Aborted or abandoned: the server has given the attempt up, nothing to report.
		endRun(span, nil, err, cause)
		return
	}
	defer s.reporting.Done()
	msg := outcome(r.lease.ID, out, err, maxMessage)
	endRun(span, msg, err, cause)
	_ = s.send(msg)
}

// call runs the handler, turning a panic into an error so one bad lease cannot take the
// worker down.
func (s *session) call(ctx context.Context, l *Lease) (out []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.w.log.Error("cronoq handler panicked", "task", l.TaskID, "panic", p)
			out, err = nil, fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return s.w.handler(ctx, l)
}

// outcome is the one message that reports how a lease ended.
func outcome(lease uint64, out []byte, err error, maxMessage int) *pb.WorkerMessage {
	fail := func(msg string, permanent bool, after *float64) *pb.WorkerMessage {
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: &pb.Fail{
			Lease: lease, Message: msg, Permanent: permanent, RetryAfterS: after}}}
	}
	var (
		reject    *rejectError
		cancel    *cancelTaskError
		permanent *permanentError
		retry     *retryAfterError
	)
	switch {
	case err == nil && maxMessage > 0 && len(out)+messageOverhead > maxMessage:
		// The server would refuse the message and the attempt would only time out; failing
		// permanently says why, since a retry would produce the same output.
		return fail(fmt.Sprintf("output of %d bytes exceeds the server's message limit of %d bytes",
			len(out), maxMessage), true, nil)
	case err == nil:
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{Complete: &pb.Complete{Lease: lease, Output: out}}}
	case errors.As(err, &reject):
		return nack(lease, reject.reason)
	case errors.As(err, &cancel):
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Cancelled{Cancelled: &pb.Cancelled{Lease: lease}}}
	case errors.As(err, &permanent):
		return fail(err.Error(), true, nil)
	case errors.As(err, &retry):
		return fail(err.Error(), false, seconds(retry.after))
	default:
		return fail(err.Error(), false, nil)
	}
}

// remove takes a running lease out of the running set, which ends its heartbeats; s.mu must
// be held.
func (s *session) remove(r *run) {
	delete(s.runs, r.lease.ID)
	close(r.gone)
	if len(s.runs) == 0 {
		select {
		case s.emptied <- struct{}{}:
		default:
		}
	}
}

// abandon stops reporting and cancels every running handler: the server fails those attempts
// as retryable when the stream ends.
func (s *session) abandon(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, r := range s.runs {
		s.remove(r)
		r.cancel(cause)
	}
}

// drain stops taking leases, waits for the running ones up to DrainTimeout, cancels the rest
// and gives them outcomeGrace to report, then half-closes and waits for the server to end the
// stream (cancelling it after closeWait).
func (s *session) drain(cancelStream context.CancelFunc) {
	s.mu.Lock()
	s.draining = true
	registered := s.registered
	s.mu.Unlock()
	if registered {
		_ = s.send(setSlots(0))
	}
	if !s.waitEmpty(s.w.opts.DrainTimeout) {
		s.mu.Lock()
		for _, r := range s.runs {
			r.cancel(ErrDrainTimeout)
		}
		s.mu.Unlock()
		s.waitEmpty(outcomeGrace)
	}
	s.abandon(ErrDrainTimeout)
	s.reporting.Wait()
	s.sendMu.Lock()
	_ = s.stream.CloseSend()
	s.sendMu.Unlock()
	select {
	case <-s.over:
	case <-s.w.after(closeWait):
		cancelStream()
	}
}

// waitEmpty waits until no lease runs, the stream ends or d passes; it reports whether the
// running set is empty.
func (s *session) waitEmpty(d time.Duration) bool {
	expired := s.w.after(d)
	for {
		s.mu.Lock()
		n := len(s.runs)
		s.mu.Unlock()
		if n == 0 {
			return true
		}
		select {
		case <-s.emptied:
		case <-s.over:
			return false
		case <-expired:
			return false
		}
	}
}

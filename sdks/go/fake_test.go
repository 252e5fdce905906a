package cronoq

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/synaptiai/cronoq/sdks/go/cronoqpb"
)

// fakeWorkers is an in-process Workers server whose streams are handled by a test function,
// for what the real server cannot be made to do.
type fakeWorkers struct {
	pb.UnimplementedWorkersServer
	work  func(n int32, s pb.Workers_WorkServer) error
	conns atomic.Int32
	addr  string
}

func (f *fakeWorkers) Work(s pb.Workers_WorkServer) error {
	return f.work(f.conns.Add(1), s)
}

func startFake(t *testing.T, host string, creds credentials.TransportCredentials,
	work func(n int32, s pb.Workers_WorkServer) error) *fakeWorkers {
	t.Helper()
	lis, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	srv := grpc.NewServer(opts...)
	f := &fakeWorkers{work: work, addr: lis.Addr().String()}
	pb.RegisterWorkersServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return f
}

var quiet = slog.New(slog.DiscardHandler)

// register reads the worker's register and answers it.
func register(s pb.Workers_WorkServer, r *pb.Registered) error {
	m, err := s.Recv()
	if err != nil {
		return err
	}
	if m.GetRegister() == nil || m.GetRegister().GetProtocolVersion() != protocolVersion {
		return status.Errorf(codes.InvalidArgument, "first message %v", m)
	}
	return s.Send(&pb.ServerMessage{Msg: &pb.ServerMessage_Registered{Registered: r}})
}

func sendLease(s pb.Workers_WorkServer, l *pb.Lease) error {
	return s.Send(&pb.ServerMessage{Msg: &pb.ServerMessage_Lease{Lease: l}})
}

func redirect(s pb.Workers_WorkServer, endpoint string) error {
	s.SetTrailer(metadata.Pairs(endpointKey, endpoint, "cronoq-shard", "other"))
	return status.Error(codes.FailedPrecondition, "pool served by shard other")
}

// runFake runs a worker against target until the handler or the test's stop ends it. A nil
// clk means real time; a nil h completes every lease with "ok".
func runFake(t *testing.T, opts WorkerOptions, clk *fakeClock, h Handler) (<-chan error, context.CancelFunc) {
	t.Helper()
	opts.Pool = "p"
	opts.Logger = quiet
	if h == nil {
		h = func(context.Context, *Lease) ([]byte, error) { return []byte("ok"), nil }
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- runWorker(ctx, opts, h, clk.source()) }()
	return done, cancel
}

// fakeClock stands in for time.After in a worker: the test sees every wait the worker starts
// and decides when it ends, so timing rules are checked without waiting in real time.
type fakeClock struct {
	mu      sync.Mutex
	pending []fakeWait
	started chan struct{} // closed and replaced whenever a wait starts
}

type fakeWait struct {
	d    time.Duration
	fire chan time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{started: make(chan struct{})} }

// source is what the worker waits with: time.After for a nil clock.
func (c *fakeClock) source() func(time.Duration) <-chan time.Time {
	if c == nil {
		return time.After
	}
	return c.after
}

func (c *fakeClock) after(d time.Duration) <-chan time.Time {
	w := fakeWait{d: d, fire: make(chan time.Time, 1)}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending = append(c.pending, w)
	close(c.started)
	c.started = make(chan struct{})
	return w.fire
}

// take waits until the worker has started a wait of d and returns the function that ends it.
// Waits of other lengths stay pending.
func (c *fakeClock) take(t *testing.T, d time.Duration) (fire func()) {
	t.Helper()
	safety := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		started := c.started
		var lengths []time.Duration
		for i, w := range c.pending {
			if w.d == d {
				c.pending = slices.Delete(c.pending, i, i+1)
				c.mu.Unlock()
				return func() { w.fire <- time.Now() }
			}
			lengths = append(lengths, w.d)
		}
		c.mu.Unlock()
		select {
		case <-started:
		case <-safety:
			t.Fatalf("the worker never waited %v; its pending waits: %v", d, lengths)
		}
	}
}

func returned(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("RunWorker did not return")
		return nil
	}
}

// completeOnce registers, hands out one lease and returns the worker's answer to it.
func completeOnce(s pb.Workers_WorkServer, got chan<- *pb.WorkerMessage) error {
	if err := register(s, &pb.Registered{Slots: 1, ProtocolVersion: 3}); err != nil {
		return err
	}
	if err := sendLease(s, &pb.Lease{Lease: 1, TaskId: 7, Attempt: 1}); err != nil {
		return err
	}
	m, err := s.Recv()
	if err != nil {
		return err
	}
	got <- m
	<-s.Context().Done()
	return nil
}

func TestRedirectFollowed(t *testing.T) {
	got := make(chan *pb.WorkerMessage, 1)
	shard := startFake(t, "127.0.0.1", nil, func(_ int32, s pb.Workers_WorkServer) error {
		if md, _ := metadata.FromIncomingContext(s.Context()); strings.Join(md.Get("authorization"), "") != "Bearer tok" {
			return status.Error(codes.Unauthenticated, "no token")
		}
		return completeOnce(s, got)
	})
	entry := startFake(t, "127.0.0.1", nil, func(_ int32, s pb.Workers_WorkServer) error {
		return redirect(s, "http://"+shard.addr+"/")
	})
	_, cancel := runFake(t, WorkerOptions{Target: entry.addr, Token: "tok"}, nil, nil)
	defer cancel()
	select {
	case m := <-got:
		if string(m.GetComplete().GetOutput()) != "ok" {
			t.Fatalf("the shard got %v", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the redirected worker did not complete the lease")
	}
}

func TestRedirectRefused(t *testing.T) {
	for _, tc := range []struct {
		name, endpoint, token string
	}{
		{"not http", "grpc://127.0.0.1:1", ""},
		{"bare host", "127.0.0.1:1", ""},
		{"userinfo", "http://user:pw@127.0.0.1:1", ""},
		{"path", "http://127.0.0.1:1/cronoq", ""},
		{"token to another host", "http://192.0.2.77:7070", "tok"},
		{"token to a lookalike name", "http://localhost.example.com:7070", "tok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			entry := startFake(t, "127.0.0.1", nil, func(_ int32, s pb.Workers_WorkServer) error {
				return redirect(s, tc.endpoint)
			})
			done, _ := runFake(t, WorkerOptions{Target: "http://" + entry.addr, Token: tc.token}, nil, nil)
			e := asError(t, returned(t, done))
			if e.Code != codes.FailedPrecondition || !strings.Contains(e.Message, "refusing shard redirect") {
				t.Fatalf("got %v", e)
			}
			if n := entry.conns.Load(); n != 1 {
				t.Fatalf("%d connections to the entry server", n)
			}
		})
	}
}

func TestRedirectNeverFromTLSToPlain(t *testing.T) {
	cert, pool := selfSigned(t)
	entry := startFake(t, "127.0.0.1", credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}}),
		func(_ int32, s pb.Workers_WorkServer) error { return redirect(s, "http://127.0.0.1:1") })
	done, _ := runFake(t, WorkerOptions{Target: "https://" + entry.addr, TLSConfig: &tls.Config{RootCAs: pool}}, nil, nil)
	e := asError(t, returned(t, done))
	if e.Code != codes.FailedPrecondition || !strings.Contains(e.Message, "TLS") {
		t.Fatalf("got %v", e)
	}
	if entry.conns.Load() != 1 {
		t.Fatal("the TLS entry server was never reached")
	}
}

func TestRedirectInsecureHTTPAllowed(t *testing.T) {
	host := nonLoopbackIP(t)
	got := make(chan *pb.WorkerMessage, 1)
	shard := startFake(t, host, nil, func(_ int32, s pb.Workers_WorkServer) error { return completeOnce(s, got) })
	entry := startFake(t, "127.0.0.1", nil, func(_ int32, s pb.Workers_WorkServer) error {
		return redirect(s, "http://"+shard.addr)
	})
	_, cancel := runFake(t, WorkerOptions{Target: entry.addr, Token: "tok", InsecureRedirectHTTP: true}, nil, nil)
	defer cancel()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the redirect to a non-loopback http endpoint was not followed")
	}
}

func TestRedirectLimit(t *testing.T) {
	var a, b *fakeWorkers
	a = startFake(t, "127.0.0.1", nil, func(_ int32, s pb.Workers_WorkServer) error { return redirect(s, "http://"+b.addr) })
	b = startFake(t, "127.0.0.1", nil, func(_ int32, s pb.Workers_WorkServer) error { return redirect(s, "http://"+a.addr) })
	done, _ := runFake(t, WorkerOptions{Target: a.addr}, nil, nil)
	e := asError(t, returned(t, done))
	if e.Code != codes.FailedPrecondition || !strings.Contains(e.Message, "4 redirects in a row") {
		t.Fatalf("got %v", e)
	}
	if n := a.conns.Load() + b.conns.Load(); n != MaxRedirects+1 {
		t.Fatalf("%d connections, want %d", n, MaxRedirects+1)
	}
}

func TestRedirectUnreachableGoesBackToTarget(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := closed.Addr().String()
	closed.Close()
	got := make(chan *pb.WorkerMessage, 1)
	entry := startFake(t, "127.0.0.1", nil, func(n int32, s pb.Workers_WorkServer) error {
		if n == 1 {
			return redirect(s, "http://"+dead)
		}
		return completeOnce(s, got)
	})
	_, cancel := runFake(t, WorkerOptions{Target: entry.addr, Token: "tok", MinBackoff: 20 * time.Millisecond}, nil, nil)
	defer cancel()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not come back to its target")
	}
}

// shutdown registers, then tells the worker to go, as a leadership change (notLeader) or an
// ordinary server shutdown does.
func shutdown(notLeader bool) func(pb.Workers_WorkServer) error {
	return func(s pb.Workers_WorkServer) error {
		if err := register(s, &pb.Registered{Slots: 1, ProtocolVersion: 3}); err != nil {
			return err
		}
		return s.Send(&pb.ServerMessage{Msg: &pb.ServerMessage_Shutdown{Shutdown: &pb.Shutdown{Reason: "bye", NotLeader: notLeader}}})
	}
}

// unavailable refuses the worker as a standby server does, before any registration.
func unavailable(pb.Workers_WorkServer) error {
	return status.Error(codes.Unavailable, "standby")
}

// TestReconnectDelays follows the reconnect delay through a sequence of sessions: none after a
// leadership change, MinBackoff after a registered session, doubling up to MaxBackoff while
// sessions fail, and back to MinBackoff once one registers again.
func TestReconnectDelays(t *testing.T) {
	const minBackoff, maxBackoff = 100 * time.Millisecond, 300 * time.Millisecond
	steps := []struct {
		name  string
		serve func(pb.Workers_WorkServer) error
		delay time.Duration // before the next connection
	}{
		{"not leader", shutdown(true), 0},
		{"shutdown", shutdown(false), minBackoff},
		{"unavailable", unavailable, 2 * minBackoff},
		{"unavailable again", unavailable, maxBackoff},
		{"unavailable at the cap", unavailable, maxBackoff},
		{"registered again", shutdown(false), minBackoff},
	}
	reconnected := make(chan struct{})
	f := startFake(t, "127.0.0.1", nil, func(n int32, s pb.Workers_WorkServer) error {
		if int(n) <= len(steps) {
			return steps[n-1].serve(s)
		}
		if int(n) == len(steps)+1 {
			close(reconnected)
		}
		<-s.Context().Done()
		return nil
	})
	clk := newFakeClock()
	runFake(t, WorkerOptions{Target: f.addr, MinBackoff: minBackoff, MaxBackoff: maxBackoff}, clk, nil)
	for i, step := range steps {
		fire := clk.take(t, step.delay)
		// The worker is waiting, so it cannot have reconnected yet.
		if n := f.conns.Load(); n != int32(i+1) {
			t.Fatalf("after %q: %d connections before the delay ended, want %d", step.name, n, i+1)
		}
		fire()
	}
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("no reconnect after the last delay")
	}
}

func next(t *testing.T, got <-chan *pb.WorkerMessage) *pb.WorkerMessage {
	t.Helper()
	select {
	case m := <-got:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message from the worker")
		return nil
	}
}

// TestHeartbeats checks that a running lease is heartbeaten once per third of its TTL (the
// registration's, or the lease's own when it has one), but not more often than minHeartbeat.
func TestHeartbeats(t *testing.T) {
	send := make(chan *pb.ServerMessage, 10)
	got := make(chan *pb.WorkerMessage, 10)
	registered, own := 0.3, 0.015
	f := startFake(t, "127.0.0.1", nil, interactive(&pb.Registered{Slots: 1, ProtocolVersion: 3, LeaseTtlS: &registered}, send, got))
	cases := []struct {
		lease *pb.Lease
		every time.Duration
	}{
		{&pb.Lease{Lease: 5, TaskId: 1, Attempt: 1}, 100 * time.Millisecond},
		{&pb.Lease{Lease: 6, TaskId: 2, Attempt: 1, LeaseTtlS: &own}, minHeartbeat},
	}
	finish := map[uint64]chan struct{}{5: make(chan struct{}), 6: make(chan struct{})}
	clk := newFakeClock()
	_, cancel := runFake(t, WorkerOptions{Target: f.addr}, clk, func(_ context.Context, l *Lease) ([]byte, error) {
		<-finish[l.ID]
		return nil, nil
	})
	defer cancel()
	for _, tc := range cases {
		id := tc.lease.GetLease()
		send <- &pb.ServerMessage{Msg: &pb.ServerMessage_Lease{Lease: tc.lease}}
		for range 3 {
			clk.take(t, tc.every)()
			if hb := next(t, got).GetHeartbeat(); hb.GetLease() != id {
				t.Fatalf("lease %d: want a heartbeat, got %v", id, hb)
			}
		}
		close(finish[id])
		if c := next(t, got).GetComplete(); c.GetLease() != id {
			t.Fatalf("lease %d: want its completion, got %v", id, c)
		}
	}
}

// interactive registers with reg, then sends what the test puts on send and forwards what
// the worker sends to got (closed when the worker half-closes).
func interactive(reg *pb.Registered, send <-chan *pb.ServerMessage, got chan<- *pb.WorkerMessage) func(int32, pb.Workers_WorkServer) error {
	return func(_ int32, s pb.Workers_WorkServer) error {
		if err := register(s, reg); err != nil {
			return err
		}
		go func() {
			for m := range send {
				if s.Send(m) != nil {
					return
				}
			}
		}()
		for {
			m, err := s.Recv()
			if err == io.EOF {
				close(got)
				return nil
			}
			if err != nil {
				return err
			}
			got <- m
		}
	}
}

func leaseMsg(id uint64, payload string) *pb.ServerMessage {
	return &pb.ServerMessage{Msg: &pb.ServerMessage_Lease{Lease: &pb.Lease{Lease: id, TaskId: id, Attempt: 1, Payload: []byte(payload)}}}
}

func TestOutcomesOnTheWire(t *testing.T) {
	send := make(chan *pb.ServerMessage, 10)
	got := make(chan *pb.WorkerMessage, 10)
	// One slot granted although the worker asks for four.
	f := startFake(t, "127.0.0.1", nil, interactive(&pb.Registered{Slots: 1, ProtocolVersion: 3, MaxMessageBytes: 4096}, send, got))
	causes := make(chan error, 1)
	_, cancel := runFake(t, WorkerOptions{Target: f.addr, Slots: 4}, nil, func(ctx context.Context, l *Lease) ([]byte, error) {
		switch string(l.Payload) {
		case "big":
			return make([]byte, 4096-messageOverhead+1), nil
		case "fits":
			return make([]byte, 4096-messageOverhead), nil
		case "panic":
			panic("boom")
		case "retry":
			return nil, fmt.Errorf("wrapped: %w", RetryAfter(errors.New("later"), 1500*time.Millisecond))
		case "cancel":
			return nil, CancelTask("obsolete")
		case "block":
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return []byte("after the abort"), nil
		}
		return nil, Reject("")
	})
	defer cancel()

	send <- leaseMsg(1, "big")
	if fl := next(t, got).GetFail(); fl.GetLease() != 1 || !fl.GetPermanent() || !strings.Contains(fl.GetMessage(), "message limit of 4096 bytes") {
		t.Fatalf("oversize output: %v", fl)
	}
	send <- leaseMsg(2, "fits")
	if c := next(t, got).GetComplete(); c.GetLease() != 2 || len(c.GetOutput()) != 4096-messageOverhead {
		t.Fatalf("output at the limit: lease %d, %d bytes", c.GetLease(), len(c.GetOutput()))
	}
	send <- leaseMsg(3, "panic")
	if fl := next(t, got).GetFail(); fl.GetLease() != 3 || fl.GetPermanent() || !strings.Contains(fl.GetMessage(), "boom") {
		t.Fatalf("panic: %v", fl)
	}
	send <- leaseMsg(4, "retry")
	if fl := next(t, got).GetFail(); fl.GetLease() != 4 || fl.GetPermanent() || fl.RetryAfterS == nil ||
		fl.GetRetryAfterS() != 1.5 || fl.GetMessage() != "wrapped: later" {
		t.Fatalf("retry after: %v", fl)
	}
	send <- leaseMsg(5, "reject")
	if n := next(t, got).GetNack(); n.GetLease() != 5 || n.GetReason() != "rejected by the handler" {
		t.Fatalf("reject: %v", n)
	}
	send <- leaseMsg(6, "block")
	send <- leaseMsg(7, "reject")
	if n := next(t, got).GetNack(); n.GetLease() != 7 || n.GetReason() != "worker has no free slot" {
		t.Fatalf("a lease beyond the grant: %v", n)
	}
	send <- &pb.ServerMessage{Msg: &pb.ServerMessage_Abort{Abort: &pb.Abort{Lease: 6, Reason: "attempt timed out"}}}
	if cause := <-causes; !errors.Is(cause, ErrAborted) || !strings.Contains(cause.Error(), "attempt timed out") {
		t.Fatalf("cause after an abort: %v", cause)
	}
	// The aborted lease reports nothing: the next message is about the next lease.
	send <- leaseMsg(8, "cancel")
	if m := next(t, got); m.GetCancelled().GetLease() != 8 {
		t.Fatalf("after the abort: %v", m)
	}
}

func TestDrainOnTheWire(t *testing.T) {
	send := make(chan *pb.ServerMessage, 10)
	got := make(chan *pb.WorkerMessage, 10)
	f := startFake(t, "127.0.0.1", nil, interactive(&pb.Registered{Slots: 3, ProtocolVersion: 3}, send, got))
	const drainTimeout = time.Minute // never waited for in real time: the fake clock ends it
	clk := newFakeClock()
	running := make(chan struct{}, 3)
	finishQuick := make(chan struct{})
	causes := make(chan error, 1)
	// The stubborn handler ignores its context; only the test's end lets it return.
	unblock := make(chan struct{})
	t.Cleanup(func() { close(unblock) })
	done, cancel := runFake(t, WorkerOptions{Target: f.addr, Slots: 3, DrainTimeout: drainTimeout}, clk,
		func(ctx context.Context, l *Lease) ([]byte, error) {
			running <- struct{}{}
			switch string(l.Payload) {
			case "quick":
				<-finishQuick
				return []byte("quick"), nil
			case "in time":
				<-ctx.Done()
				causes <- context.Cause(ctx)
				return []byte("in time"), nil
			}
			<-unblock
			return []byte("too late"), nil
		})
	send <- leaseMsg(1, "quick")
	send <- leaseMsg(2, "in time")
	send <- leaseMsg(3, "stubborn")
	for range 3 {
		<-running
	}
	cancel()
	if m := next(t, got); m.GetSetSlots() == nil || m.GetSetSlots().GetSlots() != 0 {
		t.Fatalf("first message of the drain: %v", m)
	}
	send <- leaseMsg(4, "offered during the drain")
	if n := next(t, got).GetNack(); n.GetLease() != 4 || n.GetReason() != "worker is stopping" {
		t.Fatalf("a lease offered during the drain: %v", n)
	}

	endDrain := clk.take(t, drainTimeout)
	// Within the drain timeout a handler that returns has its outcome reported.
	close(finishQuick)
	if c := next(t, got).GetComplete(); c.GetLease() != 1 || string(c.GetOutput()) != "quick" {
		t.Fatalf("a handler finishing during the drain: %v", c)
	}
	endDrain()
	if cause := <-causes; !errors.Is(cause, ErrDrainTimeout) {
		t.Fatalf("the cause at the drain timeout: %v", cause)
	}
	// A cancelled handler that returns within the grace is still reported.
	if c := next(t, got).GetComplete(); c.GetLease() != 2 || string(c.GetOutput()) != "in time" {
		t.Fatalf("a handler returning within the grace: %v", c)
	}
	clk.take(t, outcomeGrace)()
	// The stubborn one is dropped: the worker half-closes without another message.
	select {
	case m, ok := <-got:
		if ok {
			t.Fatalf("after the grace: %v", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not half-close after the grace")
	}
	if err := returned(t, done); err != nil {
		t.Fatal(err)
	}
}

// TestDrainHeartbeatsUntilOutcome checks that a lease whose handler the drain timeout
// cancelled is still heartbeaten until the handler returns, so that with a short lease TTL
// the lease is alive when its outcome is reported within the grace.
func TestDrainHeartbeatsUntilOutcome(t *testing.T) {
	send := make(chan *pb.ServerMessage, 10)
	got := make(chan *pb.WorkerMessage, 10)
	ttl := 0.9
	f := startFake(t, "127.0.0.1", nil, interactive(&pb.Registered{Slots: 1, ProtocolVersion: 3, LeaseTtlS: &ttl}, send, got))
	const drainTimeout = time.Minute // never waited for in real time: the fake clock ends it
	clk := newFakeClock()
	running := make(chan struct{})
	causes := make(chan error, 1)
	finish := make(chan struct{})
	done, cancel := runFake(t, WorkerOptions{Target: f.addr, DrainTimeout: drainTimeout}, clk,
		func(ctx context.Context, l *Lease) ([]byte, error) {
			close(running)
			<-ctx.Done()
			causes <- context.Cause(ctx)
			<-finish
			return []byte("late"), nil
		})
	send <- leaseMsg(1, "slow")
	<-running
	cancel()
	if m := next(t, got); m.GetSetSlots() == nil {
		t.Fatalf("first message of the drain: %v", m)
	}
	clk.take(t, drainTimeout)()
	if cause := <-causes; !errors.Is(cause, ErrDrainTimeout) {
		t.Fatalf("the cause at the drain timeout: %v", cause)
	}
	for range 3 {
		clk.take(t, 300*time.Millisecond)()
		if hb := next(t, got).GetHeartbeat(); hb.GetLease() != 1 {
			t.Fatalf("after the drain timeout: want a heartbeat, got %v", hb)
		}
	}
	close(finish)
	if c := next(t, got).GetComplete(); c.GetLease() != 1 || string(c.GetOutput()) != "late" {
		t.Fatalf("the outcome after the drain timeout: %v", c)
	}
	if err := returned(t, done); err != nil {
		t.Fatal(err)
	}
}

func TestFatalFromServer(t *testing.T) {
	f := startFake(t, "127.0.0.1", nil, func(int32, pb.Workers_WorkServer) error {
		return status.Error(codes.Unimplemented, "no workers here")
	})
	done, _ := runFake(t, WorkerOptions{Target: f.addr}, nil, nil)
	if e := asError(t, returned(t, done)); e.Code != codes.Unimplemented {
		t.Fatalf("got %v", e)
	}
}

// selfSigned makes a certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "cronoq test"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

func nonLoopbackIP(t *testing.T) string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	t.Skip("no non-loopback IPv4 address to listen on")
	return ""
}

package cronoq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/synaptiai/cronoq/sdks/go/cronoqpb"
)

// startWorker runs RunWorker in the background, on clk (nil: real time), and returns a stop
// function that ends its context and returns RunWorker's result.
func startWorker(t *testing.T, opts WorkerOptions, clk *fakeClock, h Handler) (stop func() error) {
	t.Helper()
	if opts.Target == "" {
		opts.Target = "http://" + sharedServer(t).addr
	}
	if opts.Token == "" {
		opts.Token = workerToken
	}
	opts.Logger = quiet
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runWorker(ctx, opts, h, clk.source()) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(patience):
				err = errors.New("RunWorker did not return")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func TestWorkerOutcomes(t *testing.T) {
	c := dialShared(t, clientToken)
	ctx := testContext(t)
	var lease atomic.Pointer[Lease]
	stop := startWorker(t, WorkerOptions{Pool: "outcomes", Slots: 8, Name: "go-test"}, nil,
		func(ctx context.Context, l *Lease) ([]byte, error) {
			switch string(l.Payload) {
			case "ok":
				lease.Store(l)
				return []byte("done"), nil
			case "permanent":
				return nil, Permanent(errors.New("bad input"))
			case "retry-after":
				if l.Attempt == 1 {
					return nil, RetryAfter(errors.New("rate limited"), 700*time.Millisecond)
				}
				return []byte(fmt.Sprint("attempt ", l.Attempt)), nil
			case "cancel":
				return nil, CancelTask("no longer needed")
			case "panic":
				if l.Attempt == 1 {
					panic("boom")
				}
				return []byte("recovered"), nil
			case "error":
				return nil, errors.New("always broken")
			case "slow":
				// The work outlasts the pool's 1 s lease TTL: only heartbeats keep the lease. An
				// expired lease would end the context, and the attempt, before the work is done.
				select {
				case <-ctx.Done():
					return nil, context.Cause(ctx)
				case <-time.After(1500 * time.Millisecond):
					return []byte("slow"), nil
				}
			case "big":
				return bytes.Repeat([]byte("x"), 300_000), nil
			case "reject":
				return nil, Reject("not for me")
			}
			return nil, Permanent(fmt.Errorf("unexpected payload %q", l.Payload))
		})

	cases := []struct {
		payload  string
		task     Task
		status   Status
		attempt  uint32
		output   string
		message  string
		minDelay time.Duration
	}{
		{payload: "ok", status: Succeeded, attempt: 1, output: "done"},
		{payload: "permanent", status: Failed, attempt: 1, message: "bad input"},
		{payload: "retry-after", status: Succeeded, attempt: 2, output: "attempt 2", minDelay: 600 * time.Millisecond},
		{payload: "cancel", status: Cancelled, attempt: 1},
		{payload: "panic", status: Succeeded, attempt: 2, output: "recovered"},
		{payload: "error", task: Task{MaxAttempts: 2}, status: DeadLettered, attempt: 2, message: "always broken"},
		{payload: "slow", status: Succeeded, attempt: 1, output: "slow"},
		{payload: "big", status: Failed, attempt: 1, message: "message limit"},
		// The only worker hands it back each time, so every attempt fails as retryable.
		{payload: "reject", status: DeadLettered, attempt: 3},
	}
	var ids []uint64
	for _, tc := range cases {
		task := tc.task
		task.Pool, task.Payload, task.Kind = "outcomes", []byte(tc.payload), "test"
		task.Tags = map[string]string{"case": tc.payload}
		task.Timeout = 10 * time.Second
		sub, err := c.Submit(ctx, task)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sub.ID)
	}
	for i, tc := range cases {
		res, err := c.Wait(ctx, ID(ids[i]), patience)
		if err != nil {
			t.Fatalf("%s: %v", tc.payload, err)
		}
		info, err := c.Get(ctx, ID(ids[i]))
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != tc.status || info.Attempt != tc.attempt || string(res.Output) != tc.output ||
			!strings.Contains(res.Message, tc.message) {
			t.Errorf("%s: result %+v, attempt %d; want %v on attempt %d with output %q, message ~%q",
				tc.payload, res, info.Attempt, tc.status, tc.attempt, tc.output, tc.message)
		}
		// Both times are the server's: the delay it enforced, however slowly the test runs.
		if d := info.Finished.Sub(info.Created); tc.minDelay > 0 && d < tc.minDelay {
			t.Errorf("%s: finished %v after its creation, want at least %v", tc.payload, d, tc.minDelay)
		}
	}
	l := lease.Load()
	if l == nil || l.Pool != "outcomes" || l.Kind != "test" || l.Tags["case"] != "ok" ||
		l.Timeout != 10*time.Second || l.Attempt != 1 || l.Priority != Normal || l.TaskID != ids[0] {
		t.Errorf("lease %+v", l)
	}
	if err := stop(); err != nil {
		t.Fatalf("RunWorker: %v", err)
	}
}

func TestWorkerSlots(t *testing.T) {
	c := dialShared(t, clientToken)
	ctx := testContext(t)
	var running, peak atomic.Int32
	entered := make(chan struct{}, 6)
	release := make(chan struct{})
	// The pool's max is 2, so the grant is 2 although the worker asks for 5.
	startWorker(t, WorkerOptions{Pool: "slots", Slots: 5}, nil, func(ctx context.Context, l *Lease) ([]byte, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		entered <- struct{}{}
		<-release
		return nil, nil
	})
	var ids []uint64
	for range 6 {
		sub, err := c.Submit(ctx, Task{Pool: "slots"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sub.ID)
	}
	// Two handlers hold their leases; the other tasks must wait for a free slot.
	for range 2 {
		select {
		case <-entered:
		case <-ctx.Done():
			t.Fatal("two handlers did not start")
		}
	}
	page, err := c.List(ctx, ListOptions{Pools: []string{"slots"}, Statuses: []Status{Running}})
	if err != nil || len(page.Tasks) != 2 {
		t.Fatalf("running tasks while two handlers are held: %+v, %v", page.Tasks, err)
	}
	close(release)
	for _, id := range ids {
		res, err := c.Wait(ctx, ID(id), patience)
		if err != nil || !res.OK() {
			t.Fatalf("task %d: %+v, %v", id, res, err)
		}
	}
	if p := peak.Load(); p != 2 {
		t.Fatalf("at most %d handlers ran at once, want 2", p)
	}
}

func TestWorkerAbortOnCancel(t *testing.T) {
	c := dialShared(t, clientToken)
	admin := pb.NewAdminClient(dialShared(t, adminToken).Conn())
	ctx := testContext(t)
	entered := make(chan struct{})
	causes := make(chan error, 1)
	stop := startWorker(t, WorkerOptions{Pool: "abort"}, nil, func(ctx context.Context, l *Lease) ([]byte, error) {
		close(entered)
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return []byte("too late"), nil
	})
	before, err := admin.Snapshot(ctx, &pb.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := c.Submit(ctx, Task{Pool: "abort"})
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	if ok, err := c.Cancel(ctx, ID(sub.ID)); err != nil || !ok {
		t.Fatalf("Cancel = %v, %v", ok, err)
	}
	select {
	case cause := <-causes:
		if !errors.Is(cause, ErrAborted) {
			t.Fatalf("the handler's context ended with %v, want ErrAborted", cause)
		}
	case <-ctx.Done():
		t.Fatal("the handler's context did not end")
	}
	// Once RunWorker returned, whatever the worker sent has reached the server: it ended the
	// stream only after reading the rest of it.
	if err := stop(); err != nil {
		t.Fatalf("RunWorker: %v", err)
	}
	after, err := admin.Snapshot(ctx, &pb.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	// An outcome sent after the abort would be counted as stale by the server.
	if b, a := before.GetTotals().GetStaleCompletions(), after.GetTotals().GetStaleCompletions(); a != b {
		t.Fatalf("stale completions went from %d to %d: the aborted lease was reported", b, a)
	}
	if res, err := c.Wait(ctx, ID(sub.ID), patience); err != nil || res.Status != Cancelled {
		t.Fatalf("task: %+v, %v", res, err)
	}
}

func TestWorkerDrain(t *testing.T) {
	c := dialShared(t, clientToken)
	ctx := testContext(t)
	const drainTimeout = time.Hour // ended by the fake clock, not waited for
	clk := newFakeClock()
	entered := make(chan string, 2)
	finishQuick := make(chan struct{})
	stop := startWorker(t, WorkerOptions{Pool: "drain", Slots: 2, DrainTimeout: drainTimeout}, clk,
		func(ctx context.Context, l *Lease) ([]byte, error) {
			entered <- string(l.Payload)
			if string(l.Payload) == "quick" {
				<-finishQuick
				return []byte("finished"), nil
			}
			// Runs until the drain timeout cancels it, then still reports in time.
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), ErrDrainTimeout) {
				return nil, Permanent(fmt.Errorf("cause %v", context.Cause(ctx)))
			}
			return []byte("cut short"), nil
		})
	quick, err := c.Submit(ctx, Task{Pool: "drain", Payload: []byte("quick")})
	if err != nil {
		t.Fatal(err)
	}
	long, err := c.Submit(ctx, Task{Pool: "drain", Payload: []byte("long")})
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	<-entered
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// The drain has begun once it waits for the drain timeout; quick finishes within it.
	endDrain := clk.take(t, drainTimeout)
	close(finishQuick)
	res, err := c.Wait(ctx, ID(quick.ID), patience)
	if err != nil || string(res.Output) != "finished" {
		t.Fatalf("the task finishing during the drain: %+v, %v", res, err)
	}
	endDrain()
	if err := <-stopped; err != nil {
		t.Fatalf("RunWorker: %v", err)
	}
	res, err = c.Wait(ctx, ID(long.ID), patience)
	if err != nil || string(res.Output) != "cut short" {
		t.Fatalf("the task cut short by the drain timeout: %+v, %v", res, err)
	}
}

func TestWorkerFatal(t *testing.T) {
	ctx := testContext(t)
	target := "http://" + sharedServer(t).addr
	noop := func(context.Context, *Lease) ([]byte, error) { return nil, nil }
	for _, tc := range []struct {
		opts WorkerOptions
		code codes.Code
		is   error
	}{
		{WorkerOptions{Target: target, Pool: "no-such-pool", Token: workerToken}, codes.NotFound, ErrNotFound},
		{WorkerOptions{Target: target, Pool: "default", Token: "wrong-token-for-the-go-sdk-tests-000"}, codes.Unauthenticated, ErrUnauthenticated},
		{WorkerOptions{Target: target, Pool: "default", Token: clientToken}, codes.PermissionDenied, ErrPermissionDenied},
	} {
		err := RunWorker(ctx, tc.opts, noop)
		if e := asError(t, err); e.Code != tc.code || !errors.Is(err, tc.is) {
			t.Errorf("pool %q: %v, want %v (%v)", tc.opts.Pool, err, tc.code, tc.is)
		}
	}
}

func TestWorkerReconnectsAfterRestart(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	addr := srv.addr
	t.Cleanup(func() { srv.kill() })
	ctx := testContext(t)
	startWorker(t, WorkerOptions{Target: "http://" + addr, Pool: "restart", MinBackoff: 50 * time.Millisecond}, nil,
		func(ctx context.Context, l *Lease) ([]byte, error) { return l.Payload, nil })

	for round, payload := range []string{"before", "after"} {
		if round == 1 {
			srv.kill()
			srv = startServer(t, addr)
		}
		c, err := Dial(addr, Options{Token: clientToken})
		if err != nil {
			t.Fatal(err)
		}
		sub, err := c.Submit(ctx, Task{Pool: "restart", Payload: []byte(payload)})
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Wait(ctx, ID(sub.ID), patience)
		c.Close()
		if err != nil || string(res.Output) != payload {
			t.Fatalf("%s the restart: %+v, %v", payload, res, err)
		}
	}
}

package cronoq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func asError(t *testing.T, err error) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want a *cronoq.Error, got %T: %v", err, err)
	}
	return e
}

func TestSubmitGetWaitCancel(t *testing.T) {
	c := dialShared(t, clientToken)
	ctx := testContext(t)

	sub, err := c.Submit(ctx, Task{Payload: []byte(`{"to":"ada"}`), ContentType: "application/json",
		Pool: "idle", Key: "welcome-ada", Kind: "mail", Priority: High, Tags: map[string]string{"a": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Submit(ctx, Task{Pool: "idle", Key: "welcome-ada"})
	if err != nil || !again.Duplicate || again.ID != sub.ID {
		t.Fatalf("resubmitting the key: %+v, %v; want a duplicate of %d", again, err, sub.ID)
	}

	for _, ref := range []Ref{ID(sub.ID), Key("welcome-ada")} {
		info, err := c.Get(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if info.ID != sub.ID || info.Status != Ready || info.Pool != "idle" || info.Kind != "mail" ||
			info.Priority != High || info.Created.IsZero() || info.Status.Done() {
			t.Fatalf("Get(%v) = %+v", ref, info)
		}
	}

	// No worker serves the pool, so the task is still queued when the server's wait ends.
	_, err = c.Wait(ctx, ID(sub.ID), 300*time.Millisecond)
	if e := asError(t, err); !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) ||
		!e.Timeout() || e.Retryable() || !strings.Contains(e.Message, "still running") {
		t.Fatalf("Wait on a queued task: %v, want ErrTimeout", err)
	}

	ok, err := c.Cancel(ctx, Key("welcome-ada"))
	if err != nil || !ok {
		t.Fatalf("Cancel = %v, %v", ok, err)
	}
	res, err := c.Wait(ctx, ID(sub.ID), patience)
	if err != nil || res.Status != Cancelled || res.OK() || !res.Status.Done() || res.Output != nil {
		t.Fatalf("Wait after Cancel = %+v, %v", res, err)
	}
	if ok, err := c.Cancel(ctx, ID(sub.ID)); err != nil || ok {
		t.Fatalf("second Cancel = %v, %v; want false", ok, err)
	}
	if got := Cancelled.String(); got != "cancelled" {
		t.Fatalf("Cancelled.String() = %q", got)
	}
}

func TestErrors(t *testing.T) {
	c := dialShared(t, clientToken)
	ctx := testContext(t)

	_, err := c.Get(ctx, ID(987654321))
	if e := asError(t, err); !errors.Is(err, ErrNotFound) || !e.NotFound() || e.Code != codes.NotFound {
		t.Fatalf("Get of an unknown task: %v, want ErrNotFound", err)
	}
	_, err = c.Submit(ctx, Task{Pool: "no-such-pool"})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("Submit to an unknown pool: %v, want ErrNotFound", err)
	}
	_, err = c.Submit(ctx, Task{Pool: "idle", After: []Dep{{Ref: Key("never-submitted")}}})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("Submit with an unknown dependency: %v, want ErrNotFound", err)
	}

	// The pool holds one pending task and rejects the next.
	if _, err := c.Submit(ctx, Task{Pool: "full"}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Submit(ctx, Task{Pool: "full"})
	if e := asError(t, err); !errors.Is(err, ErrResourceExhausted) || !e.Retryable() {
		t.Fatalf("Submit to a full pool: %v, want ErrResourceExhausted", err)
	}

	bad, err := Dial(sharedServer(t).addr, Options{Token: "not-a-valid-token-at-all-0000000000"})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	_, err = bad.Get(ctx, ID(1))
	if e := asError(t, err); !errors.Is(err, ErrUnauthenticated) || e.Retryable() {
		t.Fatalf("bad token: %v, want ErrUnauthenticated", err)
	}
	if _, err := Dial("", Options{}); err == nil {
		t.Fatal("Dial of an empty target succeeded")
	}
}

// TestWaitEndedByTheContext: a wait cut off by the caller's deadline is a timeout matching
// context.DeadlineExceeded, and one whose context was cancelled matches context.Canceled only.
func TestWaitEndedByTheContext(t *testing.T) {
	c := dialShared(t, clientToken)
	ctx := testContext(t)
	sub, err := c.Submit(ctx, Task{Pool: "idle"})
	if err != nil {
		t.Fatal(err)
	}
	// No worker serves the pool and the server would wait for minutes: only the deadline ends it.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = c.Wait(short, ID(sub.ID), 0)
	if e := asError(t, err); !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) ||
		e.Code != codes.DeadlineExceeded {
		t.Fatalf("Wait past the context's deadline: %v, want ErrTimeout and context.DeadlineExceeded", err)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = c.Wait(cancelled, ID(sub.ID), time.Minute)
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with a cancelled context: %v, want context.Canceled only", err)
	}
	if _, err := c.Cancel(ctx, ID(sub.ID)); err != nil {
		t.Fatal(err)
	}
}

// TestUnavailableWhenTheServerStopped: calls to a server that is gone fail with ErrUnavailable.
func TestUnavailableWhenTheServerStopped(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	t.Cleanup(srv.kill)
	ctx := testContext(t)
	c, err := Dial(srv.addr, Options{Token: clientToken})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub, err := c.Submit(ctx, Task{Pool: "idle"})
	if err != nil {
		t.Fatal(err)
	}
	srv.kill()
	_, err = c.Get(ctx, ID(sub.ID))
	if e := asError(t, err); !errors.Is(err, ErrUnavailable) || !e.Retryable() || errors.Is(err, ErrTimeout) {
		t.Fatalf("Get from a stopped server: %v, want ErrUnavailable", err)
	}
}

// TestSentinelMapping checks the code-to-sentinel mapping on every code, also through
// wrapping, and that errors.As still finds the *Error.
func TestSentinelMapping(t *testing.T) {
	sentinels := map[codes.Code]error{
		codes.NotFound:          ErrNotFound,
		codes.DeadlineExceeded:  ErrTimeout,
		codes.Unavailable:       ErrUnavailable,
		codes.ResourceExhausted: ErrResourceExhausted,
		codes.Unauthenticated:   ErrUnauthenticated,
		codes.PermissionDenied:  ErrPermissionDenied,
	}
	for code := codes.Canceled; code <= codes.Unauthenticated; code++ {
		err := fmt.Errorf("submitting: %w", toError(context.Background(), status.Error(code, "msg")))
		for other, s := range sentinels {
			if got := errors.Is(err, s); got != (other == code) {
				t.Errorf("%v: errors.Is(err, %v) = %v", code, s, got)
			}
		}
		if e := asError(t, err); e.Code != code || e.Message != "msg" || status.Code(err) != code {
			t.Errorf("%v: errors.As gives %+v, status.Code %v", code, e, status.Code(err))
		}
		if got := errors.Is(err, context.DeadlineExceeded); got != (code == codes.DeadlineExceeded) {
			t.Errorf("%v: errors.Is(err, context.DeadlineExceeded) = %v", code, got)
		}
		if errors.Is(err, context.Canceled) {
			t.Errorf("%v: matches context.Canceled although no context was cancelled", code)
		}
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := toError(done, status.Error(codes.Canceled, "stop")); !errors.Is(err, context.Canceled) {
		t.Errorf("CANCELLED with a cancelled context: %v, want context.Canceled", err)
	}
	// The answer's code decides, not a context that ended meanwhile.
	if err := toError(done, status.Error(codes.NotFound, "gone")); errors.Is(err, context.Canceled) {
		t.Errorf("a NOT_FOUND answer matches context.Canceled: %v", err)
	}
	if err := toError(done, errors.New("no status")); err.Code != codes.Unknown || errors.Is(err, ErrTimeout) {
		t.Errorf("an error without a status: %+v", err)
	}
}

func TestListPaging(t *testing.T) {
	c := dialShared(t, clientToken)
	ctx := testContext(t)
	var want []uint64
	for i := range 5 {
		sub, err := c.Submit(ctx, Task{Pool: "list", Kind: fmt.Sprint("k", i)})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, sub.ID)
	}
	var got []uint64
	opts := ListOptions{Pools: []string{"list"}, Statuses: []Status{Ready}, Limit: 2}
	for pages := 1; ; pages++ {
		page, err := c.List(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Tasks) > 2 || len(page.UnavailableShards) != 0 {
			t.Fatalf("page %+v", page)
		}
		for _, info := range page.Tasks {
			got = append(got, info.ID)
		}
		if page.NextAfter == 0 {
			break
		}
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		opts.After = page.NextAfter
	}
	if !slices.Equal(got, want) {
		t.Fatalf("listed %v, submitted %v", got, want)
	}
	page, err := c.List(ctx, ListOptions{Pools: []string{"list"}, Statuses: []Status{Succeeded}})
	if err != nil || len(page.Tasks) != 0 || page.NextAfter != 0 {
		t.Fatalf("filter by status: %+v, %v", page, err)
	}
}

func TestWatch(t *testing.T) {
	c := dialShared(t, clientToken)
	ctx := testContext(t)
	events := make(chan Event, 64)
	go func() {
		defer close(events)
		for ev, err := range c.Watch(ctx, WatchOptions{Pools: []string{"idle"}, AllTransitions: true}) {
			if err != nil {
				t.Errorf("Watch: %v", err)
				return
			}
			events <- ev
		}
	}()
	// The server subscribes asynchronously and says nothing until an event matches, so probe
	// tasks are submitted until one is seen: from then on the watch is live.
	probes := map[uint64]bool{}
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for live := false; !live; {
		probe, err := c.Submit(ctx, Task{Pool: "idle", Kind: "probe"})
		if err != nil {
			t.Fatal(err)
		}
		probes[probe.ID] = true
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("the watch ended early")
			}
			live = probes[ev.ID]
		case <-poll.C:
		case <-ctx.Done():
			t.Fatal("the watch never saw a probe")
		}
	}
	sub, err := c.Submit(ctx, Task{Pool: "idle", Key: "watched"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, ID(sub.ID)); err != nil {
		t.Fatal(err)
	}
	var seen []Status
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("the watch ended early")
			}
			if probes[ev.ID] {
				continue
			}
			if ev.ID != sub.ID || ev.Key != "watched" || ev.Pool != "idle" || ev.At.IsZero() {
				t.Fatalf("event %+v", ev)
			}
			seen = append(seen, ev.Status)
			if ev.Status == Cancelled {
				if len(seen) < 2 {
					t.Fatalf("statuses %v: want the transitions before the cancellation too", seen)
				}
				return
			}
		case <-ctx.Done():
			t.Fatalf("no cancelled event; saw %v", seen)
		}
	}
}

package cronoq

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
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
	ctx := testContext(t, 20*time.Second)

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

	start := time.Now()
	_, err = c.Wait(ctx, ID(sub.ID), 300*time.Millisecond)
	if e := asError(t, err); !e.Timeout() || e.Retryable() {
		t.Fatalf("Wait on a queued task: %v, want a timeout", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 3*time.Second {
		t.Fatalf("Wait took %v for a 300ms timeout", d)
	}

	ok, err := c.Cancel(ctx, Key("welcome-ada"))
	if err != nil || !ok {
		t.Fatalf("Cancel = %v, %v", ok, err)
	}
	res, err := c.Wait(ctx, ID(sub.ID), 5*time.Second)
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
	ctx := testContext(t, 20*time.Second)

	_, err := c.Get(ctx, ID(987654321))
	if e := asError(t, err); !e.NotFound() || e.Code != codes.NotFound {
		t.Fatalf("Get of an unknown task: %v", err)
	}
	_, err = c.Submit(ctx, Task{Pool: "no-such-pool"})
	if e := asError(t, err); !e.NotFound() {
		t.Fatalf("Submit to an unknown pool: %v", err)
	}
	_, err = c.Submit(ctx, Task{Pool: "idle", After: []Dep{{Ref: Key("never-submitted")}}})
	if e := asError(t, err); !e.NotFound() {
		t.Fatalf("Submit with an unknown dependency: %v", err)
	}

	// The pool holds one pending task and rejects the next.
	if _, err := c.Submit(ctx, Task{Pool: "full"}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Submit(ctx, Task{Pool: "full"})
	if e := asError(t, err); !e.Retryable() || e.Code != codes.ResourceExhausted {
		t.Fatalf("Submit to a full pool: %v", err)
	}

	bad, err := Dial(sharedServer(t).addr, Options{Token: "not-a-valid-token-at-all-0000000000"})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	_, err = bad.Get(ctx, ID(1))
	if e := asError(t, err); e.Code != codes.Unauthenticated || e.Retryable() {
		t.Fatalf("bad token: %v", err)
	}
	if _, err := Dial("", Options{}); err == nil {
		t.Fatal("Dial of an empty target succeeded")
	}
}

func TestListPaging(t *testing.T) {
	c := dialShared(t, clientToken)
	ctx := testContext(t, 20*time.Second)
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
	ctx := testContext(t, 20*time.Second)
	events := make(chan Event, 16)
	go func() {
		for ev, err := range c.Watch(ctx, WatchOptions{Keys: []string{"watched"}, AllTransitions: true}) {
			if err != nil {
				t.Errorf("Watch: %v", err)
				return
			}
			events <- ev
		}
		close(events)
	}()
	// The subscription is made by the server asynchronously; give it a moment.
	time.Sleep(300 * time.Millisecond)
	sub, err := c.Submit(ctx, Task{Pool: "idle", Key: "watched"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, ID(sub.ID)); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("the watch ended early")
			}
			if ev.ID != sub.ID || ev.Key != "watched" || ev.Pool != "idle" || ev.At.IsZero() {
				t.Fatalf("event %+v", ev)
			}
			if ev.Status == Cancelled {
				return
			}
		case <-ctx.Done():
			t.Fatal("no cancelled event")
		}
	}
}

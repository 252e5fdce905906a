// Command submit is the load of bench/fleet.py's and bench/peers.py's latency phases against
// cronoq-server: tasks at a fixed rate, each call on a goroutine of its own so that a slow
// answer never delays the next submission, over a few connections in turn. Each task's payload
// is the wall-clock time (CLOCK_REALTIME, seconds) taken just before its call: the worker that
// starts it subtracts it from its own clock. With -tick 0 every task is its own Tasks.Submit;
// with -tick D the tasks that fall due within each period D go together in one
// Tasks.SubmitBatch (what a busy producer does: thousands of calls a second would cost the
// server more than the tasks themselves). At most -inflight calls are outstanding (the server
// refuses calls past its max_concurrent_requests): when the server answers slower than the
// rate, the submitter falls behind it and says so by its rate reached. A Python submitter
// cannot keep a fixed rate of thousands of calls a second on the machine's spare CPU; this one
// can.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"strconv"
	"sync"
	"time"

	pb "github.com/synaptiai/cronoq/sdks/go/cronoqpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	target := flag.String("target", "", "the server's host:port")
	rate := flag.Float64("rate", 200, "tasks per second")
	seconds := flag.Float64("seconds", 5, "how long to submit")
	kind := flag.String("kind", "", "the tasks' kind")
	envelope := flag.Bool("envelope", false, `payload {"t": T} as JSON (a task function's envelope) instead of T`)
	conns := flag.Int("conns", 4, "connections, used in turn")
	inflight := flag.Int("inflight", 1024, "calls at most in flight (under the server's limit)")
	tick := flag.Duration("tick", 0, "submit the tasks due within each such period as one SubmitBatch (0: one Submit per task)")
	maxBatch := flag.Int("max-batch", 1000, "tasks at most per SubmitBatch (the server's max_tasks_per_batch)")
	flag.Parse()
	clients := make([]pb.TasksClient, *conns)
	for i := range clients {
		conn, err := grpc.NewClient(*target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			log.Fatal(err)
		}
		defer conn.Close()
		clients[i] = pb.NewTasksClient(conn)
		// Connect before the clock starts (the answer, NOT_FOUND or not, does not matter): the
		// first call of each connection would pay for it.
		_, _ = clients[i].Get(context.Background(), &pb.GetRequest{Task: &pb.TaskRef{Target: &pb.TaskRef_Id{Id: 1}}})
	}
	n := int(*rate**seconds + 0.5)
	contentType := ""
	if *envelope {
		contentType = "application/json"
	}
	spec := func() *pb.TaskSpec {
		stamp := strconv.FormatFloat(float64(time.Now().UnixNano())/1e9, 'f', 6, 64)
		payload := stamp
		if *envelope {
			payload = `{"t": ` + stamp + `}`
		}
		return &pb.TaskSpec{Kind: *kind, Payload: []byte(payload), ContentType: contentType}
	}
	slots := make(chan struct{}, *inflight)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	call := func(i int, do func(pb.TasksClient) error) {
		slots <- struct{}{}
		wg.Add(1)
		go func(c pb.TasksClient) {
			defer func() { <-slots; wg.Done() }()
			if err := do(c); err != nil {
				mu.Lock()
				failed = err
				mu.Unlock()
			}
		}(clients[i%len(clients)])
	}
	t0 := time.Now()
	dueAt := func(i int) time.Time { return t0.Add(time.Duration(float64(i) / *rate * float64(time.Second))) }
	for i, calls := 0, 0; i < n; calls++ {
		due := dueAt(i)
		if *tick > 0 {
			due = due.Add(*tick - 1).Truncate(*tick) // the end of the period task i falls in
		}
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		// Every task due by now (at most -max-batch): one, or with -tick those of the periods
		// ended.
		m := 1
		if *tick > 0 {
			for i+m < n && m < *maxBatch && dueAt(i+m).Before(time.Now()) {
				m++
			}
		}
		if m == 1 {
			req := &pb.SubmitRequest{Task: spec()}
			call(calls, func(c pb.TasksClient) error { _, err := c.Submit(context.Background(), req); return err })
		} else {
			req := &pb.SubmitBatchRequest{Tasks: make([]*pb.TaskSpec, m)}
			for j := range req.Tasks {
				req.Tasks[j] = spec()
			}
			call(calls, func(c pb.TasksClient) error { _, err := c.SubmitBatch(context.Background(), req); return err })
		}
		i += m
	}
	wg.Wait()
	if failed != nil {
		log.Fatal(failed)
	}
	fmt.Printf("submitted=%d seconds=%.6f\n", n, time.Since(t0).Seconds())
}

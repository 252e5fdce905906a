// Command worker serves the "default" pool of a cronoq server: each task's payload is a JSON
// object with a name, and the task's output is a greeting. Ctrl-C or SIGTERM drains it: no new
// tasks are taken and the running ones finish before it exits.
//
//	CRONOQ_TARGET=http://127.0.0.1:7070 CRONOQ_WORKER_TOKEN=... go run ./examples/worker
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	cronoq "github.com/synaptiai/cronoq/sdks/go"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cronoq.RunWorker(ctx, cronoq.WorkerOptions{
		Target: os.Getenv("CRONOQ_TARGET"),
		Pool:   "default",
		Slots:  4,
		Token:  os.Getenv("CRONOQ_WORKER_TOKEN"),
	}, greet)
	// RunWorker outlives connection failures; it returns an error only for what retrying cannot
	// fix, such as a token the server rejects (cronoq.ErrUnauthenticated) or an unknown pool
	// (cronoq.ErrNotFound).
	if err != nil {
		log.Fatal(err)
	}
}

func greet(ctx context.Context, l *cronoq.Lease) ([]byte, error) {
	var in struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(l.Payload, &in); err != nil {
		// The same payload would fail again: no retries.
		return nil, cronoq.Permanent(fmt.Errorf("task %d: payload: %w", l.TaskID, err))
	}
	return fmt.Appendf(nil, "hello, %s", in.Name), nil
}

// Command crosslang is the Go side of the cross-language example: with -serve it serves the
// "images" pool, running the "resize" tasks that Python submits (tasks.py declares them);
// with -add it submits the Python task "add" and prints its result.
//
//	go run . -serve
//	go run . -add
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	cronoq "github.com/synaptiai/cronoq/sdks/go"
)

func main() {
	target := flag.String("target", envOr("CRONOQ_TARGET", "http://127.0.0.1:7070"), "server address")
	serve := flag.Bool("serve", false, `serve the "images" pool (kind "resize") until interrupted`)
	add := flag.Bool("add", false, `submit the Python task "add" with a=2, b=3 and print its result`)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch {
	case *serve:
		err = cronoq.RunWorker(ctx, cronoq.WorkerOptions{Target: *target, Pool: "images", Slots: 4}, handle)
	case *add:
		err = submitAdd(ctx, *target, 2, 3)
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// resizeArgs are the arguments of tasks.resize: one JSON member per Python parameter.
type resizeArgs struct {
	Path  string `json:"path"`
	Width int    `json:"width"`
}

// handle runs one lease of the "images" pool. A kind it does not know goes back to the server
// for another worker of the pool.
func handle(ctx context.Context, l *cronoq.Lease) ([]byte, error) {
	if l.Kind != "resize" {
		return nil, cronoq.Reject("no Go handler for kind " + l.Kind)
	}
	var in resizeArgs
	if err := json.Unmarshal(l.Payload, &in); err != nil {
		return nil, cronoq.Permanent(fmt.Errorf("resize: arguments: %w", err))
	}
	if in.Path == "" || in.Width <= 0 {
		return nil, cronoq.Permanent(fmt.Errorf("resize: need a path and a positive width, got %s", l.Payload))
	}
	ext := filepath.Ext(in.Path)
	return json.Marshal(map[string]any{
		"path":   fmt.Sprintf("%s_%d%s", strings.TrimSuffix(in.Path, ext), in.Width, ext),
		"width":  in.Width,
		"worker": "go",
	})
}

// submitAdd submits tasks.add(a, b), which a Python worker runs, and prints its result.
func submitAdd(ctx context.Context, target string, a, b int) error {
	c, err := cronoq.Dial(target, cronoq.Options{})
	if err != nil {
		return err
	}
	defer c.Close()
	payload, err := json.Marshal(map[string]int{"a": a, "b": b})
	if err != nil {
		return err
	}
	sub, err := c.Submit(ctx, cronoq.Task{
		Pool:        "default",
		Kind:        "add",
		Payload:     payload,
		ContentType: "application/json",
	})
	if err != nil {
		return err
	}
	res, err := c.Wait(ctx, cronoq.ID(sub.ID), time.Minute)
	if err != nil {
		return err
	}
	if !res.OK() {
		return fmt.Errorf("task %d ended %s: %s", sub.ID, res.Status, res.Message)
	}
	var sum int
	if err := json.Unmarshal(res.Output, &sum); err != nil {
		return fmt.Errorf("task %d: result %q: %w", sub.ID, res.Output, err)
	}
	fmt.Printf("add(%d, %d) = %d\n", a, b, sum)
	return nil
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

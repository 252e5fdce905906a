// Command client submits a task to the "default" pool of a cronoq server, waits for it and
// prints its output. The worker example runs such tasks.
//
//	CRONOQ_TARGET=http://127.0.0.1:7070 CRONOQ_TOKEN=... go run ./examples/client ada
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	cronoq "github.com/synaptiai/cronoq/sdks/go"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: client NAME")
	}
	if err := run(os.Args[1]); err != nil {
		log.Fatal(err)
	}
}

func run(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := cronoq.Dial(os.Getenv("CRONOQ_TARGET"), cronoq.Options{Token: os.Getenv("CRONOQ_TOKEN")})
	if err != nil {
		return err
	}
	defer c.Close()

	payload, err := json.Marshal(map[string]string{"name": name})
	if err != nil {
		return err
	}
	sub, err := c.Submit(ctx, cronoq.Task{
		Pool:        "default",
		Kind:        "greet",
		Payload:     payload,
		ContentType: "application/json",
		Timeout:     10 * time.Second,
	})
	if errors.Is(err, cronoq.ErrUnavailable) {
		return fmt.Errorf("no server to take the task, try again later: %w", err)
	}
	if err != nil {
		return err
	}

	res, err := c.Wait(ctx, cronoq.ID(sub.ID), 30*time.Second)
	switch {
	case errors.Is(err, cronoq.ErrTimeout):
		// The task goes on; waiting again later would still get its result.
		return fmt.Errorf("task %d is not done yet: %w", sub.ID, err)
	case err != nil:
		return err
	case !res.OK():
		return fmt.Errorf("task %d ended %s: %s", sub.ID, res.Status, res.Message)
	}
	fmt.Println(string(res.Output))
	return nil
}

// Command river is bench/peers.py's River side, on the PostgreSQL database at -url.
//
//	river -mode migrate -url U
//	    River's schema, migrated up.
//	river -mode worker -url U [-workers 64] [-every 100]
//	    one Client working the default queue with a no-op worker, with the fetch settings of
//	    River's own benchmark (FetchCooldown 2 ms, FetchPollInterval 20 ms); prints "ready"
//	    once started, "completed=K at=T" each time its count of completed jobs (from the
//	    client's event subscription: after the completer has recorded them) reaches a multiple
//	    of -every, and on SIGTERM, after stopping, "starts=S:E ..." for every job that carried
//	    a submit time.
//	river -mode bulk -url U -n N [-batch 1000]
//	    prints "start=T", inserts N jobs with InsertMany in batches, prints "added=N at=T".
//	river -mode rate -url U -rate R -seconds S
//	    inserts R*S jobs one at a time at fixed times (each Insert on a goroutine of its own),
//	    each job's args carrying its submit time; prints "submitted=N seconds=S".
//
// Every time is the wall clock (CLOCK_REALTIME) in seconds.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// NoopArgs is the job: T is its submit time, zero for the bulk phase.
type NoopArgs struct {
	T float64 `json:"t,omitempty"`
}

// Kind names the job's worker.
func (NoopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[NoopArgs]
	mu     sync.Mutex
	starts []string
}

func (w *noopWorker) Work(_ context.Context, job *river.Job[NoopArgs]) error {
	if job.Args.T != 0 {
		at := now()
		w.mu.Lock()
		w.starts = append(w.starts, fmt.Sprintf("%.6f:%.6f", job.Args.T, at))
		w.mu.Unlock()
	}
	return nil
}

func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

func main() {
	mode := flag.String("mode", "", "migrate, worker, bulk or rate")
	url := flag.String("url", "", "the PostgreSQL database")
	workers := flag.Int("workers", 64, "the queue's MaxWorkers")
	every := flag.Int("every", 100, "print the completed count at each multiple of this")
	n := flag.Int("n", 20000, "jobs to insert (bulk)")
	batch := flag.Int("batch", 1000, "jobs per InsertMany (bulk)")
	rate := flag.Float64("rate", 200, "jobs per second (rate)")
	seconds := flag.Float64("seconds", 5, "how long to insert (rate)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, *url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	switch *mode {
	case "migrate":
		err = migrate(ctx, driver)
	case "worker":
		err = work(ctx, driver, *workers, *every)
	case "bulk":
		err = bulk(ctx, driver, *n, *batch)
	case "rate":
		err = steady(ctx, driver, *rate, *seconds)
	default:
		err = fmt.Errorf("unknown -mode %q", *mode)
	}
	if err != nil {
		log.Fatal(err)
	}
}

func migrate(ctx context.Context, driver *riverpgxv5.Driver) error {
	m, err := rivermigrate.New(driver, nil)
	if err != nil {
		return err
	}
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

func work(ctx context.Context, driver *riverpgxv5.Driver, maxWorkers, every int) error {
	w := &noopWorker{}
	registry := river.NewWorkers()
	river.AddWorker(registry, w)
	client, err := river.NewClient(driver, &river.Config{
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}},
		Workers:           registry,
	})
	if err != nil {
		return err
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: 100_000, Kinds: []river.EventKind{river.EventKindJobCompleted},
	})
	defer cancel()
	go func() {
		completed := 0
		for range events {
			completed++
			if completed%every == 0 {
				fmt.Printf("completed=%d at=%.6f\n", completed, now())
			}
		}
	}()
	if err := client.Start(context.Background()); err != nil {
		return err
	}
	fmt.Println("ready")
	<-ctx.Done()
	if err := client.Stop(context.Background()); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Println("starts=" + strings.Join(w.starts, " "))
	return nil
}

// inserter is a client that only inserts (no queues, no workers).
func inserter(driver *riverpgxv5.Driver) (*river.Client[pgx.Tx], error) {
	return river.NewClient(driver, &river.Config{})
}

func bulk(ctx context.Context, driver *riverpgxv5.Driver, n, batch int) error {
	client, err := inserter(driver)
	if err != nil {
		return err
	}
	params := make([]river.InsertManyParams, batch)
	for i := range params {
		params[i].Args = NoopArgs{}
	}
	fmt.Printf("start=%.6f\n", now())
	for i := 0; i < n; i += batch {
		if _, err := client.InsertMany(ctx, params[:min(batch, n-i)]); err != nil {
			return err
		}
	}
	fmt.Printf("added=%d at=%.6f\n", n, now())
	return nil
}

func steady(ctx context.Context, driver *riverpgxv5.Driver, rate, seconds float64) error {
	client, err := inserter(driver)
	if err != nil {
		return err
	}
	n := int(rate*seconds + 0.5)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	t0 := time.Now()
	for i := 0; i < n; i++ {
		due := t0.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		args := NoopArgs{T: now()}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := client.Insert(ctx, args, nil); err != nil {
				mu.Lock()
				failed = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if failed != nil {
		return failed
	}
	fmt.Printf("submitted=%d seconds=%.6f\n", n, time.Since(t0).Seconds())
	return nil
}

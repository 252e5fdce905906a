package cronoq

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	pb "github.com/synaptiai/cronoq/sdks/go/cronoqpb"
)

// RunWorker against real sharded cronoq-server processes (docs/worker.md, "Shard redirects";
// docs/sharding.md, "Workers"): shards a (number 1, pool "pa") and b (number 2, pool "pb"),
// each a server with a memory store. A worker started at the shard that does not serve its
// pool is refused with the pool's endpoint and must end up registered at the right shard.
//
// "Another host" is http://0.0.0.0:<b's port>: not loopback for the worker (nor for the
// server, which forwards there only with insecure_peer_http), yet on Linux it reaches b's
// loopback listener, so a redirect that is followed really registers, and one that is refused
// cannot pass for a connection that merely failed.

// shard is one [[shards]] entry and the loopback ports its server listens on, chosen before
// any server starts since every server of a plan must know every endpoint.
type shard struct {
	name     string
	number   int
	pools    []string
	host     string // the endpoint's host; the server listens on 127.0.0.1 whatever it is
	grpcPort int
	httpPort int
}

func newShard(t *testing.T, name string, number int, pool, host string) shard {
	return shard{name: name, number: number, pools: []string{pool}, host: host, grpcPort: freePort(t), httpPort: freePort(t)}
}

func (s shard) endpoint() string { return fmt.Sprintf("http://%s:%d", s.host, s.grpcPort) }
func (s shard) addr() string     { return fmt.Sprintf("127.0.0.1:%d", s.grpcPort) }

// freePort is a loopback TCP port nobody listens on now.
func freePort(t *testing.T) int {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().(*net.TCPAddr).Port
}

// shardAuth gives the SDK tests' three tokens to every server of a plan.
var shardAuth = fmt.Sprintf("[[auth.tokens]]\ntoken = %q\nrole = \"worker\"\n"+
	"[[auth.tokens]]\ntoken = %q\nrole = \"client\"\n"+
	"[[auth.tokens]]\ntoken = %q\nrole = \"admin\"\n", workerToken, clientToken, adminToken)

// shardPlan is two shards served by server processes, and whether they ask for tokens.
type shardPlan struct {
	shards map[string]shard
	auth   bool
	py     string
	files  map[string]string // each shard's config file
	mu     sync.Mutex
	kills  map[string]func() // each running server's kill
}

// startShards starts a server for each of a and b (at once), both with the plan [a, b], and
// waits until both are ready; server holds more keys of [server], rest more tables (auth).
// The test's cleanup kills them.
func startShards(t *testing.T, a, b shard, server, rest string) *shardPlan {
	t.Helper()
	return startViews(t, map[string][]shard{"a": {a, b}, "b": {a, b}}, server, rest)
}

// startViews is startShards with the plan each server reads: views["a"] for shard a's server
// and views["b"] for b's, each holding its own shard under its name.
func startViews(t *testing.T, views map[string][]shard, server, rest string) *shardPlan {
	t.Helper()
	p := &shardPlan{shards: map[string]shard{}, auth: rest != "", py: python(t),
		files: map[string]string{}, kills: map[string]func(){}}
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, kill := range p.kills {
			kill()
		}
	})
	dir := t.TempDir()
	for _, name := range []string{"a", "b"} {
		var own shard
		var tables strings.Builder
		for _, s := range views[name] {
			if s.name == name {
				own = s
			}
			for _, pool := range s.pools {
				fmt.Fprintf(&tables, "[[pools]]\nname = %q\nmax = 64\n", pool)
			}
		}
		for _, s := range views[name] {
			fmt.Fprintf(&tables, "[[shards]]\nname = %q\nnumber = %d\npools = [%s]\nendpoint = %q\n",
				s.name, s.number, quoted(s.pools), s.endpoint())
		}
		p.shards[name] = own
		text := fmt.Sprintf("[server]\ngrpc_addr = %q\nhttp_addr = \"127.0.0.1:%d\"\nshard = %q\n"+
			"shutdown_grace_s = 0.5\n%s\n%s\n%s", own.addr(), own.httpPort, name, server, rest, tables.String())
		p.files[name] = filepath.Join(dir, name+".toml")
		if err := os.WriteFile(p.files[name], []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, name := range []string{"a", "b"} {
		wg.Go(func() { errs[i] = p.start(name) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return p
}

// quoted is a TOML array's items: "x", "y".
func quoted(items []string) string {
	q := make([]string, len(items))
	for i, item := range items {
		q[i] = fmt.Sprintf("%q", item)
	}
	return strings.Join(q, ", ")
}

// start starts shard `name`'s server (again, on the same ports) and returns once it logged
// event=ready. It returns its errors rather than failing the test, for use off the test's
// goroutine.
func (p *shardPlan) start(name string) error {
	cmd := exec.Command(p.py, "-m", "cronoq.server.cli", "-c", p.files[name])
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	ready := make(chan struct{})
	var mu sync.Mutex
	var lines []string
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		isReady := false
		for sc.Scan() {
			if isReady {
				continue
			}
			line := sc.Text()
			mu.Lock()
			lines = append(lines, line)
			mu.Unlock()
			if readyLine.MatchString(line) {
				isReady = true
				close(ready)
			}
		}
		_ = cmd.Wait()
	}()
	p.mu.Lock()
	p.kills[name] = func() {
		_ = cmd.Process.Kill()
		<-done
	}
	p.mu.Unlock()
	log := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(lines, "\n")
	}
	select {
	case <-ready:
		return nil
	case <-done:
		return fmt.Errorf("cronoq-server for shard %s exited before it was ready:\n%s", name, log())
	case <-time.After(patience):
		return fmt.Errorf("cronoq-server for shard %s not ready after %v:\n%s", name, patience, log())
	}
}

// kill kills shard `name`'s server and waits until it has exited.
func (p *shardPlan) kill(name string) {
	p.mu.Lock()
	kill := p.kills[name]
	delete(p.kills, name)
	p.mu.Unlock()
	kill()
}

func (p *shardPlan) token(token string) string {
	if p.auth {
		return token
	}
	return ""
}

func (p *shardPlan) dial(t *testing.T, name, token string) *Client {
	t.Helper()
	c, err := Dial("http://"+p.shards[name].addr(), Options{Token: p.token(token)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// workersAt lists the names of the workers connected to shard `name` itself: a forwarded call
// is answered by the own shard alone, without the other shard's workers merged in.
func (p *shardPlan) workersAt(ctx context.Context, t *testing.T, name string) []string {
	t.Helper()
	c := p.dial(t, name, adminToken)
	ctx = metadata.AppendToOutgoingContext(ctx, "cronoq-forwarded", "1")
	r, err := pb.NewAdminClient(c.Conn()).ListWorkers(ctx, &pb.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, w := range r.GetWorkers() {
		names = append(names, w.GetName()+"/"+w.GetPool())
	}
	return names
}

// logged records a worker's log messages, so a test can wait for one.
type logged struct {
	mu      sync.Mutex
	records []slog.Record
	wake    chan struct{} // closed and replaced at every record
}

func newLogged() *logged { return &logged{wake: make(chan struct{})} }

func (l *logged) Enabled(context.Context, slog.Level) bool { return true }
func (l *logged) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logged) WithGroup(string) slog.Handler            { return l }

func (l *logged) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	close(l.wake)
	l.wake = make(chan struct{})
	return nil
}

// find returns the records with message msg, each as its attributes' text.
func (l *logged) find(msg string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var found []map[string]string
	for _, r := range l.records {
		if r.Message != msg {
			continue
		}
		attrs := map[string]string{"level": r.Level.String()}
		r.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		found = append(found, attrs)
	}
	return found
}

// waitFor waits until msg was logged n times, or until the worker returned (an error saying
// so) or ctx ended (the test fails).
func (l *logged) waitFor(ctx context.Context, t *testing.T, msg string, n int, w *workerRun) error {
	t.Helper()
	for {
		l.mu.Lock()
		wake := l.wake
		l.mu.Unlock()
		if len(l.find(msg)) >= n {
			return nil
		}
		select {
		case <-wake:
		case <-w.done:
			return fmt.Errorf("RunWorker returned before %q: %v", msg, w.err)
		case <-ctx.Done():
			t.Fatalf("%q not logged %d times in time", msg, n)
		}
	}
}

// workerRun is RunWorker running in the background: err is its result once done is closed.
type workerRun struct {
	done chan struct{}
	err  error
}

// runShardWorker runs RunWorker at shard `entry` until it returns or the test ends.
func runShardWorker(t *testing.T, p *shardPlan, entry string, opts WorkerOptions) (*logged, *workerRun) {
	t.Helper()
	log := newLogged()
	opts.Target = "http://" + p.shards[entry].addr()
	opts.Token = p.token(workerToken)
	opts.Logger = slog.New(log)
	opts.MinBackoff, opts.MaxBackoff = 20*time.Millisecond, 200*time.Millisecond
	opts.DrainTimeout = time.Second
	ctx, cancel := context.WithCancel(context.Background())
	w := &workerRun{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.err = RunWorker(ctx, opts, reverseHandler)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-w.done:
		case <-time.After(patience):
			t.Error("RunWorker did not return")
		}
	})
	return log, w
}

func reverseHandler(_ context.Context, l *Lease) ([]byte, error) {
	out := slices.Clone(l.Payload)
	slices.Reverse(out)
	return out, nil
}

// servesAtTheRightShard starts a worker for `pool` at shard `entry`: it must be redirected
// once, to `home`'s endpoint, register there, and run a task submitted through `entry`.
func servesAtTheRightShard(t *testing.T, p *shardPlan, entry, home, pool string, insecure bool) *logged {
	t.Helper()
	ctx := testContext(t)
	name := "go-" + strings.ReplaceAll(t.Name(), "/", "-")
	log, w := runShardWorker(t, p, entry, WorkerOptions{Pool: pool, Name: name, InsecureRedirectHTTP: insecure})
	if err := log.waitFor(ctx, t, "cronoq worker registered", 1, w); err != nil {
		t.Fatal(err)
	}
	redirected := log.find("cronoq worker redirected")
	if len(redirected) != 1 || redirected[0]["endpoint"] != p.shards[home].endpoint() {
		t.Fatalf("redirects %v, want one to %s", redirected, p.shards[home].endpoint())
	}
	if got := p.workersAt(ctx, t, home); !slices.Contains(got, name+"/"+pool) {
		t.Fatalf("shard %s lists %v, not the worker", home, got)
	}
	if got := p.workersAt(ctx, t, entry); slices.ContainsFunc(got, func(w string) bool { return strings.HasPrefix(w, name+"/") }) {
		t.Fatalf("shard %s lists the worker: %v", entry, got)
	}
	p.runsTask(ctx, t, entry, pool)
	return log
}

// runsTask submits a task to `pool` through shard `entry` and checks that it succeeds with the
// worker's output.
func (p *shardPlan) runsTask(ctx context.Context, t *testing.T, entry, pool string) {
	t.Helper()
	c := p.dial(t, entry, clientToken)
	sub, err := c.Submit(ctx, Task{Pool: pool, Payload: []byte("via " + entry)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Wait(ctx, ID(sub.ID), patience)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("via " + entry)
	slices.Reverse(want)
	if !res.OK() || string(res.Output) != string(want) {
		t.Fatalf("result %+v, want success with %q", res, want)
	}
}

func TestShardRedirectToTheRightShard(t *testing.T) {
	a, b := newShard(t, "a", 1, "pa", "127.0.0.1"), newShard(t, "b", 2, "pb", "127.0.0.1")
	p := startShards(t, a, b, "", "")
	t.Run("a to b", func(t *testing.T) { servesAtTheRightShard(t, p, "a", "b", "pb", false) })
	t.Run("b to a", func(t *testing.T) { servesAtTheRightShard(t, p, "b", "a", "pa", false) })
}

func TestShardRedirectWithATokenToLoopback(t *testing.T) {
	a, b := newShard(t, "a", 1, "pa", "127.0.0.1"), newShard(t, "b", 2, "pb", "127.0.0.1")
	p := startShards(t, a, b, "", shardAuth)
	servesAtTheRightShard(t, p, "a", "b", "pb", false)
}

func TestShardRedirectWithATokenToAnotherHost(t *testing.T) {
	a, b := newShard(t, "a", 1, "pa", "127.0.0.1"), newShard(t, "b", 2, "pb", "0.0.0.0")
	p := startShards(t, a, b, "insecure_peer_http = true\n", shardAuth)

	t.Run("refused", func(t *testing.T) {
		ctx := testContext(t)
		log, w := runShardWorker(t, p, "a", WorkerOptions{Pool: "pb", Name: "go-refused"})
		select {
		case <-w.done:
		case <-ctx.Done():
			t.Fatal("RunWorker did not return the refusal")
		}
		e := asError(t, w.err)
		if e.Code != codes.FailedPrecondition ||
			!strings.Contains(e.Message, "would send the token over plain http to another host") ||
			!strings.Contains(e.Message, fmt.Sprintf("pool 'pb' is served by shard 'b' at %s", b.endpoint())) {
			t.Fatalf("got %v", e)
		}
		if got := log.find("cronoq worker redirected"); len(got) != 0 {
			t.Fatalf("followed: %v", got)
		}
		if got := p.workersAt(ctx, t, "b"); slices.Contains(got, "go-refused/pb") {
			t.Fatalf("shard b lists the refused worker: %v", got)
		}
	})

	t.Run("InsecureRedirectHTTP", func(t *testing.T) {
		log := servesAtTheRightShard(t, p, "a", "b", "pb", true)
		warned := log.find("cronoq worker sends its token over plain http")
		if len(warned) != 1 || warned[0]["level"] != "WARN" || warned[0]["endpoint"] != b.endpoint() {
			t.Fatalf("warnings %v", warned)
		}
	})
}

// TestShardRedirectBackToTargetWhenTheShardIsGone: when the shard a worker was sent to cannot
// be reached, the worker asks its Target again, which sends it back once the shard serves.
func TestShardRedirectBackToTargetWhenTheShardIsGone(t *testing.T) {
	a, b := newShard(t, "a", 1, "pa", "127.0.0.1"), newShard(t, "b", 2, "pb", "127.0.0.1")
	p := startShards(t, a, b, "", "")
	ctx := testContext(t)
	log, w := runShardWorker(t, p, "a", WorkerOptions{Pool: "pb", Name: "go-back"})
	if err := log.waitFor(ctx, t, "cronoq worker registered", 1, w); err != nil {
		t.Fatal(err)
	}
	p.kill("b")
	// b unreachable: the worker goes back to a, which sends it to b again, and so on.
	if err := log.waitFor(ctx, t, "cronoq worker redirected", 2, w); err != nil {
		t.Fatal(err)
	}
	if err := p.start("b"); err != nil { // on the same port
		t.Fatal(err)
	}
	if err := log.waitFor(ctx, t, "cronoq worker registered", 2, w); err != nil {
		t.Fatal(err)
	}
	if got := p.workersAt(ctx, t, "b"); !slices.Contains(got, "go-back/pb") {
		t.Fatalf("shard b lists %v, not the worker", got)
	}
	p.runsTask(ctx, t, "a", "pb")
}

// TestShardRedirectLimitBetweenDisagreeingShards: shards whose servers disagree about a pool
// (a's plan says b serves pb, b's plan says a does, as during a plan change rolled out
// halfway) send a worker back and forth; RunWorker gives up after MaxRedirects.
func TestShardRedirectLimitBetweenDisagreeingShards(t *testing.T) {
	a, b := newShard(t, "a", 1, "pa", "127.0.0.1"), newShard(t, "b", 2, "pb", "127.0.0.1")
	aInB, bInB := a, b
	aInB.pools, bInB.pools = []string{"pa", "pb"}, []string{"pc"}
	p := startViews(t, map[string][]shard{"a": {a, b}, "b": {aInB, bInB}}, "", "")
	ctx := testContext(t)
	log, w := runShardWorker(t, p, "a", WorkerOptions{Pool: "pb", Name: "go-loop"})
	select {
	case <-w.done:
	case <-ctx.Done():
		t.Fatal("RunWorker did not give up")
	}
	e := asError(t, w.err)
	if e.Code != codes.FailedPrecondition || !strings.Contains(e.Message, "4 redirects in a row") ||
		!strings.Contains(e.Message, "pool 'pb' is served by shard 'a' at "+a.endpoint()) {
		t.Fatalf("got %v", e)
	}
	if n := len(log.find("cronoq worker redirected")); n != MaxRedirects {
		t.Fatalf("%d redirects followed, want %d", n, MaxRedirects)
	}
}

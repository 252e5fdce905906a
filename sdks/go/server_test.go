package cronoq

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"
)

// The integration tests run the real cronoq-server (Python) as a subprocess, configured from
// a temporary TOML file, and talk to it over real sockets.

const (
	clientToken = "client-token-for-the-sdk-tests-0000001"
	workerToken = "worker-token-for-the-sdk-tests-0000001"
	adminToken  = "admin-token-for-the-sdk-tests-00000001"
	// serverConfig is shared with the TypeScript SDK's tests; {grpc_addr} is filled in.
	serverConfig = "../testdata/server.toml"
)

type pyServer struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

func python(t testing.TB) string {
	py := os.Getenv("CRONOQ_PYTHON")
	if py == "" {
		py, _ = filepath.Abs("../../.venv/bin/python")
	}
	if _, err := os.Stat(py); err != nil {
		t.Skipf("no Python for cronoq-server at %s (set CRONOQ_PYTHON): %v", py, err)
	}
	return py
}

var (
	listening = regexp.MustCompile(`event=listening grpc=(\S+)`)
	readyLine = regexp.MustCompile(`event=ready`)
)

// startServer starts cronoq-server with grpcAddr filled into serverConfig and waits until it
// logs event=ready. The config file may go with t's temporary directory once the server is
// ready: it is read only at the start.
func startServer(t testing.TB, grpcAddr string) *pyServer {
	config := filepath.Join(t.TempDir(), "server.toml")
	template, err := os.ReadFile(serverConfig)
	if err != nil {
		t.Fatal(err)
	}
	text := bytes.ReplaceAll(template, []byte("{grpc_addr}"), []byte(grpcAddr))
	if err := os.WriteFile(config, text, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python(t), "-m", "cronoq.server.cli", "-c", config)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &pyServer{cmd: cmd, done: make(chan struct{})}
	ready := make(chan struct{})
	var lines []string
	go func() {
		isReady := false
		defer close(s.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if m := listening.FindStringSubmatch(line); m != nil && s.addr == "" {
				s.addr = m[1]
			}
			if !isReady && s.addr != "" && readyLine.MatchString(line) {
				isReady = true
				close(ready)
			}
			if !isReady {
				lines = append(lines, line)
			}
		}
		_ = cmd.Wait()
	}()
	select {
	case <-ready:
		return s
	case <-s.done:
		t.Fatalf("cronoq-server exited before it was ready: %q", lines)
	case <-time.After(patience):
		s.kill()
		t.Fatalf("cronoq-server not ready after %v: %q", patience, lines)
	}
	return nil
}

func (s *pyServer) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

var shared struct {
	once sync.Once
	srv  *pyServer
}

// sharedServer is started by the first test that needs it and killed by TestMain.
func sharedServer(t testing.TB) *pyServer {
	python(t)
	shared.once.Do(func() { shared.srv = startServer(t, "127.0.0.1:0") })
	if shared.srv == nil {
		t.Fatal("the shared server failed to start")
	}
	return shared.srv
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.srv != nil {
		shared.srv.kill()
	}
	os.Exit(code)
}

func dialShared(t testing.TB, token string) *Client {
	c, err := Dial("http://"+sharedServer(t).addr, Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// patience bounds every wait on a server process and on what it does for a test. It is only
// a safety net against a hung process, so it is generous: on a loaded machine a server can
// take many seconds to start or to answer.
const patience = time.Minute

// testContext ends after patience, or with the test.
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	t.Cleanup(cancel)
	return ctx
}

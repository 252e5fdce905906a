package cronoq

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestREADMEPrograms checks that README.md shows the example programs as they are, and runs
// them against the real server: the client's task is run by the worker and its output printed,
// then an interrupt drains the worker, which exits cleanly.
func TestREADMEPrograms(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"worker", "client"} {
		src, err := os.ReadFile(filepath.Join("examples", name, "main.go"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(readme, []byte("```go\n"+string(src)+"```\n")) {
			t.Errorf("README.md does not show examples/%s/main.go as it is", name)
		}
	}

	srv := sharedServer(t)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-buildvcs=false", "-o", bin, "./examples/worker", "./examples/client")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the examples: %v\n%s", err, out)
	}
	env := append(os.Environ(), "CRONOQ_TARGET=http://"+srv.addr,
		"CRONOQ_TOKEN="+clientToken, "CRONOQ_WORKER_TOKEN="+workerToken)

	worker := exec.Command(filepath.Join(bin, "worker"))
	worker.Env = env
	var workerLog bytes.Buffer
	worker.Stderr = &workerLog
	if err := worker.Start(); err != nil {
		t.Fatal(err)
	}
	var workerErr error
	exited := make(chan struct{})
	go func() {
		workerErr = worker.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = worker.Process.Kill()
		<-exited
	})

	client := exec.Command(filepath.Join(bin, "client"), "ada")
	client.Env = env
	var clientLog bytes.Buffer
	client.Stderr = &clientLog
	out, err := client.Output()
	if err != nil || string(out) != "hello, ada\n" {
		t.Fatalf("client: %v, printed %q\n%s", err, out, clientLog.Bytes())
	}

	if err := worker.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if workerErr != nil {
			t.Fatalf("worker after an interrupt: %v\n%s", workerErr, workerLog.Bytes())
		}
	case <-time.After(patience):
		t.Fatalf("the worker did not exit after an interrupt\n%s", workerLog.Bytes())
	}
}

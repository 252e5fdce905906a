package cronoq

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestStubsUpToDate regenerates the stubs with gen.sh and compares them with the committed
// ones. It needs no network, but it needs the repository's .venv (for protoc) and the two Go
// plugins installed; without them it skips.
func TestStubsUpToDate(t *testing.T) {
	if _, err := os.Stat("../../.venv/bin/python"); err != nil {
		t.Skip("no ../../.venv/bin/python with grpcio-tools")
	}
	gopath, err := exec.Command("go", "env", "GOPATH").Output()
	if err != nil {
		t.Skip("no go command")
	}
	for _, plugin := range []string{"protoc-gen-go", "protoc-gen-go-grpc"} {
		if _, err := os.Stat(filepath.Join(strings.TrimSpace(string(gopath)), "bin", plugin)); err != nil {
			t.Skipf("%s is not installed (see gen.sh)", plugin)
		}
	}
	out := t.TempDir()
	if msg, err := exec.Command("bash", "gen.sh", out).CombinedOutput(); err != nil {
		t.Fatalf("gen.sh: %v\n%s", err, msg)
	}
	for _, name := range []string{"cronoq.pb.go", "cronoq_grpc.pb.go"} {
		fresh, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(filepath.Join("cronoqpb", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fresh, committed) {
			t.Errorf("cronoqpb/%s is stale: run ./gen.sh", name)
		}
	}
}

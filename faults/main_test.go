package faults

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/testbroker"
)

// rabbit is the private broker every single-node scenario shares (each
// uses its own queues).
var rabbit *testbroker.Broker

// brokerTarget is where the suite's helpers connect and run rabbitmqctl:
// the shared node, or a cluster while a cluster scenario runs.
type brokerTarget interface {
	URLs() []string
	Ctl(args ...string) (string, error)
}

type singleNode struct{ *testbroker.Broker }

func (n singleNode) URLs() []string { return []string{n.URL()} }

// target is the broker of the scenario running now (scenarios run one at
// a time).
var target brokerTarget

// useTarget points the helpers at tg until the test ends.
func useTarget(t *testing.T, tg brokerTarget) {
	prev := target
	target = tg
	t.Cleanup(func() { target = prev })
}

// workDir holds the hopper binary, its configs and its logs.
var workDir string

// build is the one build of the hopper binary; it runs while the broker
// boots and the tests wait for it with hopperBinary.
var build = struct {
	done chan struct{}
	bin  string
	err  error
	took time.Duration
}{done: make(chan struct{})}

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "hopper-faults-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: faults: %v\n", err)
		return 1
	}
	workDir = dir
	code := 1
	defer func() {
		// A failed run keeps hopper's logs and configs for the post-mortem.
		if code != 0 || os.Getenv("HOPPER_FAULTS_KEEP") == "1" {
			fmt.Fprintf(os.Stderr, "faults: hopper logs and configs kept in %s\n", dir)
			return
		}
		os.RemoveAll(dir)
	}()

	go func() {
		defer close(build.done)
		began := time.Now()
		build.bin = filepath.Join(dir, "hopper")
		cmd := exec.Command("go", "build", "-o", build.bin, "../cmd/hopper")
		if os.Getenv("HOPPER_FAULTS_RACE") == "1" {
			cmd = exec.Command("go", "build", "-race", "-o", build.bin, "../cmd/hopper")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build ../cmd/hopper: %w\n%s", err, out)
		}
		build.took = time.Since(began)
	}()

	code = testbroker.RunMain(&targetSetter{m}, &rabbit)
	<-build.done // never leave the build running behind the test binary
	return code
}

var buildLogged sync.Once

// hopperBinary waits for the build and returns the binary's path.
func hopperBinary(t *testing.T) string {
	t.Helper()
	<-build.done
	if build.err != nil {
		t.Fatal(build.err)
	}
	buildLogged.Do(func() { t.Logf("hopper binary built in %s", build.took.Round(time.Millisecond)) })
	return build.bin
}

// messageCount is N, the number of messages each scenario publishes.
func messageCount(t *testing.T) int {
	t.Helper()
	return envInt(t, "HOPPER_FAULTS_N", 1000)
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// targetSetter points target at the shared node once it is up, before the
// tests run.
type targetSetter struct{ m *testing.M }

func (ts *targetSetter) Run() int {
	target = singleNode{rabbit}
	return ts.m.Run()
}

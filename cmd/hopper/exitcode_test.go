package main_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// The exit statuses scripts branch on (sysexits, as rabbitmqctl uses them).
const (
	exitOK          = 0
	exitUsage       = 64
	exitDataErr     = 65
	exitUnavailable = 69
	exitTempFail    = 75
)

// closedPort is a local TCP port nothing listens on: taken by listening,
// then released.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

func wantExit(t *testing.T, r result, want int, what string) {
	t.Helper()
	if r.code != want {
		t.Errorf("%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, r.code, want, r.stdout, r.stderr)
	}
}

// Each class of failure has its own exit status, the same from every
// subcommand, and the message still says what went wrong.
func TestExitCodes(t *testing.T) {
	nowhere := fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", closedPort(t))

	t.Run("success", func(t *testing.T) {
		wantExit(t, hopper(t, "version"), exitOK, "version")
		wantExit(t, hopper(t, "config", "validate", "--queue", "orders"), exitOK, "config validate of a good config")
		r := hopper(t, "--help")
		wantExit(t, r, exitOK, "--help")
		for _, want := range []string{"Exit status:", "64  usage", "65  bad config", "69  broker unavailable", "75  temporary failure"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("hopper --help does not list %q:\n%s", want, r.stdout)
			}
		}
	})

	t.Run("usage", func(t *testing.T) {
		r := hopper(t, "no-such-command")
		wantExit(t, r, exitUsage, "unknown subcommand")
		if !strings.Contains(r.stderr, "no-such-command") {
			t.Errorf("stderr does not name the unknown command: %s", r.stderr)
		}
		wantExit(t, hopper(t, "dlq", "purg"), exitUsage, "unknown dlq subcommand")
		wantExit(t, hopper(t, "version", "extra"), exitUsage, "an argument to a command that takes none")
		wantExit(t, hopper(t, "run", "--no-such-flag"), exitUsage, "unknown flag")
		wantExit(t, hopper(t, "dlq", "replay", "--queue", "q", "--limit", "many"), exitUsage, "unparsable flag value")
		// Flag values checked before anything connects: the broker URL
		// leads nowhere, and the usage error must win.
		r = hopper(t, "dlq", "replay", "--queue", "q", "--broker-url", nowhere, "--status", "5x")
		wantExit(t, r, exitUsage, "--status 5x")
		if !strings.Contains(r.stderr, "5x") {
			t.Errorf("stderr does not name the bad value: %s", r.stderr)
		}
		r = hopper(t, "dlq", "replay", "--queue", "q", "--broker-url", nowhere, "--status", "7xx")
		wantExit(t, r, exitUsage, "--status 7xx (no such class)")
		if !strings.Contains(r.stderr, "7xx") {
			t.Errorf("stderr does not name the bad class: %s", r.stderr)
		}
		wantExit(t, hopper(t, "dlq", "peek", "--queue", "q", "--broker-url", nowhere, "-n", "0"), exitUsage, "peek -n 0")
		wantExit(t, hopper(t, "dlq", "stats", "--queue", "q", "--broker-url", nowhere, "-o", "xml"), exitUsage, "stats -o xml")
		wantExit(t, hopper(t, "dlq", "import", "--queue", "q", "--broker-url", nowhere), exitUsage, "import without --file")
		wantExit(t, hopper(t, "topology", "plan", "--queue", "q", "-o", "xml"), exitUsage, "topology plan -o xml")
	})

	t.Run("config", func(t *testing.T) {
		bad := configFile(t, "queue:\n  name: q\nlog:\n  level: loud\n")
		r := hopper(t, "config", "validate", "--config", bad)
		wantExit(t, r, exitDataErr, "config that fails validation")
		if !strings.Contains(r.stderr, "log.level") {
			t.Errorf("stderr does not name the key: %s", r.stderr)
		}
		unparsable := configFile(t, "queue: [name: q\n")
		wantExit(t, hopper(t, "config", "validate", "--config", unparsable), exitDataErr, "config file that does not parse")
		missing := filepath.Join(t.TempDir(), "absent.yaml")
		wantExit(t, hopper(t, "config", "validate", "--config", missing), exitDataErr, "config file that cannot be read")
		// The same from a tool that would connect next.
		wantExit(t, hopper(t, "dlq", "stats", "--config", bad, "--broker-url", nowhere), exitDataErr, "dlq stats with a bad config")
	})

	t.Run("unavailable", func(t *testing.T) {
		r := hopper(t, "dlq", "stats", "--queue", "q", "--broker-url", nowhere)
		wantExit(t, r, exitUnavailable, "dlq stats against a closed port")
		if !strings.Contains(r.stderr, "connect") {
			t.Errorf("stderr does not say the connection failed: %s", r.stderr)
		}
		wantExit(t, hopper(t, "dlq", "replay", "--queue", "q", "--broker-url", nowhere), exitUnavailable, "dlq replay against a closed port")
		wantExit(t, hopper(t, "dlq", "purge", "--yes", "--queue", "q", "--broker-url", nowhere), exitUnavailable, "dlq purge against a closed port")
		wantExit(t, hopper(t, "topology", "verify", "--queue", "q", "--broker-url", nowhere), exitUnavailable, "topology verify against a closed port")
	})
}

// An import file with a line that is not an export record is bad data:
// the lines before it are published, and the exit status tells it from a
// broker failure.
func TestExitCodeImportInvalidFile(t *testing.T) {
	q := queueName(t)
	if r := hopper(t, "topology", "apply", "--broker-url", rabbit.URL(), "--queue", q, "--log-level", "error"); r.code != 0 {
		t.Fatalf("apply: exit %d\n%s", r.code, r.stderr)
	}
	line, err := dlq.MarshalLine(&msg.Message{MessageID: "good", Body: []byte("x"), Headers: map[string]any{}}, q+".dlq")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dlq.jsonl")
	if err := os.WriteFile(file, append(line, []byte("this is not an export line\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	r := hopper(t, "dlq", "import", "--queue", q, "--broker-url", rabbit.URL(), "--file", file, "--progress", "none")
	wantExit(t, r, exitDataErr, "import of an invalid file")
	if !strings.Contains(r.stderr, "line 2") || !strings.Contains(r.stderr, "--skip 1") {
		t.Errorf("stderr does not name the bad line and how to resume: %s", r.stderr)
	}
	readyIn(t, inspector(t), q+".dlq", 1)

	// A file that cannot be opened is bad data too.
	r = hopper(t, "dlq", "import", "--queue", q, "--broker-url", rabbit.URL(), "--file", file+".absent", "--progress", "none")
	wantExit(t, r, exitDataErr, "import of a missing file")
}

// A replay that moves some messages and not others ends with the
// temporary-failure status: what it did not move is still in the DLQ, and
// running it again is the remedy.
func TestExitCodeReplayPartial(t *testing.T) {
	q := queueName(t)
	if r := hopper(t, "topology", "apply", "--broker-url", rabbit.URL(), "--queue", q, "--log-level", "error"); r.code != 0 {
		t.Fatalf("apply: exit %d\n%s", r.code, r.stderr)
	}
	pub := broker.NewPublisher(broker.PublisherOptions{Options: broker.Options{URLs: []string{rabbit.URL()}}, Channels: 1})
	defer pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for id, origin := range map[string]string{"home": q, "lost": q + ".no-such-queue"} {
		m := &msg.Message{MessageID: id, Body: []byte(id), Headers: map[string]any{msg.HeaderOriginalQueue: origin}}
		if err := pub.PublishTo(ctx, "", q+".dlq", m); err != nil {
			t.Fatal(err)
		}
	}
	r := hopper(t, "dlq", "replay", "--queue", q, "--broker-url", rabbit.URL(), "--progress", "none", "--log-level", "error")
	wantExit(t, r, exitTempFail, "replay with one message moved and one not")
	if !strings.Contains(r.stderr, "could not be replayed") {
		t.Errorf("stderr: %s", r.stderr)
	}
	readyIn(t, inspector(t), q, 1)
	readyIn(t, inspector(t), q+".dlq", 1)
}

// A DLQ tool stopped by a signal ends with the temporary-failure status:
// it finished what it had in flight, the rest is still in the DLQ.
func TestExitCodeReplayInterrupted(t *testing.T) {
	q := queueName(t)
	if r := hopper(t, "topology", "apply", "--broker-url", rabbit.URL(), "--queue", q, "--log-level", "error"); r.code != 0 {
		t.Fatalf("apply: exit %d\n%s", r.code, r.stderr)
	}
	pub := broker.NewPublisher(broker.PublisherOptions{Options: broker.Options{URLs: []string{rabbit.URL()}}, Channels: 1})
	defer pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 30
	for i := range n {
		m := &msg.Message{MessageID: fmt.Sprint(i), Body: []byte("x"), Headers: map[string]any{msg.HeaderOriginalQueue: q}}
		if err := pub.PublishTo(ctx, "", q+".dlq", m); err != nil {
			t.Fatal(err)
		}
	}
	// At one message a second the run lasts half a minute: the signal
	// lands while it runs.
	cmd := exec.Command(hopperBin, "dlq", "replay", "--queue", q, "--broker-url", rabbit.URL(), "--rate", "1", "--progress", "none", "--log-level", "error")
	cmd.Env = cleanEnv()
	stderr := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = io.Discard, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill() //nolint:errcheck // the process we started
			<-done
		}
	})
	waitfor.Until(t, 30*time.Second, "the replay to start", func() bool {
		return strings.Contains(stderr.String(), "present in")
	})
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-done:
		exited = true
	case <-time.After(30 * time.Second):
		t.Fatalf("replay still running 30s after SIGINT\n%s", stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitTempFail {
		t.Fatalf("interrupted replay: %v, want exit %d\n%s", err, exitTempFail, stderr.String())
	}
	if !strings.Contains(stderr.String(), "interrupted") {
		t.Errorf("stderr does not say the run was interrupted:\n%s", stderr.String())
	}
	moved, err := inspector(t).Depth(q)
	if err != nil {
		t.Fatal(err)
	}
	if moved >= n {
		t.Fatalf("all %d messages moved before the signal; the run was not interrupted", moved)
	}
	readyIn(t, inspector(t), q+".dlq", n-moved)
}

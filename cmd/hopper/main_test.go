package main_test

// These tests run the real binary, built once in TestMain, against a
// private RabbitMQ node, as an operator would run it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

var (
	rabbit    *testbroker.Broker
	hopperBin string
	queueSeq  atomic.Int64
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hopper-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	hopperBin = filepath.Join(dir, "hopper")
	build := exec.Command("go", "build", "-o", hopperBin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := testbroker.RunMain(m, &rabbit)
	os.RemoveAll(dir)
	os.Exit(code)
}

// cleanEnv is the test's environment without HOPPER_* and OTEL_* variables,
// so that the developer's shell (or the test broker's own HOPPER_RABBITMQ_BIN)
// cannot change what the binary does.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "HOPPER_") || strings.HasPrefix(kv, "OTEL_") || strings.HasPrefix(kv, "GOMEMLIMIT=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

type result struct {
	code           int
	stdout, stderr string
}

// hopper runs the binary to completion (at most 60 s).
func hopper(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, hopperBin, args...)
	cmd.Env = cleanEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("hopper %q: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("hopper %q did not finish in 60s\nstdout: %s\nstderr: %s", args, r.stdout, r.stderr)
	}
	return r
}

func configFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hopper.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// queueName is unique per test and run.
func queueName(t *testing.T) string {
	return fmt.Sprintf("cmd%d.%d.%s", os.Getpid(), queueSeq.Add(1), strings.ToLower(t.Name()))
}

func TestHelp(t *testing.T) {
	r := hopper(t, "--help")
	if r.code != 0 {
		t.Fatalf("--help exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"run", "config", "topology", "--help"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("hopper --help does not mention %q:\n%s", want, r.stdout)
		}
	}

	r = hopper(t, "run", "--help")
	if r.code != 0 {
		t.Fatalf("run --help exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"--config", "--queue", "--app-url", "--broker-url", "--prefetch", "--workers",
		"--admin-listen", "--log-level", "--log-format", "--set", "SIGTERM"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("hopper run --help does not mention %q:\n%s", want, r.stdout)
		}
	}

	for _, sub := range [][]string{{"config", "validate", "--help"}, {"topology", "--help"}, {"topology", "verify", "--help"}} {
		if r := hopper(t, sub...); r.code != 0 || !strings.Contains(r.stdout, "Usage:") {
			t.Errorf("hopper %v: exit %d\n%s", sub, r.code, r.stdout)
		}
	}

	if r := hopper(t, "no-such-command"); r.code == 0 {
		t.Errorf("unknown command exit 0")
	}
	if r := hopper(t, "run", "--no-such-flag"); r.code == 0 || !strings.Contains(r.stderr, "no-such-flag") {
		t.Errorf("unknown flag: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestConfigValidateReportsEveryProblem(t *testing.T) {
	path := configFile(t, `
queue:
  type: fifo
  tpyo: 1
broker:
  heartbeat: 30
retry:
  maxAttempts: 0
  policies:
    - name: p
      match:
        typo: x
log:
  level: loud
`)
	r := hopper(t, "config", "validate", "--config", path)
	if r.code != exitDataErr {
		t.Fatalf("exit %d, want 65\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if strings.Contains(r.stdout, "config OK") {
		t.Errorf("bad config reported OK: %s", r.stdout)
	}
	paths := []string{"queue.tpyo", "queue.type", "queue.name", "broker.heartbeat", "retry.maxAttempts",
		"retry.policies[0].match.typo", "retry.policies[0].match", "log.level"}
	found := 0
	for _, p := range paths {
		if strings.Contains(r.stderr, p+":") {
			found++
		} else {
			t.Errorf("stderr does not name %s:\n%s", p, r.stderr)
		}
	}
	if found < 3 {
		t.Fatalf("only %d of the problems named", found)
	}
	// The header's count matches the list.
	m := regexp.MustCompile(`\((\d+) problem\(s\)\)`).FindStringSubmatch(r.stderr)
	items := strings.Count(r.stderr, "\n  - ")
	if m == nil || m[1] != fmt.Sprint(items) || items != len(paths) {
		t.Errorf("header %q, %d items listed, want %d:\n%s", m, items, len(paths), r.stderr)
	}

	// Flags and --set are checked too, in the same run.
	r = hopper(t, "config", "validate", "--queue", "q", "--prefetch", "many", "--set", "retry.tiers=5", "--set", "nokey=1", "--set", "novalue")
	if r.code != exitDataErr {
		t.Fatalf("exit %d, want 65: %s", r.code, r.stderr)
	}
	for _, want := range []string{"--prefetch", "consumer.prefetch", "retry.tiers", "nokey: unknown key", `"novalue": want key=value`} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr does not mention %q:\n%s", want, r.stderr)
		}
	}
}

func TestConfigValidateGoodFile(t *testing.T) {
	path := configFile(t, `
queue:
  name: orders
retry:
  tiers: ["1s", "10s"]
  policies:
    - name: slow
      match: {type: "slow.*"}
      tiers: ["1m"]
`)
	r := hopper(t, "config", "validate", "--config", path)
	if r.code != 0 {
		t.Fatalf("exit %d\nstderr: %s", r.code, r.stderr)
	}
	if want := `config OK: queue "orders", 3 delay tier(s), DLQ "orders.dlq"`; !strings.Contains(r.stdout, want) {
		t.Errorf("stdout %q, want %q", r.stdout, want)
	}

	// Flags win over the file, and the environment is read.
	cmd := exec.Command(hopperBin, "config", "validate", "--config", path, "--queue", "from-flag")
	cmd.Env = cleanEnv("HOPPER_TOPOLOGY_DLQ={queue}.dead", "HOPPER_NOT_A_KEY=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(string(out), `config OK: queue "from-flag", 3 delay tier(s), DLQ "from-flag.dead"`) ||
		!strings.Contains(string(out), "HOPPER_NOT_A_KEY") {
		t.Errorf("output %s", out)
	}

	// The config file can come from HOPPER_CONFIG.
	cmd = exec.Command(hopperBin, "config", "validate")
	cmd.Env = cleanEnv("HOPPER_CONFIG=" + path)
	out, err = cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), `queue "orders"`) || strings.Contains(string(out), "warning") {
		t.Errorf("HOPPER_CONFIG: %v %s", err, out)
	}
}

func TestTopologyPlan(t *testing.T) {
	path := configFile(t, `
queue:
  name: orders
  type: quorum
retry:
  tiers: ["500ms", "5s", "1h30m"]
topology:
  dlqMaxLength: 1000
`)
	r := hopper(t, "topology", "plan", "--config", path)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{
		"work  orders durable=true",
		"tier  orders.retry.500ms durable=true",
		"x-message-ttl=500 ",
		"tier  orders.retry.5s durable=true",
		"tier  orders.retry.1h30m durable=true",
		"x-dead-letter-routing-key=orders",
		"dlq   orders.dlq durable=true",
		"x-max-length=1000",
		"x-overflow=reject-publish",
		"x-queue-type=quorum",
		"warning: quorum work queue \"orders\" has no x-delivery-limit",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("plan does not contain %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "x-expires") {
		t.Errorf("plan has x-expires:\n%s", r.stdout)
	}
	// Plan needs no broker: it must not try one.
	if r.stderr != "" {
		t.Errorf("stderr: %s", r.stderr)
	}
}

func TestTopologyApplyVerify(t *testing.T) {
	q := queueName(t)
	args := func(sub, queue string) []string {
		return []string{"topology", sub, "--broker-url", rabbit.URL(), "--queue", queue, "--set", "retry.tiers=1s,5s", "--log-level", "error"}
	}
	r := hopper(t, args("apply", q)...)
	if r.code != 0 || !strings.Contains(r.stdout, "topology applied: OK (4 queues)") {
		t.Fatalf("apply: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	wantDepths(t, planned(q), nil)
	r = hopper(t, args("verify", q)...)
	if r.code != 0 || !strings.Contains(r.stdout, "topology verified: OK (4 queues)") {
		t.Fatalf("verify: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	// apply is idempotent.
	if r = hopper(t, args("apply", q)...); r.code != 0 {
		t.Fatalf("second apply: exit %d: %s", r.code, r.stderr)
	}

	// Verify creates nothing and names what is missing.
	missing := queueName(t) + ".never-applied"
	r = hopper(t, args("verify", missing)...)
	if r.code == 0 {
		t.Fatalf("verify of a queue never applied: exit 0\n%s", r.stdout)
	}
	if !strings.Contains(r.stderr, `"`+missing+`"`) {
		t.Errorf("stderr does not name %q:\n%s", missing, r.stderr)
	}
	if _, err := inspector(t).Depth(missing); err == nil {
		t.Errorf("verify created %s", missing)
	}

	// Verify also catches tiers declared with other arguments: quorum
	// tiers (the default) where the config names classic ones.
	r = hopper(t, "topology", "verify", "--broker-url", rabbit.URL(), "--queue", q, "--set", "retry.tiers=1s,5s", "--set", "queue.tierType=classic")
	if r.code == 0 {
		t.Fatalf("verify with another queue type: exit 0\n%s", r.stdout)
	}
	if !strings.Contains(r.stderr, q+".retry.1s") {
		t.Errorf("stderr does not name the mismatched tier:\n%s", r.stderr)
	}
}

// syncBuffer collects a process's output while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a running `hopper run`.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	err    error
}

func startRun(t *testing.T, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(hopperBin, append([]string{"run"}, args...)...)
	cmd.Env = cleanEnv()
	p := &proc{t: t, cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stderr, p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			cmd.Process.Kill() //nolint:errcheck // the process we started
			<-p.done
		}
		if t.Failed() {
			t.Logf("hopper output:\n%s", p.stderr.String())
		}
	})
	return p
}

func (p *proc) signal(s os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		p.t.Fatalf("signal %v: %v", s, err)
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("hopper still running %v later", timeout)
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee):
		return ee.ExitCode() // -1 when killed by a signal
	default:
		p.t.Fatal(p.err)
		return -1
	}
}

func publish(t *testing.T, queue string, ids ...string) {
	t.Helper()
	pub := broker.NewPublisher(broker.PublisherOptions{Options: broker.Options{URLs: []string{rabbit.URL()}}, Channels: 1})
	defer pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, id := range ids {
		m := &msg.Message{MessageID: id, ContentType: "text/plain", Body: []byte("body-" + id), Headers: map[string]any{"x-test": id}}
		if err := pub.Publish(ctx, queue, m); err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
	}
}

// inspector opens an AMQP connection for polling queues: much cheaper
// than a rabbitmqctl call, which boots an Erlang VM each time.
func inspector(t *testing.T) *broker.Inspector {
	t.Helper()
	insp, err := broker.OpenInspector(context.Background(), broker.Options{URLs: []string{rabbit.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { insp.Close() })
	return insp
}

// queueExists waits for the sidecar to declare its topology.
func queueExists(t *testing.T, insp *broker.Inspector, name string, p *proc) {
	t.Helper()
	waitfor.Until(t, 30*time.Second, "queue "+name+" declared", func() bool {
		if p.exited() {
			t.Fatalf("hopper exited early:\n%s", p.stderr.String())
		}
		_, err := insp.Depth(name)
		return err == nil
	})
}

// readyIn waits until a queue holds n ready messages.
func readyIn(t *testing.T, insp *broker.Inspector, name string, n int) {
	t.Helper()
	waitfor.Until(t, 15*time.Second, fmt.Sprintf("%d ready message(s) in %s", n, name), func() bool {
		got, err := insp.Depth(name)
		return err == nil && got == n
	})
}

// depths returns the broker's own count (ready + unacked) of every queue,
// from one rabbitmqctl call.
func depths(t *testing.T) map[string]int {
	t.Helper()
	out, err := rabbit.Ctl("list_queues", "-q", "--no-table-headers", "-p", "/", "name", "messages")
	if err != nil {
		t.Fatalf("list queues: %v", err)
	}
	m := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		var name string
		var n int
		if _, err := fmt.Sscanf(line, "%s\t%d", &name, &n); err == nil {
			m[name] = n
		}
	}
	return m
}

// wantDepths checks queues against the broker's counts; a queue missing
// from want must be empty.
func wantDepths(t *testing.T, queues []string, want map[string]int) {
	t.Helper()
	got := depths(t)
	for _, q := range queues {
		n, ok := got[q]
		if !ok {
			t.Errorf("queue %s does not exist", q)
		} else if n != want[q] {
			t.Errorf("queue %s holds %d message(s), want %d", q, n, want[q])
		}
	}
}

func planned(q string) []string { return []string{q, q + ".retry.1s", q + ".retry.5s", q + ".dlq"} }

func runArgs(q, appURL string, extra ...string) []string {
	return append([]string{
		"--broker-url", rabbit.URL(),
		"--queue", q,
		"--app-url", appURL,
		"--admin-listen=",
		"--set", "retry.tiers=1s,5s",
		"--set", "broker.reconnectMax=1s",
	}, extra...)
}

func TestRunDeliversAndStopsCleanly(t *testing.T) {
	var mu sync.Mutex
	got := map[string]http.Header{}
	bodies := map[string]string{}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got[r.Header.Get("Hopper-Message-Id")] = r.Header.Clone()
		bodies[r.Header.Get("Hopper-Message-Id")] = string(b)
		mu.Unlock()
	}))
	defer app.Close()
	received := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }

	q := queueName(t)
	insp := inspector(t)
	p := startRun(t, runArgs(q, app.URL+"/in/{queue}")...)
	queueExists(t, insp, q, p)
	publish(t, q, "a", "b", "c")
	waitfor.Until(t, 30*time.Second, "the app to receive 3 messages", func() bool { return received() == 3 })

	p.signal(syscall.SIGTERM)
	if code := p.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	wantDepths(t, planned(q), nil)
	mu.Lock()
	defer mu.Unlock()
	for _, id := range []string{"a", "b", "c"} {
		h := got[id]
		if h.Get("Hopper-Queue") != q || h.Get("Hopper-Attempt") != "1" || h.Get("Hopper-Header-X-Test") != id ||
			h.Get("Content-Type") != "text/plain" || bodies[id] != "body-"+id {
			t.Errorf("message %s arrived as %v with body %q", id, h, bodies[id])
		}
	}
	out := p.stderr.String()
	// At the defaults the soft memory limit is the 64 MiB prefetch byte
	// budget plus 64 MiB.
	for _, ev := range []string{`"event":"SHUTDOWN_STARTED"`, `"event":"SHUTDOWN_COMPLETE"`,
		`"event":"MEMORY_LIMIT","bytes":134217728`} {
		if !strings.Contains(out, ev) {
			t.Errorf("log lacks %s", ev)
		}
	}
	if strings.Contains(out, "guest:guest@") {
		t.Error("broker password in the log")
	}
}

// hangingApp accepts requests and never answers until the test ends.
func hangingApp(t *testing.T) (url string, calls *atomic.Int64) {
	t.Helper()
	calls = &atomic.Int64{}
	release := make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(func() { close(release); app.Close() })
	return app.URL, calls
}

func TestRunSecondSignalExitsWithoutAcking(t *testing.T) {
	url, calls := hangingApp(t)
	q := queueName(t)
	insp := inspector(t)
	p := startRun(t, runArgs(q, url, "--set", "app.timeout=5m", "--set", "shutdown.grace=5m")...)
	queueExists(t, insp, q, p)
	publish(t, q, "stuck")
	waitfor.Until(t, 30*time.Second, "the app to receive the message", func() bool { return calls.Load() == 1 })

	p.signal(syscall.SIGTERM)
	waitfor.Until(t, 10*time.Second, "shutdown to start", func() bool {
		return strings.Contains(p.stderr.String(), `"event":"SHUTDOWN_STARTED"`)
	})
	if p.exited() {
		t.Fatalf("exited on the first signal with a message in flight and 5m of grace:\n%s", p.stderr.String())
	}
	began := time.Now()
	p.signal(syscall.SIGTERM)
	code := p.wait(5 * time.Second)
	if code == 0 {
		t.Errorf("forced exit reported success")
	}
	t.Logf("exited %v after the second signal, code %d", time.Since(began).Round(time.Millisecond), code)

	// Nothing was acked: the message is back in the work queue, and was
	// not moved anywhere.
	readyIn(t, insp, q, 1)
	if n, err := rabbit.QueueDepth(q); err != nil || n != 1 {
		t.Errorf("work queue depth %d (%v), want 1", n, err)
	}
	wantDepths(t, planned(q), map[string]int{q: 1})
	if calls.Load() != 1 {
		t.Errorf("app called %d times", calls.Load())
	}
}

func TestRunGraceExpiresReturnsMessage(t *testing.T) {
	url, calls := hangingApp(t)
	q := queueName(t)
	insp := inspector(t)
	p := startRun(t, runArgs(q, url, "--set", "app.timeout=5m", "--set", "shutdown.grace=1s")...)
	queueExists(t, insp, q, p)
	publish(t, q, "slow")
	waitfor.Until(t, 30*time.Second, "the app to receive the message", func() bool { return calls.Load() == 1 })

	p.signal(syscall.SIGTERM)
	if code := p.wait(15 * time.Second); code != 0 {
		t.Errorf("exit code %d after the grace period, want 0", code)
	}
	readyIn(t, insp, q, 1)
	wantDepths(t, planned(q), map[string]int{q: 1})
}

func TestRunFailsOnTopologyMismatch(t *testing.T) {
	url, _ := hangingApp(t)
	q := queueName(t)
	// declare=false: run only verifies, and nothing exists.
	r := hopper(t, append([]string{"run"}, runArgs(q, url, "--set", "topology.declare=false")...)...)
	if r.code == 0 {
		t.Fatalf("run against a missing topology: exit 0")
	}
	if !strings.Contains(r.stderr, "topology") || !strings.Contains(r.stderr, `"`+q+`"`) {
		t.Errorf("stderr does not explain the mismatch:\n%s", r.stderr)
	}
	if _, err := inspector(t).Depth(q); err == nil {
		t.Errorf("run with declare=false created %s", q)
	}
}

// TestTopologyBindings: apply declares the exchanges and binds the work
// queue (a message published to each exchange with a bound key lands in the
// work queue, one with an unbound key is refused as unroutable); verify
// checks them; an exchange that exists with another type fails apply and
// verify by name, and is left as it was.
func TestTopologyBindings(t *testing.T) {
	q := queueName(t)
	fan, top := q+".main-exchange", q+".events"
	cfg := func(topType string) string {
		return configFile(t, fmt.Sprintf(`
queue: {name: %s}
retry: {tiers: [1s, 5s]}
topology:
  bindings:
    - exchange: %s
      type: fanout
    - exchange: %s
      type: %s
      routingKeys: ["order.*", "invoice.paid"]
`, q, fan, top, topType))
	}
	good := cfg("topic")
	args := func(sub, file string) []string {
		return []string{"topology", sub, "-c", file, "--broker-url", rabbit.URL(), "--log-level", "error"}
	}
	r := hopper(t, args("apply", good)...)
	if r.code != 0 || !strings.Contains(r.stdout, "topology applied: OK (4 queues, 2 exchanges, 3 bindings)") {
		t.Fatalf("apply: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if r = hopper(t, args("verify", good)...); r.code != 0 {
		t.Fatalf("verify: exit %d\n%s", r.code, r.stderr)
	}

	pub := broker.NewPublisher(broker.PublisherOptions{Options: broker.Options{URLs: []string{rabbit.URL()}}, Channels: 1})
	defer pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, p := range []struct{ exchange, key string }{{fan, "anything"}, {top, "order.created"}, {top, "invoice.paid"}} {
		if err := pub.PublishTo(ctx, p.exchange, p.key, &msg.Message{MessageID: p.key, Body: []byte("x")}); err != nil {
			t.Fatalf("publish to %s with %q: %v", p.exchange, p.key, err)
		}
	}
	if err := pub.PublishTo(ctx, top, "order.created.late", &msg.Message{MessageID: "unbound", Body: []byte("x")}); err == nil {
		t.Error("a key no binding matches was routed to the work queue")
	}
	readyIn(t, inspector(t), q, 3)

	// The topic exchange declared as direct: refused by name, not redeclared.
	bad := cfg("direct")
	for _, sub := range []string{"apply", "verify"} {
		r = hopper(t, args(sub, bad)...)
		if r.code == 0 {
			t.Fatalf("%s with the exchange's type changed: exit 0\n%s", sub, r.stdout)
		}
		if !strings.Contains(r.stderr, fmt.Sprintf("exchange %q exists with another type", top)) {
			t.Errorf("%s: stderr does not name the mismatched exchange:\n%s", sub, r.stderr)
		}
	}
	if err := pub.PublishTo(ctx, top, "order.again", &msg.Message{MessageID: "again", Body: []byte("x")}); err != nil {
		t.Errorf("the topic exchange no longer routes after the refused redeclare: %v", err)
	}

	// Verify creates nothing: a missing exchange is named.
	missing := configFile(t, fmt.Sprintf("queue: {name: %s}\nretry: {tiers: [1s, 5s]}\ntopology:\n  bindings:\n    - {exchange: %s.nope, type: fanout}\n", q, q))
	if r = hopper(t, args("verify", missing)...); r.code == 0 || !strings.Contains(r.stderr, q+".nope") {
		t.Errorf("verify of a missing exchange: exit %d\n%s", r.code, r.stderr)
	}
}

package dlq_test

// Tests of the hopper dlq commands against a real RabbitMQ node, through
// the built binary: exactly what an operator runs, signals and exit codes
// included. The node starts on first use, so the pure tests of this package
// run without one.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

var (
	brokerOnce sync.Once
	shared     *testbroker.Broker
	brokerErr  error

	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: testbroker: stop: %v\n", err)
			code = max(code, 1)
		}
	}
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// rabbit returns the package's RabbitMQ node, starting it on first use.
// A missing RabbitMQ fails the test; it is never skipped.
func rabbit(t *testing.T) *testbroker.Broker {
	t.Helper()
	brokerOnce.Do(func() { shared, brokerErr = testbroker.Start(testbroker.Options{Quiet: true}) })
	if brokerErr != nil {
		t.Fatalf("testbroker: cannot start RabbitMQ: %v\n%s", brokerErr, testbroker.InstallHint)
	}
	return shared
}

// hopper returns the path of the hopper binary, built once per run.
func hopper(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "hopper-dlq-test-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "hopper")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/hopper-sidecar/hopper/cmd/hopper").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// env is one test's broker, queue names and clients.
type env struct {
	t    *testing.T
	rb   *testbroker.Broker
	opts broker.Options
	pub  *broker.Publisher
	// Work is a work queue and DLQ its dead-letter queue, as Hopper names
	// them by default.
	Work, DLQ string
}

var seq atomic.Int64

func newEnv(t *testing.T) *env {
	return newEnvOn(t, rabbit(t))
}

func newEnvOn(t *testing.T, rb *testbroker.Broker) *env {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()))
	e := &env{t: t, rb: rb, Work: fmt.Sprintf("d%d.%s", seq.Add(1), name)}
	e.DLQ = e.Work + ".dlq"
	e.opts = broker.Options{URLs: []string{rb.URL()}, ConnectTimeout: 5 * time.Second,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond, Name: "test " + t.Name()}
	e.pub = broker.NewPublisher(broker.PublisherOptions{Options: e.opts, Channels: 16, ConfirmTimeout: 10 * time.Second})
	t.Cleanup(func() { e.pub.Close() })
	e.declare(e.Work, nil)
	e.declare(e.DLQ, nil)
	return e
}

// declare declares a durable classic queue with extra arguments.
func (e *env) declare(name string, args map[string]any) {
	e.t.Helper()
	a := map[string]any{"x-queue-type": "classic"}
	for k, v := range args {
		a[k] = v
	}
	plan := topology.Plan{Work: topology.Queue{Name: name, Role: topology.RoleWork, Args: a, Owned: true}, Declare: true}
	plan.DLQ = plan.Work // declared twice, idempotent
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := broker.Apply(ctx, e.opts, &plan, true); err != nil {
		e.t.Fatal(err)
	}
}

// deadMsg is a message as Hopper dead-letters it from queue.
func deadMsg(id, queue, rk, reason string, status int, age time.Duration) *msg.Message {
	m := &msg.Message{MessageID: id, ContentType: "application/json", Headers: map[string]any{msg.HeaderRetryCount: int32(3)},
		Body: []byte(`{"id":"` + id + `"}`), Timestamp: time.Now().Add(-age).Truncate(time.Second)}
	*m = *msg.DLQCopy(m, msg.Info{Queue: queue, RoutingKey: rk}, msg.DeadLetter{Status: status, Reason: reason, Retries: 3, Error: "HTTP " + strconv.Itoa(status), Now: time.Now().Add(-age)})
	return m
}

// fill publishes messages to a queue, in order, each confirmed.
func (e *env) fill(queue string, ms ...*msg.Message) {
	e.t.Helper()
	for _, m := range ms {
		if err := e.pub.Publish(context.Background(), queue, m); err != nil {
			e.t.Fatal(err)
		}
	}
}

// fillFast publishes n dead-lettered messages (ids prefix0..) in parallel;
// their order in the queue is not guaranteed.
func (e *env) fillFast(queue, prefix string, n int, body []byte) {
	e.t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	ids := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ids {
				m := &msg.Message{MessageID: prefix + strconv.Itoa(i), Headers: map[string]any{}, Body: body}
				*m = *msg.DLQCopy(m, msg.Info{Queue: e.Work}, msg.DeadLetter{Reason: "max-attempts", Status: 503, Now: time.Now()})
				if err := e.pub.Publish(context.Background(), queue, m); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := range n {
		ids <- i
	}
	close(ids)
	wg.Wait()
	select {
	case err := <-errs:
		e.t.Fatal(err)
	default:
	}
}

// browse returns the messages of a queue in order, leaving it unchanged.
// Closing the connection gracefully makes the broker requeue what it held
// before it answers close-ok, so the next look sees the same queue. (After
// a SIGKILL or a broker restart, call settled first.)
func (e *env) browse(queue string) []*msg.Message {
	e.t.Helper()
	return e.getAll(queue, false)
}

// getAll gets every message of a queue in order, acking each when ack is
// set.
func (e *env) getAll(queue string, ack bool) []*msg.Message {
	e.t.Helper()
	in, err := broker.OpenInspector(context.Background(), e.opts)
	if err != nil {
		e.t.Fatal(err)
	}
	defer in.Close()
	var out []*msg.Message
	for {
		d, ok, err := in.Get(queue)
		if err != nil {
			e.t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d.Message())
		if ack {
			if err := d.Ack(); err != nil {
				e.t.Fatal(err)
			}
		}
	}
}

func ids(ms []*msg.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.MessageID
	}
	return out
}

// settled waits until no message of the queue is unacked: a closed
// connection's messages return asynchronously.
func (e *env) settled(queue string) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, unacked, err := e.rb.QueueCounts(queue)
		if err != nil {
			e.t.Fatal(err)
		}
		if unacked == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("queue %s still has %d unacked messages", queue, unacked)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// depth is the ready count of a queue.
func (e *env) depth(queue string) int {
	e.t.Helper()
	in, err := broker.OpenInspector(context.Background(), e.opts)
	if err != nil {
		e.t.Fatal(err)
	}
	defer in.Close()
	n, err := in.Depth(queue)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// result is one run of the binary.
type result struct {
	code           int
	stdout, stderr string
}

// command builds `hopper dlq <args> --broker-url <url>` with a clean
// environment (no HOPPER_* from the developer's shell).
func (e *env) command(args ...string) *exec.Cmd {
	e.t.Helper()
	full := append([]string{"dlq"}, args...)
	full = append(full, "--broker-url", e.rb.URL(), "--log-format", "text")
	cmd := exec.Command(hopper(e.t), full...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOPPER_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	return cmd
}

func (e *env) run(args ...string) result {
	e.t.Helper()
	cmd := e.command(args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		e.t.Fatal(err)
	}
	return r
}

// ok runs and requires exit status 0.
func (e *env) ok(args ...string) result {
	e.t.Helper()
	r := e.run(args...)
	if r.code != 0 {
		e.t.Fatalf("hopper dlq %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

func (e *env) replayJSON(args ...string) (dlq.ReplayResult, result) {
	e.t.Helper()
	r := e.run(append([]string{"replay", "-o", "json"}, args...)...)
	var res dlq.ReplayResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		e.t.Fatalf("replay output is not JSON (%v), exit %d:\n%s\n%s", err, r.code, r.stdout, r.stderr)
	}
	return res, r
}

func TestCLIStatsCountsWithoutRemoving(t *testing.T) {
	e := newEnv(t)
	e.fill(e.DLQ,
		deadMsg("1", "orders", "o.c", "max-attempts", 503, 3*time.Hour),
		deadMsg("2", "orders", "o.c", "non-retriable", 404, time.Hour),
		deadMsg("3", "billing", "b", "max-attempts", 503, 2*time.Hour),
		deadMsg("4", "billing", "b", "expired", 0, 10*time.Minute),
		&msg.Message{MessageID: "5", Headers: map[string]any{}, Body: []byte("foreign")},
	)
	before := ids(e.browse(e.DLQ))

	r := e.ok("stats", "--dlq", e.DLQ, "-o", "json")
	var st dlq.Stats
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("%v:\n%s", err, r.stdout)
	}
	if st.Depth != 5 || st.Scanned != 5 || st.NoTime != 1 {
		t.Errorf("depth %d scanned %d noTime %d", st.Depth, st.Scanned, st.NoTime)
	}
	if st.ByQueue["orders"] != 2 || st.ByQueue["billing"] != 2 || st.ByQueue[dlq.Unknown] != 1 {
		t.Errorf("by queue %v", st.ByQueue)
	}
	if st.ByReason["max-attempts"] != 2 || st.ByReason["expired"] != 1 || st.ByStatus["503"] != 2 || st.ByStatus["0"] != 1 {
		t.Errorf("by reason %v, by status %v", st.ByReason, st.ByStatus)
	}
	if age := time.Since(st.Oldest); age < 3*time.Hour-time.Minute || age > 3*time.Hour+time.Minute {
		t.Errorf("oldest %v (%s ago)", st.Oldest, age)
	}
	if age := time.Since(st.Newest); age < 9*time.Minute || age > 11*time.Minute {
		t.Errorf("newest %v (%s ago)", st.Newest, age)
	}

	table := e.ok("stats", "--dlq", e.DLQ).stdout
	for _, want := range []string{"depth", "5", "By original queue", "orders", "By reason", "By final status", "oldest"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if after := ids(e.browse(e.DLQ)); !slices.Equal(after, before) {
		t.Fatalf("stats changed the DLQ: %v -> %v", before, after)
	}
}

// The DLQ name comes from the config when --dlq is not given: the DLQ of
// queue.name through topology.dlq.
func TestCLIDLQNameFromConfig(t *testing.T) {
	e := newEnv(t)
	e.fill(e.DLQ, deadMsg("1", e.Work, "k", "max-attempts", 500, time.Minute))
	r := e.ok("stats", "--queue", e.Work, "-o", "json")
	if !strings.Contains(r.stdout, `"dlq": "`+e.DLQ+`"`) || !strings.Contains(r.stdout, `"depth": 1`) {
		t.Fatalf("stats of --queue %s:\n%s", e.Work, r.stdout)
	}
	cfg := filepath.Join(t.TempDir(), "hopper.yaml")
	custom := e.Work + ".parked"
	e.declare(custom, nil)
	e.fill(custom, deadMsg("p", e.Work, "k", "max-attempts", 500, time.Minute))
	if err := os.WriteFile(cfg, []byte("queue:\n  name: "+e.Work+"\ntopology:\n  dlq: \"{queue}.parked\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = e.ok("stats", "--config", cfg, "-o", "json")
	if !strings.Contains(r.stdout, `"dlq": "`+custom+`"`) {
		t.Fatalf("stats with topology.dlq template:\n%s", r.stdout)
	}
	if r := e.run("stats", "--dlq", "no-such-dlq-"+e.Work); r.code == 0 || !strings.Contains(r.stderr, "does not exist") {
		t.Fatalf("missing DLQ: exit %d\n%s", r.code, r.stderr)
	}
}

func TestCLIPeekShowsWithoutRemoving(t *testing.T) {
	e := newEnv(t)
	bin := &msg.Message{MessageID: "bin", Headers: map[string]any{"x-original-queue": "orders", "n": int16(7)}, Body: []byte{0, 1, 2, 0xff}}
	e.fill(e.DLQ,
		deadMsg("1", "orders", "order.created", "max-attempts", 503, time.Hour),
		bin,
		deadMsg("3", "orders", "order.created", "max-attempts", 503, time.Hour),
	)
	before := ids(e.browse(e.DLQ))
	out := e.ok("peek", "--dlq", e.DLQ, "-n", "2").stdout
	for _, want := range []string{
		"--- message 1 ---", "message-id:       1", "x-dead-letter-reason: max-attempts", "x-final-status-code: 503 (int64)",
		`body (10 bytes, text):`, `{"id":"1"}`,
		"--- message 2 ---", "body (4 bytes, binary)", "00 01 02 ff", "n: 7 (int16)",
		"2 of 3 message(s)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("peek lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "--- message 3 ---") {
		t.Error("peek -n 2 showed a third message")
	}
	js := e.ok("peek", "--dlq", e.DLQ, "-n", "5", "-o", "json").stdout
	lines := strings.Split(strings.TrimSpace(js), "\n")
	if len(lines) != 3 {
		t.Fatalf("json peek: %d lines:\n%s", len(lines), js)
	}
	if m, err := dlq.UnmarshalLine([]byte(lines[1])); err != nil || !bytes.Equal(m.Body, bin.Body) || m.Headers["n"] != int16(7) {
		t.Errorf("json line 2: %v %+v", err, m)
	}
	if after := ids(e.browse(e.DLQ)); !slices.Equal(after, before) {
		t.Fatalf("peek changed the DLQ: %v -> %v", before, after)
	}
}

func TestCLIReplayMovesToOriginalQueues(t *testing.T) {
	e := newEnv(t)
	other := e.Work + ".billing"
	e.declare(other, nil)
	foreign := &msg.Message{MessageID: "foreign", Headers: map[string]any{}, Body: []byte("no origin")}
	capped := deadMsg("capped", e.Work, "k", "max-attempts", 500, time.Hour)
	capped.Headers[msg.HeaderReplayCount] = int32(5)
	e.fill(e.DLQ,
		deadMsg("a", e.Work, "order.created", "max-attempts", 503, time.Hour),
		foreign,
		deadMsg("b", other, "bill", "non-retriable", 404, time.Hour),
		capped,
		deadMsg("c", e.Work, "order.created", "max-attempts", 503, time.Hour),
	)
	res, r := e.replayJSON("--dlq", e.DLQ)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	if res.Present != 5 || res.Recovered != 3 || res.Kept != 2 || res.Failed != 0 || res.End != dlq.EndDone {
		t.Fatalf("result %+v", res)
	}
	if res.ByQueue[e.Work].Recovered != 2 || res.ByQueue[other].Recovered != 1 || res.ByQueue[dlq.Unknown].Kept != 1 {
		t.Errorf("by queue %+v", res.ByQueue)
	}
	if !strings.Contains(r.stderr, "5 message(s) present") {
		t.Errorf("no start line on stderr:\n%s", r.stderr)
	}
	work := e.browse(e.Work)
	// Parallel publishes (--parallel 8) may land in either order.
	if got := ids(work); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"a", "c"}) {
		t.Errorf("work queue %v", got)
	}
	slices.SortFunc(work, func(x, y *msg.Message) int { return strings.Compare(x.MessageID, y.MessageID) })
	if got := ids(e.browse(other)); !slices.Equal(got, []string{"b"}) {
		t.Errorf("billing queue %v", got)
	}
	if got := ids(e.browse(e.DLQ)); !slices.Equal(got, []string{"foreign", "capped"}) {
		t.Errorf("DLQ after %v", got)
	}
	h := work[0].Headers
	if n, _ := msg.AsInt(h[msg.HeaderReplayCount]); n != 1 {
		t.Errorf("x-replay-count %v", h[msg.HeaderReplayCount])
	}
	if _, ok := h[msg.HeaderDeadLetterReason]; ok {
		t.Error("x-dead-letter-reason kept on the replayed copy")
	}
	if n, _ := msg.AsInt(h[msg.HeaderRetryCount]); n != 3 {
		t.Errorf("x-retry-count %v, want it kept without --reset-attempts", h[msg.HeaderRetryCount])
	}
	if work[0].ContentType != "application/json" || string(work[0].Body) != `{"id":"a"}` || work[0].DeliveryMode != 2 {
		t.Errorf("copy properties changed: %+v", work[0])
	}

	// Table summary, and a second run keeps what has no destination.
	r = e.ok("replay", "--dlq", e.DLQ)
	for _, want := range []string{"present at start", "recovered", "kept", "no destination", "Original queue"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("summary lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestCLIReplayResetAttemptsAndTo(t *testing.T) {
	e := newEnv(t)
	fixed := e.Work + ".fixed"
	e.declare(fixed, nil)
	m := deadMsg("a", e.Work, "k", "max-attempts", 503, time.Hour)
	m.Headers[msg.HeaderDeadline] = int64(1)
	e.fill(e.DLQ, m, &msg.Message{MessageID: "foreign", Headers: map[string]any{}})
	res, r := e.replayJSON("--dlq", e.DLQ, "--to", fixed, "--reset-attempts", "--clear-deadline", "--parallel", "1")
	if r.code != 0 || res.Recovered != 2 {
		t.Fatalf("exit %d %+v\n%s", r.code, res, r.stderr)
	}
	got := e.browse(fixed)
	if !slices.Equal(ids(got), []string{"a", "foreign"}) {
		t.Fatalf("--to queue %v", ids(got))
	}
	for _, h := range []string{msg.HeaderRetryCount, msg.HeaderFirstFailureTime, msg.HeaderDeadline, msg.HeaderFinalStatusCode} {
		if _, ok := got[0].Headers[h]; ok {
			t.Errorf("%s kept with --reset-attempts --clear-deadline", h)
		}
	}
	if r := e.run("replay", "--dlq", e.DLQ, "--to", e.DLQ); r.code == 0 {
		t.Error("--to the DLQ itself accepted")
	}
	e.fill(e.DLQ, deadMsg("b", e.Work, "k", "max-attempts", 503, time.Hour))
	if r := e.run("replay", "--dlq", e.DLQ, "--to", "no-such-"+e.Work); r.code == 0 || !strings.Contains(r.stderr, "destination queue") {
		t.Errorf("--to a missing queue: exit %d\n%s", r.code, r.stderr)
	}
	if n := e.depth(e.DLQ); n != 1 {
		t.Errorf("DLQ holds %d after a refused replay", n)
	}
}

func TestCLIReplayFilters(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"original queue", []string{"--original-queue", "billing"}, []string{"3", "4"}},
		{"reason", []string{"--reason", "non-retriable,expired"}, []string{"2", "4"}},
		{"status class", []string{"--status", "5xx"}, []string{"1", "3"}},
		{"status code", []string{"--status", "404"}, []string{"2"}},
		{"status none", []string{"--status", "0"}, []string{"4"}},
		{"routing key", []string{"--routing-key", "order.*"}, []string{"1", "2"}},
		{"header", []string{"--header", "tenant=acme"}, []string{"1", "4"}},
		{"header present", []string{"--header", "tenant"}, []string{"1", "2", "4"}},
		{"older than", []string{"--older-than", "90m"}, []string{"1", "3"}},
		{"newer than", []string{"--newer-than", "90m"}, []string{"2", "4"}},
		{"limit", []string{"--limit", "2", "--parallel", "1"}, []string{"1", "2"}},
		{"combined", []string{"--reason", "max-attempts", "--status", "503", "--routing-key", "#"}, []string{"1", "3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			billing := e.Work + ".billing"
			e.declare(billing, nil)
			all := []*msg.Message{
				deadMsg("1", e.Work, "order.created", "max-attempts", 503, 3*time.Hour),
				deadMsg("2", e.Work, "order.updated", "non-retriable", 404, time.Hour),
				deadMsg("3", billing, "bill.created", "max-attempts", 503, 2*time.Hour),
				deadMsg("4", billing, "bill.created", "expired", 0, 10*time.Minute),
			}
			all[0].Headers["tenant"] = "acme"
			all[1].Headers["tenant"] = "other"
			all[3].Headers["tenant"] = "acme"
			e.fill(e.DLQ, all...)
			args := slices.Clone(tc.args)
			for i := range args { // the test's own queue names
				args[i] = strings.ReplaceAll(args[i], "billing", billing)
			}
			res, r := e.replayJSON(append([]string{"--dlq", e.DLQ}, args...)...)
			if r.code != 0 {
				t.Fatalf("exit %d\n%s", r.code, r.stderr)
			}
			moved := append(ids(e.browse(e.Work)), ids(e.browse(billing))...)
			slices.Sort(moved)
			if !slices.Equal(moved, tc.want) {
				t.Errorf("moved %v, want %v (result %+v)", moved, tc.want, res)
			}
			var rest []string
			for _, m := range all {
				if !slices.Contains(tc.want, m.MessageID) {
					rest = append(rest, m.MessageID)
				}
			}
			if got := ids(e.browse(e.DLQ)); !slices.Equal(got, rest) {
				t.Errorf("DLQ after %v, want %v in their original order", got, rest)
			}
			if res.Recovered != len(tc.want) {
				t.Errorf("recovered %d", res.Recovered)
			}
		})
	}
}

func TestCLIReplayDryRunChangesNothing(t *testing.T) {
	e := newEnv(t)
	e.fill(e.DLQ, deadMsg("1", e.Work, "k", "max-attempts", 503, time.Hour), deadMsg("2", e.Work, "k", "expired", 0, time.Hour))
	res, r := e.replayJSON("--dlq", e.DLQ, "--dry-run", "--reason", "expired")
	if r.code != 0 || res.WouldRecover != 1 || res.Skipped != 1 || res.Recovered != 0 || !res.DryRun {
		t.Fatalf("exit %d %+v", r.code, res)
	}
	if n := e.depth(e.Work); n != 0 {
		t.Errorf("dry run published %d", n)
	}
	if got := ids(e.browse(e.DLQ)); !slices.Equal(got, []string{"1", "2"}) {
		t.Errorf("DLQ after %v", got)
	}
}

func TestCLIReplayUnroutableDestinationStays(t *testing.T) {
	e := newEnv(t)
	e.fill(e.DLQ, deadMsg("lost", "no-such-queue-"+e.Work, "k", "max-attempts", 500, time.Hour), deadMsg("ok", e.Work, "k", "max-attempts", 500, time.Hour))
	res, r := e.replayJSON("--dlq", e.DLQ)
	if r.code == 0 || res.Failed != 1 || res.Recovered != 1 {
		t.Fatalf("exit %d %+v", r.code, res)
	}
	if !strings.Contains(r.stderr, "could not be replayed") {
		t.Errorf("stderr:\n%s", r.stderr)
	}
	if got := ids(e.browse(e.DLQ)); !slices.Equal(got, []string{"lost"}) {
		t.Errorf("DLQ after %v", got)
	}
}

func TestCLIReplayRate(t *testing.T) {
	e := newEnv(t)
	for i := range 6 {
		e.fill(e.DLQ, deadMsg(strconv.Itoa(i), e.Work, "k", "max-attempts", 500, time.Hour))
	}
	res, r := e.replayJSON("--dlq", e.DLQ, "--rate", "10")
	if r.code != 0 || res.Recovered != 6 {
		t.Fatalf("exit %d %+v", r.code, res)
	}
	if el := time.Duration(res.Elapsed); el < 450*time.Millisecond {
		t.Errorf("6 messages at 10/s in %s", el)
	}
}

// --timeout stops taking messages; the ones in flight finish, the rest
// stay, and the run says why it stopped.
func TestCLIReplayTotalTimeout(t *testing.T) {
	e := newEnv(t)
	const n = 30
	for i := range n {
		e.fill(e.DLQ, deadMsg(strconv.Itoa(i), e.Work, "k", "max-attempts", 500, time.Hour))
	}
	res, r := e.replayJSON("--dlq", e.DLQ, "--rate", "10", "--timeout", "1s")
	if r.code == 0 || res.End != dlq.EndInterrupted || !strings.Contains(r.stderr, "total timeout 1s reached") {
		t.Fatalf("exit %d %+v\n%s", r.code, res, r.stderr)
	}
	// At most what the rate allows in 1 s (the first one at once, then 10
	// a second); how many fewer a slow machine moves, connecting included,
	// is not the point.
	moved, left := e.depth(e.Work), e.depth(e.DLQ)
	if res.Recovered > 11 || moved != res.Recovered || moved+left != n {
		t.Fatalf("recovered %d, work queue %d, DLQ %d", res.Recovered, moved, left)
	}
	// Messages held unacked by someone else (here a browse) are not
	// present: the run ends at once instead of waiting for them. (Waiting
	// out --idle-timeout is covered by TestReplayEndsWhenDLQIsEmpty.)
	in, err := broker.OpenInspector(context.Background(), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	for range left {
		if _, ok, err := in.Get(e.DLQ); !ok || err != nil {
			t.Fatalf("get: %v %v", ok, err)
		}
	}
	res, r = e.replayJSON("--dlq", e.DLQ, "--idle-timeout", "1m")
	in.Close()
	// Done with nothing present: it did not wait for the held messages (an
	// idle timeout of a minute would have ended it as idle).
	if r.code != 0 || res.End != dlq.EndDone || res.Present != 0 {
		t.Fatalf("replay of a DLQ whose messages are all held elsewhere: exit %d %+v", r.code, res)
	}
}

// A destination that dead-letters every message straight back to the DLQ
// (TTL 0): one run replays each message once, not again and again.
func TestCLIReplayBoundedWhenMessagesComeBack(t *testing.T) {
	e := newEnv(t)
	bounce := e.Work + ".bounce"
	e.declare(bounce, map[string]any{"x-message-ttl": int32(0), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": e.DLQ})
	const n = 50
	for i := range n {
		e.fill(e.DLQ, deadMsg(strconv.Itoa(i), e.Work, "k", "max-attempts", 500, time.Hour))
	}
	res, r := e.replayJSON("--dlq", e.DLQ, "--to", bounce, "--parallel", "4")
	if r.code != 0 || res.Recovered != n || res.Taken != n {
		t.Fatalf("exit %d %+v\n%s", r.code, res, r.stderr)
	}
	back := e.browse(e.DLQ)
	if len(back) != n {
		t.Fatalf("DLQ holds %d after the run, want the %d that came back once", len(back), n)
	}
	for _, m := range back {
		if c, _ := msg.AsInt(m.Headers[msg.HeaderReplayCount]); c != 1 {
			t.Fatalf("message %s came back with x-replay-count %d", m.MessageID, c)
		}
	}
	// Each further run replays them once more, until the cap keeps them.
	for run := 2; run <= 4; run++ {
		res, _ := e.replayJSON("--dlq", e.DLQ, "--to", bounce, "--max-replays", "3")
		want := n
		if run == 4 {
			want = 0
		}
		if res.Recovered != want || res.Kept != n-want {
			t.Fatalf("run %d: %+v", run, res)
		}
	}
	if got := e.depth(e.DLQ); got != n {
		t.Fatalf("DLQ holds %d, want %d: the loop multiplied messages", got, n)
	}
}

// Two replayers on one DLQ: the second is refused and the first moves every
// message exactly once.
func TestCLIReplayConcurrentReplayerRefused(t *testing.T) {
	e := newEnv(t)
	const n = 20
	for i := range n {
		e.fill(e.DLQ, deadMsg(strconv.Itoa(i), e.Work, "k", "max-attempts", 500, time.Hour))
	}
	first := e.command("replay", "--dlq", e.DLQ, "--rate", "4", "-o", "json")
	var out, errb bytes.Buffer
	first.Stdout, first.Stderr = &out, &errb
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 10*time.Second, "the condition", func() bool { return e.depth(e.Work) > 0 })

	second := e.run("replay", "--dlq", e.DLQ)
	if second.code == 0 || !strings.Contains(second.stderr, "another replayer owns DLQ \""+e.DLQ+"\"") {
		t.Fatalf("second replayer: exit %d\n%s\n%s", second.code, second.stdout, second.stderr)
	}
	// export --remove owns the DLQ the same way; a plain export may read.
	if r := e.run("export", "--dlq", e.DLQ, "--remove", "--file", filepath.Join(t.TempDir(), "x.jsonl")); r.code == 0 {
		t.Error("export --remove ran beside a replayer")
	}

	if err := first.Wait(); err != nil {
		t.Fatalf("first replayer: %v\n%s", err, errb.String())
	}
	var res dlq.ReplayResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || res.Recovered != n {
		t.Fatalf("first replayer: %v %+v", err, res)
	}
	got := ids(e.browse(e.Work))
	slices.Sort(got)
	want := make([]string, n)
	for i := range n {
		want[i] = strconv.Itoa(i)
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("work queue %v", got)
	}
	if e.depth(e.DLQ) != 0 {
		t.Fatal("DLQ not empty")
	}
	if _, err := e.rb.QueueDepth(broker.LockQueue(e.DLQ)); !errors.Is(err, testbroker.ErrNoQueue) {
		t.Errorf("lock queue left behind: %v", err)
	}
}

// Quorum queues accept several "exclusive" consumers; the lock queue still
// refuses a second replayer.
func TestCLIReplayQuorumDLQ(t *testing.T) {
	e := newEnv(t)
	qdlq := e.Work + ".qdlq"
	e.declare(qdlq, map[string]any{"x-queue-type": "quorum"})
	const n = 12
	for i := range n {
		e.fill(qdlq, deadMsg(strconv.Itoa(i), e.Work, "k", "max-attempts", 500, time.Hour))
	}
	first := e.command("replay", "--dlq", qdlq, "--rate", "4", "-o", "json")
	var out, errb bytes.Buffer
	first.Stdout, first.Stderr = &out, &errb
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 10*time.Second, "the condition", func() bool { return e.depth(e.Work) > 0 })
	if r := e.run("replay", "--dlq", qdlq); r.code == 0 || !strings.Contains(r.stderr, "another replayer owns DLQ") {
		t.Fatalf("second replayer of a quorum DLQ: exit %d\n%s", r.code, r.stderr)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("first replayer: %v\n%s", err, errb.String())
	}
	if got := len(e.browse(e.Work)); got != n {
		t.Fatalf("work queue holds %d, want %d", got, n)
	}
	if d := e.depth(qdlq); d != 0 {
		t.Fatalf("quorum DLQ holds %d", d)
	}
}

// account checks that every id 0..n-1 is in the DLQ or the destination
// and returns how many are in both.
func (e *env) account(prefix string, n int, dest string) (inDLQ, inDest, dups int) {
	e.t.Helper()
	e.settled(e.DLQ)
	where := map[string]int{}
	for _, m := range e.browse(e.DLQ) {
		where[m.MessageID] |= 1
		inDLQ++
	}
	destCount := map[string]int{}
	for _, m := range e.browse(dest) {
		where[m.MessageID] |= 2
		destCount[m.MessageID]++
		inDest++
	}
	for i := range n {
		id := prefix + strconv.Itoa(i)
		switch where[id] {
		case 0:
			e.t.Errorf("message %s lost", id)
		case 3:
			dups++
		}
		if destCount[id] > 1 {
			dups += destCount[id] - 1
		}
	}
	return inDLQ, inDest, dups
}

// SIGKILL mid-replay loses nothing; at most the messages in flight
// (--parallel) end up in both queues.
func TestCLIReplaySIGKILLLosesNothing(t *testing.T) {
	e := newEnv(t)
	const n, parallel = 3000, 8
	e.fillFast(e.DLQ, "k", n, bytes.Repeat([]byte("x"), 256))
	// At 50 msg/s the replay needs a minute: the kill lands mid-run on any
	// machine, however slowly the depth below is polled.
	cmd := e.command("replay", "--dlq", e.DLQ, "--parallel", strconv.Itoa(parallel), "--rate", "50")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 30*time.Second, "the replay under way", func() bool {
		d, _ := e.rb.QueueDepth(e.Work)
		return d >= 50
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	inDLQ, inDest, dups := e.account("k", n, e.Work)
	t.Logf("after SIGKILL: DLQ %d, work queue %d, in both %d", inDLQ, inDest, dups)
	if inDest == 0 || inDest == n {
		t.Fatalf("the kill did not land mid-replay (work queue %d)", inDest)
	}
	if dups > parallel {
		t.Errorf("%d duplicates, want at most %d (the publishes in flight)", dups, parallel)
	}

	// A second run finishes the job.
	res, r := e.replayJSON("--dlq", e.DLQ, "--parallel", "16")
	if r.code != 0 || res.Recovered != inDLQ {
		t.Fatalf("second run: exit %d %+v\n%s", r.code, res, r.stderr)
	}
	inDLQ, inDest, dups2 := e.account("k", n, e.Work)
	if inDLQ != 0 || inDest != n+dups || dups2 != dups {
		t.Errorf("after the second run: DLQ %d, work queue %d, duplicates %d (want 0, %d, %d)", inDLQ, inDest, dups2, n+dups, dups)
	}
}

// A broker restart mid-replay ends the run with an error; nothing is lost
// and a second run finishes.
func TestCLIReplayBrokerRestart(t *testing.T) {
	rb := testbroker.MustStart(t)
	e := newEnvOn(t, rb)
	const n, parallel = 3000, 8
	e.fillFast(e.DLQ, "r", n, bytes.Repeat([]byte("y"), 256))
	// At 50 msg/s the replay needs a minute, far longer than a graceful
	// node stop takes on any machine, so the stop always lands mid-run. A
	// graceful stop (not a SIGKILL) keeps the acks already sent, which is
	// what bounds the duplicates below.
	cmd := e.command("replay", "--dlq", e.DLQ, "--parallel", strconv.Itoa(parallel), "--rate", "50", "-o", "json")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 30*time.Second, "the condition", func() bool {
		d, _ := rb.QueueDepth(e.Work)
		return d >= 50
	})
	if err := rb.Restart(); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	// A replay cut short by a lost broker is a temporary failure (75):
	// what it did not move is still in the DLQ.
	if !errors.As(err, &ee) || ee.ExitCode() != 75 {
		t.Fatalf("replay across a broker restart: %v\n%s", err, errb.String())
	}
	var res dlq.ReplayResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("no summary after the restart: %v\n%s\n%s", err, out.String(), errb.String())
	}
	if res.End != dlq.EndLost && res.End != dlq.EndStalled {
		t.Errorf("end %q", res.End)
	}
	e.pub.Close()
	e.pub = broker.NewPublisher(broker.PublisherOptions{Options: e.opts, Channels: 4, ConfirmTimeout: 10 * time.Second})
	inDLQ, inDest, dups := e.account("r", n, e.Work)
	t.Logf("after the restart: DLQ %d, work queue %d, in both %d; first run %+v", inDLQ, inDest, dups, res)
	if dups > parallel {
		t.Errorf("%d duplicates, want at most %d", dups, parallel)
	}
	res2, r := e.replayJSON("--dlq", e.DLQ)
	if r.code != 0 {
		t.Fatalf("second run: exit %d\n%s", r.code, r.stderr)
	}
	if inDLQ, _, _ := e.account("r", n, e.Work); inDLQ != 0 {
		t.Errorf("DLQ holds %d after the second run (%+v)", inDLQ, res2)
	}
}

// export, export --remove, import: body, properties and headers come back
// byte for byte, AMQP types included.
func TestCLIExportImportRoundTrip(t *testing.T) {
	e := newEnv(t)
	rich := &msg.Message{
		ContentType: "application/json", ContentEncoding: "identity", Priority: 3,
		CorrelationID: "corr", ReplyTo: "replies", MessageID: "rich", Timestamp: time.Unix(1_700_000_000, 0),
		Type: "order.created", UserID: "guest", AppID: "shop",
		Headers: map[string]any{
			"s": "text", "bad": "a\xffb", "bytes": []byte{0, 0xff}, "t": true,
			"i8": int8(-8), "i16": int16(-16), "i32": int32(-32), "i64": int64(-64),
			"u8": uint8(8), "f32": float32(1.5), "f64": 2.25,
			"dec": msg.Decimal{Scale: 2, Value: 1234}, "ts": time.Unix(1_600_000_000, 0), "null": nil,
			"table": map[string]any{"n": int32(1), "deep": map[string]any{"x": "y"}},
			"array": []any{"a", int32(1), []any{false}},
		},
		Body: []byte{0, 1, 2, 'x', 0xfe, 0xff},
	}
	*rich = *msg.DLQCopy(rich, msg.Info{Queue: e.Work, RoutingKey: "k"}, msg.DeadLetter{Status: 500, Reason: "max-attempts", Now: time.Now()})
	var all []*msg.Message
	all = append(all, rich)
	for i := range 20 {
		all = append(all, deadMsg(strconv.Itoa(i), e.Work, "k", "max-attempts", 500, time.Duration(i)*time.Minute))
	}
	e.fill(e.DLQ, all...)
	original := e.browse(e.DLQ)

	dir := t.TempDir()
	first := filepath.Join(dir, "first.jsonl")
	r := e.ok("export", "--dlq", e.DLQ, "--file", first)
	if !strings.Contains(r.stdout, "exported 21 of 21") {
		t.Errorf("export output: %s", r.stdout)
	}
	if got := ids(e.browse(e.DLQ)); !slices.Equal(got, ids(original)) {
		t.Fatalf("export without --remove changed the DLQ: %v", got)
	}
	if r := e.run("export", "--dlq", e.DLQ, "--file", first); r.code == 0 {
		t.Error("export overwrote an existing file")
	}

	second := filepath.Join(dir, "second.jsonl")
	e.ok("export", "--dlq", e.DLQ, "--file", second, "--remove", "--sync-every", "7")
	if n := e.depth(e.DLQ); n != 0 {
		t.Fatalf("export --remove left %d messages", n)
	}
	r = e.ok("import", "--dlq", e.DLQ, "--file", second, "--parallel", "1")
	if !strings.Contains(r.stdout, "imported 21 message(s) to "+e.DLQ) {
		t.Errorf("import output: %s", r.stdout)
	}
	restored := e.browse(e.DLQ)
	if !slices.Equal(ids(restored), ids(original)) {
		t.Fatalf("order after import %v", ids(restored))
	}
	for i := range original {
		a, b := original[i], restored[i]
		a.Redelivered, b.Redelivered = false, false
		la, err := dlq.MarshalLine(a, e.DLQ)
		if err != nil {
			t.Fatal(err)
		}
		lb, err := dlq.MarshalLine(b, e.DLQ)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(la, lb) {
			t.Errorf("message %s differs after the round trip:\n%s\n%s", a.MessageID, la, lb)
		}
	}
	if d := restored[0].Headers["dec"]; d != (msg.Decimal{Scale: 2, Value: 1234}) {
		t.Errorf("decimal came back as %#v", d)
	}
	if v := restored[0].Headers["i16"]; v != int16(-16) {
		t.Errorf("int16 came back as %#v", v)
	}

	// Exporting the restored DLQ gives the first file again, line for line
	// (the redelivered flag aside: the first export had read the messages).
	third := filepath.Join(dir, "third.jsonl")
	e.ok("export", "--dlq", e.DLQ, "--file", third)
	normalize := func(path string) []string {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			out = append(out, strings.Replace(l, `"redelivered":true,`, "", 1))
		}
		return out
	}
	if a, b := normalize(first), normalize(third); !slices.Equal(a, b) {
		t.Errorf("export after import differs from the first export")
	}
}

func TestCLIImportStopsAndResumes(t *testing.T) {
	e := newEnv(t)
	var data bytes.Buffer
	for i := range 6 {
		line, err := dlq.MarshalLine(deadMsg(strconv.Itoa(i), e.Work, "k", "max-attempts", 500, time.Minute), e.DLQ)
		if err != nil {
			t.Fatal(err)
		}
		if i == 4 {
			data.WriteString("{not json\n")
		}
		data.Write(line)
	}
	file := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(file, data.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	r := e.run("import", "--dlq", e.DLQ, "--file", file, "--parallel", "1")
	if r.code == 0 || !strings.Contains(r.stderr, "line 5") || !strings.Contains(r.stderr, "--skip 4") {
		t.Fatalf("exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if n := e.depth(e.DLQ); n != 4 {
		t.Fatalf("DLQ holds %d after the failed import", n)
	}
	// Fix the line and resume.
	fixed := bytes.Replace(data.Bytes(), []byte("{not json\n"), []byte("\n"), 1)
	if err := os.WriteFile(file, fixed, 0o600); err != nil {
		t.Fatal(err)
	}
	e.ok("import", "--dlq", e.DLQ, "--file", file, "--skip", "4", "--parallel", "1")
	if got := ids(e.browse(e.DLQ)); !slices.Equal(got, []string{"0", "1", "2", "3", "4", "5"}) {
		t.Errorf("DLQ after resume %v", got)
	}
	// A destination that does not exist is reported, not silently dropped.
	if r := e.run("import", "--dlq", e.DLQ, "--file", file, "--to", "no-such-"+e.Work); r.code == 0 || !strings.Contains(r.stderr, "unroutable") {
		t.Errorf("import to a missing queue: exit %d\n%s", r.code, r.stderr)
	}
}

func TestCLIPurge(t *testing.T) {
	e := newEnv(t)
	for i := range 7 {
		e.fill(e.DLQ, deadMsg(strconv.Itoa(i), e.Work, "k", "max-attempts", 500, time.Minute))
	}
	cmd := e.command("purge", "--dlq", e.DLQ)
	cmd.Stdin = strings.NewReader("yes\n") // a pipe, not a terminal
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Run(); err == nil || !strings.Contains(errb.String(), "not a terminal") {
		t.Fatalf("purge without a terminal and without --yes: %v\n%s", err, errb.String())
	}
	if r := e.run("purge", "--dlq", e.DLQ); r.code == 0 || !strings.Contains(r.stderr, "not a terminal") { // stdin /dev/null
		t.Fatalf("purge with /dev/null as standard input: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := e.depth(e.DLQ); n != 7 {
		t.Fatalf("refused purge deleted messages: %d left", n)
	}
	r := e.ok("purge", "--dlq", e.DLQ, "--yes")
	if !strings.Contains(r.stdout, "purged 7 message(s) from "+e.DLQ) {
		t.Errorf("purge output: %s", r.stdout)
	}
	if n := e.depth(e.DLQ); n != 0 {
		t.Fatalf("%d left after purge", n)
	}
}

// export --file - writes the lines to standard output and the summary to
// standard error; the lines import back.
func TestCLIExportToStdout(t *testing.T) {
	e := newEnv(t)
	e.fill(e.DLQ, deadMsg("s1", e.Work, "k", "max-attempts", 503, time.Minute), deadMsg("s2", e.Work, "k", "max-attempts", 503, time.Minute), deadMsg("s3", e.Work, "k", "max-attempts", 503, time.Minute))
	r := e.ok("export", "--dlq", e.DLQ, "--file", "-")
	if n := strings.Count(r.stdout, "\n"); n != 3 {
		t.Fatalf("stdout holds %d lines, want 3 JSON lines:\n%s", n, r.stdout)
	}
	if !strings.Contains(r.stderr, "exported 3 of 3") || strings.Contains(r.stdout, "exported") {
		t.Errorf("the summary must go to stderr only:\nstdout: %s\nstderr: %s", r.stdout, r.stderr)
	}
	// Standard error is no terminal here: progress comes as plain lines,
	// there and never in the export.
	if want := "export " + e.DLQ + ": 3/3 (100%)"; !strings.Contains(r.stderr, want) || strings.Contains(r.stdout, "(100%)") {
		t.Errorf("want the progress line %q on stderr only:\nstdout: %s\nstderr: %s", want, r.stdout, r.stderr)
	}
	if quiet := e.ok("export", "--dlq", e.DLQ, "--file", "-", "--progress", "none"); strings.Contains(quiet.stderr, "(100%)") {
		t.Errorf("--progress none printed progress:\n%s", quiet.stderr)
	}
	if bad := e.run("export", "--dlq", e.DLQ, "--file", "-", "--progress", "fancy"); bad.code == 0 || !strings.Contains(bad.stderr, "auto, bar, plain, none") {
		t.Errorf("--progress fancy: exit %d\n%s", bad.code, bad.stderr)
	}
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if _, err := dlq.UnmarshalLine([]byte(line)); err != nil {
			t.Fatalf("not an export line: %v\n%s", err, line)
		}
	}
}

func TestCLIReplayToExchange(t *testing.T) {
	e := newEnv(t)
	byOriginal, byKey := e.Work+".by-original", e.Work+".by-key"
	e.declare(byOriginal, nil)
	e.declare(byKey, nil)
	in, err := broker.OpenInspector(context.Background(), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	// amq.topic exists on every broker; each queue is bound by its own key.
	for q, key := range map[string]string{byOriginal: e.Work + ".created", byKey: e.Work + ".fixed"} {
		if err := in.Bind(q, "amq.topic", key); err != nil {
			t.Fatal(err)
		}
	}
	e.fill(e.DLQ, deadMsg("a", e.Work, e.Work+".created", "max-attempts", 503, time.Hour))
	if r := e.run("replay", "--dlq", e.DLQ, "--to-exchange", "no-such-"+e.Work); r.code == 0 || !strings.Contains(r.stderr, "destination exchange") {
		t.Errorf("--to-exchange a missing exchange: exit %d\n%s", r.code, r.stderr)
	}
	if r := e.run("replay", "--dlq", e.DLQ, "--to-routing-key", "x"); r.code != 64 || !strings.Contains(r.stderr, "only with --to-exchange") {
		t.Errorf("--to-routing-key alone: exit %d\n%s", r.code, r.stderr)
	}
	if n := e.depth(e.DLQ); n != 1 {
		t.Fatalf("DLQ holds %d after refused replays, want 1", n)
	}
	// The original routing key picks the queue.
	if res, r := e.replayJSON("--dlq", e.DLQ, "--to-exchange", "amq.topic"); r.code != 0 || res.Recovered != 1 {
		t.Fatalf("exit %d %+v\n%s", r.code, res, r.stderr)
	}
	if got := ids(e.browse(byOriginal)); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("%s holds %v", byOriginal, got)
	}
	e.fill(e.DLQ, deadMsg("b", e.Work, e.Work+".created", "max-attempts", 503, time.Hour))
	if res, r := e.replayJSON("--dlq", e.DLQ, "--to-exchange", "amq.topic", "--to-routing-key", e.Work+".fixed"); r.code != 0 || res.Recovered != 1 {
		t.Fatalf("exit %d %+v\n%s", r.code, res, r.stderr)
	}
	if got := ids(e.browse(byKey)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("%s holds %v", byKey, got)
	}
}

func TestCLIReplayTransform(t *testing.T) {
	e := newEnv(t)
	body := func(id, b string) *msg.Message {
		m := deadMsg(id, e.Work, "k", "non-retriable", 422, time.Hour)
		m.Body = []byte(b)
		return m
	}
	e.fill(e.DLQ, body("a", `{"currency":"EUR","amt":1}`), body("usd", `{"currency":"USD","amt":2}`), body("b", `{"currency":"EUR","amt":3}`))
	patch := `[{"op":"test","path":"/body/currency","value":"EUR"},{"op":"move","from":"/body/amt","path":"/body/amount"}]`
	if r := e.run("replay", "--dlq", e.DLQ, "--transform", `[{"op":"replace","path":"/headers/x-retry-count","value":0}]`); r.code != 64 || !strings.Contains(r.stderr, "history") {
		t.Errorf("a patch of a history header: exit %d\n%s", r.code, r.stderr)
	}
	dry, r := e.replayJSON("--dlq", e.DLQ, "--transform", patch, "--dry-run")
	if r.code != 0 || dry.WouldRecover != 2 || dry.Changed != 2 || dry.KeptWhy[dlq.KeptChange] != 1 {
		t.Fatalf("dry run: exit %d %+v\n%s", r.code, dry, r.stderr)
	}
	if n := e.depth(e.DLQ); n != 3 {
		t.Fatalf("a dry run left %d in the DLQ", n)
	}
	res, r := e.replayJSON("--dlq", e.DLQ, "--transform", patch, "--keep-originals", "--parallel", "1")
	if r.code != 0 || res.Recovered != 2 || res.Changed != 2 || res.Kept != 1 {
		t.Fatalf("exit %d %+v\n%s", r.code, res, r.stderr)
	}
	got := e.browse(e.Work)
	if len(got) != 2 || string(got[0].Body) != `{"currency":"EUR","amount":1}` || string(got[1].Body) != `{"currency":"EUR","amount":3}` ||
		!strings.HasPrefix(got[0].String(msg.HeaderEditedBy), "hopper dlq replay") {
		t.Fatalf("work queue: %v", got)
	}
	orig := e.browse(dlq.OriginalsQueue(e.DLQ))
	if len(orig) != 2 || string(orig[0].Body) != `{"currency":"EUR","amt":1}` {
		t.Fatalf("originals: %v", orig)
	}
	left := e.browse(e.DLQ)
	if len(left) != 1 || left[0].MessageID != "usd" || string(left[0].Body) != `{"currency":"USD","amt":2}` {
		t.Fatalf("DLQ after: %v", left)
	}
}

func TestCLIReplayInBatches(t *testing.T) {
	e := newEnv(t)
	for i := range 5 {
		e.fill(e.DLQ, deadMsg(fmt.Sprint(i), e.Work, "k", "max-attempts", 503, time.Hour))
	}
	if r := e.run("replay", "--dlq", e.DLQ, "--batch", "2"); r.code != 64 || !strings.Contains(r.stderr, "--pause") {
		t.Errorf("--batch without --pause: exit %d\n%s", r.code, r.stderr)
	}
	res, r := e.replayJSON("--dlq", e.DLQ, "--batch", "2", "--pause", "10ms")
	if r.code != 0 || res.Recovered != 5 {
		t.Fatalf("exit %d %+v\n%s", r.code, res, r.stderr)
	}
	if n := strings.Count(r.stderr, "next batch of 2"); n != 2 {
		t.Errorf("%d waits between batches, want 2:\n%s", n, r.stderr)
	}
}

// Command demo runs Hopper end to end on this machine, with nothing
// running beforehand: it is the program behind `make demo`.
//
// It starts a private RabbitMQ node (internal/testbroker), the scriptable
// app examples/demoapp and a hopper binary in front of it, publishes five
// orders whose demo-script header makes the app answer each row of the
// outcome table once (200; 425 then 200; 503 then 200; 400; 503 for ever),
// waits until every message has settled, and prints what the app saw and
// where each message ended, DLQ headers included. Then it publishes four
// orders to a second queue that Hopper delivers in batches
// (consumer.batch), one of which the app fails inside the batch: the
// other three are acked from that one answer, the failing one alone is
// retried. Last it stops hopper with SIGTERM, which must exit 0, and tears
// everything down.
//
// It exits non-zero, saying which, if any expectation fails, so it doubles
// as a smoke test of a freshly built binary:
//
//	go build -o bin/hopper ./cmd/hopper && go run ./examples/demo
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/hopper-sidecar/hopper/internal/testbroker"
)

// The demo's topology and policy. They are small on purpose: tiers of
// seconds and three attempts make a failing message reach the DLQ in
// about four seconds instead of the production defaults' hours.
const (
	queueName   = "demo.orders"
	maxAttempts = 3
	// batchQueue is delivered in batches of up to batchSize messages; a
	// batch waits up to batchWait to fill, far longer than publishing the
	// batch step's messages takes, so they go to the app as one request.
	batchQueue = "demo.batch"
	batchSize  = 4
	batchWait  = "1s"
	// streamName is a stream Hopper declares and reads as streamConsumer;
	// its retries come back through the queue streamName.streamConsumer.
	streamName     = "demo.events"
	streamConsumer = "demo"
)

// tiers are the delay tiers of every queue, as in their queue names.
var tiers = []string{"1s", "2s"}

// step is one queue (or stream) of the demo and what is published to it.
type step struct {
	Queue string
	// Consumer is the consumer name Hopper reads the stream Queue as; ""
	// when Queue is a queue.
	Consumer string
	Messages []demoMessage
}

// work is the queue Hopper consumes and names the tiers and the DLQ from:
// the step's queue, or the queue beside its stream.
func (s step) work() string {
	if s.Consumer != "" {
		return s.Queue + "." + s.Consumer
	}
	return s.Queue
}

func (s step) dlq() string { return s.work() + ".dlq" }

// queues are the step's work queue, its DLQ and its tier queues.
func (s step) queues() []string {
	q := []string{s.work(), s.dlq()}
	for _, t := range tiers {
		q = append(q, s.work()+".retry."+t)
	}
	return q
}

// wantDead is how many of the step's messages should end in its DLQ.
func (s step) wantDead() int {
	n := 0
	for _, m := range s.Messages {
		if !m.Acked {
			n++
		}
	}
	return n
}

// The two steps: one message per row of the outcome table, then one batch.
var (
	outcomes = step{Queue: queueName, Messages: messages}
	batches  = step{Queue: batchQueue, Messages: batchMessages}
	streams  = step{Queue: streamName, Consumer: streamConsumer, Messages: streamMessages}
	steps    = []step{outcomes, batches, streams}
)

// Bounds on each step, so a broken binary fails the demo instead of
// hanging it.
const (
	appStartTimeout    = 10 * time.Second
	hopperReadyTimeout = 30 * time.Second
	// hopperExitTimeout is shutdown.grace (5s) plus a margin.
	hopperExitTimeout = 15 * time.Second
	appExitTimeout    = 10 * time.Second
	pollInterval      = 250 * time.Millisecond
)

// demoMessage is one order and what it must go through.
type demoMessage struct {
	ID     string
	Script string // the demo-script header: the app's answers in turn
	// Want is the app's answers in order: one per request it receives.
	Want []answer
	// Acked, or else dead-lettered with Reason, FinalStatus, FinalRetries.
	Acked        bool
	Reason       string
	FinalStatus  int64
	FinalRetries int64
	// Why explains the path, for the summary.
	Why string
}

// answer is one request the app received and what it answered.
type answer struct {
	Attempt    int  `json:"attempt"`
	Requeues   int  `json:"requeues"`
	Status     int  `json:"status"`
	ClientGone bool `json:"client_gone"`
	// Batch is the number of entries of the batch the answer was part of;
	// 0 for a request of its own.
	Batch int `json:"batch"`
}

func (a answer) String() string {
	s := fmt.Sprintf("a%d", a.Attempt)
	if a.Requeues > 0 {
		s += fmt.Sprintf("/r%d", a.Requeues)
	}
	s += "->" + strconv.Itoa(a.Status)
	if a.ClientGone {
		s += "(gone)"
	}
	if a.Batch > 0 {
		s += fmt.Sprintf(" [batch of %d]", a.Batch)
	}
	return s
}

var messages = []demoMessage{
	{
		ID: "ok", Script: "200",
		Want:  []answer{{1, 0, 200, false, 0}},
		Acked: true,
		Why:   "2xx: acked on the first attempt",
	},
	{
		ID: "too-early", Script: "425,200",
		Want:  []answer{{1, 0, 425, false, 0}, {1, 1, 200, false, 0}},
		Acked: true,
		Why: "425 with Retry-After: 1 (longer than requeue.maxHold 500ms): requeued through the 1s tier " +
			"with x-requeue-count 1; not an attempt, so attempt stays 1",
	},
	{
		ID: "flaky", Script: "503,200",
		Want:  []answer{{1, 0, 503, false, 0}, {2, 0, 200, false, 0}},
		Acked: true,
		Why:   "503: retried through the 1s tier (x-retry-count 1), 200 on attempt 2",
	},
	{
		ID: "bad-request", Script: "400",
		Want:   []answer{{1, 0, 400, false, 0}},
		Reason: "non-retriable", FinalStatus: 400, FinalRetries: 1, // the one failed attempt counts
		Why: "400: will fail again, so straight to the DLQ without a retry",
	},
	{
		ID: "always-down", Script: "503",
		Want:   []answer{{1, 0, 503, false, 0}, {2, 0, 503, false, 0}, {3, 0, 503, false, 0}},
		Reason: "max-attempts", FinalStatus: 503, FinalRetries: maxAttempts,
		Why: "503 three times: 1s tier, 2s tier, then retry.maxAttempts (3) reached: DLQ",
	},
}

// batchMessages are published to batchQueue together and reach the app as
// one batch. The app answers batch-flaky's entry 503 and the others 200 in
// one results body: the three are acked, batch-flaky alone goes through the
// 1s tier and comes back, in a batch of its own, to be answered 200.
var batchMessages = []demoMessage{
	{
		ID: "batch-1", Script: "200",
		Want:  []answer{{1, 0, 200, false, batchSize}},
		Acked: true,
		Why:   "its result in the batch said 200: acked",
	},
	{
		ID: "batch-2", Script: "200",
		Want:  []answer{{1, 0, 200, false, batchSize}},
		Acked: true,
		Why:   "acked from the same answer",
	},
	{
		ID: "batch-flaky", Script: "503,200",
		Want:  []answer{{1, 0, 503, false, batchSize}, {2, 0, 200, false, 1}},
		Acked: true,
		Why:   "its result said 503: this entry alone was retried through the 1s tier, 200 on attempt 2",
	},
	{
		ID: "batch-4", Script: "200",
		Want:  []answer{{1, 0, 200, false, batchSize}},
		Acked: true,
		Why:   "acked from the same answer, not delivered again",
	},
}

// streamMessages are published to the stream streamName. A stream keeps
// its messages where they are: a retry goes through the tiers to the queue
// beside it, and the offset Hopper stores never passes a message that is
// not settled.
var streamMessages = []demoMessage{
	{
		ID: "stream-ok", Script: "200",
		Want:  []answer{{1, 0, 200, false, 0}},
		Acked: true,
		Why:   "2xx: settled; the stored offset may pass it",
	},
	{
		ID: "stream-flaky", Script: "503,200",
		Want:  []answer{{1, 0, 503, false, 0}, {2, 0, 200, false, 0}},
		Acked: true,
		Why:   "503: retried through the 1s tier into " + streamName + "." + streamConsumer + ", never the stream; 200 on attempt 2",
	},
	{
		ID: "stream-bad", Script: "400",
		Want:   []answer{{1, 0, 400, false, 0}},
		Reason: "non-retriable", FinalStatus: 400, FinalRetries: 1,
		Why: "400: to the DLQ, with x-stream and x-stream-offset saying where it came from",
	},
}

type options struct {
	hopperBin  string
	demoappBin string
	quiet      bool
	timeout    time.Duration
	logLevel   string
}

func main() {
	var o options
	flag.StringVar(&o.hopperBin, "hopper-bin", "", "hopper binary (default bin/hopper in the repository root)")
	flag.StringVar(&o.demoappBin, "demoapp-bin", "", "demoapp binary (default: built from examples/demoapp into a temporary directory)")
	flag.BoolVar(&o.quiet, "quiet", false, "do not forward hopper's and demoapp's output (shown anyway on failure)")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Second, "how long to wait for every message to settle")
	flag.StringVar(&o.logLevel, "hopper-log-level", "info", "hopper's log.level (debug shows every delivery)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "demo: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	os.Exit(run(o))
}

// run returns the exit code. Everything the demo started is stopped
// before it returns, whatever happened.
func run(o options) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	d := &demo{o: o}
	err := d.run(ctx)
	d.teardown()
	if err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo: FAILED: %v\n", err)
		if o.quiet {
			for _, c := range []*child{d.hopper, d.app} {
				if c != nil {
					fmt.Fprintln(os.Stderr, c.report())
				}
			}
		}
		return 1
	}
	fmt.Println("\ndemo: PASSED: every message was acked or dead-lettered as expected, and hopper exited 0 on SIGTERM")
	return 0
}

// demo holds what one run started, so teardown can stop it in order.
type demo struct {
	o      options
	tmp    string
	broker *testbroker.Broker
	app    *child
	hopper *child
}

func (d *demo) run(ctx context.Context) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	hopperBin := d.o.hopperBin
	if hopperBin == "" {
		hopperBin = filepath.Join(root, "bin", "hopper")
	}
	if fi, err := os.Stat(hopperBin); err != nil || fi.IsDir() {
		return fmt.Errorf("no hopper binary at %s: build it with `go build -o bin/hopper ./cmd/hopper` (or run `make demo`), or pass --hopper-bin", hopperBin)
	}
	if d.tmp, err = os.MkdirTemp("", "hopper-demo-"); err != nil {
		return fmt.Errorf("temporary directory: %w", err)
	}

	// The broker's first boot takes about ten seconds; build the app
	// meanwhile.
	logf("starting a private RabbitMQ node (first boot takes about 10s)")
	brokerDone := make(chan error, 1)
	go func() {
		b, err := testbroker.Start(testbroker.Options{Quiet: d.o.quiet, Streams: true})
		d.broker = b
		brokerDone <- err
	}()
	appBin, buildErr := d.demoappBinary(root)
	if err := <-brokerDone; err != nil {
		return fmt.Errorf("start RabbitMQ: %w\n%s", err, testbroker.InstallHint)
	}
	if buildErr != nil {
		return buildErr
	}
	if ctx.Err() != nil {
		return errInterrupted
	}

	appAddr, adminAddr, err := freeAddrs()
	if err != nil {
		return err
	}
	if d.app, err = startChild("demoapp", appBin, []string{"--listen", appAddr}, d.o.quiet); err != nil {
		return err
	}
	if err := waitOK(ctx, "http://"+appAddr+"/healthz", appStartTimeout, d.app); err != nil {
		return fmt.Errorf("demoapp did not come up: %w", err)
	}

	cfgFile := filepath.Join(d.tmp, "hopper.yaml")
	conf := hopperConfig(d.broker.URL(), d.broker.StreamPort(), appAddr, adminAddr, d.o.logLevel)
	if err := os.WriteFile(cfgFile, []byte(conf), 0o600); err != nil {
		return fmt.Errorf("write hopper config: %w", err)
	}
	if !d.o.quiet {
		logf("hopper config %s:\n%s", cfgFile, indent(conf))
	}
	if d.hopper, err = startChild("hopper", hopperBin, []string{"run", "--config", cfgFile}, d.o.quiet); err != nil {
		return err
	}
	// /readyz turns 200 once the topology is declared, the app answered
	// its health check and the consumer is up: publishing earlier would
	// hit a queue that does not exist yet.
	if err := waitOK(ctx, "http://"+adminAddr+"/readyz", hopperReadyTimeout, d.hopper); err != nil {
		return fmt.Errorf("hopper did not become ready: %w", err)
	}
	logf("hopper is ready (GET /readyz on %s answered 200)", adminAddr)

	statsURL := "http://" + appAddr + "/stats"
	var failures []string
	for _, st := range steps {
		f, err := d.runStep(ctx, st, statsURL)
		if err != nil {
			return err
		}
		failures = append(failures, f...)
	}

	failures = append(failures, d.stopHopper(ctx)...)
	if len(failures) > 0 {
		return fmt.Errorf("%d expectation(s) not met:\n  - %s", len(failures), strings.Join(failures, "\n  - "))
	}
	return nil
}

// runStep publishes a step's messages, waits until they are settled and
// prints where each ended. It returns the expectations that failed; an
// error means the step could not be carried out at all.
func (d *demo) runStep(ctx context.Context, st step, statsURL string) ([]string, error) {
	if err := publish(ctx, d.broker.URL(), st.Queue, st.Messages); err != nil {
		return nil, err
	}
	if err := d.waitSettled(ctx, statsURL, st); err != nil {
		return nil, err
	}
	dead, err := peekDLQ(d.broker.URL(), st.dlq(), 100)
	if err != nil {
		return nil, err
	}
	depths, err := listQueues(d.broker, st.work())
	if err != nil {
		return nil, err
	}
	stats, err := fetchStats(ctx, statsURL)
	if err != nil {
		return nil, err
	}
	printSummary(os.Stdout, st, stats, dead, depths)
	return check(st, stats, dead, depths), nil
}

var errInterrupted = errors.New("interrupted by a signal")

// demoappBinary returns --demoapp-bin or builds examples/demoapp into the
// temporary directory.
func (d *demo) demoappBinary(root string) (string, error) {
	if d.o.demoappBin != "" {
		return d.o.demoappBin, nil
	}
	bin := filepath.Join(d.tmp, "demoapp")
	cmd := exec.Command("go", "build", "-o", bin, "./examples/demoapp")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build demoapp (or pass --demoapp-bin): %w\n%s", err, out)
	}
	return bin, nil
}

// hopperConfig is the YAML hopper runs with: three subscriptions, the
// second delivered in batches to the app's batch path, the third a stream
// read through the stream protocol on streamPort. Durations are strings
// with units, as hopper requires.
func hopperConfig(brokerURL string, streamPort int, appAddr, adminAddr, logLevel string) string {
	return fmt.Sprintf(`# Written by examples/demo.
broker:
  urls: [%q]
topology:
  declare: true
app:
  url: http://%s/
  healthPath: /healthz
  timeout: 5s
retry:
  maxAttempts: %d
  tiers: [%q, %q]
requeue:
  minHold: 200ms
  maxHold: 500ms
subscriptions:
  - queue: {name: %s}
  - queue: {name: %s}
    path: /batch
    consumer:
      batch: {maxMessages: %d, maxWait: %s}
  - queue:
      name: %s
      type: stream
      stream: {consumer: %s, port: %d, storeEvery: 200ms}
shutdown:
  grace: 5s
admin:
  listen: %s
log:
  format: text
  level: %s
`, brokerURL, appAddr, maxAttempts, tiers[0], tiers[1], queueName, batchQueue, batchSize, batchWait,
		streamName, streamConsumer, streamPort, adminAddr, logLevel)
}

// waitSettled polls the app's /stats and the step's queue depths until
// every message of the step is settled: the ones meant to be acked got
// their 200 and the work queue is empty (so the ack happened), the DLQ
// holds the others and no tier queue holds anything. It fails at once if
// hopper exits.
func (d *demo) waitSettled(ctx context.Context, statsURL string, st step) error {
	logf("waiting up to %v for every message of %s to settle", d.o.timeout, st.Queue)
	deadline := time.Now().Add(d.o.timeout)
	var pending []string
	for {
		if d.hopper.exited() {
			return fmt.Errorf("hopper exited while messages were in flight (%s)", d.hopper.describeExit())
		}
		// Queues first: the stats read after them are at least as recent,
		// so a message the queues show as settled is never judged on
		// answers read before its last attempt.
		depths, qerr := listQueues(d.broker, st.work())
		stats, serr := fetchStats(ctx, statsURL)
		if err := errors.Join(qerr, serr); err != nil {
			pending = []string{err.Error()}
		} else {
			pending = pendingWork(st, stats, depths)
			if len(pending) == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("messages not settled after %v:\n  - %s", d.o.timeout, strings.Join(pending, "\n  - "))
		}
		select {
		case <-ctx.Done():
			return errInterrupted
		case <-time.After(pollInterval):
		}
	}
}

// pendingWork says what of a step is not finished yet; empty means
// settled.
func pendingWork(st step, stats map[string][]answer, depths []queueDepth) []string {
	var p []string
	for _, m := range st.Messages {
		if !m.Acked {
			continue
		}
		h := stats[m.ID]
		if len(h) == 0 || h[len(h)-1].Status != http.StatusOK {
			p = append(p, fmt.Sprintf("%s: app has not answered 200 yet (saw %s)", m.ID, history(h)))
		}
	}
	byName := map[string]queueDepth{}
	for _, q := range depths {
		byName[q.Name] = q
	}
	if n := byName[st.dlq()].Total(); n != st.wantDead() {
		p = append(p, fmt.Sprintf("%s holds %d message(s), want %d", st.dlq(), n, st.wantDead()))
	}
	for _, q := range depths {
		if q.Name != st.dlq() && q.Total() > 0 {
			p = append(p, fmt.Sprintf("%s holds %d ready + %d unacked", q.Name, q.Ready, q.Unacked))
		}
	}
	return p
}

// check compares a step's outcome with its expectations and returns every
// mismatch.
func check(st step, stats map[string][]answer, dead []dlqEntry, depths []queueDepth) []string {
	var f []string
	inDLQ := map[string][]dlqEntry{}
	for _, e := range dead {
		inDLQ[e.ID] = append(inDLQ[e.ID], e)
	}
	known := map[string]bool{}
	for _, other := range steps {
		for _, m := range other.Messages {
			known[m.ID] = true
		}
	}
	mine := map[string]bool{}
	for _, m := range st.Messages {
		mine[m.ID] = true
		if got := stats[m.ID]; !slices.Equal(got, m.Want) {
			f = append(f, fmt.Sprintf("%s: app answered %s, want %s", m.ID, history(got), history(m.Want)))
		}
		es := inDLQ[m.ID]
		switch {
		case m.Acked && len(es) > 0:
			f = append(f, fmt.Sprintf("%s: should have been acked but is in the DLQ (reason %q)", m.ID, es[0].Reason))
		case !m.Acked && len(es) == 0:
			f = append(f, fmt.Sprintf("%s: should be in the DLQ but is not", m.ID))
		case !m.Acked && len(es) > 1:
			f = append(f, fmt.Sprintf("%s: in the DLQ %d times (a duplicate)", m.ID, len(es)))
		case !m.Acked:
			e := es[0]
			if e.Reason != m.Reason {
				f = append(f, fmt.Sprintf("%s: x-dead-letter-reason %q, want %q", m.ID, e.Reason, m.Reason))
			}
			if e.FinalStatus != m.FinalStatus {
				f = append(f, fmt.Sprintf("%s: x-final-status-code %d, want %d", m.ID, e.FinalStatus, m.FinalStatus))
			}
			if e.FinalRetries != m.FinalRetries {
				f = append(f, fmt.Sprintf("%s: x-final-retry-count %d, want %d", m.ID, e.FinalRetries, m.FinalRetries))
			}
			if st.Consumer != "" && (e.Stream != st.Queue || e.StreamOffset < 0) {
				f = append(f, fmt.Sprintf("%s: x-stream %q x-stream-offset %d, want the stream %s and an offset", m.ID, e.Stream, e.StreamOffset, st.Queue))
			}
			if e.OriginalQueue != st.work() {
				f = append(f, fmt.Sprintf("%s: x-original-queue %q, want %q", m.ID, e.OriginalQueue, st.work()))
			}
		}
	}
	for id := range stats {
		if !known[id] {
			f = append(f, fmt.Sprintf("app received a message the demo did not publish: id %q", id))
		}
	}
	for _, e := range dead {
		if !mine[e.ID] {
			f = append(f, fmt.Sprintf("%s holds a message the demo did not publish to %s: id %q", st.dlq(), st.Queue, e.ID))
		}
	}
	seen := map[string]bool{}
	for _, q := range depths {
		seen[q.Name] = true
	}
	for _, name := range st.queues() {
		if !seen[name] {
			f = append(f, fmt.Sprintf("queue %s was not declared", name))
		}
	}
	return f
}

// stopHopper sends SIGTERM and checks hopper exits 0 within the grace
// period, without an ERROR logged on the way, and that the shutdown left
// the queues as they were.
func (d *demo) stopHopper(ctx context.Context) []string {
	var f []string
	logf("sending SIGTERM to hopper (pid %d)", d.hopper.cmd.Process.Pid)
	began := time.Now()
	code, inTime := d.hopper.stop(syscall.SIGTERM, hopperExitTimeout)
	took := time.Since(began).Round(time.Millisecond)
	switch {
	case !inTime:
		f = append(f, fmt.Sprintf("hopper did not exit within %v of SIGTERM and was killed", hopperExitTimeout))
	case code != 0:
		f = append(f, fmt.Sprintf("hopper exited with code %d after SIGTERM, want 0 (%s)", code, d.hopper.describeExit()))
	default:
		fmt.Printf("\nhopper exited with code 0, %v after SIGTERM\n", took)
	}
	var errs []string
	for _, l := range d.hopper.out.lines() {
		if strings.Contains(l, "level=ERROR") {
			errs = append(errs, l)
		}
	}
	if len(errs) > 0 {
		f = append(f, fmt.Sprintf("hopper logged %d error(s):\n      %s", len(errs), strings.Join(errs, "\n      ")))
	}
	if ctx.Err() != nil {
		return f
	}
	for _, st := range steps {
		depths, err := listQueues(d.broker, st.work())
		if err != nil {
			return append(f, err.Error())
		}
		for _, q := range depths {
			want := 0
			if q.Name == st.dlq() {
				want = st.wantDead()
			}
			if q.Total() != want {
				f = append(f, fmt.Sprintf("after hopper stopped, %s holds %d message(s), want %d", q.Name, q.Total(), want))
			}
		}
	}
	return f
}

// teardown stops what run started, in dependency order, and removes the
// temporary directory. It never fails the demo: the verdict is already
// known, and every step is logged.
func (d *demo) teardown() {
	if d.hopper != nil && !d.hopper.exited() {
		if code, _ := d.hopper.stop(syscall.SIGTERM, hopperExitTimeout); code != 0 {
			logf("hopper exited with code %d", code)
		}
	}
	if d.app != nil {
		if code, _ := d.app.stop(syscall.SIGTERM, appExitTimeout); code != 0 {
			logf("demoapp exited with code %d (%s)", code, d.app.describeExit())
		}
	}
	if d.broker != nil {
		if err := d.broker.Stop(); err != nil {
			logf("stop RabbitMQ: %v", err)
		}
	}
	if d.tmp != "" {
		if err := os.RemoveAll(d.tmp); err != nil {
			logf("remove %s: %v", d.tmp, err)
		}
	}
}

// printSummary prints, for each message of a step, what the app answered
// and where the message ended, then the queue depths.
func printSummary(w io.Writer, st step, stats map[string][]answer, dead []dlqEntry, depths []queueDepth) {
	switch {
	case st.Consumer != "":
		fmt.Fprintf(w, "\n=== Streams: stream %s read as %s, retries through the queue %s ===\n\n", st.Queue, st.Consumer, st.work())
	case st.Queue == batchQueue:
		fmt.Fprintf(w, "\n=== Batches: queue %s, consumer.batch.maxMessages %d, maxWait %s ===\n\n", st.Queue, batchSize, batchWait)
		printBatches(w, st, stats)
	default:
		fmt.Fprintf(w, "\n=== Hopper demo: queue %s, tiers %s and %s, retry.maxAttempts %d ===\n\n", st.Queue, tiers[0], tiers[1], maxAttempts)
	}
	fmt.Fprintln(w, "What the app answered (aN = Hopper-Attempt N, rN = Hopper-Requeue-Count N) and where each message ended:")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  MESSAGE\tDEMO-SCRIPT\tAPP ANSWERED\tENDED")
	inDLQ := map[string]dlqEntry{}
	for _, e := range dead {
		inDLQ[e.ID] = e
	}
	for _, m := range st.Messages {
		end := "acked"
		if e, ok := inDLQ[m.ID]; ok {
			end = "DLQ (" + e.Reason + ")"
		} else if !lastIs200(stats[m.ID]) {
			end = "unknown (not acked, not in the DLQ)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", m.ID, m.Script, history(stats[m.ID]), end)
	}
	_ = tw.Flush() // writes to stdout; nothing to do if that fails

	fmt.Fprintln(w, "\nWhy:")
	for _, m := range st.Messages {
		fmt.Fprintf(w, "  %-12s %s\n", m.ID, m.Why)
	}

	if len(dead) == 0 {
		fmt.Fprintf(w, "\nDLQ %s is empty.\n", st.dlq())
	} else {
		fmt.Fprintf(w, "\nDLQ %s, headers Hopper set on each message:\n", st.dlq())
	}
	for _, e := range dead {
		fmt.Fprintf(w, "  %s\n", e.ID)
		fmt.Fprintf(w, "    x-dead-letter-reason=%s x-final-status-code=%d x-final-retry-count=%d\n",
			e.Reason, e.FinalStatus, e.FinalRetries)
		fmt.Fprintf(w, "    x-original-queue=%s x-original-routing-key=%s\n", e.OriginalQueue, e.OriginalRoutingKey)
		fmt.Fprintf(w, "    x-final-error=%q\n", e.FinalError)
		if e.Stream != "" {
			fmt.Fprintf(w, "    x-stream=%s x-stream-offset=%d\n", e.Stream, e.StreamOffset)
		}
	}

	fmt.Fprintln(w, "\nFinal queue depths (DLQ read with basic.get and put back with nack-requeue):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  QUEUE\tREADY\tUNACKED")
	for _, q := range depths {
		fmt.Fprintf(tw, "  %s\t%d\t%d\n", q.Name, q.Ready, q.Unacked)
	}
	_ = tw.Flush()
}

// printBatches says which of the step's messages the app received together
// in its first batch, and what came of the one it failed there.
func printBatches(w io.Writer, st step, stats map[string][]answer) {
	var together, failed []string
	for _, m := range st.Messages {
		h := stats[m.ID]
		if len(h) == 0 || h[0].Batch < 2 {
			continue
		}
		together = append(together, m.ID)
		if h[0].Status != http.StatusOK {
			failed = append(failed, fmt.Sprintf("%s (answered %d in the batch, then %s)", m.ID, h[0].Status, history(h[1:])))
		}
	}
	fmt.Fprintf(w, "One request to the app's /batch carried %d messages: %s.\n", len(together), strings.Join(together, ", "))
	fmt.Fprintf(w, "Its results body failed %d of them; the others were acked from that one answer.\n", len(failed))
	for _, f := range failed {
		fmt.Fprintf(w, "  retried alone: %s\n", f)
	}
	fmt.Fprintln(w)
}

func lastIs200(h []answer) bool {
	return len(h) > 0 && h[len(h)-1].Status == http.StatusOK
}

func history(h []answer) string {
	if len(h) == 0 {
		return "nothing"
	}
	s := make([]string, len(h))
	for i, a := range h {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// fetchStats reads the demoapp's GET /stats: every answer it gave, per
// message id.
func fetchStats(ctx context.Context, url string) (map[string][]answer, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("demoapp stats: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("demoapp stats: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("demoapp stats: %s", resp.Status)
	}
	var body struct {
		ByMessage map[string]struct {
			History []answer `json:"history"`
		} `json:"by_message"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("demoapp stats: decode: %w", err)
	}
	out := make(map[string][]answer, len(body.ByMessage))
	for id, m := range body.ByMessage {
		out[id] = m.History
	}
	return out, nil
}

// waitOK polls url until it answers 200, the timeout passes, or c exits.
func waitOK(ctx context.Context, url string, timeout time.Duration, c *child) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	var last error
	for {
		if c.exited() {
			return fmt.Errorf("%s exited (%s)", c.name, c.describeExit())
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		last = err
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", timeout, last)
		}
		select {
		case <-ctx.Done():
			return errInterrupted
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// freeAddrs returns two free 127.0.0.1 addresses, held open together so
// they differ. Another process could take one before the child binds it;
// on a developer machine that is rare enough for a demo.
func freeAddrs() (app, admin string, err error) {
	var addrs [2]string
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", "", fmt.Errorf("pick a free port: %w", err)
		}
		defer l.Close()
		addrs[i] = l.Addr().String()
	}
	return addrs[0], addrs[1], nil
}

// repoRoot finds the hopper module's root from the working directory, so
// the demo runs from anywhere inside the repository.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		data, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.Contains(string(data), "module github.com/hopper-sidecar/hopper\n") {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("run the demo from inside the hopper repository (no hopper go.mod above %s)", dir)
		}
	}
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}

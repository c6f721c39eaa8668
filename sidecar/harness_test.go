package sidecar_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/sidecar"
)

var rabbit *testbroker.Broker

func TestMain(m *testing.M) { os.Exit(testbroker.RunMain(m, &rabbit)) }

var queueSeq atomic.Int64

// testConfig is a config with short tiers so that a whole retry cycle fits
// in a test, and a queue name no other test uses.
func testConfig(t *testing.T, appURL string) config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Broker.URLs = []string{rabbit.URL()}
	cfg.Broker.ReconnectMin = config.Duration(100 * time.Millisecond)
	cfg.Broker.ReconnectMax = config.Duration(time.Second)
	cfg.Broker.ConfirmTimeout = config.Duration(5 * time.Second)
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	cfg.Queue.Name = fmt.Sprintf("t%d.%s", queueSeq.Add(1), strings.ToLower(name))
	cfg.App.URL = appURL
	// Longer than a test waits while it holds a message at the app, so
	// that the held request is not cut off by Hopper's timeout, and
	// retried, while the test waits for something else on a loaded
	// machine; the tests of the timeout set their own.
	cfg.App.Timeout = config.Duration(time.Minute)
	cfg.App.UnavailableBackoff = config.Duration(100 * time.Millisecond)
	cfg.Retry.Tiers = []config.Duration{config.Duration(200 * time.Millisecond), config.Duration(400 * time.Millisecond)}
	cfg.Retry.MaxAttempts = 3
	cfg.Requeue.MinHold = config.Duration(20 * time.Millisecond)
	cfg.Requeue.MaxHold = config.Duration(100 * time.Millisecond)
	cfg.Shutdown.Grace = config.Duration(5 * time.Second)
	cfg.Admin.Listen = ""
	cfg.Consumer.Prefetch = 10
	cfg.Breaker.OpenTimeout = config.Duration(500 * time.Millisecond)
	cfg.Breaker.ProbeInterval = config.Duration(100 * time.Millisecond)
	return cfg
}

// call is one request the app received.
type call struct {
	ID         string
	Path       string
	Attempt    int
	Requeues   int
	RoutingKey string
	Exchange   string
	Status     int
	Header     http.Header
	Body       string
	// At is when the request reached the app.
	At time.Time
}

// scriptApp answers per message id from a script of statuses, indexed by
// attempt-1+requeues (the last entry repeats). A status of 0 hangs past any
// timeout; statusReset resets the connection without an answer while the
// app (and its health) stays up. Extra response headers come from hdrs.
type scriptApp struct {
	t       *testing.T
	srv     *http.Server
	ln      net.Listener
	URL     string
	mu      sync.Mutex
	scripts map[string][]int
	hdrs    map[string]http.Header
	// holds keeps the answer to a message id until the channel is closed.
	holds map[string]chan struct{}
	calls []call
}

// statusReset scripts a connection reset without an answer.
const statusReset = -1

func newScriptApp(t *testing.T) *scriptApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &scriptApp{t: t, ln: ln, URL: "http://" + ln.Addr().String() + "/msg", scripts: map[string][]int{}, hdrs: map[string]http.Header{}, holds: map[string]chan struct{}{}}
	a.serve(ln)
	t.Cleanup(a.Close)
	return a
}

func (a *scriptApp) serve(ln net.Listener) {
	a.srv = &http.Server{Handler: http.HandlerFunc(a.handle), ReadHeaderTimeout: 5 * time.Second}
	go a.srv.Serve(ln) //nolint:errcheck // ends with Close
}

// Close stops the app (connections refused afterwards).
func (a *scriptApp) Close() { a.srv.Close() }

// Restart serves again on the same address.
func (a *scriptApp) Restart() {
	a.t.Helper()
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ {
		if ln, err = net.Listen("tcp", a.ln.Addr().String()); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		a.t.Fatal(err)
	}
	a.ln = ln
	a.serve(ln)
}

// hold keeps the app's answer to each of ids until the returned function
// is called.
func (a *scriptApp) hold(ids ...string) (release func()) {
	ch := make(chan struct{})
	a.mu.Lock()
	for _, id := range ids {
		a.holds[id] = ch
	}
	a.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

func (a *scriptApp) script(id string, statuses ...int) {
	a.mu.Lock()
	a.scripts[id] = statuses
	a.mu.Unlock()
}

func (a *scriptApp) handle(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id := r.Header.Get("Hopper-Message-Id")
	attempt, _ := strconv.Atoi(r.Header.Get("Hopper-Attempt"))
	requeues, _ := strconv.Atoi(r.Header.Get("Hopper-Requeue-Count"))
	a.mu.Lock()
	sc := a.scripts[id]
	status := 200
	if len(sc) > 0 {
		status = sc[min(max(attempt-1+requeues, 0), len(sc)-1)]
	}
	a.calls = append(a.calls, call{ID: id, Path: r.URL.Path, Attempt: attempt, Requeues: requeues, Status: status,
		RoutingKey: r.Header.Get("Hopper-Routing-Key"), Exchange: r.Header.Get("Hopper-Exchange"),
		Header: r.Header.Clone(), Body: string(body), At: time.Now()})
	extra := a.hdrs[id]
	hold := a.holds[id]
	a.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	if status == statusReset {
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.SetLinger(0) //nolint:errcheck // close sends a reset
			}
			conn.Close()
		}
		return
	}
	if status == 0 {
		select {
		case <-r.Context().Done():
		case <-time.After(30 * time.Second):
		}
		return
	}
	for k, vs := range extra {
		w.Header()[k] = vs
	}
	w.WriteHeader(status)
}

// callsFor returns the calls for one message id.
func (a *scriptApp) callsFor(id string) []call {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []call
	for _, c := range a.calls {
		if c.ID == id {
			out = append(out, c)
		}
	}
	return out
}

// order lists the message ids of the calls keep selects, in the order the
// app first saw each run of calls for one id.
func (a *scriptApp) order(keep func(call) bool) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, c := range a.calls {
		if !keep(c) {
			continue
		}
		if len(out) == 0 || out[len(out)-1] != c.ID {
			out = append(out, c.ID)
		}
	}
	return out
}

func (a *scriptApp) statuses(id string) []int {
	var out []int
	for _, c := range a.callsFor(id) {
		out = append(out, c.Status)
	}
	return out
}

func (a *scriptApp) attempts(id string) []int {
	var out []int
	for _, c := range a.callsFor(id) {
		out = append(out, c.Attempt)
	}
	return out
}

// running is a sidecar started by a test.
type running struct {
	t    *testing.T
	cfg  config.Config
	sc   *sidecar.Sidecar
	stop context.CancelFunc
	done chan error
	pub  *broker.Publisher
	insp *broker.Inspector
}

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("HOPPER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// start validates cfg, runs a sidecar and waits until it consumes.
func start(t *testing.T, cfg config.Config) *running {
	t.Helper()
	return startWith(t, cfg, nil)
}

// startWith is start with a hook to set up the sidecar before it runs.
func startWith(t *testing.T, cfg config.Config, setup func(*sidecar.Sidecar)) *running {
	t.Helper()
	return startLogged(t, cfg, testLogger(t), setup)
}

// startLogged is startWith logging to log.
func startLogged(t *testing.T, cfg config.Config, log *slog.Logger, setup func(*sidecar.Sidecar)) *running {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("test config invalid: %v", err)
	}
	r := &running{t: t, cfg: cfg, done: make(chan error, 1)}
	r.sc = sidecar.New(&r.cfg, log)
	if setup != nil {
		setup(r.sc)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() { r.done <- r.sc.Run(ctx) }()
	bo := broker.ConfigOptions(r.cfg.Broker, testLogger(t), "test")
	r.pub = broker.NewPublisher(broker.PublisherOptions{Options: bo, Channels: 2, ConfirmTimeout: 5 * time.Second})
	t.Cleanup(func() { r.pub.Close() })
	waitfor.Until(t, 30*time.Second, "sidecar consuming", func() bool {
		select {
		case err := <-r.done:
			t.Fatalf("sidecar ended before consuming: %v", err)
		default:
		}
		return r.sc.Consuming()
	})
	insp, err := broker.OpenInspector(context.Background(), bo)
	if err != nil {
		t.Fatal(err)
	}
	r.insp = insp
	t.Cleanup(func() { insp.Close() })
	t.Cleanup(func() { r.shutdown() })
	return r
}

// shutdown stops the sidecar as SIGTERM does and returns Run's error.
func (r *running) shutdown() error {
	r.stop()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(30 * time.Second):
		r.t.Fatal("sidecar did not stop within 30s")
		return nil
	}
}

type pubOpt func(*msg.Message)

func withHeader(k string, v any) pubOpt { return func(m *msg.Message) { m.Headers[k] = v } }

// publish sends a persistent message with a confirm, to the work queue via
// the default exchange unless an exchange is given with via.
func (r *running) publish(id string, opts ...pubOpt) {
	r.t.Helper()
	m := &msg.Message{MessageID: id, Headers: map[string]any{}, Body: []byte("body-" + id), ContentType: "text/plain"}
	for _, o := range opts {
		o(m)
	}
	ex, key := m.Exchange, m.RoutingKey
	if key == "" {
		key = r.cfg.Queue.Name
	}
	if err := r.pub.PublishTo(context.Background(), ex, key, m); err != nil {
		r.t.Fatalf("publish %s: %v", id, err)
	}
}

func via(exchange, key string) pubOpt {
	return func(m *msg.Message) { m.Exchange, m.RoutingKey = exchange, key }
}

// depth is ready+unacked messages in a queue, from the broker's own count.
func (r *running) depth(queue string) int {
	r.t.Helper()
	n, err := rabbit.QueueDepth(queue)
	if err != nil {
		r.t.Fatalf("depth of %s: %v", queue, err)
	}
	return n
}

// dlq takes every message from the DLQ (acking them) and returns them by id.
func (r *running) drain(queue string) map[string]*msg.Message {
	r.t.Helper()
	out := map[string]*msg.Message{}
	for {
		d, ok, err := r.insp.Get(queue)
		if err != nil {
			r.t.Fatal(err)
		}
		if !ok {
			return out
		}
		out[d.Message().MessageID] = d.Message()
		if err := d.Ack(); err != nil {
			r.t.Fatal(err)
		}
	}
}

// allDepths returns ready+unacked for every queue, in one rabbitmqctl call.
func allDepths(t *testing.T) map[string]int {
	t.Helper()
	out, err := rabbit.Ctl("list_queues", "-q", "--no-table-headers", "name", "messages")
	if err != nil {
		t.Fatalf("list queues: %v", err)
	}
	m := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 {
			n, err := strconv.Atoi(f[1])
			if err == nil {
				m[f[0]] = n
			}
		}
	}
	return m
}

// settled waits until the work queue and every tier queue are empty, and
// the DLQ holds want messages.
func (r *running) settled(wantDLQ int) {
	r.t.Helper()
	plan := r.sc.Plan()
	var last map[string]int
	deadline := time.Now().Add(30 * time.Second)
	for {
		last = allDepths(r.t)
		ok := true
		for _, q := range plan.Queues() {
			want := 0
			if q.Name == plan.DLQ.Name {
				want = wantDLQ
			}
			if last[q.Name] != want {
				ok = false
			}
		}
		// The broker's listed counts of a quorum queue can lag behind it
		// by seconds (0 while it holds messages); a passive declare's
		// ready count is current.
		if ok {
			// A connection of its own: a test may have closed every
			// connection of the broker meanwhile.
			in, err := broker.OpenInspector(context.Background(), broker.ConfigOptions(r.cfg.Broker, testLogger(r.t), "settled"))
			ok = err == nil
			for _, q := range plan.Queues() {
				if !ok {
					break
				}
				want := 0
				if q.Name == plan.DLQ.Name {
					want = wantDLQ
				}
				if n, err := in.Depth(q.Name); err != nil || n > want {
					ok = false
				}
			}
			if in != nil {
				in.Close()
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("queues did not settle with %d in the DLQ: %v", wantDLQ, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

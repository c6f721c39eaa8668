package sidecar_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/sidecar"
)

// batchApp is an app that takes batch requests. Each entry's status comes
// from a script per message id, indexed by attempt (the last repeats); the
// answer is written in one of the results shapes. A message named "pill"
// kills the app process: its server closes with every connection, and it
// comes back restartAfter later.
type batchApp struct {
	t    *testing.T
	addr string
	URL  string
	// shape is how the app answers: "hopper", "lambda", "dapr".
	shape string
	// whole, when set, is the status of every request, with no body.
	whole        int
	restartAfter time.Duration

	mu       sync.Mutex
	srv      *http.Server
	scripts  map[string][]int
	garbage  int // answer this many requests with an unreadable body
	requests []batchRequest
	singles  []string // single requests to /single: message id and Hopper-Batch-Size
	deaths   int
	closed   bool
}

// batchRequest is one request the app received: its entries' ids,
// attempts and the status each was answered, in order.
type batchRequest struct {
	ids      []string
	attempts []int
	statuses []int
	header   http.Header
	// at is when the request reached the app.
	at time.Time
}

type envelope struct {
	Entries []struct {
		ID         string            `json:"id"`
		Headers    map[string]string `json:"headers"`
		Data       json.RawMessage   `json:"data"`
		DataBase64 *string           `json:"data_base64"`
	} `json:"entries"`
}

func newBatchApp(t *testing.T, shape string) *batchApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &batchApp{t: t, addr: ln.Addr().String(), shape: shape, scripts: map[string][]int{}, restartAfter: 200 * time.Millisecond}
	a.URL = "http://" + a.addr + "/batch"
	a.serve(ln)
	t.Cleanup(func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.closed = true
		a.srv.Close()
	})
	return a
}

func (a *batchApp) serve(ln net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc("/batch", a.handle)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) })
	mux.HandleFunc("/single", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.singles = append(a.singles, r.Header.Get("Hopper-Message-Id")+" "+r.Header.Get("Hopper-Batch-Size"))
		a.mu.Unlock()
		w.WriteHeader(200)
	})
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: mux}
	a.mu.Lock()
	a.srv = srv
	a.mu.Unlock()
	go srv.Serve(ln) //nolint:errcheck // ends with Close
}

func (a *batchApp) script(id string, statuses ...int) {
	a.mu.Lock()
	a.scripts[id] = statuses
	a.mu.Unlock()
}

func (a *batchApp) handle(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil || r.Header.Get("Hopper-Batch-Size") != strconv.Itoa(len(env.Entries)) {
		a.t.Errorf("not a batch request (%v, Hopper-Batch-Size %q): %.200s", err, r.Header.Get("Hopper-Batch-Size"), body)
		w.WriteHeader(400)
		return
	}
	req := batchRequest{header: r.Header.Clone(), at: time.Now()}
	pill := false
	a.mu.Lock()
	for _, e := range env.Entries {
		id := e.Headers["Hopper-Message-Id"]
		attempt, _ := strconv.Atoi(e.Headers["Hopper-Attempt"])
		if want := "body-" + id; e.DataBase64 == nil || decode64(*e.DataBase64) != want {
			a.t.Errorf("entry %s: body not carried as data_base64 %q", id, want)
		}
		status := 200
		if sc := a.scripts[id]; len(sc) > 0 {
			status = sc[min(max(attempt-1, 0), len(sc)-1)]
		}
		if a.whole != 0 {
			status = a.whole
		}
		pill = pill || id == "pill"
		req.ids = append(req.ids, e.ID)
		req.attempts = append(req.attempts, attempt)
		req.statuses = append(req.statuses, status)
	}
	a.requests = append(a.requests, req)
	garbage := a.garbage > 0
	if garbage {
		a.garbage--
	}
	whole, srv := a.whole, a.srv
	if pill {
		a.deaths++
	}
	a.mu.Unlock()
	switch {
	case pill:
		srv.Close() // the process dies: every request in flight is cut
		time.AfterFunc(a.restartAfter, a.restart)
		return
	case whole != 0:
		w.WriteHeader(whole)
		return
	case garbage:
		w.WriteHeader(200)
		io.WriteString(w, `{"results": [oops`) //nolint:errcheck // the test reads what Hopper makes of it
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(a.answer(req)) //nolint:errcheck // a failed write is a cut Hopper handles
}

// answer writes the statuses of req in the app's shape.
func (a *batchApp) answer(req batchRequest) any {
	switch a.shape {
	case "lambda":
		failures := []map[string]string{}
		for i, id := range req.ids {
			if req.statuses[i] >= 300 {
				failures = append(failures, map[string]string{"itemIdentifier": id})
			}
		}
		return map[string]any{"batchItemFailures": failures}
	case "dapr":
		var st []map[string]string
		for i, id := range req.ids {
			s := "SUCCESS"
			switch {
			case req.statuses[i] >= 400 && req.statuses[i] < 500:
				s = "DROP"
			case req.statuses[i] >= 300:
				s = "RETRY"
			}
			st = append(st, map[string]string{"entryId": id, "status": s})
		}
		return map[string]any{"statuses": st}
	}
	var rs []map[string]any
	for i, id := range req.ids {
		rs = append(rs, map[string]any{"id": id, "status": req.statuses[i], "error": fmt.Sprintf("scripted %d", req.statuses[i])})
	}
	return map[string]any{"results": rs}
}

func (a *batchApp) restart() {
	for range 100 {
		a.mu.Lock()
		closed := a.closed
		a.mu.Unlock()
		if closed {
			return
		}
		if ln, err := net.Listen("tcp", a.addr); err == nil {
			a.serve(ln)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.t.Errorf("app could not listen on %s again", a.addr)
}

// calls lists every (id, attempt, status) the app saw, by id.
func (a *batchApp) calls() map[string][]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string][]string{}
	for _, r := range a.requests {
		for i, id := range r.ids {
			out[id] = append(out[id], fmt.Sprintf("%d:%d", r.attempts[i], r.statuses[i]))
		}
	}
	return out
}

func (a *batchApp) sizes() []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	var s []int
	for _, r := range a.requests {
		s = append(s, len(r.ids))
	}
	return s
}

func decode64(s string) string {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// batchConfig turns batching on. A batch waits up to wait to fill: a test
// that must know which messages share a request waits a minute, more than
// a burst of prefetched deliveries takes on any machine, and only sends
// whole batches; one that retries does not wait long for the retried
// messages to fill a batch.
func batchConfig(t *testing.T, url string, size int, wait time.Duration) config.Config {
	cfg := testConfig(t, url)
	cfg.Consumer.Prefetch = 64
	cfg.Consumer.Workers = 2
	cfg.Consumer.Batch = config.Batch{MaxMessages: size, MaxBytes: config.DefaultBatchMaxBytes, MaxWait: config.Duration(wait)}
	return cfg
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return out
}

func TestBatchAllAcked(t *testing.T) {
	for _, qt := range []string{"classic", "quorum"} {
		t.Run(qt, func(t *testing.T) {
			app := newBatchApp(t, "hopper")
			cfg := batchConfig(t, app.URL, 8, time.Minute)
			cfg.Queue.Type = qt
			r := start(t, cfg)
			for _, id := range ids("m", 32) {
				r.publish(id)
			}
			r.settled(0)
			for _, s := range app.sizes() {
				if s != 8 {
					t.Fatalf("batch sizes %v, want 8 each", app.sizes())
				}
			}
			for id, c := range app.calls() {
				if !slices.Equal(c, []string{"1:200"}) {
					t.Errorf("%s: calls %v, want one", id, c)
				}
			}
			if n := len(app.calls()); n != 32 {
				t.Fatalf("%d messages reached the app, want 32", n)
			}
		})
	}
}

// TestBatchPartialFailure: in one batch, m02 fails its first attempt and
// m05 is not retriable; each of the three results shapes settles every
// message on its own.
func TestBatchPartialFailure(t *testing.T) {
	for _, shape := range []string{"hopper", "lambda", "dapr"} {
		t.Run(shape, func(t *testing.T) {
			app := newBatchApp(t, shape)
			app.script("m02", 503, 200)
			if shape != "lambda" { // Lambda's shape has no way to say "not retriable"
				app.script("m05", 422)
			}
			r := start(t, batchConfig(t, app.URL, 8, 50*time.Millisecond))
			for _, id := range ids("m", 8) {
				r.publish(id)
			}
			wantDLQ := 1
			if shape == "lambda" {
				wantDLQ = 0
			}
			r.settled(wantDLQ)
			calls := app.calls()
			if c := calls["m02"]; !slices.Equal(c, []string{"1:503", "2:200"}) {
				t.Errorf("m02: calls %v, want a failed attempt and a retry", c)
			}
			for _, id := range []string{"m00", "m01", "m03", "m04", "m06", "m07"} {
				if c := calls[id]; len(c) != 1 {
					t.Errorf("%s: calls %v, want one", id, c)
				}
			}
			if shape == "lambda" {
				return
			}
			dead := r.drain(r.sc.Plan().DLQ.Name)
			m, ok := dead["m05"]
			if !ok {
				t.Fatalf("m05 not in the DLQ: %v", keys(dead))
			}
			reason := m.String(msg.HeaderDeadLetterReason)
			want := map[string]string{"hopper": "non-retriable", "dapr": "app-action"}[shape]
			if reason != want {
				t.Errorf("m05 dead-lettered as %q, want %q", reason, want)
			}
			if shape == "hopper" {
				if code := msg.Counter(m.Headers[msg.HeaderFinalStatusCode]); code != 422 {
					t.Errorf("x-final-status-code %v, want the entry's 422", m.Headers[msg.HeaderFinalStatusCode])
				}
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestBatchWholeStatus: a 503 for the whole request is every entry's
// outcome: each is retried once, none is acked on it.
func TestBatchWholeStatus(t *testing.T) {
	app := newBatchApp(t, "hopper")
	app.mu.Lock()
	app.whole = 503
	app.mu.Unlock()
	r := start(t, batchConfig(t, app.URL, 4, 50*time.Millisecond))
	for _, id := range ids("w", 4) {
		r.publish(id)
	}
	waitfor.Until(t, 30*time.Second, "every entry retried once", func() bool {
		c := app.calls()
		for _, id := range ids("w", 4) {
			if len(c[id]) < 2 {
				return false
			}
		}
		return true
	})
	app.mu.Lock()
	app.whole = 0
	app.mu.Unlock()
	r.settled(0)
	for id, c := range app.calls() {
		if len(c) < 2 || c[0] != "1:503" || c[1] != "2:503" && c[1] != "2:200" {
			t.Errorf("%s: calls %v, want a 503 on attempt 1 then attempt 2", id, c)
		}
	}
}

// TestBatchMalformedResults: an answer that cannot be read retries every
// entry (an attempt each); nothing is acked on it.
func TestBatchMalformedResults(t *testing.T) {
	app := newBatchApp(t, "hopper")
	app.garbage = 1
	r := start(t, batchConfig(t, app.URL, 4, 50*time.Millisecond))
	for _, id := range ids("g", 4) {
		r.publish(id)
	}
	r.settled(0)
	for _, id := range ids("g", 4) {
		if c := app.calls()[id]; !slices.Equal(c, []string{"1:200", "2:200"}) {
			t.Errorf("%s: calls %v, want the unread answer then a second attempt", id, c)
		}
	}
}

// TestBatchCrashPillBisected: one message in a batch of 32 kills the app
// each time it is delivered. The batch is split in halves down to the
// pill, which alone reaches the DLQ as app-crash; every other message is
// acked, and none of them was charged a crash.
func TestBatchCrashPillBisected(t *testing.T) {
	app := newBatchApp(t, "hopper")
	cfg := batchConfig(t, app.URL, 32, 50*time.Millisecond)
	cfg.Consumer.Workers = 1
	cfg.App.HealthPath = "/healthz"
	cfg.Retry.MaxCrashes = 2
	r := start(t, cfg)
	all := ids("c", 31)
	for i, id := range all {
		if i == 20 {
			r.publish("pill")
		}
		r.publish(id)
	}
	r.settled(1)
	dead := r.drain(r.sc.Plan().DLQ.Name)
	m, ok := dead["pill"]
	if !ok || len(dead) != 1 {
		t.Fatalf("DLQ holds %v, want the pill alone", keys(dead))
	}
	if reason := m.String(msg.HeaderDeadLetterReason); reason != "app-crash" {
		t.Errorf("pill dead-lettered as %q, want app-crash", reason)
	}
	calls := app.calls()
	for _, id := range all {
		c := calls[id]
		if len(c) == 0 || c[len(c)-1] != fmt.Sprintf("%d:200", len(c)) && !strings.HasSuffix(c[len(c)-1], ":200") {
			t.Errorf("%s: calls %v, want acked", id, c)
		}
		for _, s := range c {
			if !strings.HasPrefix(s, "1:") {
				t.Errorf("%s: calls %v: a neighbour of the pill spent an attempt", id, c)
				break
			}
		}
	}
	app.mu.Lock()
	defer app.mu.Unlock()
	if n := app.deaths; n != 1+cfg.Retry.MaxCrashes && !splitDown(app.requests) {
		t.Errorf("the app died %d times; requests %v", n, app.requests)
	}
	if !splitDown(app.requests) {
		t.Errorf("no batch with the pill was split down to it alone: %+v", app.requests)
	}
}

// splitDown says whether a request with the pill among others was followed
// by requests halving it down to the pill alone. An odd size splits into a
// larger first half and a smaller second one; the pill may be in either
// (a batch of 24, filled before its linger ended on a loaded machine,
// halves to 12, 6, 3, then 2 and 1).
func splitDown(reqs []batchRequest) bool {
	size := 0
	for _, r := range reqs {
		if !slices.Contains(r.ids, "pill") {
			continue
		}
		switch {
		case size == 0 && len(r.ids) > 1:
			size = len(r.ids)
		case size > 1 && (len(r.ids) == batch.Half(size) || len(r.ids) == size-batch.Half(size)):
			size = len(r.ids)
		}
		if size == 1 {
			return true
		}
	}
	return false
}

// TestBatchOrderedFailureInTheMiddle: an ordered subscription delivers a
// batch in queue order; when o03 fails, o04..o07 are not acked ahead of
// it: they go again with it, after its retry delay.
func TestBatchOrderedFailureInTheMiddle(t *testing.T) {
	app := newBatchApp(t, "hopper")
	app.script("o03", 503, 200)
	cfg := batchConfig(t, app.URL, 8, time.Minute)
	cfg.Consumer.Prefetch = 0
	cfg.Consumer.Workers = 0
	cfg.Consumer.Ordered = true
	r := start(t, cfg)
	for _, id := range ids("o", 8) {
		r.publish(id)
	}
	r.settled(0)
	app.mu.Lock()
	reqs := slices.Clone(app.requests)
	app.mu.Unlock()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2: %+v", len(reqs), reqs)
	}
	if want := ids("o", 8); !slices.Equal(reqs[0].ids, want) {
		t.Fatalf("first request %v, want %v in order", reqs[0].ids, want)
	}
	if want := ids("o", 8)[3:]; !slices.Equal(reqs[1].ids, want) {
		t.Fatalf("second request %v, want the failed message and every one after it: %v", reqs[1].ids, want)
	}
	if !slices.Equal(reqs[1].attempts, []int{2, 1, 1, 1, 1}) {
		t.Fatalf("second request attempts %v: only the failed message spent one", reqs[1].attempts)
	}
}

// TestBatchNextToSingle: two subscriptions of one sidecar, one batching
// and one not; each gets the requests it asked for.
func TestBatchNextToSingle(t *testing.T) {
	app := newBatchApp(t, "hopper")
	cfg := batchConfig(t, "http://"+app.addr, 4, time.Minute)
	base := cfg.Queue.Name
	one := 1
	cfg.Queue.Name = ""
	cfg.Subscriptions = []config.Subscription{
		{Queue: config.Queue{Name: base + ".b"}, Path: "/batch"},
		{Queue: config.Queue{Name: base + ".s"}, Path: "/single",
			Consumer: config.SubscriptionConsumer{Batch: config.SubscriptionBatch{MaxMessages: &one}}},
	}
	r := start(t, cfg)
	for _, id := range ids("b", 4) {
		r.publish(id, via("", base+".b"))
	}
	for _, id := range ids("s", 3) {
		r.publish(id, via("", base+".s"))
	}
	waitfor.Until(t, 30*time.Second, "both queues drained", func() bool {
		app.mu.Lock()
		n := len(app.singles)
		app.mu.Unlock()
		return n == 3 && r.depth(base+".b") == 0 && r.depth(base+".s") == 0
	})
	if s := app.sizes(); !slices.Equal(s, []int{4}) {
		t.Errorf("batching queue: request sizes %v, want one of 4", s)
	}
	app.mu.Lock()
	singles := slices.Clone(app.singles)
	app.mu.Unlock()
	slices.Sort(singles)
	if want := []string{"s00 ", "s01 ", "s02 "}; !slices.Equal(singles, want) {
		t.Errorf("single queue: requests %q, want %q (one each, no batch size)", singles, want)
	}
}

// TestBatchObserved: a batch's messages are counted one by one as single
// deliveries are, the batch sizes are a histogram and on /readyz, and
// each message's attempt span stays in its own trace while one span per
// batch request links to all of them.
func TestBatchObserved(t *testing.T) {
	app := newBatchApp(t, "hopper")
	app.script("t03", 503, 200)
	cfg := batchConfig(t, app.URL, 4, time.Minute)
	cfg.Admin.Listen = "127.0.0.1:0"
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	r := startWith(t, cfg, func(s *sidecar.Sidecar) { s.TracerProvider = tp })

	traces := map[string]trace.TraceID{}
	for _, id := range ids("t", 4) {
		ctx, span := tp.Tracer("test").Start(context.Background(), "publish "+id, trace.WithSpanKind(trace.SpanKindProducer))
		carrier := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(ctx, carrier)
		span.End()
		traces[id] = span.SpanContext().TraceID()
		r.publish(id, withHeader("traceparent", carrier["traceparent"]))
	}
	// t03's retry comes back alone and waits out the batch's minute
	// unless three more messages fill the batch.
	waitfor.Until(t, 30*time.Second, "t03 retried", func() bool { return len(app.calls()["t03"]) == 1 && r.depth(r.cfg.Queue.Name) == 1 })
	for _, id := range ids("u", 3) {
		r.publish(id)
	}
	r.settled(0)

	ms := scrape(t, r.sc.AdminAddr())
	if n := metricValue(ms, "hopper_batch_size", nil); n != 2 {
		t.Errorf("hopper_batch_size counts %v batches, want 2", n)
	}
	if n := metricValue(ms, "hopper_deliveries_total", map[string]string{"outcome": "ack"}); n != 7 {
		t.Errorf("%v acks counted, want 7 (one per message)", n)
	}
	if n := metricValue(ms, "hopper_deliveries_total", map[string]string{"outcome": "retry", "status_class": "5xx"}); n != 1 {
		t.Errorf("%v retries counted, want 1", n)
	}
	resp, err := http.Get("http://" + r.sc.AdminAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "batches of up to 4: 2 sent, 4.0 messages each on average") {
		t.Errorf("/readyz does not show the batches:\n%s", body)
	}

	waitfor.Until(t, 5*time.Second, "spans ended", func() bool { return len(rec.Ended()) >= 8 })
	attempts := map[trace.TraceID]int{}
	var batches []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		if len(s.Links()) > 0 {
			batches = append(batches, s)
			continue
		}
		attempts[s.SpanContext().TraceID()]++
	}
	for id, tid := range traces {
		want := map[bool]int{true: 2, false: 1}[id == "t03"]
		if attempts[tid] != want {
			t.Errorf("%s: %d attempt spans in its trace, want %d", id, attempts[tid], want)
		}
	}
	if len(batches) != 2 {
		t.Fatalf("%d batch spans, want 2", len(batches))
	}
	linked := map[trace.TraceID]bool{}
	for _, l := range batches[0].Links() {
		linked[l.SpanContext.TraceID()] = true
	}
	for id, tid := range traces {
		if !linked[tid] {
			t.Errorf("the first batch span has no link to %s's trace", id)
		}
	}
}

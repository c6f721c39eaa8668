package proxy

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hopper-sidecar/hopper/app"
	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/route"
	"github.com/hopper-sidecar/hopper/topology"
)

// FuzzDeliveryPath drives arbitrary messages (header tables of every AMQP
// field type, nested and huge, hostile properties, any body) and arbitrary
// app answers through the whole delivery path: read the history, build the
// request, decide, copy, publish, settle. Whatever comes in, nothing may
// panic (a recovered panic counts as a finding too), every delivery is
// settled exactly once, what reaches the app is valid HTTP, and every copy
// Hopper publishes can be encoded and read back with its counters in range.
// Every other message also meets routing rules over its headers,
// properties and body, with a filter that dead-letters what it leaves out.
// What bytes are left after the message and its answer may make a batch
// (checkBatch): the message among others whose ids and bodies the fuzzer
// writes too, bytes that are not UTF-8 among them, sent through the real
// batch client to an app that reads the request as a strict JSON parser
// does, ordered (a failed entry held in place) or not, and now and then
// with the channel of its deliveries closing while a request is at the
// app, the batch timing out as a whole (each message then sent alone,
// beside the worker), or Hopper breaking (a panic) during one of the
// requests while moves to a tier are under way.
func FuzzDeliveryPath(f *testing.F) {
	for _, seed := range [][]byte{
		{},
		[]byte("\x00\x01\x02\x03"),
		append([]byte{7, 3, 1}, []byte("x-retry-count\x009223372036854775807")...),
		append([]byte{2, 200, 4, 9}, []byte("id\r\nX-Injected: 1\x00body")...),
		append([]byte{5, 255, 255, 255, 255, 6}, make([]byte, 64)...),
		[]byte(strings.Repeat("\xff", 300)),
		// Batches: ids that differ only in bytes that are not UTF-8, the
		// same id twice, JSON bodies that are not UTF-8.
		batchSeed(2, "m", 0, 4,
			1, 0, 0, "caf\xe9!", 0, "\xff",
			2, 0, 0, "ok", 1, "",
			1, 1, 1, "{\"a\":\"\xc3\"}", 2, "",
			0, 0, 0, "x", 0, ""),
		batchSeed(0, "\xed\xa0", 1, 0,
			3, `\xed\xa0`, 3, 0, "\xc0\xaf", 1, "\xfe\xfe",
			0, 0, 2, "\"\xff\"", "1", 2, ""),
		// Ordered, the channel closing at the second request: the first
		// answer holds the 503 (the second message) in place.
		batchSeed(1, "m", 0, 3,
			0, 0, 0, "ok", 0, "",
			0, 0, 0, "ok", 2, "",
			0, 0, 0, "ok", 0, "",
			1, 2),
		// Not ordered, the channel closing at the first request.
		batchSeed(0, "m", 1, 0,
			0, 0, 0, "ok", 2, "",
			0, 0, 0, "ok", 1, "",
			0, 1),
		// Not ordered, the batch timing out as a whole, then one of the
		// requests alone breaking while the others' moves are under way.
		batchSeed(1, "m", 0, 0,
			0, 0, 0, "ok", 2, "",
			0, 0, 0, "ok", 2, "",
			0, 0, 0, "ok", 0, "",
			0, 0, 1, 2),
		// The same, the last request alone breaking.
		batchSeed(1, "m", 0, 0,
			0, 0, 0, "ok", 2, "",
			0, 0, 0, "ok", 1, "",
			0, 0, 1, 4),
		// Not ordered, the worker's own request breaking.
		batchSeed(0, "m", 0, 0,
			0, 0, 0, "ok", 2, "",
			0, 0, 0, "ok", 0, "",
			0, 0, 0, 1),
		// Ordered, the second request breaking while its head is held.
		batchSeed(0, "m", 0, 0,
			0, 0, 0, "ok", 0, "",
			0, 0, 0, "ok", 2, "",
			1, 0, 0, 2),
	} {
		f.Add(seed)
	}
	srv := httptest.NewServer(http.HandlerFunc(strictBatchApp))
	f.Cleanup(srv.Close)
	client := app.NewClient(app.ClientOptions{URL: srv.URL, Timeout: 10 * time.Second})
	f.Fuzz(func(t *testing.T, data []byte) {
		g := &gen{b: data}
		m, deadlineHeader := g.message()
		out := g.outcome()
		checkPath(t, m, deadlineHeader, out)
		if g.byte()%2 == 1 {
			checkBatch(t, client, g, m, deadlineHeader)
		}
	})
}

// checkPath runs one delivery of m, answered with out, through a loop with
// a fake app and a fake publisher, and checks what came out.
func checkPath(t *testing.T, m *msg.Message, deadlineHeader string, out retry.Outcome) {
	t.Helper()
	cfg := config.Default()
	cfg.Queue.Name = "orders"
	cfg.Requeue.MinHold = config.Duration(time.Microsecond)
	cfg.Requeue.MaxHold = config.Duration(time.Millisecond)
	cfg.Retry.MaxCrashes = 3
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := topology.FromConfig(&cfg)
	j := &journal{}
	pub := &fakePub{j: j}
	var forwarded []app.Header
	deliverer := appFunc(func(got *msg.Message) retry.Outcome {
		in := msg.Read(got, plan.Work.Name, deadlineHeader, time.Now())
		if in.Attempt < 1 || in.Retries < 0 || in.Retries > msg.MaxCount || in.Requeues < 0 || in.Crashes < 0 {
			t.Errorf("history read out of range: %+v", in)
		}
		hdrs, _ := app.BuildHeaders(nil, got, in)
		forwarded = app.CloudEventHeaders(hdrs, got, in)
		return out
	})
	var routes *route.Table
	if len(m.MessageID)%2 == 1 {
		routes = fuzzRoutes()
	}
	p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: deliverer, Pub: pub, Workers: 1,
		MoveRetryMin: time.Microsecond, MoveRetryMax: time.Microsecond, DeadlineHeader: deadlineHeader,
		Quorum: len(m.Body)%2 == 1, Routes: routes})
	p.handle(context.Background(), &fakeDelivery{m: m, j: j, alive: true}, false)

	if n := p.Stats.InternalErrors.Load(); n != 0 {
		t.Fatalf("%d internal errors (recovered panics) on message %#v", n, m)
	}
	for _, h := range forwarded {
		if !httpToken(h.Name) {
			t.Errorf("forwarded header name %q is not an HTTP token", h.Name)
		}
		if strings.ContainsAny(h.Value, "\r\n\x00") {
			t.Errorf("forwarded header %s carries CR, LF or NUL: %q", h.Name, h.Value)
		}
	}
	settles := 0
	for _, e := range j.all() {
		if e == "ack" || strings.HasPrefix(e, "nack") {
			settles++
		}
	}
	if settles != 1 {
		t.Fatalf("settled %d times (%v), want exactly once", settles, j.all())
	}
	for i, cp := range pub.got {
		checkCopy(t, &plan, deadlineHeader, cp, pub.to[i], m)
	}
}

// checkCopy checks a copy of m that Hopper published to queue to.
func checkCopy(t *testing.T, plan *topology.Plan, deadlineHeader string, cp *msg.Message, to string, m *msg.Message) {
	t.Helper()
	if err := broker.Publishable(cp); err != nil {
		t.Errorf("copy to %s cannot be published: %v", to, err)
	}
	back := msg.Read(cp, plan.Work.Name, deadlineHeader, time.Now())
	if back.Retries < 0 || back.Retries > msg.MaxCount || back.Requeues < 0 || back.Requeues > msg.MaxCount ||
		back.Crashes < 0 || back.Crashes > msg.MaxCount || back.Attempt < 1 {
		t.Errorf("copy to %s reads back out of range: %+v", to, back)
	}
	if string(cp.Body) != string(m.Body) || cp.MessageID != m.MessageID {
		t.Errorf("copy to %s changed the message's body or id", to)
	}
	if v, ok := cp.Headers[msg.HeaderDeath]; ok {
		list, isList := v.([]any)
		for _, e := range list {
			if _, isTable := e.(map[string]any); !isTable {
				isList = false
			}
		}
		if !isList {
			t.Errorf("copy to %s carries an x-death the broker cannot extend: %#v", to, v)
		}
	}
	if to == plan.DLQ.Name && cp.String(msg.HeaderDeadLetterReason) == "" {
		t.Errorf("DLQ copy without a reason")
	}
}

// Headers of a batch's messages: the status the app answers the message's
// entry with, and which message a copy is of.
const (
	hdrWant = "x-want"
	hdrN    = "x-n"
)

// checkBatch delivers a batch of messages the fuzzer writes, with m (the
// path's own message) among them, through the real batch client to
// strictBatchApp, and checks that each is settled exactly once and that
// each of the written ones fares as the status the app gave its own entry
// says: 200 acked, 422 dead-lettered with that status, 503 retried (on an
// ordered loop, held in place until its last attempt, then dead-lettered).
// When the fuzzer closes the deliveries' channel while a request is at
// the app, nothing may happen to them after that: no request, no copy, no
// settle (the broker has them back).
func checkBatch(t *testing.T, client *app.Client, g *gen, m *msg.Message, deadlineHeader string) {
	t.Helper()
	cfg := config.Default()
	cfg.Queue.Name = "orders"
	// In-place retries of an ordered batch wait out the tier's delay.
	cfg.Retry.Tiers = []config.Duration{config.Duration(time.Millisecond)}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := topology.FromConfig(&cfg)
	n := 2 + int(g.byte()%4)
	base := g.str()
	base = base[:min(len(base), 64)]
	quorum := g.byte()%2 == 1
	at := int(g.byte()) % (n + 1)
	statuses := []int{200, 422, 503}
	var ms []*msg.Message
	var wants []int
	written := make(map[int64]*msg.Message, n)
	for k := range n {
		id := base
		switch g.byte() % 5 {
		case 1:
			id += "\xff"
		case 2:
			id += "\xfe"
		case 3:
			id = g.str()
			id = id[:min(len(id), 255)] // an AMQP short string
		case 4:
			id = "" // Hopper makes one up from routing key and body
		}
		ct := []string{"application/json", "application/json; charset=utf-8", "text/plain", "application/cloudevents+json"}[g.byte()%4]
		var body []byte
		switch g.byte() % 3 {
		case 0:
			body = []byte(`{"k":"` + g.str() + `"}`)
		case 1:
			body = []byte(g.str())
		default:
			body = []byte(`["` + g.str() + `",` + g.str() + `]`)
		}
		want := statuses[g.byte()%3]
		note := g.str()
		note = note[:min(len(note), 200)]
		bm := &msg.Message{MessageID: id, RoutingKey: "orders", ContentType: ct, Body: body,
			Headers: map[string]any{hdrWant: strconv.Itoa(want), hdrN: int64(k), "x-note": note}}
		ms, wants, written[int64(k)] = append(ms, bm), append(wants, want), bm
	}
	// The path's message, hostile headers and all, goes along; only that
	// it is settled once is checked. Its entry is acked if it carries no
	// wish the app can read.
	hostile := *m
	hostile.Headers = maps.Clone(m.Headers)
	hostile.Headers[hdrN] = int64(-1)
	delete(hostile.Headers, hdrWant)
	ms = slices.Insert(ms, at, &hostile)

	// Read last, so that the inputs written before they were read keep
	// their meaning.
	ordered := g.byte()%2 == 1
	closeAt := int64(g.byte() % 4) // the request during which the channel closes; 0: none
	// The first request, of several messages, timing out as a whole, so
	// that each goes again in a request of its own, beside the worker.
	timeoutFirst := g.byte()%3 == 1
	if timeoutFirst {
		// Requests alone run at once: which reaches the app after the
		// channel closed is a race, not a finding.
		closeAt = 0
	}
	// The request during which Hopper itself breaks (the app's call
	// panics); 0: none. Copies to a tier are held until then, so that
	// moves are under way when it comes.
	panicAt := int64(g.byte() % 5)

	pub := &fakePub{j: &journal{}}
	ch := &fakeChannel{}
	var requests atomic.Int64
	var publishedAtClose int
	broke := make(chan struct{})
	var breakOnce sync.Once
	release := func() { breakOnce.Do(func() { close(broke) }) }
	deliverer := &closingApp{Deliverer: client, before: func(r *batch.Request) *batch.Answer {
		n := requests.Add(1)
		if n == closeAt {
			ch.closed.Store(true)
			publishedAtClose = len(pub.j.all())
		}
		if n == panicAt {
			release()
			panic("fuzz: Hopper broke during a request")
		}
		if n == 1 && timeoutFirst && r.Len() > 1 {
			a := batch.Answer{Whole: retry.Outcome{Kind: retry.Timeout, Error: "timeout"}, Entries: make([]retry.Outcome, r.Len())}
			for i := range a.Entries {
				a.Entries[i] = a.Whole
			}
			return &a
		}
		return nil
	}}
	if panicAt == 0 {
		release()
	}
	p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: deliverer, Pub: &heldTierPub{Publisher: pub, until: broke},
		MoveRetryMin: time.Microsecond, MoveRetryMax: time.Microsecond, DeadlineHeader: deadlineHeader, Quorum: quorum,
		Workers: 1, Batch: batch.Limits{MaxMessages: len(ms), MaxBytes: 1 << 20}, InPlace: ordered})
	ds := make([]Delivery, len(ms))
	js := make([]*journal, len(ms))
	for i, bm := range ms {
		js[i] = &journal{}
		ds[i] = &chanDelivery{m: bm, j: js[i], ch: ch}
	}
	deliverBatch(p, ds)
	release()   // the worker is done: no request of its own is left to break
	p.wg.Wait() // the moves and requests the batch left running beside it

	panicked := p.Stats.InternalErrors.Load() > 0
	if panicked != (panicAt > 0 && requests.Load() >= panicAt) {
		t.Fatalf("%d internal errors (recovered panics) on a batch; the app's call panicked at request %d of %d",
			p.Stats.InternalErrors.Load(), panicAt, requests.Load())
	}
	closed := ch.closed.Load()
	for i, j := range js {
		settles := 0
		for _, e := range j.all() {
			switch {
			case strings.Contains(e, "on a closed channel"):
				t.Fatalf("message %d of the batch: %s (ordered %v): the broker has it back", i, e, ordered)
			case strings.HasPrefix(e, "ack ") || strings.HasPrefix(e, "nack"):
				settles++
			}
		}
		if settles != 1 && !closed || settles > 1 {
			t.Fatalf("message %d of the batch settled %d times (%v), want exactly once", i, settles, j.all())
		}
	}
	if closed {
		if requests.Load() > closeAt {
			t.Fatalf("%d requests to the app, %d after the deliveries' channel closed during request %d (ordered %v)",
				requests.Load(), requests.Load()-closeAt, closeAt, ordered)
		}
		if got := pub.j.all(); len(got) > publishedAtClose {
			t.Fatalf("published %v after the deliveries' channel closed", got[publishedAtClose:])
		}
		return
	}
	if panicked {
		// Which messages the panic sent back is the recovery's to choose;
		// none may be both moved and given back.
		copies := make(map[int64][]string, len(ms))
		for i, cp := range pub.got {
			k, _ := cp.Headers[hdrN].(int64)
			copies[k] = append(copies[k], pub.to[i])
		}
		for k, to := range copies {
			if len(to) > 1 {
				t.Fatalf("message %d copied %d times after a panic: %v", k, len(to), to)
			}
		}
		return
	}
	copies := make(map[int64][]int, len(ms))
	for i, cp := range pub.got {
		k, _ := cp.Headers[hdrN].(int64)
		if k < 0 {
			checkCopy(t, &plan, deadlineHeader, cp, pub.to[i], &hostile)
			continue
		}
		checkCopy(t, &plan, deadlineHeader, cp, pub.to[i], written[k])
		copies[k] = append(copies[k], i)
	}
	for k, want := range wants {
		got := copies[int64(k)]
		var to string
		var status int
		if len(got) == 1 {
			to, status = pub.to[got[0]], msg.Counter(pub.got[got[0]].Headers[msg.HeaderFinalStatusCode])
		}
		switch {
		case want == 200 && len(got) == 0,
			want == 422 && len(got) == 1 && to == plan.DLQ.Name && status == 422,
			want == 503 && !ordered && len(got) == 1 && to != plan.DLQ.Name && to != plan.Work.Name,
			want == 503 && ordered && len(got) == 1 && to == plan.DLQ.Name && status == 503:
		default:
			var dests []string
			for _, i := range got {
				dests = append(dests, fmt.Sprintf("%s (status %d, %q)", pub.to[i],
					msg.Counter(pub.got[i].Headers[msg.HeaderFinalStatusCode]), pub.got[i].String(msg.HeaderFinalError)))
			}
			w := written[int64(k)]
			t.Fatalf("message %d (id %q, %s body %q), answered %d: copies to %v, want its own answer's",
				k, w.MessageID, w.ContentType, w.Body, want, dests)
		}
	}
}

// closingApp calls before as each batch request starts, then delivers it
// through the Deliverer, unless before answers it itself.
type closingApp struct {
	Deliverer
	before func(r *batch.Request) *batch.Answer
}

func (a *closingApp) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	if ans := a.before(r); ans != nil {
		return *ans
	}
	return a.Deliverer.DeliverBatch(ctx, r)
}

// heldTierPub holds every copy to a delay tier until until is closed, so
// that moves are under way meanwhile; other copies go through at once.
type heldTierPub struct {
	Publisher
	until <-chan struct{}
}

func (p *heldTierPub) Publish(ctx context.Context, queue string, m *msg.Message) error {
	if strings.Contains(queue, ".retry.") {
		<-p.until
	}
	return p.Publisher.Publish(ctx, queue, m)
}

// strictBatchApp is an app taking Hopper's batch requests as a strict JSON
// parser does (Python's json): JSON text is UTF-8, and a request that is
// not UTF-8 or not JSON is answered 400. It answers each entry by the id
// it read, with the status the entry's Hopper-Header-x-want asks for, else
// 200.
func strictBatchApp(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !utf8.Valid(body) {
		http.Error(w, "the request is not UTF-8", http.StatusBadRequest)
		return
	}
	var req struct {
		Entries []struct {
			ID         string            `json:"id"`
			Headers    map[string]string `json:"headers"`
			Data       json.RawMessage   `json:"data"`
			DataBase64 *string           `json:"data_base64"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	type result struct {
		ID     string `json:"id"`
		Status int    `json:"status"`
		Error  string `json:"error,omitempty"`
	}
	results := make([]result, 0, len(req.Entries))
	for _, e := range req.Entries {
		if (e.Data == nil) == (e.DataBase64 == nil) {
			http.Error(w, "an entry without exactly one of data and data_base64", http.StatusBadRequest)
			return
		}
		status := 200
		if s, err := strconv.Atoi(e.Headers[app.HdrHeaderPrefix+hdrWant]); err == nil {
			status = s
		}
		results = append(results, result{ID: e.ID, Status: status, Error: "asked for"})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string][]result{"results": results}) // fails only when Hopper hung up
}

// batchSeed is a FuzzDeliveryPath input that makes a batch: zeros for the
// path's message and answer (an empty message, a timeout), then the bytes
// checkBatch reads, each int a byte and each string a length byte and its
// bytes.
func batchSeed(parts ...any) []byte {
	g := &gen{b: make([]byte, 4096)}
	g.message()
	g.outcome()
	b := make([]byte, 4096-len(g.b), 4096)
	b = append(b, 1) // a batch follows
	for _, p := range parts {
		switch v := p.(type) {
		case int:
			b = append(b, byte(v))
		case string:
			b = append(b, byte(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

// fuzzRoutes are routing rules over every part of a message, one with a
// retry policy of its own; what the filter leaves out is dead-lettered.
var fuzzRoutes = sync.OnceValue(func() *route.Table {
	tb, err := route.Compile(route.Spec{
		Filter:     `headers["x-custom"] != "drop" && properties.priority < 200`,
		OnFiltered: "dlq",
		Routes: []route.RouteSpec{
			{Name: "n", Match: `headers["x-retry-count"] > 2`},
			{Name: "b", Match: `body.kind == "b" || len(body?.items ?? []) > 1`},
			{Name: "p", Match: `properties.type startsWith "t" && "traceparent" in headers`,
				Policy: &retry.Policy{Name: "route:p", MaxAttempts: 2, Tiers: []time.Duration{time.Second}, Table: retry.DefaultTable(), ExpiredAction: retry.Drop}},
		},
	})
	if err != nil {
		panic(err)
	}
	return tb
})

// httpToken reports whether s is a valid HTTP field name.
func httpToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

// gen turns fuzz bytes into a message and an app answer; it reads zeros
// once the bytes run out.
type gen struct{ b []byte }

func (g *gen) byte() byte {
	if len(g.b) == 0 {
		return 0
	}
	c := g.b[0]
	g.b = g.b[1:]
	return c
}

func (g *gen) bytes(n int) []byte {
	n = min(n, len(g.b))
	out := g.b[:n]
	g.b = g.b[n:]
	return out
}

func (g *gen) u64() uint64 {
	var buf [8]byte
	copy(buf[:], g.bytes(8))
	return binary.LittleEndian.Uint64(buf[:])
}

func (g *gen) str() string {
	n := int(g.byte())
	if n > 200 {
		n = (n - 200) * 200 // now and then a long one
	}
	return string(g.bytes(n))
}

// Hopper's own headers come up often, so hostile values reach them.
var headerNames = []string{
	msg.HeaderRetryCount, msg.HeaderRequeueCount, msg.HeaderCrashCount, msg.HeaderDeadline,
	msg.HeaderOriginalExchange, msg.HeaderOriginalRoutingKey, msg.HeaderFirstFailureTime,
	msg.HeaderReplayCount, msg.HeaderDeath, msg.HeaderDeliveryCount, msg.HeaderFinalStatusCode,
	"traceparent", "tracestate", "valid-until", "x-custom",
}

func (g *gen) name() string {
	if c := g.byte(); int(c) < len(headerNames)*12 {
		return headerNames[int(c)%len(headerNames)]
	}
	s := g.str()
	if len(s) > 255 {
		s = s[:255] // an AMQP table key is a short string
	}
	return s
}

func (g *gen) value(depth int) any {
	switch k := g.byte() % 20; k {
	case 0:
		return nil
	case 1:
		return g.byte()%2 == 1
	case 2:
		return int8(g.byte())
	case 3:
		return int16(g.u64())
	case 4:
		return int32(g.u64())
	case 5:
		return int64(g.u64())
	case 6:
		return uint8(g.byte())
	case 7:
		return uint16(g.u64())
	case 8:
		return uint32(g.u64())
	case 9:
		return math.Float32frombits(uint32(g.u64()))
	case 10:
		return math.Float64frombits(g.u64())
	case 11, 12:
		return g.str()
	case 13:
		return g.bytes(int(g.byte()))
	case 14:
		return time.Unix(int64(g.u64()%(1<<40)), 0)
	case 15:
		return msg.Decimal{Scale: g.byte(), Value: int32(g.u64())}
	case 16:
		if depth > 4 {
			return nil
		}
		t := map[string]any{}
		for range int(g.byte() % 6) {
			t[g.name()] = g.value(depth + 1)
		}
		return t
	case 17:
		if depth > 4 {
			return nil
		}
		var a []any
		for range int(g.byte() % 6) {
			a = append(a, g.value(depth+1))
		}
		return a
	case 18:
		// A counter as a decimal string, in or far out of range.
		return []string{"9223372036854775807", "-1", "99999999999999999999", "3", "NaN", " 7 ", "0x10"}[g.byte()%7]
	}
	return int64(math.MaxInt64 - int64(g.byte()))
}

func (g *gen) message() (*msg.Message, string) {
	m := &msg.Message{
		Exchange: g.str(), RoutingKey: g.str(), Redelivered: g.byte()%2 == 1,
		ContentType: g.str(), ContentEncoding: g.str(), DeliveryMode: g.byte(), Priority: g.byte(),
		CorrelationID: g.str(), ReplyTo: g.str(), MessageID: g.str(), Type: g.str(), UserID: g.str(), AppID: g.str(),
		Headers: map[string]any{},
	}
	switch g.byte() % 5 {
	case 0:
		m.Expiration = ""
	case 1:
		m.Expiration = "0"
	case 2:
		m.Expiration = "60000"
	default:
		m.Expiration = g.str()
	}
	if g.byte()%2 == 1 {
		m.Timestamp = time.Unix(int64(g.u64()%(1<<40)), 0)
	}
	n := int(g.byte() % 24)
	if g.byte() == 0xff {
		n = 600 // a huge table
	}
	for range n {
		m.Headers[g.name()] = g.value(0)
	}
	deadlineHeader := ""
	if g.byte()%3 == 0 {
		deadlineHeader = "valid-until"
	}
	m.Body = g.bytes(int(g.byte()) * 64)
	return m, deadlineHeader
}

func (g *gen) outcome() retry.Outcome {
	switch g.byte() % 10 {
	case 0:
		return retry.Outcome{Kind: retry.Timeout, Error: "timeout"}
	case 1:
		return retry.Outcome{Kind: retry.Unavailable, Error: "connection refused"}
	case 2:
		return retry.Outcome{Kind: retry.Unavailable, Cut: true, Crashed: true, Error: "EOF; then down"}
	case 3:
		return retry.Outcome{Kind: retry.Cut, Error: "reset"}
	case 4:
		return retry.Outcome{Kind: retry.Unavailable, Refused: true}
	}
	o := retry.Outcome{Kind: retry.Response, Status: int(binary.LittleEndian.Uint16(append(g.bytes(2), 0, 0)) % 1000)}
	if g.byte()%2 == 1 {
		o.RetryAfter, o.HasRetryAfter = retry.ParseRetryAfter(g.str(), time.Now())
		if o.RetryAfter > 10*time.Millisecond && o.RetryAfter < time.Second {
			o.RetryAfter = time.Millisecond // short holds are real sleeps
		}
	}
	switch g.byte() % 4 {
	case 0:
		o.Override = []string{"ack", "retry", "requeue", "dlq", "drop", "return", "RETRY"}[g.byte()%7]
	case 1:
		o.Override = g.str()
	}
	if o.Status < 200 || o.Status > 299 {
		o.Error = g.str()
	}
	return o
}

// The path check itself catches what hostile input once did: a retry count
// at the int64 limit answered 500 made the attempt wrap and the tier index
// panic.
func TestPathHostileRetryCount(t *testing.T) {
	for _, v := range []any{int64(math.MaxInt64), "9223372036854775807", uint64(math.MaxUint64), -5, 1e300} {
		for _, status := range []int{500, 425, 400, 200} {
			m := &msg.Message{MessageID: "m", RoutingKey: "orders", Body: []byte("b"),
				Headers: map[string]any{msg.HeaderRetryCount: v, msg.HeaderRequeueCount: v, msg.HeaderCrashCount: v}}
			checkPath(t, m, "", retry.Outcome{Kind: retry.Response, Status: status})
		}
	}
}

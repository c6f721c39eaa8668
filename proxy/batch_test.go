package proxy

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/topology"
)

// batchApp answers batch requests through answer, and records their ids.
type batchApp struct {
	mu       sync.Mutex
	requests [][]string
	// splits counts the requests marked as parts of a split batch.
	splits int
	answer func(ids []string) batch.Answer
}

func (a *batchApp) Deliver(context.Context, *msg.Message, msg.Info) retry.Outcome {
	panic("a batching loop sent a single request")
}

func (a *batchApp) DeliverBatch(_ context.Context, r *batch.Request) batch.Answer {
	var ids []string
	for _, m := range r.Messages {
		ids = append(ids, m.MessageID)
	}
	a.mu.Lock()
	a.requests = append(a.requests, ids)
	if r.Split {
		a.splits++
	}
	a.mu.Unlock()
	return a.answer(ids)
}

func newBatchLoop(t *testing.T, app *batchApp, size int, hold time.Duration) (*Loop, *fakePub) {
	t.Helper()
	cfg := config.Default()
	cfg.Queue.Name = "orders"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := topology.FromConfig(&cfg)
	pub := &fakePub{j: &journal{}}
	p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: app, Pub: pub, Workers: 1, Queue: 64,
		Batch: batch.Limits{MaxMessages: size, MaxBytes: 1 << 20}, BatchWait: time.Hour, MoveHoldMax: hold})
	p.Start(context.Background())
	return p, pub
}

func each(ids []string, o retry.Outcome) batch.Answer {
	a := batch.Answer{Whole: o, Entries: make([]retry.Outcome, len(ids))}
	for i := range a.Entries {
		a.Entries[i] = o
	}
	return a
}

// settledAll waits until every delivery is settled, by the journal.
func settledAll(t *testing.T, j *journal, n int) {
	t.Helper()
	waitfor.Until(t, 10*time.Second, "every delivery settled", func() bool {
		settles := 0
		for _, e := range j.all() {
			if e == "ack" || e == "nack-requeue" {
				settles++
			}
		}
		return settles == n
	})
}

// TestBatchCrashSplitDown: a batch of 8 whose request crashes the app
// while the pill is in it is halved down to the pill alone; only the pill
// is charged the crash.
func TestBatchCrashSplitDown(t *testing.T) {
	crash := retry.Outcome{Kind: retry.Unavailable, Cut: true, Crashed: true, Error: "cut; the app died"}
	app := &batchApp{answer: func(ids []string) batch.Answer {
		if slices.Contains(ids, "m5") {
			return each(ids, crash)
		}
		return each(ids, retry.Outcome{Kind: retry.Response, Status: 200})
	}}
	p, pub := newBatchLoop(t, app, 8, time.Hour)
	j := pub.j
	for i := range 8 {
		p.Handle(&fakeDelivery{m: &msg.Message{MessageID: "m" + string(rune('0'+i)), Headers: map[string]any{}}, j: j, alive: true})
	}
	settledAll(t, j, 8)
	want := [][]string{
		{"m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7"},
		{"m0", "m1", "m2", "m3"},
		{"m4", "m5", "m6", "m7"},
		{"m4", "m5"},
		{"m4"},
		{"m5"},
		{"m6", "m7"},
	}
	if !slices.EqualFunc(app.requests, want, slices.Equal) {
		t.Fatalf("requests %v, want %v", app.requests, want)
	}
	if len(pub.got) != 1 || pub.got[0].MessageID != "m5" || msg.Counter(pub.got[0].Headers[msg.HeaderCrashCount]) != 1 {
		t.Fatalf("republished %d copies; want m5 alone with a crash count of 1", len(pub.got))
	}
}

// TestBatchUnsplitCrashChargesNobody: a batch that crashes the app when it
// can no longer be held for a split goes back with every message marked a
// suspect, none charged the crash.
func TestBatchUnsplitCrashChargesNobody(t *testing.T) {
	crash := retry.Outcome{Kind: retry.Unavailable, Cut: true, Crashed: true, Error: "cut; the app died"}
	app := &batchApp{answer: func(ids []string) batch.Answer { return each(ids, crash) }}
	// A hold limit of 1ns: no split is ever allowed.
	p, pub := newBatchLoop(t, app, 4, time.Nanosecond)
	for i := range 4 {
		p.Handle(&fakeDelivery{m: &msg.Message{MessageID: "m" + string(rune('0'+i)), Headers: map[string]any{}}, j: pub.j, alive: true})
	}
	settledAll(t, pub.j, 4)
	if len(app.requests) != 1 {
		t.Fatalf("requests %v: want one, not split", app.requests)
	}
	if len(pub.got) != 4 {
		t.Fatalf("%d republished, want 4", len(pub.got))
	}
	for _, m := range pub.got {
		if _, charged := m.Headers[msg.HeaderCrashCount]; charged || m.Headers[msg.HeaderCrashSuspect] == nil {
			t.Errorf("%s went back with headers %v: want the suspect mark and no crash count", m.MessageID, m.Headers)
		}
	}
}

// TestBatchTimeoutSendsEachAlone: a batch that times out as a whole has a
// message that makes the app hang, and halving it would cost a timeout
// per level, all its messages held meanwhile. Each message goes again
// alone, all at once, beside the worker: the hanging one is the only one
// to time out again, and while it hangs its neighbours are answered and
// the one worker goes on with the next batch.
func TestBatchTimeoutSendsEachAlone(t *testing.T) {
	var mu sync.Mutex
	answered := 0
	others := make(chan struct{}) // closed once m2's neighbours and the next batch are answered
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	app := &batchApp{answer: func(ids []string) batch.Answer {
		if !slices.Contains(ids, "m2") {
			mu.Lock()
			if answered++; answered == 4 {
				close(others)
			}
			mu.Unlock()
			return each(ids, retry.Outcome{Kind: retry.Response, Status: 200})
		}
		if len(ids) == 1 {
			select {
			case <-others:
			case <-stop:
			}
		}
		return each(ids, retry.Outcome{Kind: retry.Timeout, Error: "timeout"})
	}}
	p, pub := newBatchLoop(t, app, 4, time.Hour)
	for _, id := range []string{"m0", "m1", "m2", "m3", "n0", "n1", "n2", "n3"} {
		p.Handle(&fakeDelivery{m: &msg.Message{MessageID: id, Headers: map[string]any{}}, j: pub.j, alive: true})
	}
	settledAll(t, pub.j, 8)
	if !p.Shutdown(context.Background()) {
		t.Fatal("shutdown did not finish")
	}
	got := slices.Clone(app.requests)
	slices.SortFunc(got, func(a, b []string) int { return cmp.Compare(strings.Join(a, " "), strings.Join(b, " ")) })
	want := [][]string{{"m0"}, {"m0", "m1", "m2", "m3"}, {"m1"}, {"m2"}, {"m3"}, {"n0", "n1", "n2", "n3"}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("requests %v, want %v", got, want)
	}
	if app.splits != 4 {
		t.Errorf("%d requests marked as parts of a split, want the 4 single ones", app.splits)
	}
	if !slices.Equal(pub.to, []string{"orders.retry.1s"}) || pub.got[0].MessageID != "m2" {
		t.Errorf("published to %v: want m2 alone to its tier", pub.to)
	}
	if n := p.Stats.InFlight.Load(); n != 0 {
		t.Errorf("in flight %d after shutdown, want 0", n)
	}
}

// TestBatchMoveDoesNotKeepWorker: a message of a batch answered 425 is
// held before it is requeued; the hold keeps that message, not the
// batch's worker: the one worker takes the next batch at once.
func TestBatchMoveDoesNotKeepWorker(t *testing.T) {
	j := &journal{}
	var atNext []string
	app := &batchApp{}
	app.answer = func(ids []string) batch.Answer {
		a := each(ids, retry.Outcome{Kind: retry.Response, Status: 200})
		if ids[0] == "m0" {
			a.Entries[0] = retry.Outcome{Kind: retry.Response, Status: 425}
		} else {
			atNext = j.all()
		}
		return a
	}
	cfg := config.Default()
	cfg.Queue.Name = "orders"
	cfg.Requeue.MinHold, cfg.Requeue.MaxHold = config.Duration(time.Hour), config.Duration(time.Hour)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := topology.FromConfig(&cfg)
	p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: app, Pub: &fakePub{j: j}, Workers: 1, Queue: 64,
		Batch: batch.Limits{MaxMessages: 2, MaxBytes: 1 << 20}, BatchWait: time.Hour, MoveHoldMax: 24 * time.Hour})
	p.Start(context.Background())
	ch := &fakeChannel{}
	for _, id := range []string{"m0", "m1", "n0", "n1"} {
		p.Handle(&chanDelivery{m: &msg.Message{MessageID: id, Headers: map[string]any{}}, j: j, ch: ch})
	}
	waitfor.Until(t, 10*time.Second, "the next batch answered", func() bool {
		app.mu.Lock()
		defer app.mu.Unlock()
		return len(app.requests) == 2
	})
	if !p.Shutdown(context.Background()) {
		t.Fatal("shutdown did not finish")
	}
	if slices.Contains(atNext, "nack-requeue m0") || slices.Contains(atNext, "publish orders") {
		t.Errorf("m0 was settled (%v) before the next batch went: its hold kept the worker", atNext)
	}
	// Shutdown cut the hold short: m0 goes back as it came.
	if got := j.all(); !slices.Contains(got, "nack-requeue m0") || countOf(got, "ack m1") != 1 {
		t.Errorf("journal %v: want m1 acked, m0 given back", got)
	}
}

// flushingDelivery is a fake delivery whose channel coalesces acks: it
// records when it is asked to send the acks that may go.
type flushingDelivery struct{ fakeDelivery }

func (d *flushingDelivery) SendAcks() error { d.j.add("send-acks"); return nil }

// TestBatchSendsAcksOnceSettled: once a batch's messages are acked, the
// batch asks their channel to send its acks then, not at its next
// periodic flush: until the acks are on the wire the messages count
// against the prefetch the next batches are gathered from.
func TestBatchSendsAcksOnceSettled(t *testing.T) {
	app := &batchApp{answer: func(ids []string) batch.Answer {
		return each(ids, retry.Outcome{Kind: retry.Response, Status: 200})
	}}
	p, pub := newBatchLoop(t, app, 4, time.Hour)
	j := pub.j
	for i := range 4 {
		p.Handle(&flushingDelivery{fakeDelivery{m: &msg.Message{MessageID: "m" + string(rune('0'+i)), Headers: map[string]any{}}, j: j, alive: true}})
	}
	waitfor.Until(t, 10*time.Second, "the batch's acks sent", func() bool { return slices.Contains(j.all(), "send-acks") })
	log := j.all()
	if want := []string{"ack", "ack", "ack", "ack", "send-acks"}; !slices.Equal(log, want) {
		t.Fatalf("journal %v, want %v: the acks, then one request to send them", log, want)
	}
}

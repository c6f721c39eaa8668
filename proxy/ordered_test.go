package proxy

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/order"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/topology"
)

// An ordered delivery answered 425 is held where it is and delivered
// again, its requeue counted: republishing it to the work queue would put
// it behind every message after it.
func TestOrderedTooEarlyHoldsInPlace(t *testing.T) {
	var requeues []int
	rec := appFunc(func(m *msg.Message) retry.Outcome {
		requeues = append(requeues, msg.Read(m, "orders", "", time.Now()).Requeues)
		if len(requeues) < 3 {
			return retry.Outcome{Kind: retry.Response, Status: 425}
		}
		return retry.Outcome{Kind: retry.Response, Status: 200}
	})
	p, pub, j := newInPlaceProxy(t, rec, []time.Duration{time.Millisecond}, time.Minute)
	run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
	if len(pub.to) != 0 {
		t.Errorf("published to %v: an ordered 425 must not leave its place", pub.to)
	}
	if got := j.all(); !slices.Equal(got, []string{"ack"}) {
		t.Errorf("settles %v, want one ack", got)
	}
	if !slices.Equal(requeues, []int{0, 1, 2}) {
		t.Errorf("requeue counts seen %v, want [0 1 2]", requeues)
	}
}

// An ordered delivery the app could not take (unavailable, or refused by
// an open breaker) waits where it is and goes again, instead of being
// given back (which on a quorum queue is a republish to the tail).
func TestOrderedUnavailableHoldsInPlace(t *testing.T) {
	for _, quorum := range []bool{false, true} {
		app := &scriptedApp{outs: []retry.Outcome{
			{Kind: retry.Unavailable, Error: "connection refused"},
			{Kind: retry.Unavailable, Refused: true, Error: "circuit breaker open"},
			{Kind: retry.Response, Status: 200}}}
		p, pub, j := newInPlaceProxy(t, app, []time.Duration{time.Millisecond}, time.Minute)
		p.o.Quorum, p.o.UnavailableBackoff = quorum, time.Millisecond
		run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
		if len(pub.to) != 0 {
			t.Errorf("quorum %v: published to %v; an ordered message the app could not take stays in place", quorum, pub.to)
		}
		if got := j.all(); !slices.Equal(got, []string{"ack"}) {
			t.Errorf("quorum %v: settles %v, want one ack", quorum, got)
		}
		if !slices.Equal(app.attempts, []int{1, 1, 1}) {
			t.Errorf("quorum %v: attempts %v, want [1 1 1]: no attempt spent", quorum, app.attempts)
		}
	}
}

// brokenObserver records the reasons OrderBroken is told.
type brokenObserver struct {
	countingObserver
	mu      sync.Mutex
	reasons []string
}

func (o *brokenObserver) OrderBroken(reason string) {
	o.mu.Lock()
	o.reasons = append(o.reasons, reason)
	o.mu.Unlock()
}

// An ordered message that leaves its place in line is reported, with why:
// a give-back at shutdown on a quorum queue republishes it to the tail; a
// retry whose hold would pass MoveHoldMax goes through its tier. A
// give-back on a classic queue (a nack, back to where it was) and a
// message that is not ordered are not.
func TestOrderBrokenReported(t *testing.T) {
	for _, tc := range []struct {
		name          string
		quorum, keyed bool
		stopped       bool
		out           retry.Outcome
		holdMax       time.Duration
		want          []string
		wantPublishTo string
	}{
		{name: "quorum give-back", quorum: true, keyed: true, stopped: true, holdMax: time.Minute,
			want: []string{OrderReturned}, wantPublishTo: "orders"},
		{name: "classic give-back", keyed: true, stopped: true, holdMax: time.Minute},
		{name: "unordered quorum give-back", quorum: true, stopped: true, holdMax: time.Minute, wantPublishTo: "orders"},
		{name: "hold exhausted", keyed: true, out: retry.Outcome{Kind: retry.Response, Status: 503}, holdMax: time.Millisecond,
			want: []string{OrderHoldExhausted}, wantPublishTo: "orders.retry.1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, pub, j := newTestProxy(t, tc.out, nil)
			obs := &brokenObserver{}
			p.obs, p.o.Quorum, p.o.MoveHoldMax = obs, tc.quorum, tc.holdMax
			if tc.stopped {
				close(p.stopping)
			}
			p.handle(context.Background(), &fakeDelivery{m: msgWith(nil), j: j, alive: true}, tc.keyed)
			if !slices.Equal(obs.reasons, tc.want) {
				t.Errorf("reported %v, want %v", obs.reasons, tc.want)
			}
			if got := p.Stats.OrderBroken.Load(); got != int64(len(tc.want)) {
				t.Errorf("Stats.OrderBroken %d, want %d", got, len(tc.want))
			}
			if tc.wantPublishTo != "" && !slices.Equal(pub.to, []string{tc.wantPublishTo}) {
				t.Errorf("published to %v, want %s", pub.to, tc.wantPublishTo)
			}
		})
	}
}

// keyApp answers 503 to the first attempt of every message of key "a"
// and holds every call until released, recording the order of calls.
type keyApp struct {
	mu    sync.Mutex
	calls []string
	gate  chan struct{}
}

func (a *keyApp) Deliver(_ context.Context, m *msg.Message, in msg.Info) retry.Outcome {
	a.mu.Lock()
	a.calls = append(a.calls, m.MessageID)
	a.mu.Unlock()
	<-a.gate
	if m.Headers["k"] == "a" && in.Attempt == 1 {
		return retry.Outcome{Kind: retry.Response, Status: 503}
	}
	return retry.Outcome{Kind: retry.Response, Status: 200}
}

func (a *keyApp) DeliverBatch(context.Context, *batch.Request) batch.Answer { panic("no batches") }

func (a *keyApp) seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

// Through Handle, messages of one key go one at a time in arrival order,
// each retried in place, while another key and a message without a key go
// at once: with four workers and every call held, exactly the first of
// each key and the unkeyed one are at the app.
func TestHandleKeyedLanes(t *testing.T) {
	app := &keyApp{gate: make(chan struct{})}
	cfg := config.Default()
	cfg.Queue.Name = "orders"
	cfg.Retry.Tiers = []config.Duration{config.Duration(time.Millisecond)}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := topology.FromConfig(&cfg)
	j := &journal{}
	src, err := order.Parse("header:k")
	if err != nil {
		t.Fatal(err)
	}
	p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: app, Pub: &fakePub{j: j}, Workers: 4, Queue: 16,
		OrderingKey: src, MoveHoldMax: time.Minute})
	p.Start(context.Background())
	for _, id := range []string{"a1", "b1", "a2", "u1", "b2", "a3"} {
		m := msgWith(nil)
		m.MessageID = id
		if id[0] != 'u' {
			m.Headers["k"] = id[:1]
		}
		p.Handle(&fakeDelivery{m: m, j: j, alive: true})
	}
	waitfor.Until(t, 10*time.Second, "the first of each key and the unkeyed message at the app", func() bool {
		return len(app.seen()) == 3
	})
	first := app.seen()
	slices.Sort(first)
	if !slices.Equal(first, []string{"a1", "b1", "u1"}) {
		t.Fatalf("at the app at once: %v, want a1 b1 u1", first)
	}
	close(app.gate)
	if !p.Shutdown(context.Background()) {
		t.Fatal("shutdown did not finish")
	}
	// Shutdown after the gate opened may give back what had not started:
	// only the calls made matter, and each key's are in order.
	var a, b []string
	for _, id := range app.seen() {
		switch id[0] {
		case 'a':
			a = append(a, id)
		case 'b':
			b = append(b, id)
		}
	}
	if !slices.IsSorted(b) || !isRunsInOrder(a) {
		t.Errorf("calls per key out of order: a %v, b %v", a, b)
	}
}

// isRunsInOrder says whether ids, with an id repeated for its retries,
// never goes back to an earlier id.
func isRunsInOrder(ids []string) bool {
	for i := 1; i < len(ids); i++ {
		if ids[i] < ids[i-1] {
			return false
		}
	}
	return true
}

// clockApp moves a fake clock forward by advance while it handles a1 (a
// slow call) and answers a2 503 on its first attempt. The call of a1 waits
// for received to be closed, so that the clock moves only once both
// messages are in.
type clockApp struct {
	mu       sync.Mutex
	now      time.Time
	advance  time.Duration
	calls    []string
	received chan struct{}
}

func (a *clockApp) Now() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.now
}

func (a *clockApp) Deliver(_ context.Context, m *msg.Message, in msg.Info) retry.Outcome {
	if m.MessageID == "a1" {
		<-a.received
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, fmt.Sprintf("%s#%d", m.MessageID, in.Attempt))
	if m.MessageID == "a1" {
		a.now = a.now.Add(a.advance)
	}
	if m.MessageID == "a2" && in.Attempt == 1 {
		return retry.Outcome{Kind: retry.Response, Status: 503}
	}
	return retry.Outcome{Kind: retry.Response, Status: 200}
}

func (a *clockApp) DeliverBatch(context.Context, *batch.Request) batch.Answer { panic("no batches") }

// A message that waited behind its key has been unacked since it was
// received, and its in-place hold is bounded from then, not from when its
// turn came: a2, received with a1 and waiting while a1's call took 80ms,
// would pass MoveHoldMax (100ms) by holding for its 50ms tier, so its
// retry goes through the tier queue (and is reported as leaving its
// place). Bounded from its turn it would be held, and each message of a
// key could stay unacked a MoveHoldMax longer than the one before it,
// past the broker's consumer timeout.
func TestKeyedHoldBoundedFromReceipt(t *testing.T) {
	app := &clockApp{now: time.Unix(1_700_000_000, 0), advance: 80 * time.Millisecond, received: make(chan struct{})}
	cfg := config.Default()
	cfg.Queue.Name = "orders"
	cfg.Retry.Tiers = []config.Duration{config.Duration(50 * time.Millisecond)}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := topology.FromConfig(&cfg)
	j := &journal{}
	pub := &fakePub{j: j}
	src, err := order.Parse("header:k")
	if err != nil {
		t.Fatal(err)
	}
	obs := &brokenObserver{}
	p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: app, Pub: pub, Workers: 2, Queue: 4,
		OrderingKey: src, MoveHoldMax: 100 * time.Millisecond, Now: app.Now, Observer: obs})
	p.Start(context.Background())
	for _, id := range []string{"a1", "a2"} {
		m := msgWith(map[string]any{"k": "a"})
		m.MessageID = id
		p.Handle(&fakeDelivery{m: m, j: j, alive: true})
	}
	close(app.received)
	waitfor.Until(t, 10*time.Second, "a2's retry published", func() bool {
		pub.mu.Lock()
		defer pub.mu.Unlock()
		return len(pub.to) == 1
	})
	if !p.Shutdown(context.Background()) {
		t.Fatal("shutdown did not finish")
	}
	if want := []string{"orders.retry.50ms"}; !slices.Equal(pub.to, want) {
		t.Errorf("published to %v, want %v", pub.to, want)
	}
	if want := []string{OrderHoldExhausted}; !slices.Equal(obs.reasons, want) {
		t.Errorf("reported %v, want %v", obs.reasons, want)
	}
	if want := []string{"a1#1", "a2#1"}; !slices.Equal(app.calls, want) {
		t.Errorf("calls %v, want %v", app.calls, want)
	}
}

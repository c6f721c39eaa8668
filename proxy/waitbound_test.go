package proxy

import (
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
	"github.com/hopper-sidecar/hopper/order"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/topology"
)

// gateApp holds every call of a1 until gate is closed and answers 200;
// it records the ids it was called with.
type gateApp struct {
	mu    sync.Mutex
	calls []string
	gate  chan struct{}
}

func (a *gateApp) Deliver(_ context.Context, m *msg.Message, _ msg.Info) retry.Outcome {
	a.mu.Lock()
	a.calls = append(a.calls, m.MessageID)
	a.mu.Unlock()
	if m.MessageID == "a1" {
		<-a.gate
	}
	return retry.Outcome{Kind: retry.Response, Status: 200}
}

func (a *gateApp) DeliverBatch(context.Context, *batch.Request) batch.Answer { panic("no batches") }

func (a *gateApp) seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

// laneObserver records the reasons OrderBroken is told, from the
// workers and the lanes' bound at once.
type laneObserver struct{ brokenObserver }

func (o *laneObserver) Decided(retry.Outcome, bool, retry.Decision, time.Duration) {}

// A message waiting behind its key is unacked from its receipt, and the
// broker's consumer_timeout counts from there whatever Hopper does: a hot
// key whose messages the app is slow to answer would keep the ones at the
// back of its line past it. So a message that has waited behind its key
// until MoveHoldMax from its receipt is given back, with every message
// behind it (they would otherwise overtake it), in line order, without
// reaching the app and without spending an attempt: on a classic queue a
// nack, which puts each back in its place, on a quorum queue a republish
// to the tail, reported as leaving its place.
func TestKeyedWaitBoundedFromReceipt(t *testing.T) {
	for _, quorum := range []bool{false, true} {
		app := &gateApp{gate: make(chan struct{})}
		cfg := config.Default()
		cfg.Queue.Name = "orders"
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
		obs := &laneObserver{}
		p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: app, Pub: pub, Workers: 4, Queue: 16,
			OrderingKey: src, MoveHoldMax: 200 * time.Millisecond, Quorum: quorum, Observer: obs})
		p.Start(context.Background())
		ch := &fakeChannel{}
		for _, id := range []string{"a1", "a2", "b1", "a3"} {
			m := msgWith(map[string]any{"k": id[:1], msg.HeaderRetryCount: int64(1)})
			m.MessageID = id
			p.Handle(&chanDelivery{m: m, j: j, ch: ch})
		}
		want := []string{"nack-requeue a2", "nack-requeue a3"}
		if quorum {
			want = []string{"publish orders", "ack a2", "publish orders", "ack a3"}
		}
		waitfor.Until(t, 10*time.Second, "a2 and a3 given back", func() bool {
			var back []string
			for _, e := range j.all() {
				if strings.HasSuffix(e, " a2") || strings.HasSuffix(e, " a3") || e == "publish orders" {
					back = append(back, e)
				}
			}
			return slices.Equal(back, want)
		})
		if busy, waiting := p.Keys(); busy != 1 || waiting != 0 {
			t.Errorf("quorum %v: keys busy %d, waiting %d; want a1's key busy, nothing waiting", quorum, busy, waiting)
		}
		close(app.gate)
		if !p.Shutdown(context.Background()) {
			t.Fatal("shutdown did not finish")
		}
		got := app.seen()
		slices.Sort(got)
		if !slices.Equal(got, []string{"a1", "b1"}) {
			t.Errorf("quorum %v: the app was called with %v, want a1 and b1 only", quorum, got)
		}
		for i, cp := range pub.got {
			if n := msg.Counter(cp.Headers[msg.HeaderRetryCount]); n != 1 || pub.to[i] != "orders" {
				t.Errorf("quorum %v: copy of %s to %s with x-retry-count %d, want the work queue and 1", quorum, cp.MessageID, pub.to[i], n)
			}
		}
		wantBroken := []string(nil)
		if quorum {
			wantBroken = []string{OrderReturned, OrderReturned}
		}
		if !slices.Equal(obs.reasons, wantBroken) {
			t.Errorf("quorum %v: order broken %v, want %v", quorum, obs.reasons, wantBroken)
		}
		if n := p.Stats.Returned.Load(); n != 2 {
			t.Errorf("quorum %v: returned %d, want 2", quorum, n)
		}
	}
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// A batch's messages are unacked from their receipt, not from when a
// worker took the batch: the time a batch waits to fill (maxWait) and for
// a worker counts against its holds. Here m0 and m1 wait 80ms for the one
// worker, busy with x0 and x1; their batch then fails as a whole, and with
// MoveHoldMax 100ms a split (allowed up to half of it) would hold them
// past it, so each is retried through its tier instead. Counted from when
// the worker took the batch, it would be split.
func TestBatchHoldBoundedFromReceipt(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	gate := make(chan struct{})
	app := &batchApp{answer: func(ids []string) batch.Answer {
		if ids[0] == "x0" {
			<-gate
			return each(ids, retry.Outcome{Kind: retry.Response, Status: 200})
		}
		return each(ids, retry.Outcome{Kind: retry.Timeout, Error: "timeout"})
	}}
	p, pub := newBatchLoop(t, app, 2, 100*time.Millisecond)
	p.o.Now = clock.Now
	for _, id := range []string{"x0", "x1", "m0", "m1"} {
		p.Handle(&fakeDelivery{m: &msg.Message{MessageID: id, Headers: map[string]any{}}, j: pub.j, alive: true})
	}
	clock.advance(80 * time.Millisecond)
	close(gate)
	settledAll(t, pub.j, 4)
	if !p.Shutdown(context.Background()) {
		t.Fatal("shutdown did not finish")
	}
	want := [][]string{{"x0", "x1"}, {"m0", "m1"}}
	if !slices.EqualFunc(app.requests, want, slices.Equal) {
		t.Errorf("requests %v, want %v: no split", app.requests, want)
	}
	if !slices.Equal(pub.to, []string{"orders.retry.1s", "orders.retry.1s"}) {
		t.Errorf("published to %v, want both to their tier", pub.to)
	}
}

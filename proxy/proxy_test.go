package proxy

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/topology"
)

// journal records the order of settle and publish calls across fakes.
type journal struct {
	mu  sync.Mutex
	log []string
}

func (j *journal) add(s string) { j.mu.Lock(); j.log = append(j.log, s); j.mu.Unlock() }
func (j *journal) all() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.log...)
}

type fakeDelivery struct {
	m     *msg.Message
	j     *journal
	alive bool
}

func (d *fakeDelivery) Message() *msg.Message { return d.m }
func (d *fakeDelivery) Ack() error            { d.j.add("ack"); return nil }
func (d *fakeDelivery) Nack(requeue bool) error {
	if requeue {
		d.j.add("nack-requeue")
	} else {
		d.j.add("nack-drop")
	}
	return nil
}
func (d *fakeDelivery) Alive() bool { return d.alive }

// fakePub fails its first fails publishes with err (all of them when fails
// is negative); onFail runs after each failure.
type fakePub struct {
	// mu serialises publishes: a batch's moves run concurrently.
	mu     sync.Mutex
	j      *journal
	err    error
	fails  int
	onFail func(n int)
	got    []*msg.Message
	to     []string
	failed int
}

func (p *fakePub) Publish(_ context.Context, queue string, m *msg.Message) error {
	p.mu.Lock()
	p.j.add("publish " + queue)
	p.got, p.to = append(p.got, m), append(p.to, queue)
	if p.err != nil && (p.fails < 0 || p.failed < p.fails) {
		p.failed++
		n := p.failed
		p.mu.Unlock()
		if p.onFail != nil {
			p.onFail(n)
		}
		return p.err
	}
	p.mu.Unlock()
	return nil
}

type fakeApp struct {
	out   retry.Outcome
	calls *int
}

func (a fakeApp) Deliver(context.Context, *msg.Message, msg.Info) retry.Outcome {
	if a.calls != nil {
		*a.calls++
	}
	return a.out
}

func newTestProxy(t *testing.T, out retry.Outcome, pubErr error) (*Loop, *fakePub, *journal) {
	t.Helper()
	cfg := config.Default()
	cfg.Queue.Name = "orders"
	cfg.Requeue.MinHold = config.Duration(time.Millisecond)
	cfg.Requeue.MaxHold = config.Duration(2 * time.Millisecond)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := topology.FromConfig(&cfg)
	j := &journal{}
	pub := &fakePub{j: j, err: pubErr, fails: -1}
	p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: fakeApp{out: out}, Pub: pub,
		Workers: 1, MoveRetryMin: time.Microsecond, MoveRetryMax: time.Microsecond, UnavailableBackoff: time.Millisecond})
	return p, pub, j
}

func run(p *Loop, d Delivery) {
	p.handle(context.Background(), d, false)
}

func msgWith(h map[string]any) *msg.Message {
	if h == nil {
		h = map[string]any{}
	}
	return &msg.Message{MessageID: "m", Headers: h, RoutingKey: "orders", Body: []byte("b")}
}

// TestMoveAcksOnlyAfterConfirm: every move publishes first and acks after;
// a failed publish is retried while the delivery is held, and the original
// is acked only once a copy is confirmed.
func TestMoveAcksOnlyAfterConfirm(t *testing.T) {
	cases := []struct {
		name   string
		out    retry.Outcome
		pubErr error
		want   []string
	}{
		{"retry", retry.Outcome{Kind: retry.Response, Status: 503}, nil, []string{"publish orders.retry.1s", "ack"}},
		{"dlq", retry.Outcome{Kind: retry.Response, Status: 400}, nil, []string{"publish orders.dlq", "ack"}},
		{"requeue", retry.Outcome{Kind: retry.Response, Status: 425}, nil, []string{"publish orders", "ack"}},
		{"retry refused twice", retry.Outcome{Kind: retry.Response, Status: 503}, errors.New("nacked"), []string{"publish orders.retry.1s", "publish orders.retry.1s", "publish orders.retry.1s", "ack"}},
		{"dlq refused twice", retry.Outcome{Kind: retry.Response, Status: 400}, errors.New("returned"), []string{"publish orders.dlq", "publish orders.dlq", "publish orders.dlq", "ack"}},
		{"requeue refused twice", retry.Outcome{Kind: retry.Response, Status: 425}, errors.New("timeout"), []string{"publish orders", "publish orders", "publish orders", "ack"}},
		{"ack", retry.Outcome{Kind: retry.Response, Status: 200}, nil, []string{"ack"}},
		{"unavailable classic", retry.Outcome{Kind: retry.Unavailable}, nil, []string{"nack-requeue"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, pub, j := newTestProxy(t, tc.out, tc.pubErr)
			pub.fails = 2
			calls := 0
			p.o.App = fakeApp{out: tc.out, calls: &calls}
			var failing []bool
			p.o.OnMovesFailing = func(f bool) { failing = append(failing, f) }
			run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
			if got := j.all(); !equal(got, tc.want) {
				t.Fatalf("calls %v, want %v", got, tc.want)
			}
			if calls != 1 {
				t.Fatalf("the app was called %d times, want once: a failed move must not decide again", calls)
			}
			wantFailing := []bool(nil)
			if tc.pubErr != nil {
				wantFailing = []bool{true, false}
			}
			if !equalBools(failing, wantFailing) {
				t.Fatalf("OnMovesFailing calls %v, want %v", failing, wantFailing)
			}
			if n := p.Stats.MovesFailing.Load(); n != 0 {
				t.Fatalf("MovesFailing %d after the move went through", n)
			}
		})
	}
}

func equal(a, b []string) bool { return slices.Equal(a, b) }

func equalBools(a, b []bool) bool { return slices.Equal(a, b) }

// TestFailedMoveLetGo: a move that keeps failing is given back only when
// the proxy must let go: at shutdown, or after MoveHoldMax. On a classic
// queue that is a nack; on a quorum queue a republish to the work queue
// first (a nack spends the delivery limit), and a nack only when that fails
// too.
func TestFailedMoveLetGo(t *testing.T) {
	dlq400 := retry.Outcome{Kind: retry.Response, Status: 400}
	cases := []struct {
		name     string
		quorum   bool
		shutdown bool // let go by shutdown (else by MoveHoldMax)
		failAll  bool // the give-back republish fails too
		want     []string
	}{
		{"classic shutdown", false, true, true, []string{"publish orders.dlq", "publish orders.dlq", "nack-requeue"}},
		{"classic hold max", false, false, true, []string{"publish orders.dlq", "nack-requeue"}},
		{"quorum shutdown republishes", true, true, false, []string{"publish orders.dlq", "publish orders.dlq", "publish orders", "ack"}},
		{"quorum hold max republishes", true, false, false, []string{"publish orders.dlq", "publish orders", "ack"}},
		{"quorum republish fails too", true, true, true, []string{"publish orders.dlq", "publish orders.dlq", "publish orders", "nack-requeue"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, pub, j := newTestProxy(t, dlq400, errors.New("refused"))
			p.o.Quorum = tc.quorum
			pub.fails = -1
			if !tc.failAll {
				// Only publishes to the DLQ fail (a full DLQ).
				pub.fails = 2
				if !tc.shutdown {
					pub.fails = 1
				}
			}
			if tc.shutdown {
				pub.onFail = func(n int) {
					if n == 2 {
						close(p.stopping)
					}
				}
			} else {
				p.o.MoveHoldMax = time.Nanosecond
			}
			run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
			if got := j.all(); !equal(got, tc.want) {
				t.Fatalf("calls %v, want %v", got, tc.want)
			}
			if tc.quorum && !tc.failAll {
				back := pub.got[len(pub.got)-1]
				if n, _ := back.Int(msg.HeaderRetryCount); n != 0 {
					t.Fatalf("the given-back copy spent an attempt: x-retry-count %d", n)
				}
				if back.String(msg.HeaderDeadLetterReason) != "" {
					t.Fatalf("the given-back copy carries the DLQ stamp: %v", back.Headers)
				}
			}
		})
	}
}

// TestFailedMoveOnDeadChannel: when the delivery's channel is lost while its
// move keeps failing, the broker has put the original back already: the
// proxy neither acks nor nacks it and stops retrying.
func TestFailedMoveOnDeadChannel(t *testing.T) {
	p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 503}, errors.New("refused"))
	d := &fakeDelivery{m: msgWith(nil), j: j, alive: true}
	pub.onFail = func(n int) {
		if n == 3 {
			d.alive = false
		}
	}
	run(p, d)
	want := []string{"publish orders.retry.1s", "publish orders.retry.1s", "publish orders.retry.1s"}
	if got := j.all(); !equal(got, want) {
		t.Fatalf("calls %v, want %v", got, want)
	}
}

// TestQuorumReturnRepublishes: on a quorum queue a message the app could
// not take is republished (publish, then ack), never nacked.
func TestQuorumReturnRepublishes(t *testing.T) {
	p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Unavailable}, nil)
	p.o.Quorum = true
	m := msgWith(map[string]any{msg.HeaderRetryCount: int32(2)})
	run(p, &fakeDelivery{m: m, j: j, alive: true})
	if got := j.all(); len(got) != 2 || got[0] != "publish orders" || got[1] != "ack" {
		t.Fatalf("calls %v", got)
	}
	if n, _ := pub.got[0].Int(msg.HeaderRetryCount); n != 2 {
		t.Fatalf("a return spent an attempt: x-retry-count %d", n)
	}
}

// TestRetryCopyCarriesCounters: the moved copy has x-retry-count+1, the
// original routing key and the first failure time; the original message is
// not modified.
func TestRetryCopyCarriesCounters(t *testing.T) {
	p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 500}, nil)
	m := msgWith(map[string]any{msg.HeaderRetryCount: int32(1)})
	m.Exchange, m.RoutingKey = "shop", "order.created"
	run(p, &fakeDelivery{m: m, j: j, alive: true})
	cp := pub.got[0]
	if n, _ := cp.Int(msg.HeaderRetryCount); n != 2 {
		t.Errorf("x-retry-count %d, want 2", n)
	}
	if pub.to[0] != "orders.retry.5s" {
		t.Errorf("attempt 2 went to %s, want the 5s tier", pub.to[0])
	}
	if cp.String(msg.HeaderOriginalRoutingKey) != "order.created" || cp.String(msg.HeaderOriginalExchange) != "shop" {
		t.Errorf("original routing not pinned: %v", cp.Headers)
	}
	if cp.String(msg.HeaderFirstFailureTime) == "" {
		t.Error("no first failure time")
	}
	if n, _ := m.Int(msg.HeaderRetryCount); n != 1 {
		t.Error("the original's headers were modified")
	}
}

// TestDeadDeliveryNotDelivered: a delivery whose channel died while it
// waited is neither delivered nor settled (the broker requeued it).
func TestDeadDeliveryNotDelivered(t *testing.T) {
	p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 200}, nil)
	run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: false})
	if len(j.all()) != 0 || len(pub.got) != 0 {
		t.Fatalf("dead delivery handled: %v", j.all())
	}
}

// TestShutdownReturnsQueued: after Shutdown starts, queued deliveries are
// given back, not delivered: nacked on a classic queue, republished as they
// came on a quorum queue.
func TestShutdownReturnsQueued(t *testing.T) {
	p, _, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 200}, nil)
	close(p.stopping)
	run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
	if got := j.all(); len(got) != 1 || got[0] != "nack-requeue" {
		t.Fatalf("calls %v", got)
	}

	p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 200}, nil)
	p.o.Quorum = true
	close(p.stopping)
	m := msgWith(map[string]any{msg.HeaderRetryCount: int32(3)})
	m.Exchange, m.RoutingKey = "shop", "order.created"
	run(p, &fakeDelivery{m: m, j: j, alive: true})
	if got := j.all(); !equal(got, []string{"publish orders", "ack"}) {
		t.Fatalf("quorum shutdown: calls %v", got)
	}
	cp := pub.got[0]
	if n, _ := cp.Int(msg.HeaderRetryCount); n != 3 || cp.String(msg.HeaderOriginalRoutingKey) != "order.created" {
		t.Fatalf("quorum shutdown copy lost its history: %v", cp.Headers)
	}
}

// TestQuorumHoldCutShortRepublishes: a 425 hold cut short by shutdown gives
// the message back by republishing it on a quorum queue, with its requeue
// count unchanged (the requeue did not happen).
func TestQuorumHoldCutShortRepublishes(t *testing.T) {
	out := retry.Outcome{Kind: retry.Response, Status: 425, RetryAfter: time.Hour, HasRetryAfter: true, Override: "requeue"}
	p, pub, j := newTestProxy(t, out, nil)
	p.o.Quorum = true
	pol := p.o.Selector.Select(retry.Subject{})
	pol.MaxHold = 2 * time.Hour // a hold, not a tier
	close(p.stopping)
	// A delivery that reached the worker before shutdown started.
	m := msgWith(map[string]any{msg.HeaderRequeueCount: int32(4)})
	d := &fakeDelivery{m: m, j: j, alive: true}
	info, st := p.history(m, time.Now())
	dec := retry.Decide(pol, st, out, time.Now(), p.o.Rand)
	if dec.Action != retry.Requeue || dec.Hold != time.Hour {
		t.Fatalf("setup: decision %+v", dec)
	}
	if p.settle(context.Background(), d, m, info, dec, out, time.Now()) {
		t.Fatal("a hold cut short reported the requeue as done")
	}
	if got := j.all(); !equal(got, []string{"publish orders", "ack"}) {
		t.Fatalf("calls %v", got)
	}
	if n, _ := pub.got[0].Int(msg.HeaderRequeueCount); n != 4 {
		t.Fatalf("x-requeue-count %d, want 4 (unchanged)", n)
	}
}

// TestQuorumReturnKeepsOriginAndDeadline: a message given back on a quorum
// queue keeps its original exchange and routing key and its deadline, so
// after an outage the app sees the same routing key and a deadline never
// restarts.
func TestQuorumReturnKeepsOriginAndDeadline(t *testing.T) {
	p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Unavailable}, nil)
	p.o.Quorum = true
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	p.o.Now = func() time.Time { return now }
	m := msgWith(nil)
	m.Exchange, m.RoutingKey, m.Expiration = "shop", "order.created", "60000"
	run(p, &fakeDelivery{m: m, j: j, alive: true})
	if got := j.all(); !equal(got, []string{"publish orders", "ack"}) {
		t.Fatalf("calls %v", got)
	}
	cp := pub.got[0]
	if cp.String(msg.HeaderOriginalExchange) != "shop" || cp.String(msg.HeaderOriginalRoutingKey) != "order.created" {
		t.Fatalf("origin lost: %v", cp.Headers)
	}
	if ms, _ := cp.Int(msg.HeaderDeadline); ms != now.Add(time.Minute).UnixMilli() {
		t.Fatalf("deadline %d, want %d", ms, now.Add(time.Minute).UnixMilli())
	}
	// Delivered again from the work queue, the copy is seen as published.
	info, _ := p.history(&msg.Message{Exchange: "", RoutingKey: "orders", Headers: cp.Headers}, now.Add(time.Hour))
	if info.RoutingKey != "order.created" || info.Exchange != "shop" || !info.Deadline.Equal(now.Add(time.Minute)) {
		t.Fatalf("redelivered copy reads as %+v", info)
	}
}

// TestExpirationZeroIsDelivered: AMQP expiration "0" means deliver now or
// never; a message Hopper has received is delivered, not dead-lettered.
func TestExpirationZeroIsDelivered(t *testing.T) {
	calls := 0
	p, _, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 200}, nil)
	p.o.App = fakeApp{out: retry.Outcome{Kind: retry.Response, Status: 200}, calls: &calls}
	m := msgWith(nil)
	m.Expiration = "0"
	run(p, &fakeDelivery{m: m, j: j, alive: true})
	if calls != 1 || !equal(j.all(), []string{"ack"}) {
		t.Fatalf("app calls %d, settles %v; want delivered and acked", calls, j.all())
	}
}

type countingObserver struct {
	decided []retry.Action
}

func (o *countingObserver) Decided(_ retry.Outcome, _ bool, dec retry.Decision, _ time.Duration) {
	o.decided = append(o.decided, dec.Action)
}
func (o *countingObserver) MoveFailed(string)    {}
func (o *countingObserver) InFlight(int)         {}
func (o *countingObserver) Batch(int)            {}
func (o *countingObserver) InternalError()       {}
func (o *countingObserver) OrderBroken(string)   {}
func (o *countingObserver) Routed(string)        {}
func (o *countingObserver) RuleFailed(string)    {}
func (o *countingObserver) Parked(time.Duration) {}
func (o *countingObserver) Due(time.Duration)    {}

// TestDecisionCountedOnceAfterSettle: a decision is counted once, as what
// happened: a dead-lettering whose move was let go counts as a return.
func TestDecisionCountedOnceAfterSettle(t *testing.T) {
	p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 400}, errors.New("refused"))
	obs := &countingObserver{}
	p.obs = obs
	pub.onFail = func(n int) {
		if n == 2 {
			close(p.stopping)
		}
	}
	run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
	if len(obs.decided) != 1 || obs.decided[0] != retry.Return {
		t.Fatalf("counted %v, want one return", obs.decided)
	}

	p, _, j = newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 400}, nil)
	obs = &countingObserver{}
	p.obs = obs
	run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
	if len(obs.decided) != 1 || obs.decided[0] != retry.DLQ {
		t.Fatalf("counted %v, want one dlq", obs.decided)
	}
}

// TestCrashCountTravels: a message the app died handling is given back by
// a republish carrying the new crash count, on a classic queue too (a nack
// cannot change headers); at the crash limit it goes to the DLQ as
// app-crash, without spending an attempt.
func TestCrashCountTravels(t *testing.T) {
	crash := retry.Outcome{Kind: retry.Unavailable, Cut: true, Crashed: true, Error: "EOF"}
	p, pub, j := newTestProxy(t, crash, nil)
	p.o.Selector.Default.MaxCrashes = 3
	run(p, &fakeDelivery{m: msgWith(map[string]any{msg.HeaderRetryCount: int32(1)}), j: j, alive: true})
	if got := j.all(); !equal(got, []string{"publish orders", "ack"}) {
		t.Fatalf("calls %v", got)
	}
	cp := pub.got[0]
	if n, _ := cp.Int(msg.HeaderCrashCount); n != 1 {
		t.Fatalf("x-hopper-crash-count %d, want 1", n)
	}
	if n, _ := cp.Int(msg.HeaderRetryCount); n != 1 {
		t.Fatalf("a crash spent an attempt: x-retry-count %d", n)
	}

	p, pub, j = newTestProxy(t, crash, nil)
	p.o.Selector.Default.MaxCrashes = 3
	run(p, &fakeDelivery{m: msgWith(map[string]any{msg.HeaderCrashCount: int32(2)}), j: j, alive: true})
	if got := j.all(); !equal(got, []string{"publish orders.dlq", "ack"}) {
		t.Fatalf("calls %v", got)
	}
	cp = pub.got[0]
	if cp.String(msg.HeaderDeadLetterReason) != retry.ReasonAppCrash {
		t.Fatalf("reason %q", cp.String(msg.HeaderDeadLetterReason))
	}
	if n, _ := cp.Int(msg.HeaderCrashCount); n != 3 {
		t.Fatalf("x-hopper-crash-count %d on the DLQ copy, want 3", n)
	}
}

// scriptedApp answers with outs in turn (the last one from then on) and
// records the attempt number each call saw.
type scriptedApp struct {
	outs     []retry.Outcome
	attempts []int
	onCall   func(n int)
}

func (a *scriptedApp) Deliver(_ context.Context, _ *msg.Message, in msg.Info) retry.Outcome {
	a.attempts = append(a.attempts, in.Attempt)
	n := len(a.attempts)
	if a.onCall != nil {
		a.onCall(n)
	}
	return a.outs[min(n-1, len(a.outs)-1)]
}

func newInPlaceProxy(t *testing.T, app Deliverer, tiers []time.Duration, holdMax time.Duration) (*Loop, *fakePub, *journal) {
	t.Helper()
	cfg := config.Default()
	cfg.Queue.Name = "orders"
	cfg.Consumer.Ordered = true
	cfg.Retry.MaxAttempts = 4
	cfg.Requeue.MinHold = config.Duration(time.Millisecond)
	cfg.Requeue.MaxHold = config.Duration(2 * time.Millisecond)
	cfg.Retry.Tiers = nil
	for _, d := range tiers {
		cfg.Retry.Tiers = append(cfg.Retry.Tiers, config.Duration(d))
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := topology.FromConfig(&cfg)
	j := &journal{}
	pub := &fakePub{j: j}
	p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: app, Pub: pub, Workers: 1,
		InPlace: true, MoveHoldMax: holdMax})
	return p, pub, j
}

// TestInPlaceRetry: an ordered delivery that fails twice is held and
// delivered again (attempts 1, 2, 3) with no tier publish, then acked once.
func TestInPlaceRetry(t *testing.T) {
	fail, ok := retry.Outcome{Status: 500}, retry.Outcome{Status: 200}
	app := &scriptedApp{outs: []retry.Outcome{fail, fail, ok}}
	p, pub, j := newInPlaceProxy(t, app, []time.Duration{time.Millisecond, 2 * time.Millisecond}, time.Minute)
	d := &fakeDelivery{m: msgWith(nil), j: j, alive: true}
	run(p, d)
	if !slices.Equal(app.attempts, []int{1, 2, 3}) {
		t.Errorf("attempts %v, want [1 2 3]", app.attempts)
	}
	if len(pub.to) != 0 {
		t.Errorf("published to %v: an in-place retry moves nothing", pub.to)
	}
	if got := j.all(); !slices.Equal(got, []string{"ack"}) {
		t.Errorf("settles %v, want one ack", got)
	}
	if p.Stats.Retried.Load() != 2 || p.Stats.Acked.Load() != 1 {
		t.Errorf("stats retried=%d acked=%d, want 2 and 1", p.Stats.Retried.Load(), p.Stats.Acked.Load())
	}
}

// TestInPlaceRetryReachesDLQ: past the attempt limit the held message goes
// to the DLQ with every failed attempt counted.
func TestInPlaceRetryReachesDLQ(t *testing.T) {
	app := &scriptedApp{outs: []retry.Outcome{{Status: 503}}}
	p, pub, j := newInPlaceProxy(t, app, []time.Duration{time.Millisecond}, time.Minute)
	run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
	if !slices.Equal(app.attempts, []int{1, 2, 3, 4}) {
		t.Errorf("attempts %v, want 1..4", app.attempts)
	}
	if !slices.Equal(pub.to, []string{"orders.dlq"}) {
		t.Fatalf("published to %v, want the DLQ once", pub.to)
	}
	if n, _ := pub.got[0].Int(msg.HeaderFinalRetryCount); n != 4 {
		t.Errorf("x-final-retry-count %d, want 4", n)
	}
	if got := j.all(); !slices.Equal(got, []string{"publish orders.dlq", "ack"}) {
		t.Errorf("settles %v", got)
	}
}

// TestInPlaceHoldBounded: a retry whose hold would keep the delivery past
// MoveHoldMax goes through the tier queue instead.
func TestInPlaceHoldBounded(t *testing.T) {
	app := &scriptedApp{outs: []retry.Outcome{{Status: 500}}}
	p, pub, j := newInPlaceProxy(t, app, []time.Duration{time.Millisecond, time.Hour}, 30*time.Minute)
	run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
	// Attempt 1 fails: held 1ms. Attempt 2 fails: the 1h tier exceeds the
	// hold budget, so it is published to that tier.
	if !slices.Equal(app.attempts, []int{1, 2}) {
		t.Errorf("attempts %v, want [1 2]", app.attempts)
	}
	if !slices.Equal(pub.to, []string{"orders.retry.1h"}) {
		t.Fatalf("published to %v, want the 1h tier", pub.to)
	}
	if n, _ := pub.got[0].Int(msg.HeaderRetryCount); n != 2 {
		t.Errorf("tier copy x-retry-count %d, want 2", n)
	}
}

// TestInPlaceHoldCutByShutdown: shutdown during a hold gives the delivery
// back (requeued at the head on a classic queue) instead of waiting.
func TestInPlaceHoldCutByShutdown(t *testing.T) {
	var p *Loop
	app := &scriptedApp{outs: []retry.Outcome{{Status: 500}}}
	app.onCall = func(int) { p.Shutdown(context.Background()) }
	p, pub, j := newInPlaceProxy(t, app, []time.Duration{time.Hour}, 2*time.Hour)
	run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
	if len(app.attempts) != 1 || len(pub.to) != 0 {
		t.Errorf("attempts %v, published %v: want one attempt, nothing moved", app.attempts, pub.to)
	}
	if got := j.all(); !slices.Equal(got, []string{"nack-requeue"}) {
		t.Errorf("settles %v, want the delivery given back", got)
	}
	if p.Stats.Returned.Load() != 1 {
		t.Errorf("returned %d, want 1", p.Stats.Returned.Load())
	}
}

// handle runs d as a worker would, received now.
func (p *Loop) handle(ctx context.Context, d Delivery, keyed bool) {
	p.handleSince(ctx, d, keyed, p.o.Now())
}

// TestMessageWithoutHeaders: the consumer hands over a message that came
// without headers with nil headers. Every outcome must still settle it,
// and every copy must carry the headers the outcome writes; a failure
// kept in place writes into the message itself.
func TestMessageWithoutHeaders(t *testing.T) {
	bare := func() *msg.Message { return &msg.Message{MessageID: "m", RoutingKey: "orders", Body: []byte("b")} }
	for _, c := range []struct {
		name   string
		status int
		want   []string
	}{
		{"ack", 200, []string{"ack"}},
		{"retry", 503, []string{"publish orders.retry.1s", "ack"}},
		{"dlq", 400, []string{"publish orders.dlq", "ack"}},
		{"requeue", 425, []string{"publish orders", "ack"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: c.status}, nil)
			run(p, &fakeDelivery{m: bare(), j: j, alive: true})
			if got := j.all(); !slices.Equal(got, c.want) {
				t.Fatalf("journal %v, want %v", got, c.want)
			}
			if c.status == 503 && msg.Counter(pub.got[0].Headers[msg.HeaderRetryCount]) != 1 {
				t.Fatalf("retry copy headers %v: no retry count", pub.got[0].Headers)
			}
		})
	}
	t.Run("in place", func(t *testing.T) {
		app := &scriptedApp{outs: []retry.Outcome{{Status: 500}, {Status: 200}}}
		p, _, j := newInPlaceProxy(t, app, []time.Duration{time.Millisecond}, time.Minute)
		m := bare()
		run(p, &fakeDelivery{m: m, j: j, alive: true})
		if !slices.Equal(app.attempts, []int{1, 2}) || !slices.Equal(j.all(), []string{"ack"}) {
			t.Fatalf("attempts %v, journal %v; want [1 2] and one ack", app.attempts, j.all())
		}
		if m.Headers == nil {
			t.Fatal("the failure kept in place was not written into the message")
		}
	})
}

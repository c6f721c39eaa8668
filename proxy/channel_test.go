package proxy

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/topology"
)

// fakeChannel is the consumer channel deliveries came on; the test closes
// it, as the broker or a lost connection would.
type fakeChannel struct{ closed atomic.Bool }

// chanDelivery is a delivery of a fakeChannel: once the channel is closed
// Alive says so, and an Ack or Nack fails (journalled as such), as on a
// real channel, whose deliveries the broker has put back already.
type chanDelivery struct {
	m  *msg.Message
	j  *journal
	ch *fakeChannel
}

func (d *chanDelivery) Message() *msg.Message { return d.m }
func (d *chanDelivery) Alive() bool           { return !d.ch.closed.Load() }

func (d *chanDelivery) Ack() error {
	if d.ch.closed.Load() {
		d.j.add("ack on a closed channel " + d.m.MessageID)
		return errTestChannelClosed
	}
	d.j.add("ack " + d.m.MessageID)
	return nil
}

func (d *chanDelivery) Nack(bool) error {
	if d.ch.closed.Load() {
		d.j.add("nack on a closed channel " + d.m.MessageID)
		return errTestChannelClosed
	}
	d.j.add("nack-requeue " + d.m.MessageID)
	return nil
}

var errTestChannelClosed = errorString("channel closed")

type errorString string

func (e errorString) Error() string { return string(e) }

// channelApp answers batch requests through answer and records their ids.
// Its answer may close the channel, as a broker would while the request is
// at the app.
type channelApp struct {
	mu       sync.Mutex
	requests [][]string
	answer   func(n int, ids []string) batch.Answer
}

func (a *channelApp) Deliver(context.Context, *msg.Message, msg.Info) retry.Outcome {
	panic("a batching loop sent a single request")
}

func (a *channelApp) DeliverBatch(_ context.Context, r *batch.Request) batch.Answer {
	var ids []string
	for _, m := range r.Messages {
		ids = append(ids, m.MessageID)
	}
	a.mu.Lock()
	a.requests = append(a.requests, ids)
	n := len(a.requests)
	a.mu.Unlock()
	return a.answer(n, ids)
}

func (a *channelApp) seen() [][]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.requests)
}

// newChannelLoop is a batching loop of batches up to size in front of app,
// ordered (held in place) or not, with tiers as given.
func newChannelLoop(t *testing.T, app Deliverer, size int, ordered, quorum bool, tiers ...time.Duration) (*Loop, *fakePub) {
	t.Helper()
	cfg := config.Default()
	cfg.Queue.Name = "orders"
	cfg.Retry.MaxAttempts = 4
	cfg.Retry.Tiers = nil
	for _, d := range tiers {
		cfg.Retry.Tiers = append(cfg.Retry.Tiers, config.Duration(d))
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := topology.FromConfig(&cfg)
	pub := &fakePub{j: &journal{}}
	p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: app, Pub: pub, Workers: 1, Queue: 64,
		Batch: batch.Limits{MaxMessages: size, MaxBytes: 1 << 20}, BatchWait: time.Hour, MoveHoldMax: 24 * time.Hour,
		InPlace: ordered, Quorum: quorum, UnavailableBackoff: 20 * time.Millisecond,
		MoveRetryMin: time.Millisecond, MoveRetryMax: time.Millisecond})
	return p, pub
}

// onChannel makes n deliveries m0… of one channel, journalled in j.
func onChannel(ch *fakeChannel, j *journal, n int) []Delivery {
	ds := make([]Delivery, n)
	for i := range ds {
		ds[i] = &chanDelivery{m: &msg.Message{MessageID: "m" + string(rune('0'+i)), Headers: map[string]any{}, Body: []byte("b")}, j: j, ch: ch}
	}
	return ds
}

// handleBatchAsync delivers ds as one batch, in a worker of its own, and
// returns a channel closed when the worker has returned and what it left
// running beside it has ended.
func handleBatchAsync(p *Loop, ds []Delivery) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		deliverBatch(p, ds)
		p.wg.Wait() // the moves and requests the batch left running beside it
	}()
	return done
}

// deliverBatch delivers ds as one batch, as a worker of the collector does.
func deliverBatch(p *Loop, ds []Delivery) {
	(&batcher{p: p}).deliver(context.Background(), ds, p.o.Now())
}

func waitReturned(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	waitfor.Until(t, 10*time.Second, what, func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
}

// An ordered batch whose head is held in place stops as soon as its channel
// is gone: the broker has put its messages back and redelivers them, so
// another request would reach the app with messages Hopper can no longer
// settle, and the worker would be kept from the redelivered copies behind
// it. Here the channel closes while the first request is at the app, which
// fails m0: no second request, nothing published, nothing settled.
func TestOrderedBatchStopsWhenChannelCloses(t *testing.T) {
	ch := &fakeChannel{}
	app := &channelApp{answer: func(_ int, ids []string) batch.Answer {
		ch.closed.Store(true)
		a := each(ids, retry.Outcome{Kind: retry.Response, Status: 200})
		a.Entries[0] = retry.Outcome{Kind: retry.Response, Status: 503}
		return a
	}}
	p, pub := newChannelLoop(t, app, 2, true, false, time.Millisecond)
	done := handleBatchAsync(p, onChannel(ch, pub.j, 2))
	waitReturned(t, done, "the ordered batch given up")
	if got := app.seen(); len(got) != 1 {
		t.Errorf("requests %v: want the one made before the channel closed", got)
	}
	if got := pub.j.all(); len(got) != 0 {
		t.Errorf("journal %v: want nothing published or settled", got)
	}
}

// An ordered batch's head held for a long retry delay is let go when its
// channel closes during the hold, not when the delay is over.
func TestOrderedBatchHoldEndsWhenChannelCloses(t *testing.T) {
	ch := &fakeChannel{}
	answered := make(chan struct{})
	app := &channelApp{answer: func(_ int, ids []string) batch.Answer {
		defer close(answered)
		a := each(ids, retry.Outcome{Kind: retry.Response, Status: 200})
		a.Entries[0] = retry.Outcome{Kind: retry.Response, Status: 503}
		return a
	}}
	p, pub := newChannelLoop(t, app, 2, true, false, time.Hour)
	done := handleBatchAsync(p, onChannel(ch, pub.j, 2))
	<-answered
	ch.closed.Store(true)
	waitReturned(t, done, "the hold of an hour cut short by the closed channel")
	if got := app.seen(); len(got) != 1 {
		t.Errorf("requests %v, want one", got)
	}
	if got := pub.j.all(); len(got) != 0 {
		t.Errorf("journal %v: want nothing published or settled", got)
	}
}

// A half of a split batch that the breaker refuses waits for the app, but
// not for a channel that is gone: once it closes, no further request is
// made.
func TestSplitBatchWaitEndsWhenChannelCloses(t *testing.T) {
	ch := &fakeChannel{}
	app := &channelApp{answer: func(n int, ids []string) batch.Answer {
		if n == 1 {
			return each(ids, retry.Outcome{Kind: retry.Cut, Error: "connection reset"})
		}
		if n == 3 {
			ch.closed.Store(true)
		}
		return each(ids, retry.Outcome{Kind: retry.Unavailable, Refused: true, Error: "circuit breaker open"})
	}}
	p, pub := newChannelLoop(t, app, 4, false, false, time.Millisecond)
	done := handleBatchAsync(p, onChannel(ch, pub.j, 4))
	waitReturned(t, done, "the split given up")
	want := [][]string{{"m0", "m1", "m2", "m3"}, {"m0", "m1"}, {"m0", "m1"}}
	if got := app.seen(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("requests %v, want %v", got, want)
	}
	if got := pub.j.all(); len(got) != 0 {
		t.Errorf("journal %v: want nothing published or settled", got)
	}
}

// A batch the app could not take goes back after the unavailable backoff;
// when the channel closed meanwhile, the broker has the messages back
// already, and on a quorum queue a republished copy would be a duplicate.
func TestBatchReturnAfterChannelClosedPublishesNothing(t *testing.T) {
	ch := &fakeChannel{}
	app := &channelApp{answer: func(_ int, ids []string) batch.Answer {
		ch.closed.Store(true)
		return each(ids, retry.Outcome{Kind: retry.Unavailable, Error: "connection refused"})
	}}
	p, pub := newChannelLoop(t, app, 2, false, true, time.Millisecond)
	done := handleBatchAsync(p, onChannel(ch, pub.j, 2))
	waitReturned(t, done, "the batch let go")
	if got := pub.j.all(); len(got) != 0 {
		t.Errorf("journal %v: want nothing published or settled", got)
	}
}

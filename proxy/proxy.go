// Package proxy runs Hopper's main loop: consume → deliver → decide →
// settle.
//
// The loop hands each delivery to one dispatcher, chosen when it is made:
// a pool of workers that deliver each message on its own (pool.go), the
// same workers taking a key's messages one at a time (lanes.go), or a
// collector that forms batches for its workers (collect.go, batch.go).
// Whatever the grouping, each delivery lives the same life in the settle
// core: open the attempt → judge (core.go) → finish: settle, move or
// give back (settle.go). The delivery is wrapped once, to be settled once,
// and the waits it is held through sit with it (delivery.go).
//
// With a schedule (Options.Schedule), a delivery that is not due is
// parked as it is received, before any dispatcher sees it (schedule.go):
// moved to a parking queue (publish → confirm → ack) without a request
// or an attempt, it comes back to the work queue later and is judged
// again; one that is due goes on as any other.
//
// A delivery's state machine:
//
//	queued ─(worker free)→ delivering ─(app answers)→ decided ─→ settled
//	   │                       │                          │
//	   └─ shutdown: given      └─ shutdown after grace:   ├─ ack / drop: ack
//	      back (never the        call cut off, given      ├─ return: given back
//	      DLQ)                   back                     └─ requeue / retry / dlq:
//	                                                          publish copy → confirm → ack;
//	                                                          a failed publish is retried
//	                                                          with backoff while the
//	                                                          delivery is held
//
// With routing rules (Options.Routes) a delivery is judged when its turn
// comes, before the app is called: the route picks the app path and may
// bring its own retry policy, and a message the filter leaves out goes
// straight to settled (ack, or publish to the DLQ → confirm → ack) without
// reaching the app.
//
// "Given back" is a nack with requeue on a classic queue. On a quorum queue
// it is a republish of the message as it came (same counters, origin and
// deadline) → confirm → ack, because a quorum queue counts every nack
// against its delivery limit and drops or dead-letters the message past it:
// a message the app never saw must not spend that budget.
//
// Once the app has answered, the decision is kept: a move whose publish
// fails is retried, never decided again, so the app is not called a second
// time for a message whose fate is settled. While any move keeps failing the
// proxy reports it (OnMovesFailing) so consumption can pause; the delivery is
// let go (given back) only at shutdown, when its channel dies, or after
// MoveHoldMax, which stays under the broker's consumer timeout.
//
// The original is acked only after its copy is confirmed, so a message is
// always in at least one queue. Duplicates are possible, loss is not.
package proxy

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/order"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/route"
	"github.com/hopper-sidecar/hopper/schedule"
	"github.com/hopper-sidecar/hopper/topology"
)

// Delivery is a message received from the work queue that must be settled
// exactly once, on the channel it came from.
type Delivery interface {
	Message() *msg.Message
	Ack() error
	Nack(requeue bool) error
}

// Publisher publishes a copy of a message to a queue and returns nil only
// once the broker has confirmed it.
type Publisher interface {
	Publish(ctx context.Context, queue string, m *msg.Message) error
}

// Deliverer sends a message to the app and classifies what happened.
type Deliverer interface {
	Deliver(ctx context.Context, m *msg.Message, in msg.Info) retry.Outcome
	// DeliverBatch sends several messages in one request and reads the
	// app's answer into an outcome per message.
	DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer
}

// Refusals hears the decisions that say whether the app takes Hopper's
// requests at all: a pause (the app refused Hopper itself, its
// credentials) and the decision on each probe request. The decision is the
// loop's, under each message's own policy, so only the loop can tell.
type Refusals interface {
	Judged(out retry.Outcome, pause bool)
}

// Options configure a Loop. Zero values take the defaults named.
type Options struct {
	// Plan names the work, tier and dead-letter queues. Required.
	Plan *topology.Plan
	// Selector picks the retry policy of each message. Required.
	Selector *retry.Selector
	// Routes decides, once per delivery, the route a message takes (its
	// app path, and its retry policy when the route has one) and whether
	// the filter lets it through; a filtered message is settled in its
	// turn without reaching the app. Not with batching. Default nil: every
	// message is delivered on the queue's path.
	Routes *route.Table
	// App delivers a message to the app. Required.
	App Deliverer
	// Pub publishes the copies moves make. Required.
	Pub Publisher
	// Workers is the number of concurrent deliveries. Default 1.
	Workers int
	// WorkerCap, when set, bounds the workers started to what it returns
	// at the time, at most Workers: the concurrency limit in front of the
	// app. A delivery that would only wait for a slot at the app then
	// waits in the hand-off buffer, not as a worker of its own parked on
	// the limit with a stack grown by the deliveries before. Workers that
	// run stay when the cap falls. Only for workers that hold nothing away
	// from the app (no in-place holds, keys or batches). Default nil: Workers.
	WorkerCap func() int
	// Queue is the hand-off buffer between the consumer and the workers; at
	// least the prefetch, so the consumer never blocks. Default Workers.
	Queue int
	// Quorum makes give-backs republish instead of nack: a quorum queue
	// counts every nack against its delivery limit. Default false.
	Quorum bool
	// UnavailableBackoff is waited before returning a message the app could
	// not take, so an app that is down is not spun on. Default 0.
	UnavailableBackoff time.Duration
	// MoveRetryMin and MoveRetryMax bound the jittered exponential backoff
	// between attempts of a move whose publish failed. Defaults 1s and 30s.
	MoveRetryMin, MoveRetryMax time.Duration
	// MoveHoldMax is how long a delivery whose move keeps failing is held
	// before it is given back. Counted from receipt, it also bounds the
	// holds of an ordered delivery (InPlace, a key, an ordered batch) and
	// a delivery's wait behind its key. It must stay under the broker's
	// consumer_timeout (30 min by default), past which the broker takes
	// back everything the channel holds. Default 10m.
	MoveHoldMax time.Duration
	// OnMovesFailing is told true when a first delivery starts waiting on a
	// failing move and false when none is left waiting, so the caller can
	// pause consumption meanwhile. Optional.
	OnMovesFailing func(failing bool)
	// InPlace makes a retry hold the delivery and call the app again after
	// the tier's delay, instead of moving the message to the tier queue, so
	// that no later message overtakes it (ordered consumption, one worker).
	// The hold is bounded by MoveHoldMax; past it the retry goes through the
	// tier queue. Default false.
	InPlace bool
	// Batch turns batch delivery on when Batch.MaxMessages is above 1:
	// Workers then count batch requests. Default off.
	Batch batch.Limits
	// PausedKeepsConsuming says the consumer is not cancelled while
	// paused (a single active consumer keeping its role), so a message the
	// breaker refuses comes straight back: its return waits
	// UnavailableBackoff too, rather than spin. Default false.
	PausedKeepsConsuming bool
	// OrderingKey, when set, delivers the messages with the same key one
	// at a time, in the order they came, each retried in place as InPlace
	// does, while messages of other keys (and those without a key) are
	// delivered in parallel. Default none.
	OrderingKey order.Source
	// BatchWait is how long the oldest delivery of a batch waits for it
	// to fill. Default 0: a batch goes with what is at hand as soon as a
	// worker is free.
	BatchWait time.Duration
	// Schedule, when set, parks each message that is not due yet (x-delay,
	// Hopper-Not-Before) in the plan's parking queues as it is received,
	// before any dispatcher sees it, and delivers it when it comes back
	// due. Default nil: such messages are delivered at once.
	Schedule *schedule.Policy
	// DeadlineHeader names an application header with an absolute
	// deadline. Default "" (none).
	DeadlineHeader string
	// Refusals is told of every decision to pause and of the decision on
	// every probe (retry.Outcome.Probe), before the delivery is settled,
	// so that consuming pauses before the message goes back. Default nil.
	Refusals Refusals
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Tracer makes the consumer and producer spans. Default noop.
	Tracer trace.Tracer
	// Observer records decisions (metrics). Default: records nothing.
	Observer Observer
	// Now and Rand are the clock and the jitter source, injected by tests.
	// Defaults time.Now and math/rand.
	Now  func() time.Time
	Rand retry.Rand
}

// Stats are cumulative counts, safe to read at any time. The outcome counts
// (Acked … Returned) are recorded once per delivery, after the settle, at
// the same point the Observer is told, so the two never disagree.
type Stats struct {
	Received, Acked, Dropped, Requeued, Retried, DeadLettered, Returned atomic.Int64
	// ReceivedBytes is the body bytes of the Received deliveries.
	ReceivedBytes                                          atomic.Int64
	MoveFailed, SettleFailed, ReturnedOnShutdown, InFlight atomic.Int64
	// MovesFailing is the number of deliveries held now because their move
	// keeps failing.
	MovesFailing atomic.Int64
	// InternalErrors counts panics recovered while handling a delivery.
	InternalErrors atomic.Int64
	// Batches and BatchedMessages count batch requests and the messages
	// they carried.
	Batches, BatchedMessages atomic.Int64
	// OrderBroken counts ordered messages that had to leave their place
	// in line.
	OrderBroken atomic.Int64
	// Parked counts messages moved to a parking queue because they were
	// not due.
	Parked atomic.Int64
}

// Loop is the delivery loop: it takes deliveries from the consumer, sends
// each to the app, decides and settles.
type Loop struct {
	o   Options
	log *slog.Logger
	tr  trace.Tracer
	// tracing is false when tr records nothing.
	tracing bool
	obs     Observer
	wg      sync.WaitGroup
	Stats   Stats

	// stopping is closed when shutdown starts: holds end early and queued
	// deliveries are returned instead of delivered.
	stopping chan struct{}
	// waiting counts the workers in a wait (see wait): the worker cap
	// leaves them out.
	waiting  atomic.Int64
	stopOnce sync.Once

	// ctx is Start's: it bounds the parking moves, as the dispatcher's
	// workers.
	ctx context.Context
	// due are the due times of the messages parked, for NextDue.
	due dueTimes

	// disp groups the deliveries on their way to the app: each on its
	// own (pool), one at a time per ordering key (lanes), or in batches
	// (collector). It is chosen once, by New.
	disp dispatcher
}

// dispatcher takes the deliveries Handle receives and has each settled by
// the loop's core: one by one (handleSince), or per message of a batch,
// each attempt opened before the request and concluded once the app's
// answer is read (batcher). It owns the workers and whatever waits for
// them.
type dispatcher interface {
	// start launches what runs beside the workers; ctx bounds in-flight
	// work.
	start(ctx context.Context)
	// handle takes a delivery; it blocks only while the queue in front of
	// the workers is full.
	handle(j job)
	// stop closes that queue at shutdown: what is queued is given back.
	stop()
}

// job is a delivery as Handle received it, with its ordering key ("" for
// none) and when it was received: a delivery that waited behind its key
// or for its batch to form has been unacked since then, and its holds are
// bounded from there.
type job struct {
	d     Delivery
	key   string
	since time.Time
}

// New returns a loop; Start launches its workers.
func New(o Options) *Loop {
	if o.Workers < 1 {
		o.Workers = 1
	}
	if o.Queue < o.Workers {
		o.Queue = o.Workers
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	if o.MoveRetryMin <= 0 {
		o.MoveRetryMin = time.Second
	}
	if o.MoveRetryMax < o.MoveRetryMin {
		o.MoveRetryMax = max(30*time.Second, o.MoveRetryMin)
	}
	if o.MoveHoldMax <= 0 {
		o.MoveHoldMax = 10 * time.Minute
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	// Every line names the queue: a sidecar may run a loop per queue.
	log = log.With("queue", o.Plan.Work.Name)
	p := &Loop{o: o, log: log, stopping: make(chan struct{}), tr: o.Tracer, obs: o.Observer}
	if p.tr == nil {
		p.tr = noop.NewTracerProvider().Tracer("hopper")
	}
	_, off := p.tr.(noop.Tracer)
	p.tracing = !off
	if p.obs == nil {
		p.obs = nopObserver{}
	}
	// Batches and ordering keys do not combine (a batch would hold several
	// messages of one key at once): the config refuses both at once.
	switch {
	case o.Batch.MaxMessages > 1:
		p.disp = newCollector(p)
	case o.OrderingKey.Set():
		p.disp = newLanes(p)
	default:
		pl := newPool(p, func(ctx context.Context, j job) { p.handleSince(ctx, j.d, false, j.since) })
		if o.WorkerCap != nil {
			// A worker that waits (a 425's hold, a backoff) has no request
			// at the app: it does not count against the cap, or a run of
			// 425s would leave an idle app and deliveries queued.
			pl.crew.cap = func() int { return o.WorkerCap() + int(p.waiting.Load()) }
		}
		p.disp = pl
	}
	return p
}

// Start readies the loop; Handle starts workers as deliveries need them.
// ctx bounds in-flight work: cancelling it is the end of the shutdown grace
// period.
func (p *Loop) Start(ctx context.Context) {
	p.ctx = ctx
	p.disp.start(ctx)
}

// Handle hands a delivery to the workers. It is called by the consumer.
func (p *Loop) Handle(d Delivery) {
	p.Stats.Received.Add(1)
	p.Stats.ReceivedBytes.Add(int64(len(d.Message().Body)))
	j := job{d: d, since: p.o.Now()}
	if p.o.Schedule != nil && p.early(j) {
		return
	}
	p.disp.handle(j)
}

// Keys reports, with an ordering key, how many keys have a delivery at
// the app (or held in place) and how many deliveries wait behind them.
func (p *Loop) Keys() (busy, waiting int) {
	if l, ok := p.disp.(interface{ keys() (int, int) }); ok {
		return l.keys()
	}
	return 0, 0
}

// Shutdown stops taking work and waits for the workers: in-flight
// deliveries finish, queued ones are returned to the queue. It returns
// false if ctx ended first (the caller then closes the broker channel and
// the broker requeues what is left).
func (p *Loop) Shutdown(ctx context.Context) bool {
	p.stopOnce.Do(func() {
		close(p.stopping)
		p.disp.stop()
	})
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

func (p *Loop) stopped() bool {
	select {
	case <-p.stopping:
		return true
	default:
		return false
	}
}

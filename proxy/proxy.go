// Package proxy runs Hopper's main loop: consume → deliver → decide →
// settle, on a pool of workers.
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
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/internal/backoff"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/order"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/route"
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
}

// Loop is the delivery loop: a pool of workers that take deliveries from
// the consumer, send each to the app, decide and settle.
type Loop struct {
	o   Options
	log *slog.Logger
	tr  trace.Tracer
	// tracing is false when tr records nothing.
	tracing bool
	obs     Observer
	work    chan job
	wg      sync.WaitGroup
	Stats   Stats

	// stopping is closed when shutdown starts: holds end early and queued
	// deliveries are returned instead of delivered.
	stopping chan struct{}
	stopOnce sync.Once

	// Workers start as deliveries need them, up to Workers, and then stay:
	// a ceiling of hundreds for a slow app costs an app that never needs
	// them nothing. A delivery goes to a worker waiting on hand, else to a
	// new worker, else into work for the next worker that is free. ctx is
	// Start's, for the workers.
	hand    chan job
	ctx     context.Context
	running atomic.Int64

	// With batching, Handle queues deliveries on pending, collect forms
	// them into batches and hands each on batches to a batch worker.
	pending chan job
	batches chan formed
	// sending counts batches handed to the workers and not yet done; idle
	// tells the collector it fell to 0.
	sending atomic.Int64
	idle    chan struct{}

	// With an ordering key, lanes holds the deliveries waiting behind the
	// one of their key being delivered; the worker that finishes a
	// delivery goes on with the next of its key.
	lanesMu sync.Mutex
	lanes   *order.Lanes[job]
	// laneWake wakes boundLanes when a delivery starts to wait behind its
	// key while no wake-up is set for the first to reach its bound
	// (laneTimed false; under lanesMu).
	laneWake  chan struct{}
	laneTimed bool
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
	p := &Loop{o: o, log: log, work: make(chan job, o.Queue), hand: make(chan job), stopping: make(chan struct{}), tr: o.Tracer, obs: o.Observer}
	if p.tr == nil {
		p.tr = noop.NewTracerProvider().Tracer("hopper")
	}
	_, off := p.tr.(noop.Tracer)
	p.tracing = !off
	if p.obs == nil {
		p.obs = nopObserver{}
	}
	if o.OrderingKey.Set() {
		p.lanes = order.NewLanes[job]()
		p.laneWake = make(chan struct{}, 1)
	}
	if p.batching() {
		p.pending = make(chan job, o.Queue)
		p.batches = make(chan formed)
		p.idle = make(chan struct{}, 1)
	}
	return p
}

// Start readies the loop; Handle starts workers as deliveries need them.
// ctx bounds in-flight work: cancelling it is the end of the shutdown grace
// period.
func (p *Loop) Start(ctx context.Context) {
	p.ctx = ctx
	if p.batching() {
		p.wg.Add(1)
		go p.collect(ctx)
	}
	if p.lanes != nil {
		p.wg.Add(1)
		go p.boundLanes(ctx)
	}
}

// claimWorker counts a new worker in unless Workers (or WorkerCap's
// bound) already run.
func (p *Loop) claimWorker() bool {
	limit := int64(p.o.Workers)
	if p.o.WorkerCap != nil {
		limit = min(limit, int64(max(1, p.o.WorkerCap())))
	}
	for {
		n := p.running.Load()
		if n >= limit {
			return false
		}
		if p.running.CompareAndSwap(n, n+1) {
			p.wg.Add(1)
			return true
		}
	}
}

// spawn starts a worker with j unless Workers already run.
func (p *Loop) spawn(j job) bool {
	if !p.claimWorker() {
		return false
	}
	go func() {
		defer p.wg.Done()
		for {
			p.run(p.ctx, j)
			select {
			case j = <-p.hand:
			case next, ok := <-p.work:
				if !ok {
					return
				}
				j = next
			}
		}
	}()
	return true
}

// run handles a job and, when it has a key, the deliveries that waited
// behind it for that key, one after the other, until none is left.
func (p *Loop) run(ctx context.Context, j job) {
	for {
		p.handleSince(ctx, j.d, j.key != "", j.since)
		if j.key == "" {
			return
		}
		p.lanesMu.Lock()
		next, ok := p.lanes.Done(j.key)
		p.lanesMu.Unlock()
		if !ok {
			return
		}
		j = next
	}
}

// Keys reports, with an ordering key, how many keys have a delivery at
// the app (or held in place) and how many deliveries wait behind them.
func (p *Loop) Keys() (busy, waiting int) {
	if p.lanes == nil {
		return 0, 0
	}
	p.lanesMu.Lock()
	defer p.lanesMu.Unlock()
	return p.lanes.Busy(), p.lanes.Waiting()
}

// boundLanes bounds the wait of a delivery behind its key. The broker
// counts a delivery unacked from its receipt, whatever Hopper does with
// it, and past its consumer_timeout (30 min by default) it gives back
// everything the channel holds: RabbitMQ 4.x cancels the consumer, 3.x
// closes the channel, and on a quorum queue each message so returned
// spends one of its deliveries. A hot key whose messages the app is slow
// to answer would keep the ones at the back of its line waiting that
// long, so a delivery that has waited behind its key until MoveHoldMax
// from its receipt (the bound of an in-place hold, kept under the
// consumer timeout) is given back, with every delivery behind it, which
// would otherwise overtake it (waitedTooLong). It runs until shutdown,
// waking when the first waiting delivery reaches its bound.
func (p *Loop) boundLanes(ctx context.Context) {
	defer p.wg.Done()
	timer := time.NewTimer(p.o.MoveHoldMax)
	defer timer.Stop()
	for {
		now := p.o.Now()
		cutoff := now.Add(-p.o.MoveHoldMax)
		var due []string
		var next time.Time // receipt of the first delivery waiting, of those not due
		p.lanesMu.Lock()
		p.lanes.Firsts(func(k string, first job) {
			switch {
			case !first.since.After(cutoff):
				due = append(due, k)
			case next.IsZero() || first.since.Before(next):
				next = first.since
			}
		})
		over := make([][]job, 0, len(due))
		for _, k := range due {
			over = append(over, p.lanes.Cut(k))
		}
		p.laneTimed = !next.IsZero()
		p.lanesMu.Unlock()
		for _, js := range over {
			p.waitedTooLong(ctx, js, now)
		}
		var wake <-chan time.Time
		if !next.IsZero() {
			timer.Reset(next.Add(p.o.MoveHoldMax).Sub(now))
			wake = timer.C
		}
		select {
		case <-p.stopping:
			// What still waits goes back through the workers, as at
			// every shutdown.
			return
		case <-wake:
		case <-p.laneWake:
		}
	}
}

// waitedTooLong gives back the deliveries that waited behind one key, in
// line order, none of them seen by the app, the way the loop gives back:
// a nack on a classic queue, which puts each back in its place, ahead of
// the messages published after it, so they come again in their order; a
// republish on a quorum queue (a nack would spend a delivery), which puts
// them at the tail, behind messages of their key published meanwhile, and
// is reported as leaving their place. No attempt is spent.
func (p *Loop) waitedTooLong(ctx context.Context, js []job, now time.Time) {
	p.log.Warn("messages waited behind their ordering key until broker.moveHoldMax from their receipt; given back to the work queue",
		"event", "ORDERED_WAIT_EXHAUSTED", "message_id", js[0].d.Message().MessageID, "messages", len(js),
		"waited_ms", now.Sub(js[0].since).Milliseconds())
	for _, j := range js {
		if !alive(j.d) {
			p.Stats.SettleFailed.Add(1) // the broker has it back already
			continue
		}
		m := j.d.Message()
		in := p.safeHistory(m)
		p.giveBack(ctx, &settleOnce{Delivery: j.d, ordered: true}, m, in)
		p.record(retry.Outcome{}, false, retry.Decision{Action: retry.Return, Retries: in.Retries, Requeues: in.Requeues}, 0)
	}
}

// Handle hands a delivery to the workers. It is called by the consumer.
func (p *Loop) Handle(d Delivery) {
	p.Stats.Received.Add(1)
	p.Stats.ReceivedBytes.Add(int64(len(d.Message().Body)))
	j := job{d: d, since: p.o.Now()}
	if p.pending != nil {
		p.pending <- j
		return
	}
	if p.lanes != nil {
		if k, ok := p.o.OrderingKey.Key(d.Message()); ok {
			j.key = k
			p.lanesMu.Lock()
			free := p.lanes.Add(k, j)
			wake := !free && !p.laneTimed
			p.laneTimed = p.laneTimed || wake
			p.lanesMu.Unlock()
			if wake {
				select {
				case p.laneWake <- struct{}{}:
				default: // woken already
				}
			}
			if !free {
				return // it waits behind its key
			}
		}
	}
	select {
	case p.hand <- j: // a worker was waiting for one
		return
	default:
	}
	if !p.spawn(j) {
		p.work <- j // every worker busy: the next one free takes it
	}
}

// Shutdown stops taking work and waits for the workers: in-flight
// deliveries finish, queued ones are returned to the queue. It returns
// false if ctx ended first (the caller then closes the broker channel and
// the broker requeues what is left).
func (p *Loop) Shutdown(ctx context.Context) bool {
	p.stopOnce.Do(func() {
		close(p.stopping)
		close(p.work)
		if p.pending != nil {
			close(p.pending)
		}
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

// handleSince runs one delivery through deliver → decide → settle; an ordered
// one (InPlace, or a message with an ordering key) repeats the delivery in
// place while it is held. A panic on the way is recovered here, so one
// message can never take the process (and with it every other message)
// down. The delivery was received at since: it is unacked from then on
// (also while it waited behind its key), and its holds are bounded from
// there.
func (p *Loop) handleSince(ctx context.Context, d Delivery, keyed bool, since time.Time) {
	ordered := p.o.InPlace || keyed
	sd := &settleOnce{Delivery: d, ordered: ordered}
	defer p.recoverDelivery(ctx, sd)
	var rt routing
	for p.attempt(ctx, sd, since, ordered, &rt) {
	}
}

// settleOnce remembers whether a delivery was acked or nacked, so that a
// panic after its settle does not settle it a second time. A batch also
// counts as settled a delivery whose channel closed (lost): the broker has
// it back.
type settleOnce struct {
	Delivery
	settled atomic.Bool
	// ordered deliveries must keep their place in line; leaving it is
	// reported.
	ordered bool
	// moving, when not nil, is closed once the move a batch started for
	// the delivery beside the goroutine handling the batch has ended. Set
	// and first read by that goroutine.
	moving chan struct{}
	// away, when not nil, is closed once the delivery, sent in a request
	// of its own beside the worker of its batch (deliverAlone), is done
	// with. Set by that worker, closed by the goroutine sending it.
	away chan struct{}
}

func (d *settleOnce) Ack() error              { d.settled.Store(true); return d.Delivery.Ack() }
func (d *settleOnce) Nack(requeue bool) error { d.settled.Store(true); return d.Delivery.Nack(requeue) }
func (d *settleOnce) Alive() bool             { return alive(d.Delivery) }
func (d *settleOnce) Ordered() bool           { return d.ordered }

// Unwrap is the delivery as the consumer handed it, for what it tells
// beyond the Delivery interface (its tag, the broker it came from).
func (d *settleOnce) Unwrap() Delivery { return d.Delivery }

// recoverDelivery turns a panic while handling d into a dead-lettering
// with reason hopper-error: retrying would run into the same failure, and
// giving the message back would crash-loop on it. A delivery already
// settled stays as it is. The panic is logged with its stack and counted.
func (p *Loop) recoverDelivery(ctx context.Context, d *settleOnce) {
	if r := recover(); r != nil {
		p.internalError(ctx, d, r)
	}
}

// internalError dead-letters d after the panic r while it was handled,
// unless it was settled already.
func (p *Loop) internalError(ctx context.Context, d *settleOnce, r any) {
	p.Stats.InternalErrors.Add(1)
	p.obs.InternalError()
	m := d.Message()
	why := fmt.Sprintf("internal error: %v", r)
	p.log.Error("internal error while handling a message", "event", "HOPPER_INTERNAL_ERROR",
		"message_id", m.MessageID, "settled", d.settled.Load(), "error", msg.Truncate(why, msg.MaxErrorLen),
		"stack", string(debug.Stack()))
	if d.settled.Load() {
		return
	}
	defer func() {
		// Even the dead-lettering failed: the last safe thing is to let
		// the broker keep the message.
		if r := recover(); r != nil {
			p.log.Error("internal error while dead-lettering after an internal error; message left to the broker",
				"event", "HOPPER_INTERNAL_ERROR", "message_id", m.MessageID, "error", fmt.Sprint(r))
			if !d.settled.Load() {
				p.nack(d)
			}
		}
	}()
	in := p.safeHistory(m)
	dec := retry.Decision{Action: retry.DLQ, Reason: retry.ReasonHopperError, Retries: in.Retries, Requeues: in.Requeues, Crashes: in.Crashes}
	out := retry.Outcome{Error: why}
	if !p.settle(ctx, d, m, in, dec, out) {
		dec = retry.Decision{Action: retry.Return, Retries: in.Retries, Requeues: in.Requeues}
	}
	p.record(out, true, dec, 0)
}

// safeHistory reads m's history, or only its queue when reading it is
// what failed.
func (p *Loop) safeHistory(m *msg.Message) (in msg.Info) {
	defer func() {
		if recover() != nil {
			in = msg.Info{Queue: p.o.Plan.Work.Name, Exchange: m.Exchange, RoutingKey: m.RoutingKey, Attempt: 1}
		}
	}()
	in, _ = p.history(m, p.o.Now())
	return in
}

// attempt is one delivery attempt. It reports true when an in-place retry
// has waited out its delay and the app is to be called again; since is
// when the delivery was received, ordered whether it is held in place, rt
// the delivery's route decision (taken on its first attempt).
func (p *Loop) attempt(ctx context.Context, d Delivery, since time.Time, ordered bool, rt *routing) bool {
	if !p.ready(ctx, d) {
		return false
	}
	p.inFlight(1)
	defer p.inFlight(-1)

	e := p.begin(ctx, d, rt)
	e.ordered = ordered
	defer e.span.End()
	if rt.decided && rt.d.Outcome != route.Deliver {
		// Settled in its turn, like any other message of its key.
		return p.finish(e, p.leftOut(e, rt.d), since, false)
	}
	if e.expired() {
		return p.finish(e, p.expire(e), since, true)
	}
	start := time.Now()
	out := p.o.App.Deliver(e.ctx, e.m, e.in)
	return p.finish(e, p.judge(e, out, time.Since(start)), since, true)
}

// ready says whether a delivery is to be sent: not when its channel died
// while it waited (the broker has requeued it), nor during shutdown, when
// it is given back.
func (p *Loop) ready(ctx context.Context, d Delivery) bool {
	if !alive(d) {
		p.Stats.SettleFailed.Add(1)
		return false
	}
	if p.stopped() {
		p.Stats.ReturnedOnShutdown.Add(1)
		m := d.Message()
		in, _ := p.history(m, p.o.Now())
		p.giveBack(ctx, d, m, in)
		return false
	}
	return true
}

// entry is one attempt of one delivery: what its headers say, the policy
// it falls under, and the attempt's span.
type entry struct {
	d    Delivery
	m    *msg.Message
	in   msg.Info
	st   retry.State
	now  time.Time
	pol  *retry.Policy
	ctx  context.Context
	span trace.Span
	// ordered deliveries are held in place rather than moved behind
	// later messages.
	ordered bool
}

// begin starts an attempt of d: it reads the history, starts the
// attempt's CONSUMER span, parented on the context the message carries
// (the publisher's, or the previous attempt's move), takes the route
// decision (rt; nil in a batch, which routes do not combine with) and
// selects the policy: the route's own when it has one.
func (p *Loop) begin(ctx context.Context, d Delivery, rt *routing) *entry {
	m := d.Message()
	e := &entry{d: d, m: m, now: p.o.Now(), ordered: p.o.InPlace}
	e.in, e.st = p.history(m, e.now)
	if p.tracing {
		e.ctx = propagator.Extract(ctx, headerCarrier(m.Headers))
		e.ctx, e.span = p.tr.Start(e.ctx, "process "+e.in.Queue, trace.WithSpanKind(trace.SpanKindConsumer))
		if e.span.IsRecording() {
			e.span.SetAttributes(deliveryAttrs(d, m, e.in)...)
		}
	} else {
		// What a tracer that records nothing would give, without its
		// allocations: the message's own trace context still reaches
		// the app and the copies from its headers.
		e.ctx, e.span = ctx, noopSpan
	}
	if rt != nil && p.o.Routes != nil {
		p.route(e, rt)
		if r := rt.d.Route; r != nil {
			e.in.Route = r.Name
			if e.span.IsRecording() {
				e.span.SetAttributes(keyRoute.String(r.Name))
			}
			if r.Policy != nil {
				e.pol = r.Policy
				return e
			}
		}
	}
	e.pol = p.o.Selector.Default
	if len(p.o.Selector.Rules) == 0 {
		return e
	}
	e.pol = p.o.Selector.Select(retry.Subject{
		RoutingKey: e.in.RoutingKey,
		Type:       m.Type,
		Header: func(name string) (string, bool) {
			v, ok := m.Headers[name]
			if !ok {
				return "", false
			}
			s, _ := msg.Scalar(v)
			return s, true
		},
	})
	return e
}

// expired says whether the message is past its deadline: it is never
// delivered stale. A deadline of "now" (AMQP expiration 0: deliver at once
// or never) is still delivered on first receipt.
func (e *entry) expired() bool {
	return !e.st.Deadline.IsZero() && e.now.After(e.st.Deadline)
}

// verdict is what became of one attempt: the app's outcome (none when it
// was not called) and the decision taken on it.
type verdict struct {
	out     retry.Outcome
	dec     retry.Decision
	called  bool
	latency time.Duration
}

// expire is the verdict on a message past its deadline, not delivered.
func (p *Loop) expire(e *entry) verdict {
	return verdict{dec: retry.Expired(e.pol, e.st), out: retry.Outcome{Error: "deadline passed before delivery"}}
}

// judge decides on the app's outcome of an attempt.
func (p *Loop) judge(e *entry, out retry.Outcome, latency time.Duration) verdict {
	v := verdict{out: out, latency: latency, called: !out.Refused}
	v.dec = retry.Decide(e.pol, e.st, out, p.o.Now(), p.o.Rand)
	if p.o.Refusals != nil && (v.dec.Pause || out.Probe) {
		p.o.Refusals.Judged(out, v.dec.Pause)
	}
	if p.log.Enabled(e.ctx, slog.LevelDebug) {
		p.log.Debug("delivered", "event", "MESSAGE_DELIVERED", "message_id", e.m.MessageID,
			"attempt", e.in.Attempt, "status", out.Status, "decision", v.dec.Action.String(),
			"latency_ms", latency.Milliseconds(), "trace_id", traceID(e.span))
	}
	return v
}

// finish carries out a verdict: it records it on the span, holds an
// ordered delivery in place, or settles, and counts what happened. It
// reports true when an in-place hold has waited out its delay and the app
// is to be called again. backoff says whether a return of a message the
// app could not take waits the unavailable backoff first (a batch waits it
// once for all its messages).
func (p *Loop) finish(e *entry, v verdict, since time.Time, backoff bool) bool {
	out, dec := v.out, v.dec
	if e.span.IsRecording() {
		e.span.SetAttributes(keyDecision.String(dec.Action.String()), statusAttr(out))
		if dec.Reason != "" {
			e.span.SetAttributes(keyReason.String(dec.Reason))
		}
	}
	if out.Error != "" && dec.Action != retry.Ack {
		e.span.SetStatus(codes.Error, msg.Truncate(out.Error, msg.MaxErrorLen))
		e.span.SetAttributes(semconv.ErrorTypeKey.String(errorType(out)))
	}
	if e.ordered {
		switch p.holdInPlace(e.ctx, e.d, e.m, e.in, dec, out, since) {
		case held:
			p.record(out, v.called, dec, v.latency)
			return true
		case heldThenGivenBack:
			p.record(out, v.called, retry.Decision{Action: retry.Return, Retries: dec.Retries, Requeues: dec.Requeues}, v.latency)
			return false
		}
	}
	if backoff && p.unavailable(dec, out) {
		p.wait(p.o.UnavailableBackoff)
	}
	// Counted once, after the settle, as what actually happened: a decision
	// the proxy had to let go of is counted as a return.
	if !p.settle(e.ctx, e.d, e.m, e.in, dec, out) {
		dec = retry.Decision{Action: retry.Return, Retries: e.in.Retries, Requeues: e.in.Requeues}
	}
	p.record(out, v.called, dec, v.latency)
	return false
}

// unavailable says whether a decision returns a message the app could not
// take, which waits the unavailable backoff so that an app that is down
// is not spun on. A refusal does not wait, since the consumer is paused
// (unless it keeps consuming while paused), nor does a crash (the message
// goes back with its count).
func (p *Loop) unavailable(dec retry.Decision, out retry.Outcome) bool {
	if dec.Action != retry.Return || out.Crashed {
		return false
	}
	return !out.Given() || out.Refused && p.o.PausedKeepsConsuming
}

// holdResult is what holdInPlace did.
type holdResult int

const (
	notHeld           holdResult = iota // the retry goes through the tier queue
	held                                // waited out the delay: deliver again
	heldThenGivenBack                   // shutdown cut the hold short
)

// holdInPlace carries out a decision of an ordered delivery in place, so
// that no later message overtakes it: a retry waits out its tier's delay, a
// 425 its hold, a message the app could not take (down, or the breaker
// refusing) the unavailable backoff, with the delivery held unacked (the
// messages behind it wait), and is then delivered again. What the decision
// counts is written into the delivery's headers first, so the next attempt
// sees it as a moved copy would carry it. It leaves the decision to the
// usual path (notHeld) when the hold would keep the delivery unacked past
// MoveHoldMax, under the broker's consumer_timeout, and always at shutdown.
// A shutdown during the hold gives the delivery back.
func (p *Loop) holdInPlace(ctx context.Context, d Delivery, m *msg.Message, in msg.Info,
	dec retry.Decision, out retry.Outcome, since time.Time) holdResult {
	var wait time.Duration
	switch dec.Action {
	case retry.Retry:
		wait = dec.Tier
	case retry.Requeue:
		wait = max(dec.Hold, dec.Tier)
	case retry.Return:
		if out.CutOff || p.stopped() {
			return notHeld // Hopper is letting go of it
		}
		// Never spin on an app that refuses at once.
		wait = max(p.o.UnavailableBackoff, minUnavailableHold)
	default:
		return notHeld
	}
	now := p.o.Now()
	if now.Add(wait).Sub(since) >= p.o.MoveHoldMax {
		p.log.Warn("ordered message would be held too long in place; it takes the usual way and later messages overtake it",
			"event", "ORDERED_HOLD_EXHAUSTED", "message_id", m.MessageID, "held_ms", now.Sub(since).Milliseconds(),
			"wait", wait.String(), "decision", dec.Action.String())
		if dec.Action != retry.Return {
			// A return keeps its place on a classic queue; on a quorum
			// queue the republish reports it.
			p.orderBroken(OrderHoldExhausted)
		}
		return notHeld
	}
	if m.Headers == nil {
		m.Headers = map[string]any{}
	}
	switch dec.Action {
	case retry.Retry:
		// The failed attempt is written as a retry's copy would carry it,
		// so the next attempt and a later DLQ copy see the same history.
		msg.RecordFailure(m.Headers, dec.Retries, out.Status, now)
	case retry.Requeue:
		m.Headers[msg.HeaderRequeueCount] = int64(dec.Requeues)
	case retry.Return:
		if dec.Crashes > in.Crashes {
			m.Headers[msg.HeaderCrashCount] = int64(dec.Crashes)
		}
	}
	// The next attempt's span follows this one, as it would after a move.
	propagator.Inject(ctx, headerCarrier(m.Headers))
	if !p.waitHeld(wait, func() bool { return alive(d) }) {
		in.Retries, in.Requeues, in.Crashes = dec.Retries, dec.Requeues, dec.Crashes
		p.giveBack(ctx, d, m, in)
		return heldThenGivenBack
	}
	return held
}

// noopSpan is the span of an attempt when tracing is off.
var noopSpan = trace.SpanFromContext(context.Background())

// minUnavailableHold is the least an ordered delivery the app could not
// take waits before it goes again.
const minUnavailableHold = 10 * time.Millisecond

// record counts a settled delivery, once, as what happened: in Stats and
// through the Observer. It is the only place either is told of a decision.
func (p *Loop) record(out retry.Outcome, called bool, dec retry.Decision, latency time.Duration) {
	var c *atomic.Int64
	switch dec.Action {
	case retry.Ack:
		c = &p.Stats.Acked
	case retry.Drop:
		c = &p.Stats.Dropped
	case retry.Requeue:
		c = &p.Stats.Requeued
	case retry.Retry:
		c = &p.Stats.Retried
	case retry.DLQ:
		c = &p.Stats.DeadLettered
	case retry.Return:
		c = &p.Stats.Returned
	}
	if c != nil {
		c.Add(1)
	}
	p.obs.Decided(out, called, dec, latency)
}

func (p *Loop) moveFailed(why string) {
	p.Stats.MoveFailed.Add(1)
	p.obs.MoveFailed(why)
}

func (p *Loop) inFlight(delta int) {
	p.Stats.InFlight.Add(int64(delta))
	p.obs.InFlight(delta)
}

// orderBroken counts an ordered message that left its place in line.
func (p *Loop) orderBroken(reason string) {
	p.Stats.OrderBroken.Add(1)
	p.obs.OrderBroken(reason)
}

// ordered reports whether a delivery must keep its place in line.
func ordered(d Delivery) bool {
	o, ok := d.(interface{ Ordered() bool })
	return ok && o.Ordered()
}

// alive reports whether a delivery can still be settled. Deliveries that
// cannot tell are taken to be alive.
func alive(d Delivery) bool {
	a, ok := d.(interface{ Alive() bool })
	return !ok || a.Alive()
}

// history reads the delivery's history from its headers, and the part of
// it the outcome table decides on.
func (p *Loop) history(m *msg.Message, now time.Time) (msg.Info, retry.State) {
	in := msg.Read(m, p.o.Plan.Work.Name, p.o.DeadlineHeader, now)
	return in, retry.State{Retries: in.Retries, Requeues: in.Requeues, Crashes: in.Crashes, Deadline: in.Deadline, Suspect: in.Suspect}
}

// settle carries out a decision. It is the one place where deliveries are
// acked, nacked or moved. It reports whether the decision was carried out;
// false means the delivery was given back (or its channel was lost) instead.
func (p *Loop) settle(ctx context.Context, d Delivery, m *msg.Message, in msg.Info,
	dec retry.Decision, out retry.Outcome) bool {
	switch dec.Action {
	case retry.Ack, retry.Drop:
		if err := d.Ack(); err != nil {
			p.settleFailed(m, "ack", err)
			return false
		}
		if dec.Action == retry.Drop {
			p.log.Info("message dropped", "event", "MESSAGE_DROPPED", "message_id", m.MessageID, "reason", dec.Reason)
		}
		return true

	case retry.Return:
		if dec.Crashes > in.Crashes {
			// The app died handling it: the new crash count must travel
			// with the message, which a nack cannot do.
			in.Crashes, in.Suspect = dec.Crashes, dec.Suspect
			if p.republish(ctx, d, m, in) {
				p.log.Warn("the app died handling this message; returned with its crash count", "event", "APP_CRASHED",
					"message_id", m.MessageID, "crashes", dec.Crashes, "error", msg.Truncate(out.Error, msg.MaxErrorLen))
			}
			return true
		}
		if dec.Suspect != in.Suspect {
			// The app died with this message and others in flight: it goes
			// back marked, to be delivered on its own, charged nothing.
			in.Suspect = dec.Suspect
			if p.republish(ctx, d, m, in) {
				p.log.Info("the app died with this message among others in flight; returned to be delivered on its own",
					"event", "APP_CRASH_SUSPECT", "message_id", m.MessageID, "error", msg.Truncate(out.Error, msg.MaxErrorLen))
			}
			return true
		}
		p.giveBack(ctx, d, m, in)
		return true

	case retry.Requeue:
		in.Suspect = dec.Suspect
		cp := msg.RequeueCopy(m, in, dec.Requeues)
		if dec.Tier > 0 {
			return p.toTier(ctx, d, m, in, cp, dec.Tier, "requeue")
		}
		if !p.wait(dec.Hold) {
			// Shutting down: back to the queue as it came.
			p.giveBack(ctx, d, m, in)
			return false
		}
		return p.move(ctx, d, m, in, p.o.Plan.Work.Name, cp, "requeue")

	case retry.Retry:
		in.Suspect = dec.Suspect
		cp := msg.RetryCopy(m, in, dec.Retries, out.Status, p.o.Now())
		return p.toTier(ctx, d, m, in, cp, dec.Tier, "retry")

	case retry.DLQ:
		tid := traceID(trace.SpanFromContext(ctx))
		in.Crashes, in.Suspect = dec.Crashes, dec.Suspect
		cp := msg.DLQCopy(m, in, msg.DeadLetter{
			Reason: dec.Reason, Status: out.Status, Error: out.Error, Retries: dec.Retries,
			TraceID: tid, Now: p.o.Now(),
		})
		if !p.move(ctx, d, m, in, p.o.Plan.DLQ.Name, cp, "dlq") {
			return false
		}
		level := slog.LevelWarn
		if dec.Reason == retry.ReasonFiltered {
			// Set aside on purpose, as the config asks: one line per
			// message would drown the log of a busy filter.
			level = slog.LevelDebug
		}
		if p.log.Enabled(ctx, level) {
			p.log.Log(ctx, level, "message dead-lettered", "event", retry.Event(dec.Reason), "message_id", m.MessageID,
				"routing_key", in.RoutingKey, "reason", dec.Reason,
				"status", out.Status, "retries", dec.Retries, "error", msg.Truncate(out.Error, msg.MaxErrorLen),
				"trace_id", tid)
		}
		return true
	}
	// A decision without an action is a bug; keep the message.
	p.log.Error("no action decided; message returned", "event", "DECISION_MISSING", "message_id", m.MessageID)
	p.giveBack(ctx, d, m, in)
	return false
}

func (p *Loop) toTier(ctx context.Context, d Delivery, m *msg.Message, in msg.Info,
	cp *msg.Message, tier time.Duration, why string) bool {
	q, ok := p.o.Plan.TierQueue(tier)
	if !ok {
		// The selector only picks configured tiers; keep the message if not.
		p.log.Error("no queue for delay tier; message returned", "event", "TIER_MISSING", "tier", tier.String())
		p.giveBack(ctx, d, m, in)
		return false
	}
	return p.move(ctx, d, m, in, q, cp, why)
}

// move publishes cp to queue, waits for the confirm, then acks d. A failed
// publish is retried with backoff while the delivery is held; the decision
// is never taken again. The delivery is let go (given back) only when it
// must: shutdown, its channel lost, or held for MoveHoldMax. It reports
// whether the move completed.
func (p *Loop) move(ctx context.Context, d Delivery, m *msg.Message, in msg.Info,
	queue string, cp *msg.Message, why string) bool {
	var (
		started = time.Now()
		bo      = backoff.Backoff{Min: p.o.MoveRetryMin, Max: p.o.MoveRetryMax}
		held    bool
	)
	defer func() {
		if held {
			p.movesFailing(-1)
		}
	}()
	for {
		err := p.publish(ctx, queue, cp, why)
		if err == nil {
			break
		}
		p.moveFailed(why)
		if !held {
			held = true
			p.movesFailing(1)
			p.log.Error("move failed; holding the message and retrying the move", "event", "MOVE_FAILED",
				"message_id", m.MessageID, "to", queue, "why", why, "error", err.Error())
		}
		switch {
		case !alive(d):
			// The broker has put the original back already.
			p.settleFailed(m, "move", err)
			return false
		case p.stopped(), time.Since(started) >= p.o.MoveHoldMax:
			p.log.Warn("move still failing; message given back to the work queue", "event", "MOVE_ABANDONED",
				"message_id", m.MessageID, "to", queue, "why", why, "held_ms", time.Since(started).Milliseconds(),
				"error", err.Error())
			p.giveBack(ctx, d, m, in)
			return false
		}
		p.wait(bo.Next())
	}
	if held {
		p.log.Info("move succeeded after failing", "event", "MOVE_RECOVERED", "message_id", m.MessageID,
			"to", queue, "why", why, "held_ms", time.Since(started).Milliseconds())
	}
	if err := d.Ack(); err != nil {
		// The copy exists and the original will be redelivered: a duplicate,
		// never a loss.
		p.settleFailed(m, "ack after move", err)
		return false
	}
	return true
}

// publish sends one copy and waits for its confirm. The publish finishes
// even during shutdown: a copy whose confirm is abandoned would become a
// duplicate. It has its own confirm timeout.
func (p *Loop) publish(ctx context.Context, queue string, cp *msg.Message, why string) error {
	pctx, span := startProducer(context.WithoutCancel(ctx), p.tr, queue, why, cp.Headers)
	err := p.o.Pub.Publish(pctx, queue, cp)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	return err
}

func (p *Loop) movesFailing(delta int64) {
	n := p.Stats.MovesFailing.Add(delta)
	if p.o.OnMovesFailing == nil {
		return
	}
	switch {
	case delta > 0 && n == 1:
		p.o.OnMovesFailing(true)
	case delta < 0 && n == 0:
		p.o.OnMovesFailing(false)
	}
}

// giveBack returns a delivery to the work queue as it came, without
// spending an attempt: the app could not take it, or Hopper is letting go
// of it. On a classic queue that is a nack with requeue. On a quorum queue
// it is a republish (counters, origin and deadline kept) → confirm → ack,
// so the queue's delivery limit is not spent.
func (p *Loop) giveBack(ctx context.Context, d Delivery, m *msg.Message, in msg.Info) {
	if !p.o.Quorum && !unpinnedDeadline(m, in) {
		p.nack(d)
		return
	}
	p.republish(ctx, d, m, in)
}

// unpinnedDeadline says whether in's deadline was counted from m's AMQP
// expiration at this receipt and is written nowhere yet: a nack would
// bring the message back as it came, and the next receipt would count the
// expiration again, later. Such a give-back republishes with the deadline
// pinned, also on a classic queue.
func unpinnedDeadline(m *msg.Message, in msg.Info) bool {
	if in.Deadline.IsZero() || m.Expiration == "" {
		return false
	}
	_, pinned := m.Headers[msg.HeaderDeadline]
	return !pinned
}

// republish puts a copy of m, with the history in, back in the work queue,
// then acks the delivery. When the publish fails the delivery is nacked
// instead, the one way left to keep it, and it reports false: the new
// history was not kept.
func (p *Loop) republish(ctx context.Context, d Delivery, m *msg.Message, in msg.Info) bool {
	if !alive(d) {
		// The broker has put the message back already: a copy would be a
		// second one.
		p.settleFailed(m, "return", errChannelClosed)
		return false
	}
	if err := p.publish(ctx, p.o.Plan.Work.Name, msg.ReturnCopy(m, in), "return"); err != nil {
		p.moveFailed("return")
		p.log.Warn("could not republish a returned message; nacking it instead", "event", "RETURN_NACKED",
			"message_id", m.MessageID, "error", err.Error())
		p.nack(d)
		return false
	}
	if ordered(d) {
		p.log.Warn("ordered message returned to the tail of the work queue; later messages of its key may come first",
			"event", "ORDER_BROKEN", "message_id", m.MessageID, "reason", OrderReturned)
		p.orderBroken(OrderReturned)
	}
	if err := d.Ack(); err != nil {
		p.settleFailed(m, "ack after return", err)
	}
	return true
}

func (p *Loop) nack(d Delivery) {
	if err := d.Nack(true); err != nil {
		p.settleFailed(d.Message(), "nack", err)
	}
}

func (p *Loop) settleFailed(m *msg.Message, what string, err error) {
	p.Stats.SettleFailed.Add(1)
	p.log.Warn("could not settle delivery; the broker will redeliver it", "event", "SETTLE_FAILED",
		"op", what, "message_id", m.MessageID, "error", err.Error())
}

// errChannelClosed is why a delivery whose channel closed is not settled.
var errChannelClosed = errors.New("the delivery's channel is closed; the broker redelivers the message")

// channelCheck is how often a wait for held deliveries looks at their
// channel.
const channelCheck = 50 * time.Millisecond

// waitHeld sleeps d while deliveries are held for it, cut short by
// shutdown (false) and when held says none of them can be settled any
// more (true): their channel closed, the broker has put them back and
// redelivers them, and they must not keep a worker from those copies for
// the rest of a retry delay. Whoever goes on after the wait checks each
// delivery's channel before using it, as every attempt does.
func (p *Loop) waitHeld(d time.Duration, held func() bool) bool {
	if !held() {
		return true
	}
	if d <= channelCheck {
		return p.wait(d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	tick := time.NewTicker(channelCheck)
	defer tick.Stop()
	for {
		select {
		case <-t.C:
			return true
		case <-p.stopping:
			return false
		case <-tick.C:
			if !held() {
				return true
			}
		}
	}
}

// wait sleeps d, cut short by shutdown. It reports whether it slept fully.
func (p *Loop) wait(d time.Duration) bool {
	if d <= 0 {
		return !p.stopped()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.stopping:
		return false
	}
}

// traceID is the span's trace id, or "" when there is none.
func traceID(span trace.Span) string {
	if sc := span.SpanContext(); sc.HasTraceID() {
		return sc.TraceID().String()
	}
	return ""
}

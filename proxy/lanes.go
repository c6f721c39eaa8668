package proxy

import (
	"context"
	"sync"
	"time"

	"github.com/hopper-sidecar/hopper/order"
	"github.com/hopper-sidecar/hopper/retry"
)

// lanes delivers the messages with the same ordering key one at a time,
// in the order they came, on the workers of a pool; messages of other keys
// (and those without a key) are delivered in parallel. A delivery whose
// key has one at the app waits in its key's line; the worker that
// finishes a delivery goes on with the next of its key.
type lanes struct {
	p    *Loop
	pool *pool

	mu sync.Mutex
	// line holds the deliveries waiting behind the one of their key being
	// delivered (under mu).
	line *order.Lanes[job]
	// wake wakes bound when a delivery starts to wait behind its key
	// while no wake-up is set for the first to reach its bound (timed
	// false; under mu).
	wake  chan struct{}
	timed bool
}

func newLanes(p *Loop) *lanes {
	l := &lanes{p: p, line: order.NewLanes[job](), wake: make(chan struct{}, 1)}
	l.pool = newPool(p, l.run)
	return l
}

func (l *lanes) start(ctx context.Context) {
	l.pool.start(ctx)
	l.p.wg.Add(1)
	go l.bound(ctx)
}

// handle hands j to a worker, unless a delivery of its key is at the app:
// then it waits behind it.
func (l *lanes) handle(j job) {
	if k, ok := l.p.o.OrderingKey.Key(j.d.Message()); ok {
		j.key = k
		l.mu.Lock()
		free := l.line.Add(k, j)
		wake := !free && !l.timed
		l.timed = l.timed || wake
		l.mu.Unlock()
		if wake {
			select {
			case l.wake <- struct{}{}:
			default: // woken already
			}
		}
		if !free {
			return // it waits behind its key
		}
	}
	l.pool.handle(j)
}

func (l *lanes) stop() { l.pool.stop() }

// run handles a job and, when it has a key, the deliveries that waited
// behind it for that key, one after the other, until none is left.
func (l *lanes) run(ctx context.Context, j job) {
	for {
		l.p.handleSince(ctx, j.d, j.key != "", j.since)
		if j.key == "" {
			return
		}
		l.mu.Lock()
		next, ok := l.line.Done(j.key)
		l.mu.Unlock()
		if !ok {
			return
		}
		j = next
	}
}

// keys reports how many keys have a delivery at the app (or held in
// place) and how many deliveries wait behind them.
func (l *lanes) keys() (busy, waiting int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.line.Busy(), l.line.Waiting()
}

// bound bounds the wait of a delivery behind its key. The broker
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
func (l *lanes) bound(ctx context.Context) {
	defer l.p.wg.Done()
	timer := time.NewTimer(l.p.o.MoveHoldMax)
	defer timer.Stop()
	for {
		now := l.p.o.Now()
		cutoff := now.Add(-l.p.o.MoveHoldMax)
		var due []string
		var next time.Time // receipt of the first delivery waiting, of those not due
		l.mu.Lock()
		l.line.Firsts(func(k string, first job) {
			switch {
			case !first.since.After(cutoff):
				due = append(due, k)
			case next.IsZero() || first.since.Before(next):
				next = first.since
			}
		})
		over := make([][]job, 0, len(due))
		for _, k := range due {
			over = append(over, l.line.Cut(k))
		}
		l.timed = !next.IsZero()
		l.mu.Unlock()
		for _, js := range over {
			l.waitedTooLong(ctx, js, now)
		}
		var wake <-chan time.Time
		if !next.IsZero() {
			timer.Reset(next.Add(l.p.o.MoveHoldMax).Sub(now))
			wake = timer.C
		}
		select {
		case <-l.p.stopping:
			// What still waits goes back through the workers, as at
			// every shutdown.
			return
		case <-wake:
		case <-l.wake:
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
func (l *lanes) waitedTooLong(ctx context.Context, js []job, now time.Time) {
	l.p.log.Warn("messages waited behind their ordering key until broker.moveHoldMax from their receipt; given back to the work queue",
		"event", "ORDERED_WAIT_EXHAUSTED", "message_id", js[0].d.Message().MessageID, "messages", len(js),
		"waited_ms", now.Sub(js[0].since).Milliseconds())
	for _, j := range js {
		if !alive(j.d) {
			l.p.Stats.SettleFailed.Add(1) // the broker has it back already
			continue
		}
		m := j.d.Message()
		in := l.p.safeHistory(m)
		l.p.giveBack(ctx, &settleOnce{Delivery: j.d, ordered: true}, m, in)
		l.p.record(retry.Outcome{}, false, retry.Decision{Action: retry.Return, Retries: in.Retries, Requeues: in.Requeues}, 0)
	}
}

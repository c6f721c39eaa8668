package app

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// LimiterOptions configure a Limiter. Zero values take the defaults named.
type LimiterOptions struct {
	// Max is the upper bound of the limit: the number of workers. Required.
	Max int
	// Initial is the limit to start from. Default Max: a healthy app gets
	// full concurrency from the first message.
	Initial int
	// Backoff is the factor the limit is multiplied by on overload, at most
	// once per window of limit completions. Default 0.9.
	Backoff float64
	// LatencyTolerance is how many times its usual latency the app may take
	// before that counts as overload. Default 2.
	LatencyTolerance float64
	// LatencySlack is the least absolute rise of latency that counts as
	// overload, so that jitter of a very fast app (1 ms → 3 ms) does not.
	// Default 3ms: with the usual latency of an app answering within a
	// millisecond, the limit settles where requests wait about that long
	// at the app, enough to keep it busy; at 5 ms a drain of such an app
	// ran twice the requests at once for no more throughput, with a
	// worker and a prefetched message more for each.
	LatencySlack time.Duration
	// Now is the clock the usual latency's rise is timed with. Default
	// time.Now.
	Now func() time.Time
}

// The app's usual latency follows a drop at once and a rise only slowly,
// and only from answers given while few requests were at the app
// (riseInFlight or fewer, this one included). A rise seen with many
// requests at once may be the queue those requests make at the app: an
// app that answers 20,000 requests a second within a millisecond takes
// 5 ms when 100 wait at it, and taking that as its usual (as a rule of
// 0.2% per answer did, within 25 ms) lets the limit grow into a queue it
// made itself, for no more throughput. An app that really slows down
// still gets its new usual: its latency keeps the limit backing off until
// few requests are at it, and there the rise counts, over about baseRise.
const (
	baseRise     = 10 * time.Second
	riseInFlight = 4
)

// Limiter is an adaptive concurrency limit in front of the app (additive
// increase, multiplicative decrease, as TCP congestion control does): an app
// that answers 429 or 503, times out, or slows down well past its usual
// latency gets fewer concurrent requests; one that answers gets more, up to
// Max. It never goes below 1, so a healthy app is never starved — stopping
// is the breaker's job, and only for an app that is down.
//
// The limit is shared by every queue the sidecar consumes, and shared
// fairly: when requests wait for a slot, freed slots go to the waiting
// queues in turn, so a busy queue with many waiting workers cannot starve a
// quiet one whose single message waits behind them.
//
// A decrease happens at most once per window of limit completions: a burst
// of failures from the requests already in flight is one overload event,
// not fifty. After the breaker closes, Reset restarts from a small limit
// that doubles each window (slow start) up to where it was.
type Limiter struct {
	next Deliverer
	o    LimiterOptions

	mu        sync.Mutex
	limit     float64
	ssthresh  float64 // below it the limit doubles per window (slow start)
	inFlight  int
	sinceDrop int // completions since the last decrease
	// waiters wait for a slot, by queue; turn is the queues that have
	// waiters, in the order their next waiter is served.
	waiters map[string][]chan struct{}
	turn    []string
	nwait   int
	fast    float64   // latency, quickly smoothed (seconds)
	base    float64   // the app's usual latency: follows drops at once, rises over baseRise
	baseAt  time.Time // the last answer's: base rises by the time since, when few requests were at the app
}

// NewLimiter wraps next.
func NewLimiter(next Deliverer, o LimiterOptions) *Limiter {
	if o.Max < 1 {
		o.Max = 1
	}
	if o.Initial < 1 || o.Initial > o.Max {
		o.Initial = o.Max
	}
	if o.Backoff <= 0 || o.Backoff >= 1 {
		o.Backoff = 0.9
	}
	if o.LatencyTolerance < 1 {
		o.LatencyTolerance = 2
	}
	if o.LatencySlack <= 0 {
		o.LatencySlack = 3 * time.Millisecond
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Limiter{next: next, o: o, limit: float64(o.Initial), ssthresh: float64(o.Max), waiters: map[string][]chan struct{}{}}
}

// Limit is the current concurrency limit.
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.limit)
}

// InFlight is the number of requests holding a slot now.
func (l *Limiter) InFlight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inFlight
}

// Deliver waits for a slot, delivers, and adapts the limit to the outcome.
func (l *Limiter) Deliver(ctx context.Context, m *msg.Message, in msg.Info) retry.Outcome {
	return l.around(ctx, in.Queue, SignalOf, func(ctx context.Context) retry.Outcome { return l.next.Deliver(ctx, m, in) })
}

// DeliverBatch is Deliver for a batch request: it takes one slot, so the
// limit counts requests, whatever their size; a part of a split batch
// takes none.
func (l *Limiter) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	var a batch.Answer
	if r.Split {
		// A part of a split goes on the slot of the request it came from
		// (batch.Request.Split).
		start := time.Now()
		a = l.next.DeliverBatch(ctx, r)
		l.Observe(batchSignal(r.Len())(a.Whole), time.Since(start))
		return batch.Classified(a, a.Whole, r.Len())
	}
	whole := l.around(ctx, r.Infos[0].Queue, batchSignal(r.Len()), func(ctx context.Context) retry.Outcome {
		a = l.next.DeliverBatch(ctx, r)
		return a.Whole
	})
	return batch.Classified(a, whole, r.Len())
}

// batchSignal classifies the outcome of a batch request of n messages. A
// request of several that timed out says that one of its messages made
// the app hang, not that the app is overloaded: the messages go again
// each alone, and the one that hangs times out alone, which counts as a
// single message's timeout does. Counting the batch too would charge the
// hang to every message beside it, taking concurrency from the whole
// queue for one message.
func batchSignal(n int) func(retry.Outcome) Signal {
	return func(o retry.Outcome) Signal {
		if n > 1 && o.Kind == retry.Timeout && !o.Given() {
			return Ignore
		}
		return SignalOf(o)
	}
}

func (l *Limiter) around(ctx context.Context, queue string, signal func(retry.Outcome) Signal, call func(context.Context) retry.Outcome) retry.Outcome {
	if err := l.acquire(ctx, queue); err != nil {
		return retry.Outcome{Kind: retry.Unavailable, CutOff: true, Error: fmt.Sprintf("waiting for a concurrency slot: %v", err)}
	}
	start := time.Now()
	o := call(ctx)
	l.release(signal(o), time.Since(start))
	return o
}

// acquire takes a slot for a request of queue, waiting its turn when none
// is free.
func (l *Limiter) acquire(ctx context.Context, queue string) error {
	l.mu.Lock()
	if l.inFlight < int(l.limit) && l.nwait == 0 {
		l.inFlight++
		l.mu.Unlock()
		return nil
	}
	w := make(chan struct{})
	if len(l.waiters[queue]) == 0 {
		l.turn = append(l.turn, queue)
	}
	l.waiters[queue] = append(l.waiters[queue], w)
	l.nwait++
	l.wakeLocked()
	l.mu.Unlock()
	select {
	case <-w:
		return nil // the slot was handed over by release
	case <-ctx.Done():
		l.mu.Lock()
		defer l.mu.Unlock()
		ws := l.waiters[queue]
		for i, x := range ws {
			if x == w {
				l.waiters[queue] = append(ws[:i], ws[i+1:]...)
				l.nwait--
				if len(l.waiters[queue]) == 0 {
					l.turn = slices.DeleteFunc(l.turn, func(q string) bool { return q == queue })
				}
				return ctx.Err()
			}
		}
		// Handed a slot just as ctx ended: give it back.
		l.inFlight--
		l.wakeLocked()
		return ctx.Err()
	}
}

// wakeLocked hands free slots to the waiting queues in turn, each queue's
// waiters in arrival order.
func (l *Limiter) wakeLocked() {
	for l.nwait > 0 && l.inFlight < int(l.limit) {
		q := l.turn[0]
		ws := l.waiters[q]
		w := ws[0]
		l.waiters[q] = ws[1:]
		l.turn = l.turn[1:]
		if len(l.waiters[q]) > 0 {
			l.turn = append(l.turn, q) // its next waiter goes to the back
		} else {
			delete(l.waiters, q)
		}
		l.nwait--
		l.inFlight++
		close(w)
	}
}

// Signal is what an outcome says about the app's load.
type Signal int

// Signals.
const (
	// Ignore: says nothing about load (refused, cut off, app unavailable:
	// the breaker's business).
	Ignore Signal = iota
	// Answered: the app answered in time, whatever the status.
	Answered
	// Overloaded: 429, 503 or a timeout.
	Overloaded
)

// SignalOf classifies an outcome for the limiter. Only overload takes
// concurrency away: a failed message that is not overload (a 500, a
// garbled answer) is the app answering in time, and its latency counts
// like any answer's.
func SignalOf(o retry.Outcome) Signal {
	switch assess(o) {
	case NoAnswer:
		return Ignore
	case Overload:
		return Overloaded
	}
	return Answered
}

func (l *Limiter) release(s Signal, latency time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight--
	l.adaptLocked(s, latency)
	l.wakeLocked()
}

// Observe adapts the limit to one completed request without holding a slot
// (for tests and callers that measure elsewhere).
func (l *Limiter) Observe(s Signal, latency time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.adaptLocked(s, latency)
	l.wakeLocked()
}

func (l *Limiter) adaptLocked(s Signal, latency time.Duration) {
	if s == Ignore {
		return
	}
	l.sinceDrop++
	if s == Answered {
		sec := latency.Seconds()
		now := l.o.Now()
		if l.fast == 0 {
			l.fast, l.base, l.baseAt = sec, sec, now
		}
		l.fast += (sec - l.fast) * 0.2
		switch {
		case l.fast < l.base:
			l.base = l.fast
		case l.inFlight < riseInFlight:
			l.base += (l.fast - l.base) * min(1, now.Sub(l.baseAt).Seconds()/baseRise.Seconds())
		}
		l.baseAt = now
		if l.fast > l.base*l.o.LatencyTolerance && l.fast-l.base > l.o.LatencySlack.Seconds() {
			s = Overloaded
		}
	}
	if s == Overloaded {
		if l.sinceDrop >= int(l.limit) {
			l.ssthresh = math.Max(1, l.limit*l.o.Backoff)
			l.limit = l.ssthresh
			l.sinceDrop = 0
		}
		return
	}
	// Grow only while the limit is what holds requests back: a limit the
	// load never reaches tells nothing about the app.
	if l.nwait == 0 && l.inFlight+1 < int(l.limit)/2 {
		return
	}
	if l.limit < l.ssthresh {
		l.limit++ // slow start: +1 per answer doubles the limit per window
	} else {
		l.limit += 1 / l.limit // +1 per window
	}
	l.limit = math.Min(l.limit, float64(l.o.Max))
}

// Reset restarts from a limit of n (the breaker closing after an outage),
// growing back by slow start to where the limit was.
func (l *Limiter) Reset(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ssthresh = math.Max(l.limit, float64(n))
	l.limit = math.Max(1, math.Min(float64(n), float64(l.o.Max)))
	l.sinceDrop = 0
}

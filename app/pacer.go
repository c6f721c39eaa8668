package app

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// Activity records when each queue last had a message answered 2xx, so a
// queue whose messages keep failing can tell whether it competes with
// queues doing useful work. One Activity is shared by every queue of a
// sidecar.
type Activity struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// NewActivity returns an empty record.
func NewActivity() *Activity { return &Activity{last: map[string]time.Time{}} }

// Succeeded records a 2xx for queue at now.
func (a *Activity) Succeeded(queue string, now time.Time) {
	a.mu.Lock()
	a.last[queue] = now
	a.mu.Unlock()
}

// OthersSucceeding reports whether a queue other than queue had a 2xx in the
// window before now.
func (a *Activity) OthersSucceeding(queue string, now time.Time, window time.Duration) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for q, t := range a.last {
		if q != queue && now.Sub(t) < window {
			return true
		}
	}
	return false
}

// PacerOptions configure a Pacer. Zero values take the defaults named.
type PacerOptions struct {
	// Queue is the queue whose deliveries go through the pacer. Required.
	Queue string
	// Activity is shared with the other queues' pacers. Required.
	Activity *Activity
	// After is the number of failed messages in a row after which the
	// queue is paced. Default 20.
	After int
	// Min and Max bound the pause before each delivery of a paced queue:
	// it starts at Min and doubles with every further After failures, up to
	// Max. Defaults 10ms and 1s.
	Min, Max time.Duration
	// Window is how recent another queue's 2xx must be for this queue to
	// be paced. Default 1s.
	Window time.Duration
	// Clock defaults to the wall clock.
	Clock  Clock
	Logger *slog.Logger
}

// Pacer slows down a queue whose messages keep failing (5xx, 429, timeouts
// from an app that answers) while another queue of the same sidecar has
// messages succeeding. Retrying failing messages as fast as possible helps
// them nothing — they go to a delay tier or the DLQ either way — while
// every retry costs the broker and Hopper work that the healthy queue
// beside it then lacks. The pause only delays a failing message's next
// attempt; it never changes its outcome. A queue alone, or one whose
// neighbours are idle, is never paced, and the first 2xx ends the pacing.
type Pacer struct {
	next    Deliverer
	o       PacerOptions
	failing atomic.Int64 // failed messages in a row
	paced   atomic.Bool
}

// NewPacer wraps next.
func NewPacer(next Deliverer, o PacerOptions) *Pacer {
	if o.After < 1 {
		o.After = 20
	}
	if o.Min <= 0 {
		o.Min = 10 * time.Millisecond
	}
	if o.Max < o.Min {
		o.Max = max(time.Second, o.Min)
	}
	if o.Window <= 0 {
		o.Window = time.Second
	}
	if o.Clock == nil {
		o.Clock = wallClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Pacer{next: next, o: o}
}

// Pause is how long the next delivery waits (0 when the queue is not paced).
func (p *Pacer) Pause() time.Duration {
	n := int(p.failing.Load())
	if n < p.o.After || !p.o.Activity.OthersSucceeding(p.o.Queue, p.o.Clock.Now(), p.o.Window) {
		p.setPaced(false, n)
		return 0
	}
	p.setPaced(true, n)
	d := p.o.Min
	for steps := (n - p.o.After) / p.o.After; steps > 0 && d < p.o.Max; steps-- {
		d *= 2
	}
	return min(d, p.o.Max)
}

func (p *Pacer) setPaced(paced bool, failing int) {
	if p.paced.Swap(paced) == paced {
		return
	}
	if paced {
		p.o.Logger.Info("queue's messages keep failing while other queues succeed: its deliveries are paced",
			"event", "QUEUE_PACED", "queue", p.o.Queue, "failed_in_a_row", failing)
	} else {
		p.o.Logger.Info("queue no longer paced", "event", "QUEUE_UNPACED", "queue", p.o.Queue)
	}
}

// Deliver waits out the pause, if any, then delivers and records the
// outcome.
func (p *Pacer) Deliver(ctx context.Context, m *msg.Message, in msg.Info) retry.Outcome {
	return p.around(ctx, func(ctx context.Context) retry.Outcome { return p.next.Deliver(ctx, m, in) })
}

// DeliverBatch is Deliver for a batch request, paced and counted as one.
func (p *Pacer) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	var a batch.Answer
	whole := p.around(ctx, func(ctx context.Context) retry.Outcome {
		a = p.next.DeliverBatch(ctx, r)
		return a.Whole
	})
	return batch.Classified(a, whole, r.Len())
}

func (p *Pacer) around(ctx context.Context, call func(context.Context) retry.Outcome) retry.Outcome {
	if d := p.Pause(); d > 0 {
		select {
		case <-p.o.Clock.After(d):
		case <-ctx.Done():
		}
	}
	o := call(ctx)
	switch a := assess(o); {
	case a == Success:
		p.failing.Store(0)
		p.o.Activity.Succeeded(p.o.Queue, p.o.Clock.Now())
	case a == NoAnswer:
		// The app down or Hopper letting go: the breaker's business.
	case a.FailedMessage():
		p.failing.Add(1)
	}
	return o
}

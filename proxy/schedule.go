package proxy

import (
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/schedule"
)

// early decides, as a delivery is received, whether it is due. One that
// is not is handed to a goroutine of its own that parks it (or, due too
// far away, dead-letters it), and early reports true: it never waits for
// a worker, a key's line or a batch, and holds its prefetch slot only for
// the publish → confirm → ack of its copy. A due one goes on to the
// dispatcher, where routes, keys and batches take it as any other.
func (p *Loop) early(j job) bool {
	m := j.d.Message()
	due, pinned, parked := msg.When(m, j.since)
	dec := p.o.Schedule.Decide(schedule.When{Due: due, Pinned: pinned}, j.since)
	if dec.Action == schedule.Deliver {
		if parked && !m.Redelivered {
			// Back from parking and on its way to the app for the first
			// time: how late it comes is the schedule's precision.
			p.obs.Due(-dec.Left)
		}
		return false
	}
	// The delivery is the parking goroutine's from here on.
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.park(p.ctx, j, dec)
	}()
	return true
}

// park moves a delivery that is not due into the parking queue of its
// step (publish → confirm → ack), without a request to the app and
// without an attempt; a due time beyond schedule.maxDelay goes to the
// DLQ instead. A move that fails is retried like any other, while the
// delivery is held.
func (p *Loop) park(ctx context.Context, j job, dec schedule.Decision) {
	sd := &settleOnce{Delivery: j.d, since: j.since}
	defer p.recoverDelivery(ctx, sd)
	m := sd.Message()
	if !alive(sd) {
		p.Stats.SettleFailed.Add(1)
		return
	}
	in, _ := p.history(m, j.since)
	// The copy stays in the trace the publisher started.
	ctx = propagator.Extract(ctx, headerCarrier(m.Headers))
	if dec.Action == schedule.TooFar {
		rd := retry.Decision{Action: retry.DLQ, Reason: retry.ReasonScheduleTooFar, Retries: in.Retries, Requeues: in.Requeues, Crashes: in.Crashes}
		out := retry.Outcome{Error: fmt.Sprintf("due at %s, %s from receipt: further than schedule.maxDelay (%s)",
			dec.Due.UTC().Format(time.RFC3339Nano), dec.Left.Round(time.Millisecond), p.o.Schedule.Max)}
		if !p.settle(ctx, sd, m, in, rd, out, j.since) {
			rd = retry.Decision{Action: retry.Return, Retries: in.Retries, Requeues: in.Requeues}
		}
		p.record(out, false, rd, 0)
		return
	}
	q, ok := p.o.Plan.ParkQueue(dec.Step)
	if !ok {
		// The schedule only picks the plan's steps; keep the message if not.
		p.log.Error("no parking queue for this delay; message returned", "event", "PARKING_QUEUE_MISSING", "step", dec.Step.String())
		p.giveBack(ctx, sd, m, in)
		return
	}
	if !p.move(ctx, sd, m, in, q, msg.ParkCopy(m, in, dec.Due), "park", j.since) {
		return
	}
	p.Stats.Parked.Add(1)
	p.obs.Parked(dec.Step)
	p.due.add(dec.Due)
	if p.log.Enabled(ctx, slog.LevelDebug) {
		p.log.Debug("message parked until due", "event", "MESSAGE_PARKED", "message_id", m.MessageID,
			"due", dec.Due.UTC().Format(time.RFC3339Nano), "left_ms", dec.Left.Milliseconds(), "to", q)
	}
}

// NextDue is the earliest due time, to the second, of the messages this
// loop parked that are not due yet; false when it knows of none. A
// message parked before Hopper started is known once it hops through
// the work queue again (at the latest after its parking step).
func (p *Loop) NextDue() (time.Time, bool) { return p.due.next(p.o.Now()) }

// dueTimes holds the due times of parked messages, by second: a set, so
// that the many hops of one message and the messages due in one second
// take one entry, and memory is bounded by the seconds in
// schedule.maxDelay whatever the number of messages.
type dueTimes struct {
	mu   sync.Mutex
	secs secondHeap
	in   map[int64]bool
}

func (s *dueTimes) add(t time.Time) {
	sec := t.Unix()
	if t.Nanosecond() > 0 {
		sec++ // rounded up: never shown earlier than it is
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.in == nil {
		s.in = map[int64]bool{}
	}
	if s.in[sec] {
		return
	}
	s.in[sec] = true
	heap.Push(&s.secs, sec)
}

func (s *dueTimes) next(now time.Time) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.secs) > 0 && time.Unix(s.secs[0], 0).Before(now) {
		delete(s.in, heap.Pop(&s.secs).(int64))
	}
	if len(s.secs) == 0 {
		return time.Time{}, false
	}
	return time.Unix(s.secs[0], 0), true
}

type secondHeap []int64

func (h secondHeap) Len() int           { return len(h) }
func (h secondHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h secondHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *secondHeap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *secondHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

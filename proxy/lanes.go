package proxy

import (
	"context"
	"time"

	"github.com/hopper-sidecar/hopper/retry"
)

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

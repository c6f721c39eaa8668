package proxy

import (
	"sync/atomic"
	"time"
)

// A delivery as the loop holds it, from its receipt until it is settled:
// the wrapper that settles it once and tells whether it can still be
// settled, and the waits it is held through, which shutdown cuts short.

// settleOnce remembers whether a delivery was acked or nacked, so that a
// panic after its settle does not settle it a second time. A batch also
// counts as settled a delivery whose channel closed (lost): the broker has
// it back. Only the goroutine that holds the delivery settles it.
type settleOnce struct {
	Delivery
	settled atomic.Bool
	// ordered deliveries must keep their place in line; leaving it is
	// reported.
	ordered bool
	// since is when the delivery was received: it is unacked from then on.
	since time.Time
}

func (d *settleOnce) Ack() error              { d.settled.Store(true); return d.Delivery.Ack() }
func (d *settleOnce) Nack(requeue bool) error { d.settled.Store(true); return d.Delivery.Nack(requeue) }
func (d *settleOnce) Ordered() bool           { return d.ordered }

// Alive reports whether the delivery can still be settled: its channel
// is open. A delivery that cannot tell is taken to be alive.
func (d *settleOnce) Alive() bool {
	a, ok := d.Delivery.(interface{ Alive() bool })
	return !ok || a.Alive()
}

// Unwrap is the delivery as the consumer handed it, for what it tells
// beyond the Delivery interface (its tag, the broker it came from).
func (d *settleOnce) Unwrap() Delivery { return d.Delivery }

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
	p.waiting.Add(1)
	defer p.waiting.Add(-1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.stopping:
		return false
	}
}

package broker

import (
	"sync"
	"time"
)

// settler is the part of a channel the acker drives.
type settler interface {
	Ack(tag uint64, multiple bool) error
	Nack(tag uint64, multiple, requeue bool) error
}

// acker coalesces the acks of one consumer channel. One ack per message
// (a frame, a syscall and the channel lock each, under every worker) was
// the largest cost of the delivery loop after the HTTP call; the broker also
// settles a multiple-ack in one step.
//
// Safety: a multiple-ack for tag T acks every unsettled delivery with a tag
// ≤ T. The acker sends one only for T below the oldest delivery that is
// still outstanding (registered, neither acked nor nacked), so it can never
// cover a message being processed, held, or about to be nacked. Tags on a
// channel increase and deliveries are registered in arrival order, so every
// tag below a registered one is registered. Nacks go out at once, in order
// with the acks, under the same lock. Acks above an outstanding delivery
// wait for it, at most maxWait, then go out one by one.
//
// An ack the acker holds is not on the wire yet: if the channel dies first
// the broker redelivers the message (a duplicate, never a loss), as it
// would after a crash between the app's answer and the ack.
type acker struct {
	ch       settler
	maxBatch int
	maxWait  time.Duration

	mu      sync.Mutex
	order   []uint64        // registered, in arrival order, front may be settled
	settled map[uint64]bool // settled tags still in order
	pending []pendingAck    // acked, not sent, ascending tags
	err     error           // first send error: the channel is gone
	// wake, when set, is told of the next settle (see heldOver).
	wake chan<- struct{}
}

type pendingAck struct {
	tag uint64
	at  time.Time
}

func newAcker(ch settler) *acker {
	return &acker{ch: ch, maxBatch: 64, maxWait: 50 * time.Millisecond, settled: map[uint64]bool{}}
}

// register records a delivery as outstanding, in arrival order.
func (a *acker) register(tag uint64) {
	a.mu.Lock()
	a.order = append(a.order, tag)
	a.mu.Unlock()
}

// ack settles a delivery; the ack goes out with the next flush.
func (a *acker) ack(tag uint64, now time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return a.err
	}
	a.settled[tag] = true
	a.notifyLocked()
	// Keep pending sorted: acks mostly arrive in order.
	i := len(a.pending)
	for i > 0 && a.pending[i-1].tag > tag {
		i--
	}
	a.pending = append(a.pending, pendingAck{})
	copy(a.pending[i+1:], a.pending[i:])
	a.pending[i] = pendingAck{tag: tag, at: now}
	if len(a.pending) >= a.maxBatch {
		// Only a multiple-ack of at least maxBatch: acks held behind an
		// outstanding delivery are aged by the periodic flush. While many
		// wait behind one (batches finishing out of order), each ack of
		// that one would otherwise go alone, as soon as it is made.
		a.sendMultipleLocked(a.maxBatch)
	}
	return a.err
}

// nack sends a nack at once; it settles the delivery.
func (a *acker) nack(tag uint64, requeue bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return a.err
	}
	if err := a.ch.Nack(tag, false, requeue); err != nil { // multiple=false
		a.err = err
		return err
	}
	a.settled[tag] = true
	a.notifyLocked()
	return nil
}

// heldOver returns the deliveries not yet settled and, when there are more
// than most, arranges for wake to be told of the next settle, so that a
// consumer waiting for room learns of it without polling. Checking and
// arranging under one lock means no settle falls between them.
func (a *acker) heldOver(most int, wake chan<- struct{}) (held int, over bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	held = len(a.order) - len(a.settled)
	if held > most {
		a.wake = wake
		return held, true
	}
	return held, false
}

func (a *acker) notifyLocked() {
	if a.wake == nil {
		return
	}
	select {
	case a.wake <- struct{}{}:
	default:
	}
	a.wake = nil
}

// flush sends what can be sent; all=true sends every pending ack (before the
// channel closes).
func (a *acker) flush(now time.Time, all bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return a.err
	}
	a.flushLocked(now, all)
	return a.err
}

func (a *acker) flushLocked(now time.Time, all bool) {
	a.sendMultipleLocked(1)
	if a.err != nil {
		return
	}
	// Acks waiting behind a slow or held delivery: one by one once old.
	kept := a.pending[:0]
	for _, p := range a.pending {
		if all || now.Sub(p.at) >= a.maxWait {
			if err := a.ch.Ack(p.tag, false); err != nil { // multiple=false
				a.err = err
				return
			}
			continue
		}
		kept = append(kept, p)
	}
	a.pending = kept
}

// sendMultipleLocked sends one ack for every pending ack below the oldest
// outstanding delivery, when they are at least least.
func (a *acker) sendMultipleLocked(least int) {
	// The oldest outstanding delivery bounds a multiple-ack.
	for len(a.order) > 0 && a.settled[a.order[0]] {
		delete(a.settled, a.order[0])
		a.order = a.order[1:]
	}
	if len(a.pending) == 0 {
		return
	}
	n := len(a.pending)
	if len(a.order) > 0 {
		minOut := a.order[0]
		n = 0
		for n < len(a.pending) && a.pending[n].tag < minOut {
			n++
		}
	}
	if n > 0 && n >= least {
		if err := a.ch.Ack(a.pending[n-1].tag, n > 1); err != nil { // multiple when it covers several
			a.err = err
			return
		}
		a.pending = a.pending[n:]
	}
}

// flushEvery flushes a every interval until stop is closed or the channel
// fails. Both ackers hold acks that only a flush sends.
func flushEvery(a interface{ flush(time.Time, bool) error }, interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			if a.flush(now, false) != nil {
				return
			}
		}
	}
}

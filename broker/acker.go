package broker

import (
	"slices"
	"sync"
	"time"

	"github.com/hopper-sidecar/hopper/config"
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

	mu sync.Mutex
	// order holds the registered tags in arrival order (ascending), done
	// beside it whether each is settled; the front may be settled.
	// settled counts the settled ones still in order. Slices rather than
	// a map: settling is a search in order and a write, with nothing to
	// allocate or hash for each message.
	order   []uint64
	done    []bool
	settled int
	pending []pendingAck // acked, not sent, ascending tags
	// base is the time pendingAck.at counts from: the first ack's.
	base time.Time
	err  error // first send error: the channel is gone
	// wake, when set, is told of the next settle (see heldOver).
	wake chan<- struct{}
}

// pendingAck is an ack not sent yet and when it was made, as time since
// the acker's base: a time.Time holds a pointer, and moving one in the
// pending list would cost the collector's write barriers on every ack.
type pendingAck struct {
	tag uint64
	at  time.Duration
}

func newAcker(ch settler) *acker {
	return &acker{ch: ch, maxBatch: config.AckBatch, maxWait: 50 * time.Millisecond}
}

// register records a delivery as outstanding, in arrival order.
func (a *acker) register(tag uint64) {
	a.mu.Lock()
	a.order = append(a.order, tag)
	a.done = append(a.done, false)
	a.mu.Unlock()
}

// settleLocked marks tag settled in order. A tag never registered (or
// already taken off the front) is not outstanding: nothing to mark. Tags
// are registered in the order the channel numbered them, so a search
// finds them; should one ever come out of order, the search may miss it,
// and a scan still does: a settle that went unmarked would keep every
// later ack waiting behind it.
func (a *acker) settleLocked(tag uint64) {
	i, found := slices.BinarySearch(a.order, tag)
	if !found {
		i = slices.Index(a.order, tag)
	}
	if i >= 0 && i < len(a.order) && a.order[i] == tag && !a.done[i] {
		a.done[i] = true
		a.settled++
	}
}

// since is now as a pendingAck's time.
func (a *acker) since(now time.Time) time.Duration {
	if a.base.IsZero() {
		a.base = now
	}
	return now.Sub(a.base)
}

// ack settles a delivery; the ack goes out with the next flush.
func (a *acker) ack(tag uint64, now time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return a.err
	}
	a.settleLocked(tag)
	a.notifyLocked()
	// Keep pending sorted: acks mostly arrive in order.
	i := len(a.pending)
	for i > 0 && a.pending[i-1].tag > tag {
		i--
	}
	a.pending = slices.Insert(a.pending, i, pendingAck{tag: tag, at: a.since(now)})
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
	a.settleLocked(tag)
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
	held = len(a.order) - a.settled
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

// sendReady sends one multiple-ack for every pending ack below the oldest
// outstanding delivery, however few; acks above it keep waiting.
func (a *acker) sendReady() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return a.err
	}
	a.sendMultipleLocked(1)
	return a.err
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
	at := a.since(now)
	for _, p := range a.pending {
		if all || at-p.at >= a.maxWait {
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
	front := 0
	for front < len(a.order) && a.done[front] {
		front++
	}
	if front > 0 {
		// Moved to the front rather than resliced: the arrays keep their
		// room, and registering does not allocate again and again.
		a.order = a.order[:copy(a.order, a.order[front:])]
		a.done = a.done[:copy(a.done, a.done[front:])]
		a.settled -= front
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
		a.pending = a.pending[:copy(a.pending, a.pending[n:])]
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

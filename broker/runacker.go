package broker

import (
	"fmt"
	"sync"
	"time"
)

// runAcker coalesces the acks of an Exclusive's channel. The consumer's
// acker cannot serve there: it needs deliveries registered in the order the
// broker numbered them, and an Exclusive hands out pushed deliveries and
// basic.get answers from two sources, so a pushed delivery with a lower tag
// may still sit in the client's buffer while a higher one is settled.
//
// It relies on the broker's numbering instead: a channel tags its
// deliveries 1, 2, 3, … without gaps, pushed or got. A multiple-ack for T
// goes out only once the caller has settled every tag up to T, so it can
// cover nothing the caller still holds, has not seen, or nacked. An ack
// above a gap (a message held for the whole run, or one still being
// published) waits at most maxWait for the gap to close, then goes out on
// its own.
//
// For a replay, one multiple-ack in place of maxBatch single ones spares
// the broker that many ack frames; it moved messages about 15% faster.
//
// An ack held here is not on the wire yet. If the channel dies first, the
// broker puts the message back in the queue although its copy was
// published: a duplicate, never a loss. unsentAcks counts those.
type runAcker struct {
	ch       settler
	maxBatch int
	maxWait  time.Duration

	mu sync.Mutex
	// settled: every tag ≤ settled is settled by the caller. wire: every
	// tag ≤ wire is settled on the wire. last is the highest tag in
	// (wire, settled] acked by the caller and not yet sent (0: none), the
	// target of the next multiple-ack.
	settled, wire, last uint64
	runAcks             int                 // caller acks in (wire, settled] not yet sent
	above               map[uint64]aboveGap // settled by the caller past a gap
	sentAbove           int                 // entries of above already on the wire
	err                 error
	unsent              int // caller acks lost with the channel
}

// aboveGap is a tag settled past a gap: when, and whether it is on the wire
// (a nack, or an ack that waited maxWait).
type aboveGap struct {
	at   time.Time
	sent bool
}

// maxSentAbove bounds the bookkeeping of tags already sent past a gap that
// never closes (a replay holding filtered-out messages). Forgetting them
// only stops later acks from being coalesced; each then goes out alone.
const maxSentAbove = 4096

func newRunAcker(ch settler, maxBatch int, maxWait time.Duration) *runAcker {
	return &runAcker{ch: ch, maxBatch: max(1, maxBatch), maxWait: maxWait, above: map[uint64]aboveGap{}}
}

// ack settles tag; the ack goes out with a later flush, or now when it
// completes a batch.
func (a *runAcker) ack(tag uint64, now time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.check(tag); err != nil {
		return err
	}
	if tag != a.settled+1 {
		a.above[tag] = aboveGap{at: now}
		return nil
	}
	a.settled, a.last = tag, tag
	a.runAcks++
	a.advance()
	if a.settled-a.wire >= uint64(a.maxBatch) {
		a.sendRun()
	}
	return a.err
}

// nack rejects tag at once, in order with the acks already sent.
func (a *runAcker) nack(tag uint64, requeue bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.check(tag); err != nil {
		return err
	}
	if err := a.ch.Nack(tag, false, requeue); err != nil { // multiple=false
		a.fail(err)
		return a.err
	}
	if tag != a.settled+1 {
		a.above[tag] = aboveGap{sent: true}
		a.sentAbove++
		return nil
	}
	a.settled = tag
	a.advance()
	return nil
}

func (a *runAcker) check(tag uint64) error {
	if a.err != nil {
		return a.err
	}
	if _, twice := a.above[tag]; twice || tag <= a.settled || tag == 0 {
		return fmt.Errorf("delivery tag %d settled twice", tag)
	}
	return nil
}

// advance moves settled through the tags past it that are settled already.
func (a *runAcker) advance() {
	for {
		g, ok := a.above[a.settled+1]
		if !ok {
			break
		}
		delete(a.above, a.settled+1)
		a.settled++
		if g.sent {
			a.sentAbove--
		} else {
			a.last = a.settled
			a.runAcks++
		}
	}
	if a.last == 0 {
		// Everything up to settled went out on its own.
		a.wire = a.settled
	}
}

// sendRun sends one multiple-ack for the settled run past the wire. Its tag
// is one not yet acked on the wire (last), so the broker knows it.
func (a *runAcker) sendRun() {
	if a.last != 0 {
		if err := a.ch.Ack(a.last, true); err != nil { // multiple=true
			a.fail(err)
			return
		}
	}
	a.wire, a.last, a.runAcks = a.settled, 0, 0
}

// flush sends the settled run and the acks past a gap that waited maxWait;
// all sends every held ack (before the channel closes).
func (a *runAcker) flush(now time.Time, all bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return a.err
	}
	if a.settled > a.wire {
		a.sendRun()
	}
	for tag, g := range a.above {
		if a.err != nil {
			break
		}
		if g.sent || !(all || now.Sub(g.at) >= a.maxWait) {
			continue
		}
		if err := a.ch.Ack(tag, false); err != nil { // multiple=false
			a.fail(err)
			break
		}
		a.above[tag] = aboveGap{sent: true}
		a.sentAbove++
	}
	if a.sentAbove > maxSentAbove {
		for tag, g := range a.above {
			if g.sent {
				delete(a.above, tag)
			}
		}
		a.sentAbove = 0
	}
	return a.err
}

// fail records the channel's end and counts the acks it took with it.
func (a *runAcker) fail(err error) {
	a.err = fmt.Errorf("ack: %w", err)
	a.unsent += a.runAcks
	a.runAcks = 0
	for _, g := range a.above {
		if !g.sent {
			a.unsent++
		}
	}
}

// abandon counts the acks still held as unsent: the channel is gone.
func (a *runAcker) abandon() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err == nil {
		a.fail(ErrChannelGone)
	}
}

// unsentAcks is the number of acks the caller made that never reached the
// broker because the channel ended first.
func (a *runAcker) unsentAcks() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.unsent
}

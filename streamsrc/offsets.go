package streamsrc

import (
	"slices"
	"sync"
)

// Offsets follows the offsets read from one stream until each is settled,
// and says how far the consumer's stored offset may go: up to the highest
// offset at or below which every message read is settled. Messages settle
// in any order (several workers, retries that take a while to confirm),
// but the stored offset only ever names a point with nothing unsettled
// behind it, so a restart that resumes after it skips nothing.
//
// A stream hands its messages in offset order, but not every offset: a
// consumer can start in the middle of a chunk, and offsets may be missing
// (filtered, or removed by retention). Offsets therefore keeps the offsets
// it was given, not a range, and gaps between them hold nothing to wait
// for.
//
// It is safe for concurrent use.
type Offsets struct {
	mu sync.Mutex
	// next is the lowest offset not read yet; an offset below it was read
	// already (or lies in a gap) and is refused. Valid once known.
	next  int64
	known bool
	// pending are the offsets read and not yet passed by the watermark,
	// in increasing order, from head on; settled[i] says whether
	// pending[i] is settled.
	pending []int64
	settled []bool
	head    int
	// done is the watermark: every offset read at or below it is settled.
	// -1 while nothing is.
	done int64
}

// NewOffsets returns an Offsets that has read nothing.
func NewOffsets() *Offsets { return &Offsets{done: -1} }

// Resume starts after stored, an offset settled in an earlier run (the
// one the broker keeps for the consumer): reading resumes at stored+1, and
// the watermark stands at stored.
func (o *Offsets) Resume(stored int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.known && stored < o.next {
		return // read past it already
	}
	o.next, o.known = stored+1, true
	o.done = max(o.done, stored)
}

// Read records that off was read and is to be delivered. It returns false
// for an offset read before (a chunk read again from its start after a
// resubscribe, or a gap already passed): that one must not be delivered
// again.
func (o *Offsets) Read(off int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.known && off < o.next {
		return false
	}
	o.next, o.known = off+1, true
	o.pending = append(o.pending, off)
	o.settled = append(o.settled, false)
	return true
}

// Settle records that off is settled (delivered, or its copy confirmed
// elsewhere). It returns false for an offset that is not pending: settled
// already, or never read.
func (o *Offsets) Settle(off int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	live := o.pending[o.head:]
	i, found := slices.BinarySearch(live, off)
	if !found || o.settled[o.head+i] {
		return false
	}
	o.settled[o.head+i] = true
	for o.head < len(o.pending) && o.settled[o.head] {
		o.done = o.pending[o.head]
		o.head++
	}
	o.compact()
	return true
}

// compact drops what the watermark passed once it is most of the slices,
// so that a long run does not keep every offset it ever read.
func (o *Offsets) compact() {
	if o.head == len(o.pending) {
		o.pending, o.settled, o.head = o.pending[:0], o.settled[:0], 0
		return
	}
	if o.head < 1024 || o.head < len(o.pending)/2 {
		return
	}
	n := copy(o.pending, o.pending[o.head:])
	copy(o.settled, o.settled[o.head:])
	o.pending, o.settled, o.head = o.pending[:n], o.settled[:n], 0
}

// Settled returns the watermark: the highest offset at or below which
// every offset read is settled, the one the consumer may store. ok is
// false while there is none.
func (o *Offsets) Settled() (off int64, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.done, o.done >= 0
}

// Next returns where reading goes on after a resubscribe: the lowest
// offset not read yet. ok is false before anything was read or resumed.
func (o *Offsets) Next() (off int64, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.next, o.known
}

// Pending is the number of offsets read and not yet passed by the
// watermark (settled ones behind an unsettled one included).
func (o *Offsets) Pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.pending) - o.head
}

package streamsrc

import (
	"sync"
	"sync/atomic"
)

// budget bounds what the loop holds of a stream's deliveries, unsettled:
// a number, as a queue's prefetch does, and bytes of bodies, as
// consumer.prefetchBytes does for a queue. One delivery always fits, however
// large, or a message over the byte budget would stop the stream.
//
// A reader draining a backlog waits on it for nearly every message: the
// stream hands messages faster than the app settles them, so each settle
// wakes the reader to take the next one. The wait is a condition variable,
// which wakes its waiters without allocating, where a channel closed and
// made again at each settle cost an allocation per message.
type budget struct {
	mu       sync.Mutex
	n, bytes int
	maxN     int
	maxBytes int // 0: no byte bound
	// freed is signalled whenever a delivery gives its share back, and
	// at stop.
	freed   sync.Cond
	waiting int
	stopped bool
	// count is maxN, for reading without the lock.
	count atomic.Int64
}

func newBudget(maxN, maxBytes int) *budget {
	b := &budget{maxN: maxN, maxBytes: maxBytes}
	b.freed.L = &b.mu
	b.count.Store(int64(maxN))
	return b
}

// setCount makes n the bound on the number of deliveries. A lower bound
// lets what is held already stay; it only keeps more from being taken.
func (b *budget) setCount(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n == b.maxN {
		return
	}
	if n > b.maxN && b.waiting > 0 {
		b.freed.Broadcast()
	}
	b.maxN = n
	b.count.Store(int64(n))
}

// take waits until a delivery of size bytes fits, and counts it; it
// returns false, counting nothing, once stop was called.
func (b *budget) take(size int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for !b.stopped {
		if b.n == 0 || b.n < b.maxN && (b.maxBytes <= 0 || b.bytes+size <= b.maxBytes) {
			b.n++
			b.bytes += size
			return true
		}
		b.waiting++
		b.freed.Wait()
		b.waiting--
	}
	return false
}

// give returns a settled delivery's share.
func (b *budget) give(size int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n--
	b.bytes -= size
	if b.waiting > 0 {
		// Every waiter looks again: the room freed may fit one waiting
		// on bytes where it does not fit another.
		b.freed.Broadcast()
	}
}

// stop ends every wait, and every take after it, without counting.
func (b *budget) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
	b.freed.Broadcast()
}

// held is what the loop holds now: deliveries and bytes.
func (b *budget) held() (n, bytes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n, b.bytes
}

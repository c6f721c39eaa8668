package streamsrc

import "sync"

// budget bounds what the loop holds of a stream's deliveries, unsettled:
// a number, as a queue's prefetch does, and bytes of bodies, as
// consumer.prefetchBytes does for a queue. One delivery always fits, however
// large, or a message over the byte budget would stop the stream.
type budget struct {
	mu       sync.Mutex
	n, bytes int
	maxN     int
	maxBytes int // 0: no byte bound
	// freed is closed (and replaced) whenever a delivery gives its share
	// back.
	freed chan struct{}
}

func newBudget(maxN, maxBytes int) *budget {
	return &budget{maxN: maxN, maxBytes: maxBytes, freed: make(chan struct{})}
}

// take waits until a delivery of size bytes fits, and counts it; it
// returns false, counting nothing, when stop is closed first.
func (b *budget) take(size int, stop <-chan struct{}) bool {
	for {
		b.mu.Lock()
		if b.n == 0 || b.n < b.maxN && (b.maxBytes <= 0 || b.bytes+size <= b.maxBytes) {
			b.n++
			b.bytes += size
			b.mu.Unlock()
			return true
		}
		w := b.freed
		b.mu.Unlock()
		select {
		case <-w:
		case <-stop:
			return false
		}
	}
}

// give returns a settled delivery's share.
func (b *budget) give(size int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n--
	b.bytes -= size
	close(b.freed)
	b.freed = make(chan struct{})
}

// held is what the loop holds now: deliveries and bytes.
func (b *budget) held() (n, bytes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n, b.bytes
}

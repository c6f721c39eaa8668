package streamsrc

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// The stream client reads a stream a chunk at a time: each credit it gives
// the broker brings one chunk, decoded whole as it arrives, and by default
// it keeps ten credits out. A chunk holds whatever the publishers wrote
// together, 512 small messages as easily as one, so ten chunks can be
// thousands of messages, each decoded and copied, held beside the
// prefetch the loop holds: a backlog of 256-byte messages read with ten
// credits held about 8 MiB more than the same backlog read from a queue.
// The source gives the credits itself instead: enough chunks to hold about
// a prefetch's worth of messages ahead (the count the loop may hold, and
// its bytes under a byte budget), reckoned from the chunks read so far, at least one and at most
// maxReadAhead. Large chunks then come one at a time, each asked for as
// the one before is begun; chunks of a message or two still come several
// to a round trip, as they must for a backlog written one message at a
// time to be read at any speed.

// maxReadAhead is the most credits a subscription keeps out. The client
// queues the chunks that arrive for a subscription in a buffer of its
// initial credits and five more; a chunk beyond would stop its reading of
// the whole connection until there is room.
const maxReadAhead = 5

// initialCredits are the credits a subscription starts with: one chunk,
// whatever its size, before any is known.
const initialCredits = 1

// consumerOptions are a subscription's options for the credits the source
// gives itself (readAhead), starting with initialCredits.
func consumerOptions() *stream.ConsumerOptions {
	return stream.NewConsumerOptions().
		SetCreditStrategy(stream.ManualCreditStrategy).
		SetInitialCredits(initialCredits)
}

// readAhead gives one subscription's credits, chunk by chunk. seen and
// handed are called by the client's dispatch around every message it
// hands over, in order; refill by the session, now and then.
type readAhead struct {
	// held bounds what the loop holds: its count is the messages to keep
	// ahead, its bytes (0: none) the body bytes.
	held *budget

	// Of the dispatch only: the chunk being handed over, and how many of
	// its messages came so far.
	last    stream.ConsumerContext
	inChunk int

	// waiting is set from the end of handing one message over to the
	// start of the next: the subscription waits on the client meanwhile.
	waiting atomic.Bool

	mu sync.Mutex
	// out is the credits given and not yet spent on a chunk seen.
	out int
	// began is when the last chunk began (or the subscription, or the
	// last refill); refilled is set by a refill until the next chunk.
	began    time.Time
	refilled bool
	cons     *stream.Consumer
}

func newReadAhead(held *budget) *readAhead {
	r := &readAhead{held: held, out: initialCredits, began: time.Now()}
	r.waiting.Store(true) // for its first chunk
	return r
}

// attach names the subscription's consumer, for refill.
func (r *readAhead) attach(cons *stream.Consumer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cons = cons
}

// seen counts one message of the chunk cc, with a body of size bytes. The
// first message of a chunk spends a credit, and the credits are topped up
// to what the chunks read so far call for. A chunk is told from the one
// before by its context, which the client makes anew for each chunk.
func (r *readAhead) seen(cc stream.ConsumerContext, size int) {
	r.waiting.Store(false)
	if cc == r.last {
		r.inChunk++
		return
	}
	// The chunk's message count, or the last one's when that was larger
	// (a chunk of compressed sub-entries counts each as one entry).
	n := max(int(cc.GetEntriesCount()), r.inChunk, 1)
	r.last, r.inChunk = cc, 1
	window := max(int(r.held.count.Load()), 1)
	want := (window + n - 1) / n
	if r.held.maxBytes > 0 {
		chunk := n * max(size, 1)
		want = min(want, (r.held.maxBytes+chunk-1)/chunk)
	}
	want = min(max(want, 1), maxReadAhead)
	r.mu.Lock()
	r.cons, r.began, r.refilled = cc.Consumer, time.Now(), false
	r.out = max(r.out-1, 0)
	give := want - r.out
	if give > 0 {
		r.out = want
	}
	r.mu.Unlock()
	if give > 0 {
		// A consumer that closed meanwhile is being replaced; what it is
		// given is moot.
		_ = cc.Consumer.Credit(int16(give))
	}
}

// handed marks the end of handing a message over.
func (r *readAhead) handed() { r.waiting.Store(true) }

// refill gives one credit when the subscription has waited on the client
// since before quiet, without a chunk beginning, while the stream holds
// messages it has not read (more). The credits seen counts never run out
// while chunks come; this is for a chunk the client took a credit for and
// handed nothing of over. One refill waits for the next chunk before
// another. It reports whether it gave a credit.
func (r *readAhead) refill(quiet time.Time, more bool) bool {
	if !more || !r.waiting.Load() {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refilled || r.cons == nil || r.began.After(quiet) {
		return false
	}
	if err := r.cons.Credit(1); err != nil {
		return false
	}
	r.out, r.began, r.refilled = 1, time.Now(), true
	return true
}

// bodySize is the size of m's body without joining its data sections.
func bodySize(m *amqp.Message) int {
	n := 0
	for _, d := range m.Data {
		n += len(d)
	}
	return n
}

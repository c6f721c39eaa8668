package proxy

import (
	"context"
	"sync/atomic"
	"time"
)

// collector is the batch dispatcher: Handle queues deliveries on pending,
// collect forms them into batches and hands each on batches to a batch
// worker, which has the batcher deliver it (batch.go).
type collector struct {
	p       *Loop
	batcher *batcher
	crew    crew
	pending chan job
	batches chan gathered
	// sending counts batches handed to the workers and not yet done; idle
	// tells the collector it fell to 0.
	sending atomic.Int64
	idle    chan struct{}
}

func newCollector(p *Loop) *collector {
	return &collector{p: p, batcher: &batcher{p: p}, crew: crew{max: int64(p.o.Workers)},
		pending: make(chan job, p.o.Queue), batches: make(chan gathered), idle: make(chan struct{}, 1)}
}

func (c *collector) start(ctx context.Context) {
	c.p.wg.Add(1)
	go c.collect(ctx)
}

func (c *collector) handle(j job) { c.pending <- j }

// stop ends the collector: what it holds and what is still queued is
// given back, never sent.
func (c *collector) stop() { close(c.pending) }

// collect forms batches from the deliveries Handle queues and hands them
// to the workers, until Shutdown closes pending. A batch goes when it is
// full (messages or bytes), or when its oldest delivery has waited
// BatchWait. With BatchWait 0 a batch that is not full goes as soon as no
// other batch is at the app: an idle app gets each message at once, and a
// busy one gets full batches, the messages gathering while its answers
// are awaited, so no message waits longer than one request takes. (Sending
// whatever is at hand whenever a worker was free made batches of about 7
// of 32 at full speed: the cost of a request was then shared by few.)
func (c *collector) collect(ctx context.Context) {
	defer c.p.wg.Done()
	defer close(c.batches)
	var (
		cur   gathered
		bytes int
		// next is a delivery that did not fit in cur: it starts the next
		// batch, and nothing more is taken until cur has gone.
		next    job
		in      = c.pending
		timer   *time.Timer
		expired <-chan time.Time
		waited  bool
	)
	add := func(j job) {
		if len(cur.ds) == 0 {
			// Deliveries come in the order they were received: the first
			// is the one unacked longest.
			cur.since = j.since
			// Room for a full batch at once (most batches of a busy queue
			// fill), rather than growing it message by message.
			cur.ds = make([]Delivery, 0, min(c.p.o.Batch.MaxMessages, maxBatchRoom))
			if c.p.o.BatchWait > 0 {
				timer = time.NewTimer(c.p.o.BatchWait)
				expired = timer.C
			}
		}
		cur.ds = append(cur.ds, j.d)
		bytes += len(j.d.Message().Body)
		if mayCrash(j.d.Message()) {
			// It goes in a request of its own, now: nothing it could
			// wait for would join it.
			waited = true
		}
	}
	// take adds j if it fits, else keeps it for the next batch and stops
	// reading until this one is handed over.
	take := func(j job) {
		if c.p.o.Batch.Fits(len(cur.ds), bytes, len(j.d.Message().Body)) {
			add(j)
		} else {
			next, in = j, nil
		}
	}
	// handedOver starts the next batch with what was kept for it.
	handedOver := func() {
		cur, bytes, expired, waited = gathered{}, 0, nil, false
		if timer != nil {
			timer.Stop()
		}
		if next.d != nil {
			add(next)
			next, in = job{}, c.pending
		}
	}
	for {
		ready := len(cur.ds) > 0 && (waited || c.p.o.Batch.Full(len(cur.ds), bytes) ||
			c.p.o.BatchWait <= 0 && c.sending.Load() == 0)
		var out chan gathered
		if ready {
			// What has arrived meanwhile joins it first: deliveries come
			// in bursts, as acks free the prefetch.
		fill:
			for in != nil && !c.p.o.Batch.Full(len(cur.ds), bytes) {
				select {
				case j, ok := <-in:
					if !ok {
						break fill // closed: the select below sees it again
					}
					take(j)
				default:
					break fill
				}
			}
			// A worker waiting takes it; else a new worker, while fewer
			// than Workers run.
			c.sending.Add(1)
			var handed bool
			select {
			case c.batches <- cur:
				handed = true
			default:
				handed = c.spawnBatch(ctx, cur)
			}
			if !handed {
				c.sending.Add(-1) // not handed yet
			}
			if handed {
				handedOver()
				continue
			}
			out = c.batches
		}
		select {
		case j, ok := <-in:
			if !ok {
				c.batcher.giveBackAll(ctx, append(cur.ds, next.d))
				return
			}
			take(j)
		case out <- cur:
			c.sending.Add(1)
			handedOver()
		case <-expired:
			expired, waited = nil, true
		case <-c.idle:
			// No batch at the app any more: a partial one may go.
		}
	}
}

// maxBatchRoom bounds the room a batch is started with: a batch of up to
// the most messages a batch may hold grows as it fills.
const maxBatchRoom = 128

// gathered is a batch as the collector hands it to a worker: its
// deliveries, in the order received, and when the first of them was
// received, from which the batch's holds are bounded.
type gathered struct {
	ds    []Delivery
	since time.Time
}

// spawnBatch starts a batch worker with g unless Workers already run.
func (c *collector) spawnBatch(ctx context.Context, g gathered) bool {
	if !c.crew.claim(&c.p.wg) {
		return false
	}
	go func() {
		defer c.p.wg.Done()
		for ok := true; ok; g, ok = <-c.batches {
			c.batcher.deliver(ctx, g.ds, g.since)
			if c.sending.Add(-1) == 0 {
				select {
				case c.idle <- struct{}{}:
				default: // the collector has been told already
				}
			}
		}
	}()
	return true
}

package config

// The concurrency a config asks for when it leaves prefetch and workers
// unset. With the limiter on, the workers are a ceiling the adaptive limit
// climbs toward only while the app keeps its latency; the limit starts
// lower and a fast app reaches the ceiling within a few hundred answers.
const (
	// AutoWorkers is the ceiling of concurrent deliveries when prefetch
	// follows the limit. An app that takes 20 ms per message needs 200 in
	// flight for 10,000 messages/s, and more once its latency grows under
	// the load; at 256 such an app drained a backlog about 13% slower than
	// with 400 fixed workers.
	AutoWorkers = 512
	// AutoInitial is where the limit starts when prefetch follows it.
	AutoInitial = 32
	// FixedWorkers is the concurrency when prefetch is unset and the limiter
	// is off: nothing adapts, so it is a middle value that suits an app
	// answering within a few milliseconds.
	FixedWorkers = 64
	// MinFollowPrefetch is the least prefetch a following consumer asks for.
	MinFollowPrefetch = 20
	// DefaultPrefetchBytes is consumer.prefetchBytes unless set.
	DefaultPrefetchBytes = 64 << 20
	// AckBatch is how many acks a queue's consumer holds to send as one
	// multiple-ack. A message whose ack is held still counts against the
	// prefetch, so a prefetch Hopper picks leaves room for them.
	AckBatch = 64
)

// Concurrency is how a queue consumes: its initial prefetch, its workers
// (the most deliveries at the app at once), and whether the prefetch
// follows the concurrency limit while running.
//
//	consumer.ordered                   prefetch 1, 1 worker
//	consumer.prefetch set              that prefetch, workers or = prefetch
//	prefetch unset, limiter on         follows: about 2 × the limit, and up
//	                                   to AckBatch more for held acks, from 20
//	                                   up to 2 × workers + AckBatch (workers
//	                                   default 512)
//	prefetch unset, limiter off        2 × workers (default 64)
//	  or single active consumer
//
// With batching on, workers count requests, each of up to
// consumer.batch.maxMessages messages, and a prefetch Hopper picks is that
// many times larger: an ordered queue takes one batch at a time, a fixed
// prefetch gives one worker per batch it holds.
func (c *Config) Concurrency() (prefetch, workers int, follow bool) {
	per := c.Consumer.Batch.Size()
	switch {
	case c.Consumer.Ordered:
		return per, 1, false
	case c.Consumer.Prefetch > 0:
		workers = c.Consumer.Workers
		if workers <= 0 {
			workers = max(1, c.Consumer.Prefetch/per)
		}
		return c.Consumer.Prefetch, workers, false
	case c.Limiter.Enabled && !c.Queue.SAC():
		// A following prefetch registers a new broker consumer at each
		// change, and on a single-active-consumer queue a new consumer
		// goes to the back of the line: the active role would pass to
		// another pod with every step of the limit.
		workers = c.Consumer.Workers
		if workers <= 0 {
			workers = AutoWorkers
		}
		return c.FollowPrefetch(min(AutoInitial, workers), workers), workers, true
	}
	workers = c.Consumer.Workers
	if workers <= 0 {
		workers = FixedWorkers
	}
	return min(2*workers*per, 65535), workers, false
}

// Budgeted says whether consumer.prefetchBytes bounds the queue's
// prefetch: a prefetch Hopper picks, following the limit or, on a
// single-active-consumer queue, fixed (to keep the consumer's place in
// line); not one the operator set (consumer.prefetch), nor an ordered
// queue's one message.
func (c *Config) Budgeted() bool {
	_, _, follow := c.Concurrency()
	return follow || c.Queue.SAC() && c.Consumer.Prefetch == 0 && !c.Consumer.Ordered
}

// FollowPrefetch is FollowPrefetch(limit, workers) in messages. With
// batching on, each request of the limit carries a batch, and a batch's
// acks go out as soon as its messages are settled: it needs no room for
// held acks. Nor does a stream, which is read without an ack per message.
func (c *Config) FollowPrefetch(limit, workers int) int {
	if per := c.Consumer.Batch.Size(); per > 1 || c.IsStream() {
		return min(followRequests(limit, workers)*per, 65535)
	}
	return FollowPrefetch(limit, workers)
}

// FollowPrefetch is the prefetch for a queue whose share of the
// concurrency limit is limit: twice it, so that a freed slot finds the next
// delivery already in Hopper instead of waiting a broker round trip, and
// as much again, up to AckBatch, for the settled messages whose acks are
// held to go out together, but not more, so that messages do not pile up
// in Hopper's memory behind an app that slowed down. With twice the limit
// alone, a fast app's drain at a limit of about 50 had its prefetch
// filled by the requests at the app and the acks held, and waited on the
// broker: over seven runs it took 1.07 times the CPU per message of the
// same drain with AckBatch on top and reached 0.94 of its rate (medians).
// The limit counts up to the queue's workers; the prefetch is at least
// MinFollowPrefetch.
func FollowPrefetch(limit, workers int) int {
	p := 2 * min(limit, workers)
	return max(min(p+min(p, AckBatch), 65535), MinFollowPrefetch)
}

// followRequests is twice the limit, up to twice the workers, and at least
// MinFollowPrefetch.
func followRequests(limit, workers int) int {
	return max(min(2*limit, 2*workers, 65535), MinFollowPrefetch)
}

// MemoryHeadroom is what the Go runtime's soft memory limit allows beyond
// the message bytes the consumers may hold (see MemoryLimit): Hopper's own
// working memory, and room for the collector. With 64 MiB of 1 MiB
// messages held, 32 MiB of headroom made the collector run so often that
// Hopper's CPU per message rose about 4.8 times, 48 MiB about 1.9 times,
// 64 MiB about 1.2 times (peak RSS 105, 118 and 135 MiB; 189 MiB without
// a limit).
const MemoryHeadroom = 64 << 20

// MemoryLimit is the soft memory limit for the Go runtime when every
// consumed queue's prefetch is under a byte budget (Budgeted): the budgets' sum plus MemoryHeadroom. Without a limit the
// collector lets the heap grow to twice what is live, so 64 MiB of held
// 1 MiB messages took a peak RSS near three times that; with it, the heap
// is collected as it nears the bound instead. It only binds when large
// messages fill the budget: small ones stay far below it. ok is false
// when a queue's held bytes have no bound (a fixed prefetch, or a budget
// of 0), since a limit below what is live would only make the collector
// run without end.
func (c *Config) MemoryLimit() (limit int64, ok bool) {
	for _, sc := range c.Consumed() {
		if !sc.Budgeted() || sc.Consumer.PrefetchBytes <= 0 {
			return 0, false
		}
		limit += int64(sc.Consumer.PrefetchBytes)
	}
	return limit + MemoryHeadroom, limit > 0
}

// A held message costs about twice its body: the delivery the broker
// client assembled and the request body built from it, both live until
// the app answers.
const heldCost = 2

// RuntimeReserve is what a container's limit keeps for what holds no
// message before PrefetchBudget shares out the rest: the binary's pages
// (about 10 MiB of text), the Go runtime's own memory, and what the heap
// runs over its soft limit while the collector catches up (about 10 MiB
// measured with 8 MiB messages).
const RuntimeReserve = 32 << 20

// PrefetchBudget is the message bytes the consumers together may hold in
// a container whose memory limit is container: a quarter of what
// RuntimeReserve leaves, at least 1 byte (one message at a time). A held
// message costs about twice its body (the frames it arrived in are garbage
// beside it, and the collector needs room for what was freed), so the
// held messages take at most half of what is left, and the collector the
// other half. In a memory cgroup of 64 MiB that is 8 MiB, of 128 MiB 24
// MiB.
func PrefetchBudget(container int64) int64 {
	return max(1, (container-RuntimeReserve)/(2*heldCost))
}

// FitPrefetchBytes lowers the byte budget of every queue whose prefetch
// is under one (Budgeted) to an equal share of PrefetchBudget(container) where
// it is higher: the default of 64 MiB, made for a machine without a
// limit, costs about 128 MiB once held, the whole of the chart's default
// limit. It
// returns the share and whether a budget was lowered. A budget of 0 (the
// operator's "no bound") and a fixed prefetch, which the operator sized,
// stay as they are.
func (c *Config) FitPrefetchBytes(container int64) (share int, lowered bool) {
	n := 0
	for _, sc := range c.Consumed() {
		if sc.Budgeted() && sc.Consumer.PrefetchBytes > 0 {
			n++
		}
	}
	if n == 0 || container <= 0 {
		return 0, false
	}
	share = int(max(1, PrefetchBudget(container)/int64(n)))
	if c.Consumer.PrefetchBytes > share {
		c.Consumer.PrefetchBytes, lowered = share, true
	}
	for i := range c.Subscriptions {
		if p := c.Subscriptions[i].Consumer.PrefetchBytes; p != nil && *p > share {
			c.Subscriptions[i].Consumer.PrefetchBytes, lowered = &share, true
		}
	}
	return share, lowered
}

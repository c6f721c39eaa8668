// Package batch is what batch delivery decides, with no I/O: which
// deliveries go to the app together, how a batch is written into one
// request body, how the app's answer is read back into one outcome per
// message, and when a batch that failed as a whole is split.
//
// A batch is an optimisation of the transport only. Every message in it is
// decided and settled on its own, exactly as if it had been delivered
// alone; the app's answer is turned into one retry.Outcome per message and
// the outcome table does the rest.
package batch

import (
	"strconv"

	"go.opentelemetry.io/otel/trace"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// Limits bound what one batch holds. A batch is sent when it holds
// MaxMessages, or MaxBytes of bodies, or its oldest message has waited
// MaxWait (the caller's clock).
type Limits struct {
	MaxMessages int
	MaxBytes    int
}

// Full says whether a batch of n messages holding bytes of bodies takes
// no more.
func (l Limits) Full(n, bytes int) bool {
	return n >= l.MaxMessages || (l.MaxBytes > 0 && bytes >= l.MaxBytes)
}

// Fits says whether a message of size bytes may join a batch of n messages
// holding bytes already. The first message always fits: a message larger
// than MaxBytes goes alone.
func (l Limits) Fits(n, bytes, size int) bool {
	if n == 0 {
		return true
	}
	return n < l.MaxMessages && (l.MaxBytes <= 0 || bytes+size <= l.MaxBytes)
}

// Alone says whether a message must be delivered in a request of its own:
// it carries a crash count or the crash-suspect mark, so the app may have
// died with it before. Alone, a message that kills the app is charged the
// crash itself instead of taking a whole batch down again and again.
func Alone(in msg.Info) bool { return in.Crashes > 0 || in.Suspect }

// Splits says whether a batch whose request ended with o failed as a
// whole without an answer the batch could be judged by: the request timed
// out, its connection was cut (the app crashing, or breaking the
// connection on one message), or what came back was not HTTP. Any one
// message may be the cause, so the batch is split in halves and each half
// delivered again, down to single messages, and only the message that
// fails alone is charged. An answer with a status (a 503 for the whole
// batch) applies to every message and is not split; nor is a request
// Hopper itself never sent or cut off (breaker open, shutdown).
func Splits(o retry.Outcome) bool {
	if o.Given() {
		return false
	}
	switch o.Kind {
	case retry.Timeout, retry.Cut:
		return true
	case retry.Unavailable:
		return o.Cut || o.Crashed || o.CrashSuspect
	case retry.Response:
		return o.Status == 0
	}
	return false
}

// Half is where a batch of n (n ≥ 2) is split: the first half is the
// larger one when n is odd, so the head of an ordered batch goes first.
func Half(n int) int { return (n + 1) / 2 }

// IDs gives each message of a batch the id its entry carries, unique in
// the batch: the message's own id (base(i)) as UTF-8 text (asText: a byte
// that is not UTF-8 becomes \xHH), and for a second entry with the same
// id "<id>#2", then "#3", so that every result names one entry. A JSON
// request carries text only: an id with other bytes could reach the app
// only altered, and its echo would name no entry, or two of them.
func IDs(n int, base func(i int) string) []string {
	ids := make([]string, n)
	seen := make(map[string]int, n)
	for i := range ids {
		id := asText(base(i))
		for seen[id] > 0 {
			seen[id]++
			id = id + "#" + strconv.Itoa(seen[id])
		}
		seen[id] = 1
		ids[i] = id
	}
	return ids
}

// Request is one batch on its way to the app: messages of one queue, in
// the order they were received.
type Request struct {
	Messages []*msg.Message
	Infos    []msg.Info
	// Traces are the trace context each entry carries to the app: the
	// span of that message's attempt, so the app's work on one message
	// joins that message's trace. A zero one carries the message's own.
	Traces []trace.SpanContext
	// Alone marks the request of a message that must go alone: the app
	// may have died with it before, so no other request is in flight at
	// the app while it is.
	Alone bool
	// Split marks a request that carries part of a batch that failed as a
	// whole without an answer, sent again to find the message at fault.
	// The failed request held a slot of the concurrency limit for these
	// very messages, and its parts never carry more of them at once, so
	// the limiter lets a part through without a slot of its own: a
	// message that hangs waits out its own timeout without taking a slot
	// from the rest of the queue. What a part's answer says still counts.
	Split bool
}

// Len is the number of messages in the batch.
func (r *Request) Len() int { return len(r.Messages) }

// Answer is what came of a batch request.
type Answer struct {
	// Whole is the request's own outcome, classified as a single request's
	// would be: what the breaker, the limiter and the pacer count.
	Whole retry.Outcome
	// Entries are the outcomes of the messages, in the request's order.
	Entries []retry.Outcome
	// Unread says why the app's results body could not be read; every
	// entry is then retried.
	Unread error
}

// Classified is a with the request's outcome as a decorator of the call
// saw it: whole replaces a.Whole (a breaker that refused the request, or
// found that the app died under it), and when whole is no 2xx answer it is
// the outcome of every entry, as Read would have made it.
func Classified(a Answer, whole retry.Outcome, n int) Answer {
	a.Whole = whole
	if whole.Kind == retry.Response && whole.Status >= 200 && whole.Status <= 299 && len(a.Entries) == n {
		return a
	}
	a.Entries = make([]retry.Outcome, n)
	for i := range a.Entries {
		a.Entries[i] = whole
	}
	a.Unread = nil
	return a
}

// Unsplit is the outcome of each message of a batch that failed as a
// whole but is not split any further (it would be held too long, or Hopper
// is stopping): a crash of the app under the batch charges none of them,
// any one may have caused it; each goes back marked to be delivered on its
// own. Other failures are each message's, as a timeout of a single
// request would be.
func Unsplit(o retry.Outcome) retry.Outcome {
	if o.Crashed {
		o.Crashed, o.CrashSuspect = false, true
	}
	return o
}

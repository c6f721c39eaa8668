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
// the batch: the message's own id (base(i)), and for a second entry with
// the same id "<id>#2", then "#3", so that every result names one entry.
func IDs(n int, base func(i int) string) []string {
	ids := make([]string, n)
	seen := make(map[string]int, n)
	for i := range ids {
		id := base(i)
		for seen[id] > 0 {
			seen[id]++
			id = id + "#" + strconv.Itoa(seen[id])
		}
		seen[id] = 1
		ids[i] = id
	}
	return ids
}

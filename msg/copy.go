package msg

import (
	"time"
	"unicode/utf8"
)

// Every move publishes a copy of the delivered message: same body,
// properties and message id, with Hopper's headers updated as the kind of
// move says. The broker's x-death headers ride along as history only.
//
//	kind       x-retry-count   x-requeue-count   also written
//	retry      failed so far   unchanged         last failure time and status; first failure time once
//	requeue    unchanged       +1                –
//	give-back  unchanged       unchanged         x-hopper-crash-count when the app died with it
//	DLQ        failed, final   unchanged         original queue, reason, final status/error/count,
//	           one included                      first/last failure and dead-letter time, trace id
//	replay     kept or reset   kept or reset     replay count and time, the DLQ it came from;
//	                                             the DLQ stamp removed
//
// Every copy but a replay pins the original exchange and routing key and the
// deadline, so the app keeps seeing where the message was first published
// and a deadline never restarts.

// moved is the base of the copies the delivery loop publishes.
func moved(m *Message, in Info, retries, requeues int) *Message {
	cp := m.Clone()
	h := cp.Headers
	h[HeaderRetryCount] = int32(retries)
	h[HeaderRequeueCount] = int32(requeues)
	h[HeaderOriginalExchange] = in.Exchange
	h[HeaderOriginalRoutingKey] = in.RoutingKey
	if !in.Deadline.IsZero() {
		h[HeaderDeadline] = in.Deadline.UnixMilli()
	}
	if in.Crashes > 0 {
		h[HeaderCrashCount] = int32(in.Crashes)
	}
	return cp
}

// RetryCopy is the copy sent to a delay tier after a failed attempt:
// retries counts the failed attempts, this one included; status is the
// app's answer (0 when there was none).
func RetryCopy(m *Message, in Info, retries, status int, now time.Time) *Message {
	cp := moved(m, in, retries, in.Requeues)
	h := cp.Headers
	stamp := now.UTC().Format(time.RFC3339Nano)
	if m.String(HeaderFirstFailureTime) == "" {
		h[HeaderFirstFailureTime] = stamp
	}
	h[HeaderLastFailureTime] = stamp
	h[HeaderLastStatusCode] = int32(status)
	return cp
}

// RequeueCopy is the copy sent back to the work queue (or through a tier)
// after a 425 Too Early: requeues is the count after this one. A requeue is
// not an attempt.
func RequeueCopy(m *Message, in Info, requeues int) *Message {
	return moved(m, in, in.Retries, requeues)
}

// ReturnCopy is the copy that gives a message back to the work queue as it
// came (the app could not take it, or Hopper let go of it): no attempt or
// requeue is counted. in.Crashes is written, so a give-back after the app
// died handling the message carries the new crash count.
func ReturnCopy(m *Message, in Info) *Message {
	return moved(m, in, in.Retries, in.Requeues)
}

// KeepCopy is the copy that puts a message back at the tail of the queue it
// was read from, for a tool that must hand it back without returning it
// (see the dlq package): body, properties, message id and headers as they
// were, but not the broker's x-delivery-count, which counts the returns of
// the original; the copy was never returned. (Like every copy, it is
// published without a per-message expiration: see the broker package.)
func KeepCopy(m *Message) *Message {
	cp := m.Clone()
	delete(cp.Headers, HeaderDeliveryCount)
	return cp
}

// MaxErrorLen bounds x-final-error: the DLQ is for diagnosis, not for
// storing whole error pages.
const MaxErrorLen = 256

// DeadLetter is what is known when a message is dead-lettered.
type DeadLetter struct {
	Reason string // why: max-attempts, non-retriable, expired, ...
	Status int    // last HTTP status (0 when there was none)
	Error  string // last error or response summary
	// Retries is the number of failed attempts, the final one included.
	Retries int
	TraceID string
	Now     time.Time
}

// DLQCopy is the copy sent to the dead-letter queue, stamped with why it is
// there and where it came from.
func DLQCopy(m *Message, in Info, dl DeadLetter) *Message {
	cp := moved(m, in, dl.Retries, in.Requeues)
	h := cp.Headers
	now := dl.Now.UTC().Format(time.RFC3339Nano)
	if m.String(HeaderFirstFailureTime) == "" {
		h[HeaderFirstFailureTime] = now
	}
	h[HeaderOriginalQueue] = in.Queue
	h[HeaderFinalStatusCode] = int32(dl.Status)
	h[HeaderFinalError] = Truncate(dl.Error, MaxErrorLen)
	h[HeaderFinalRetryCount] = int32(dl.Retries)
	h[HeaderLastFailureTime] = now
	h[HeaderDeadLetterReason] = dl.Reason
	h[HeaderDeadLetterTime] = now
	if dl.TraceID != "" {
		h[HeaderTraceID] = dl.TraceID
	}
	return cp
}

// Truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

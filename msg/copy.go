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
//	park       unchanged       unchanged         the due time, and the parked mark
//	replay     kept or reset   kept or reset     replay count and time, the DLQ it came from;
//	                                             the DLQ stamp removed
//
// Every copy but a replay pins the original exchange and routing key and the
// deadline, so the app keeps seeing where the message was first published
// and a deadline never restarts.

// Counters are written as int64: a count read back saturated at MaxCount
// and then incremented still fits, where an int32 would wrap negative.

// moved is the base of the copies the delivery loop publishes.
func moved(m *Message, in Info, retries, requeues int) *Message {
	cp := m.Clone()
	h := cp.Headers
	h[HeaderRetryCount] = int64(retries)
	h[HeaderRequeueCount] = int64(requeues)
	h[HeaderOriginalExchange] = in.Exchange
	h[HeaderOriginalRoutingKey] = in.RoutingKey
	if !in.Deadline.IsZero() {
		h[HeaderDeadline] = in.Deadline.UnixMilli()
	}
	if !in.Due.IsZero() {
		// The schedule was served: the copy comes back due, whatever
		// x-delay says.
		h[HeaderDue] = in.Due.UnixMilli()
		delete(h, HeaderDelay)
	}
	delete(h, HeaderParked)
	if in.Crashes > 0 {
		h[HeaderCrashCount] = int64(in.Crashes)
	}
	if in.Suspect {
		h[HeaderCrashSuspect] = true
	} else {
		delete(h, HeaderCrashSuspect)
	}
	dropReturnCounts(h)
	KeepDeathReadable(h)
	return cp
}

// dropReturnCounts removes the quorum queue's counts of the original's
// returns: a copy is a new message that was never returned, and a count
// carried along would read as the copy's own.
func dropReturnCounts(h map[string]any) {
	delete(h, HeaderDeliveryCount)
	delete(h, HeaderAcquiredCount)
}

// HeaderInvalidDeath holds an x-death header a publisher wrote that is not
// a list of tables, set aside under this name on every copy Hopper makes.
const HeaderInvalidDeath = "x-hopper-invalid-x-death"

// KeepDeathReadable moves an x-death that is not a list of tables out of
// the way. The broker extends x-death when it dead-letters a message (a
// delay tier's TTL running out), and one it cannot read stops that
// dead-lettering: the message never comes back from the tier and the tier
// queue stalls. The value is kept, under HeaderInvalidDeath, for whoever
// wants to see what was sent.
func KeepDeathReadable(h map[string]any) {
	v, ok := h[HeaderDeath]
	if !ok {
		return
	}
	if list, isList := v.([]any); isList {
		readable := true
		for _, e := range list {
			if _, isTable := e.(map[string]any); !isTable {
				readable = false
				break
			}
		}
		if readable {
			return
		}
	}
	delete(h, HeaderDeath)
	h[HeaderInvalidDeath] = v
}

// RetryCopy is the copy sent to a delay tier after a failed attempt:
// retries counts the failed attempts, this one included; status is the
// app's answer (0 when there was none).
func RetryCopy(m *Message, in Info, retries, status int, now time.Time) *Message {
	cp := moved(m, in, retries, in.Requeues)
	RecordFailure(cp.Headers, retries, status, now)
	return cp
}

// RecordFailure writes a failed attempt into headers: the failed attempts
// so far (this one included), the last failure's time and status, and the
// first failure's time when none is recorded yet. A retry's copy carries
// them; an ordered retry held in place writes them on the delivery it
// keeps, so both paths tell the app and the DLQ the same history.
func RecordFailure(h map[string]any, retries, status int, now time.Time) {
	stamp := now.UTC().Format(time.RFC3339Nano)
	if (&Message{Headers: h}).String(HeaderFirstFailureTime) == "" {
		h[HeaderFirstFailureTime] = stamp
	}
	h[HeaderRetryCount] = int64(retries)
	h[HeaderLastFailureTime] = stamp
	h[HeaderLastStatusCode] = int64(status)
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

// ParkCopy is the copy sent to a parking queue of a message that is not
// due: no attempt or requeue is counted, and due is written so that the
// next hop starts again from it.
func ParkCopy(m *Message, in Info, due time.Time) *Message {
	in.Due = due
	cp := moved(m, in, in.Retries, in.Requeues)
	cp.Headers[HeaderParked] = true
	return cp
}

// KeepCopy is the copy that puts a message back at the tail of the queue it
// was read from, for a tool that must hand it back without returning it
// (see the dlq package): body, properties, message id and headers as they
// were, but not the broker's x-delivery-count and x-acquired-count, which
// count the returns of the original; the copy was never returned. (Like every copy, it is
// published without a per-message expiration: see the broker package.)
func KeepCopy(m *Message) *Message {
	cp := m.Clone()
	dropReturnCounts(cp.Headers)
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
	h[HeaderFinalStatusCode] = int64(dl.Status)
	h[HeaderFinalError] = Truncate(dl.Error, MaxErrorLen)
	h[HeaderFinalRetryCount] = int64(dl.Retries)
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

// Package dlq owns the dead-letter queue: the headers a message carries into
// it (why it is there, where it came from) and, for operators, the tools that
// read and recover it.
//
// A message reaches the DLQ only through a confirmed publish followed by the
// ack of the original, so at any instant it is in the work queue,
// in the DLQ, or briefly in both — never in neither.
package dlq

import (
	"time"
	"unicode/utf8"

	"github.com/hopper-sidecar/hopper/msg"
)

// MaxErrorLen bounds x-final-error: the DLQ is for diagnosis, not for
// storing whole error pages.
const MaxErrorLen = 256

// Info is what is known about a message when it is dead-lettered.
type Info struct {
	Queue      string // the work queue it was consumed from
	Exchange   string // original exchange
	RoutingKey string // original routing key
	Status     int    // last HTTP status (0 when there was none)
	Error      string // last error or response summary
	Retries    int    // failed attempts
	Reason     string // retry.Reason*
	TraceID    string
	// FirstFailure is when the message first failed (zero: now).
	FirstFailure time.Time
	Now          time.Time
}

// Mark sets the DLQ headers on m (a copy about to be published). Broker
// x-death headers stay as history; Hopper's counters are authoritative.
func Mark(m *msg.Message, in Info) {
	h := m.Headers
	first := in.FirstFailure
	if first.IsZero() {
		first = in.Now
	}
	h[msg.HeaderOriginalQueue] = in.Queue
	h[msg.HeaderOriginalExchange] = in.Exchange
	h[msg.HeaderOriginalRoutingKey] = in.RoutingKey
	h[msg.HeaderFinalStatusCode] = int32(in.Status)
	h[msg.HeaderFinalError] = Truncate(in.Error, MaxErrorLen)
	h[msg.HeaderFinalRetryCount] = int32(in.Retries)
	h[msg.HeaderFirstFailureTime] = first.UTC().Format(time.RFC3339Nano)
	h[msg.HeaderLastFailureTime] = in.Now.UTC().Format(time.RFC3339Nano)
	h[msg.HeaderDeadLetterReason] = in.Reason
	h[msg.HeaderDeadLetterTime] = in.Now.UTC().Format(time.RFC3339Nano)
	if in.TraceID != "" {
		h[msg.HeaderTraceID] = in.TraceID
	}
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

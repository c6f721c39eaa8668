package dlq

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// The operator tools (stats, peek, replay, export, import, purge) see the
// broker only through the interfaces below, so that their logic — filters,
// bounds, accounting, the JSON Lines encoding — is tested without one. The
// cmd/hopper wiring backs them with the broker package.
//
// A message taken from the DLQ is in one of three states during a run:
//
//	taken ─(replayed: copy published and confirmed)→ acked: gone from the DLQ
//	  │
//	  └─(filtered out, kept, publish failed, dry run, browse)→ held unacked
//	                                    until the run ends, then returned in place
//
// Holding instead of requeueing at once is what bounds a run: a requeued
// message would be delivered again at the head of the queue and processed
// twice. Nothing is acked before its copy is confirmed (or, for export
// --remove, before its line is on disk), so killing a tool at any point
// loses nothing: the broker takes back every unacked message.

// Delivery is one message taken from the DLQ. It is settled at most once,
// on the channel it came from.
type Delivery interface {
	Message() *msg.Message
	Ack() error
	Nack(requeue bool) error
}

// Source hands out the DLQ's messages, oldest first, without requeueing
// any before the run ends.
type Source interface {
	// Next returns the next message. ok is false when ctx ends before one
	// is ready; an error means the source is gone (connection lost), and
	// every message it handed out and did not settle is back in the DLQ.
	Next(ctx context.Context) (d Delivery, ok bool, err error)
}

// SourceFunc adapts a function to a Source.
type SourceFunc func(ctx context.Context) (Delivery, bool, error)

// Next calls f.
func (f SourceFunc) Next(ctx context.Context) (Delivery, bool, error) { return f(ctx) }

// Publisher publishes a copy of a message and returns nil only once the
// broker has confirmed it (and did not return it as unroutable).
type Publisher interface {
	PublishTo(ctx context.Context, exchange, key string, m *msg.Message) error
}

// Unknown labels a message whose original queue, reason or status is not
// in its headers, in stats and summaries.
const Unknown = "(unknown)"

// headerString is the string form of a scalar header value, as filters
// compare it. ok is false for tables, arrays and void.
func headerString(v any) (string, bool) {
	if b, ok := v.([]byte); ok {
		return string(b), true
	}
	if str, ok := msg.Scalar(v); ok {
		return str, true
	}
	if d, ok := v.(msg.Decimal); ok {
		return d.String(), true
	}
	return "", false
}

// orUnknown labels an empty key.
func orUnknown(s string) string {
	if s == "" {
		return Unknown
	}
	return s
}

// statusKey is the status a message is counted under.
func statusKey(m *msg.Message) string {
	if s, ok := msg.FinalStatus(m); ok {
		return strconv.Itoa(s)
	}
	return Unknown
}

// formatAge renders a duration for people: the two largest units.
func formatAge(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%02dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}

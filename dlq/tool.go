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

// Headers the tools add to a replayed copy.
const (
	// HeaderReplayCount counts how many times a message was replayed from a
	// DLQ. Hopper carries it through retries and back into the DLQ, so
	// ReplayOptions.MaxReplays can stop a message that fails for ever from
	// being replayed for ever, growing the DLQ on every pass.
	HeaderReplayCount = "x-replay-count"
	// HeaderReplayTime is when it was last replayed (RFC 3339).
	HeaderReplayTime = "x-last-replay-time"
	// HeaderReplayedFrom names the DLQ it was last replayed from.
	HeaderReplayedFrom = "x-replayed-from"
)

// HeaderDeliveryCount is set by quorum queues on a message returned to
// them: how many times it was delivered and returned.
const HeaderDeliveryCount = "x-delivery-count"

// Unknown labels a message whose original queue, reason or status is not
// in its headers, in stats and summaries.
const Unknown = "(unknown)"

// OriginalQueue is where a dead-lettered message came from, or "": the
// queue Hopper stamped, else the queue the broker dead-lettered it from.
func OriginalQueue(m *msg.Message) string {
	if q := m.String(msg.HeaderOriginalQueue); q != "" {
		return q
	}
	if d := lastDeath(m); d.queue != "" {
		return d.queue
	}
	return m.String(HeaderFirstDeathQueue)
}

// Reason is why the message is in the DLQ, or "": Hopper's
// x-dead-letter-reason, else the reason of the broker's own dead-lettering
// (delivery_limit, expired, maxlen, rejected).
func Reason(m *msg.Message) string {
	if r := m.String(msg.HeaderDeadLetterReason); r != "" {
		return r
	}
	if d := lastDeath(m); d.reason != "" {
		return d.reason
	}
	return m.String(HeaderFirstDeathReason)
}

// Headers the broker writes when it dead-letters a message itself. x-death
// holds one entry per queue and reason, the most recent first; the
// x-first-death-* headers describe the oldest, which for a message that
// went through a delay tier is the tier's expiry, not what brought it here.
const (
	HeaderDeath              = "x-death"
	HeaderFirstDeathQueue    = "x-first-death-queue"
	HeaderFirstDeathReason   = "x-first-death-reason"
	HeaderFirstDeathExchange = "x-first-death-exchange"
)

// BrokerReasons are the reasons the broker writes when it dead-letters a
// message itself.
var BrokerReasons = []string{"delivery_limit", "expired", "maxlen", "rejected"}

type death struct {
	queue, reason, exchange, routingKey string
	ok                                  bool
}

// lastDeath reads the most recent x-death entry: the dead-lettering that
// put the message where it is now.
func lastDeath(m *msg.Message) death {
	list, ok := m.Headers[HeaderDeath].([]any)
	if !ok || len(list) == 0 {
		return death{}
	}
	e, ok := list[0].(map[string]any)
	if !ok {
		return death{}
	}
	str := func(k string) string {
		switch v := e[k].(type) {
		case string:
			return v
		case []byte:
			return string(v)
		}
		return ""
	}
	d := death{queue: str("queue"), reason: str("reason"), exchange: str("exchange"), ok: true}
	if keys, ok := e["routing-keys"].([]any); ok && len(keys) > 0 {
		switch k := keys[0].(type) {
		case string:
			d.routingKey = k
		case []byte:
			d.routingKey = string(k)
		}
	}
	return d
}

// Origin is the exchange and routing key the message was first published
// with: the ones Hopper pinned, else those recorded by the broker's
// dead-lettering, else the ones it was delivered with; ok is false in the
// last case. A message the broker dead-lettered is delivered from the DLQ
// with the DLQ's routing key, so x-death is the only record of where it was
// going.
func Origin(m *msg.Message) (exchange, routingKey string, ok bool) {
	if _, ok := m.Headers[msg.HeaderOriginalRoutingKey]; ok {
		return m.String(msg.HeaderOriginalExchange), m.String(msg.HeaderOriginalRoutingKey), true
	}
	if d := lastDeath(m); d.ok {
		return d.exchange, d.routingKey, true
	}
	return m.Exchange, m.RoutingKey, false
}

// Status is the message's x-final-status-code; ok is false without one.
func Status(m *msg.Message) (int, bool) {
	n, ok := m.Int(msg.HeaderFinalStatusCode)
	return int(n), ok
}

// RoutingKey is the routing key the message was first published with: the
// one Hopper pinned in x-original-routing-key, else the one it was
// delivered with.
func RoutingKey(m *msg.Message) string {
	_, rk, _ := Origin(m)
	return rk
}

// DeadLetterTime is when the message entered the DLQ: x-dead-letter-time
// when Hopper put it there, else its AMQP timestamp. ok is false when
// neither is known.
func DeadLetterTime(m *msg.Message) (time.Time, bool) {
	switch v := m.Headers[msg.HeaderDeadLetterTime].(type) {
	case string:
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			return t, true
		}
	case []byte:
		if t, err := time.Parse(time.RFC3339Nano, string(v)); err == nil {
			return t, true
		}
	case time.Time:
		return v, true
	}
	if !m.Timestamp.IsZero() {
		return m.Timestamp, true
	}
	return time.Time{}, false
}

// ReplayCount is the message's x-replay-count (0 when never replayed).
func ReplayCount(m *msg.Message) int {
	n, _ := m.Int(HeaderReplayCount)
	return int(max(n, 0))
}

// headerString is the string form of a scalar header value, as filters
// compare it. ok is false for tables, arrays and void.
func headerString(v any) (string, bool) {
	if b, ok := v.([]byte); ok {
		return string(b), true
	}
	if str, ok := msg.Scalar(v); ok {
		return str, true
	}
	if d, ok := asDecimal(v); ok {
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
	if s, ok := Status(m); ok {
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

package msg_test

import (
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// A message the broker dead-lettered from the work queue itself (a quorum
// delivery limit) after it had gone through a delay tier: the DLQ tools
// read the most recent x-death entry, not the tier's expiry.
func TestBrokerDeadLetteredMessage(t *testing.T) {
	m := &msg.Message{
		Exchange: "", RoutingKey: "orders.dlq",
		Headers: map[string]any{
			msg.HeaderDeath: []any{
				map[string]any{"queue": "orders", "reason": "delivery_limit", "exchange": "shop",
					"routing-keys": []any{"order.created"}, "count": int64(1)},
				map[string]any{"queue": "orders.retry.1s", "reason": "expired", "exchange": "",
					"routing-keys": []any{"orders.retry.1s"}, "count": int64(1)},
			},
			msg.HeaderFirstDeathQueue:  "orders.retry.1s",
			msg.HeaderFirstDeathReason: "expired",
		},
	}
	if q := msg.OriginalQueue(m); q != "orders" {
		t.Errorf("OriginalQueue = %q, want orders", q)
	}
	if r := msg.DeadLetterReason(m); r != "delivery_limit" {
		t.Errorf("Reason = %q, want delivery_limit", r)
	}
	if ex, rk, ok := msg.Origin(m); ex != "shop" || rk != "order.created" || !ok {
		t.Errorf("Origin = %q %q %v", ex, rk, ok)
	}
	if rk := msg.OriginalRoutingKey(m); rk != "order.created" {
		t.Errorf("RoutingKey = %q", rk)
	}
	cp := msg.ReplayCopy(m, "orders.dlq", time.Now(), false, false)
	if cp.String(msg.HeaderOriginalRoutingKey) != "order.created" || cp.String(msg.HeaderOriginalExchange) != "shop" {
		t.Errorf("replay copy does not pin the origin: %v", cp.Headers)
	}

	// Only the x-first-death-* headers (a client that strips x-death).
	m2 := &msg.Message{Headers: map[string]any{msg.HeaderFirstDeathQueue: "orders", msg.HeaderFirstDeathReason: "maxlen"}}
	if msg.OriginalQueue(m2) != "orders" || msg.DeadLetterReason(m2) != "maxlen" {
		t.Errorf("first-death fallback: %q %q", msg.OriginalQueue(m2), msg.DeadLetterReason(m2))
	}

	// Hopper's own stamp wins over the broker's history.
	m3 := &msg.Message{RoutingKey: "orders.dlq", Headers: map[string]any{
		msg.HeaderOriginalQueue: "orders", msg.HeaderDeadLetterReason: "max-attempts",
		msg.HeaderOriginalRoutingKey: "order.paid", msg.HeaderOriginalExchange: "shop",
		msg.HeaderDeath: m.Headers[msg.HeaderDeath],
	}}
	if msg.DeadLetterReason(m3) != "max-attempts" || msg.OriginalRoutingKey(m3) != "order.paid" {
		t.Errorf("hopper stamp: %q %q", msg.DeadLetterReason(m3), msg.OriginalRoutingKey(m3))
	}

	// A foreign message with no history: no origin to pin.
	cp = msg.ReplayCopy(&msg.Message{RoutingKey: "orders.dlq", Headers: map[string]any{}}, "orders.dlq", time.Now(), false, false)
	if _, ok := cp.Headers[msg.HeaderOriginalRoutingKey]; ok {
		t.Errorf("a message without history got an origin: %v", cp.Headers)
	}
}

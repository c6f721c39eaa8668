package dlq

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
			HeaderDeath: []any{
				map[string]any{"queue": "orders", "reason": "delivery_limit", "exchange": "shop",
					"routing-keys": []any{"order.created"}, "count": int64(1)},
				map[string]any{"queue": "orders.retry.1s", "reason": "expired", "exchange": "",
					"routing-keys": []any{"orders.retry.1s"}, "count": int64(1)},
			},
			HeaderFirstDeathQueue:  "orders.retry.1s",
			HeaderFirstDeathReason: "expired",
		},
	}
	if q := OriginalQueue(m); q != "orders" {
		t.Errorf("OriginalQueue = %q, want orders", q)
	}
	if r := Reason(m); r != "delivery_limit" {
		t.Errorf("Reason = %q, want delivery_limit", r)
	}
	if ex, rk, ok := Origin(m); ex != "shop" || rk != "order.created" || !ok {
		t.Errorf("Origin = %q %q %v", ex, rk, ok)
	}
	if rk := RoutingKey(m); rk != "order.created" {
		t.Errorf("RoutingKey = %q", rk)
	}
	cp := ReplayCopy(m, "orders.dlq", time.Now(), false, false)
	if cp.String(msg.HeaderOriginalRoutingKey) != "order.created" || cp.String(msg.HeaderOriginalExchange) != "shop" {
		t.Errorf("replay copy does not pin the origin: %v", cp.Headers)
	}

	// Only the x-first-death-* headers (a client that strips x-death).
	m2 := &msg.Message{Headers: map[string]any{HeaderFirstDeathQueue: "orders", HeaderFirstDeathReason: "maxlen"}}
	if OriginalQueue(m2) != "orders" || Reason(m2) != "maxlen" {
		t.Errorf("first-death fallback: %q %q", OriginalQueue(m2), Reason(m2))
	}

	// Hopper's own stamp wins over the broker's history.
	m3 := &msg.Message{RoutingKey: "orders.dlq", Headers: map[string]any{
		msg.HeaderOriginalQueue: "orders", msg.HeaderDeadLetterReason: "max-attempts",
		msg.HeaderOriginalRoutingKey: "order.paid", msg.HeaderOriginalExchange: "shop",
		HeaderDeath: m.Headers[HeaderDeath],
	}}
	if Reason(m3) != "max-attempts" || RoutingKey(m3) != "order.paid" {
		t.Errorf("hopper stamp: %q %q", Reason(m3), RoutingKey(m3))
	}

	// A foreign message with no history: no origin to pin.
	cp = ReplayCopy(&msg.Message{RoutingKey: "orders.dlq", Headers: map[string]any{}}, "orders.dlq", time.Now(), false, false)
	if _, ok := cp.Headers[msg.HeaderOriginalRoutingKey]; ok {
		t.Errorf("a message without history got an origin: %v", cp.Headers)
	}
}

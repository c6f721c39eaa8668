package broker

import (
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/msg"
)

func TestFromDeliveryConvertsTheClientsTypes(t *testing.T) {
	death := amqp.Table{"count": int64(1), "queue": "work.retry.1s", "routing-keys": []any{"work"}, "time": time.Unix(1700000000, 0)}
	d := &amqp.Delivery{
		MessageId: "m-1",
		Body:      []byte("x"),
		Headers: amqp.Table{
			"x-death":       []any{death},
			"nested":        amqp.Table{"price": amqp.Decimal{Scale: 2, Value: 1999}, "list": []any{amqp.Table{}, "s"}},
			"plain":         "v",
			headerPublishID: int64(7),
		},
	}
	m := fromDelivery(d)
	want := map[string]any{
		"x-death": []any{map[string]any{"count": int64(1), "queue": "work.retry.1s", "routing-keys": []any{"work"}, "time": time.Unix(1700000000, 0)}},
		"nested":  map[string]any{"price": msg.Decimal{Scale: 2, Value: 1999}, "list": []any{map[string]any{}, "s"}},
		"plain":   "v",
	}
	if !reflect.DeepEqual(m.Headers, want) {
		t.Errorf("headers %#v\nwant %#v", m.Headers, want)
	}
	// Back to the client's types for a copy's publish.
	back := toTable(m.Headers)
	if _, ok := back["nested"].(amqp.Table)["price"].(amqp.Decimal); !ok {
		t.Errorf("nested decimal published as %T", back["nested"].(amqp.Table)["price"])
	}
	if _, ok := back["x-death"].([]any)[0].(amqp.Table); !ok {
		t.Errorf("x-death entry published as %T", back["x-death"].([]any)[0])
	}
	if err := back.Validate(); err != nil {
		t.Errorf("published headers: %v", err)
	}
	if m := fromDelivery(&amqp.Delivery{}); m.Headers == nil || len(m.Headers) != 0 {
		t.Errorf("no headers: %#v, want an empty map", m.Headers)
	}
}

// TestDeliveryWithoutHeaders: a delivery without headers reaches the
// delivery loop with nil headers (no map allocated for each such
// message), while the tools that read a queue's messages get an empty
// map they may write into; the publisher's own bookkeeping header is
// taken out either way.
func TestDeliveryWithoutHeaders(t *testing.T) {
	d := amqp.Delivery{DeliveryTag: 7, MessageId: "m"}
	if got := newDelivery(&d, nil); got.Message().Headers != nil || got.Tag() != 7 || got.Message().MessageID != "m" {
		t.Fatalf("consumer delivery: headers %v, tag %d, id %q", got.Message().Headers, got.Tag(), got.Message().MessageID)
	}
	if m := fromDelivery(&d); m.Headers == nil || len(m.Headers) != 0 {
		t.Fatalf("tool message headers %#v, want an empty map", m.Headers)
	}
	d.Headers = amqp.Table{headerPublishID: "x", "k": "v"}
	if h := newDelivery(&d, nil).Message().Headers; len(h) != 1 || h["k"] != "v" {
		t.Fatalf("headers %v, want only k", h)
	}
}

package config_test

import (
	"testing"
)

func TestOrderingKeyValidation(t *testing.T) {
	cases := []validationCase{
		{"consumer: {orderingKey: routingKey}", ""},
		{"consumer: {orderingKey: 'header:customer-id', prefetch: 100, workers: 16}", ""},
		{"consumer: {orderingKey: 'messageId:/'}", ""},
		{"consumer: {orderingKey: customer}", "consumer.orderingKey: unknown ordering key \"customer\""},
		{"consumer: {orderingKey: 'header:'}", "consumer.orderingKey: \"header:\" names no header"},
		{"consumer: {orderingKey: routingKey, ordered: true}", "consumer.orderingKey: consumer.ordered already orders the whole queue"},
		{"consumer: {orderingKey: type, batch: {maxMessages: 8}}", "consumer.orderingKey: ordering keys and batch delivery"},
	}
	checkValidation(t, cases)
}

// A subscription's orderingKey replaces the top-level one, and is checked
// with the subscription's path.
func TestOrderingKeyPerSubscription(t *testing.T) {
	cfg, err := parse(t, `
consumer: {orderingKey: routingKey}
subscriptions:
  - queue: {name: a}
  - queue: {name: b}
    consumer: {orderingKey: "header:tenant"}
  - queue: {name: c}
    consumer: {orderingKey: ""}
`)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	subs := cfg.SubscriptionConfigs()
	got := []string{subs[0].Consumer.OrderingKey, subs[1].Consumer.OrderingKey, subs[2].Consumer.OrderingKey}
	if got[0] != "routingKey" || got[1] != "header:tenant" || got[2] != "" {
		t.Fatalf("effective ordering keys %q", got)
	}
	bad, err := parse(t, `
subscriptions:
  - queue: {name: a}
    consumer: {orderingKey: "nope"}
`)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, bad.Validate(), "subscriptions[0].consumer.orderingKey: unknown ordering key")
}

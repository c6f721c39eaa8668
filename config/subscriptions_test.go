package config_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/hopper-sidecar/hopper/config"
)

// twoQueues is the seed-style topology: one fanout exchange, a queue per
// service, each with its own path; billing retries less and faster.
const twoQueues = `
app:
  url: http://127.0.0.1:8080/events?v=1
queue:
  type: quorum
topology:
  bindings:
    - exchange: wms.main-exchange
      type: fanout
consumer:
  prefetch: 40
  workers: 20
retry:
  maxAttempts: 7
  outcomes: {"404": retry}
subscriptions:
  - queue: {name: wms.queue.billing}
    path: /billing/{routingKey}
    consumer: {workers: 5}
    retry:
      maxAttempts: 3
      tiers: ["2s", "1m"]
      outcomes: {"409": dlq}
  - queue: {name: wms.queue.shipping, type: classic}
    bindings:
      - exchange: wms.shipping
        type: direct
        routingKeys: [shipped]
    consumer: {ordered: true}
`

// Each subscription is the top-level config with its own keys laid over
// it, key by key; what it leaves out is inherited.
func TestSubscriptionsInherit(t *testing.T) {
	c, err := parse(t, twoQueues)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	subs := c.SubscriptionConfigs()
	if len(subs) != 2 {
		t.Fatalf("%d subscription configs, want 2", len(subs))
	}
	b, s := subs[0], subs[1]

	if b.Queue.Name != "wms.queue.billing" || b.Queue.Type != "quorum" {
		t.Errorf("billing queue %+v: want its own name and the inherited quorum type", b.Queue)
	}
	if s.Queue.Type != "classic" {
		t.Errorf("shipping queue type %q, want its own classic", s.Queue.Type)
	}
	if b.App.URL != "http://127.0.0.1:8080/billing/{routingKey}" {
		t.Errorf("billing URL %q: the path replaces app.url's path and query", b.App.URL)
	}
	if s.App.URL != c.App.URL {
		t.Errorf("shipping URL %q, want the inherited %q", s.App.URL, c.App.URL)
	}
	if b.Consumer.Prefetch != 40 || b.Consumer.Workers != 5 || b.Consumer.Ordered {
		t.Errorf("billing consumer %+v: want prefetch 40 inherited, workers 5 its own", b.Consumer)
	}
	if !s.Consumer.Ordered || s.Consumer.Workers != 20 {
		t.Errorf("shipping consumer %+v: want ordered, workers inherited", s.Consumer)
	}
	if b.Retry.MaxAttempts != 3 || s.Retry.MaxAttempts != 7 {
		t.Errorf("maxAttempts billing %d shipping %d, want 3 and the inherited 7", b.Retry.MaxAttempts, s.Retry.MaxAttempts)
	}
	if got := b.AllTiers(); !slices.Equal(got, []time.Duration{2 * time.Second, time.Minute}) {
		t.Errorf("billing tiers %v", got)
	}
	if !slices.Equal(s.AllTiers(), c.AllTiers()) {
		t.Errorf("shipping tiers %v, want the inherited %v", s.AllTiers(), c.AllTiers())
	}
	if b.Retry.Outcomes["404"] != "retry" || b.Retry.Outcomes["409"] != "dlq" {
		t.Errorf("billing outcomes %v: its own laid over the inherited ones", b.Retry.Outcomes)
	}
	if _, ok := c.Retry.Outcomes["409"]; ok {
		t.Error("a subscription's outcomes leaked into the top-level map")
	}
	if len(b.Topology.Bindings) != 1 || b.Topology.Bindings[0].Exchange != "wms.main-exchange" {
		t.Errorf("billing bindings %+v, want the inherited fanout", b.Topology.Bindings)
	}
	if len(s.Topology.Bindings) != 1 || s.Topology.Bindings[0].Exchange != "wms.shipping" {
		t.Errorf("shipping bindings %+v, want its own", s.Topology.Bindings)
	}
	if b.Multi() || s.Multi() {
		t.Error("a subscription's config still lists subscriptions")
	}
}

// Without subscriptions the one queue is the config itself.
func TestSingleQueueIsOneSubscription(t *testing.T) {
	c := valid()
	subs := c.SubscriptionConfigs()
	if len(subs) != 1 || subs[0].Queue.Name != "orders" || subs[0].App.URL != c.App.URL {
		t.Fatalf("single-queue config gave %d configs (%+v)", len(subs), subs)
	}
}

// Problems inside a subscription are reported under its own key path, once;
// an inherited problem is reported once, under the top-level key.
func TestSubscriptionErrors(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []string
		not       []string
	}{
		{"both queue.name and subscriptions", `
queue: {name: orders}
subscriptions: [{queue: {name: a}}]`, []string{"queue.name: set either queue.name (one queue) or subscriptions (several), not both"}, nil},
		{"neither", `{}`, []string{"queue.name: required"}, nil},
		{"missing name", `
subscriptions: [{queue: {name: a}}, {path: /x}]`, []string{"subscriptions[1].queue.name: required"}, nil},
		{"duplicate queue", `
subscriptions: [{queue: {name: a}}, {queue: {name: a}}]`, []string{`subscriptions[1].queue.name: queue "a" is already used by subscriptions[0].queue.name`}, nil},
		{"shared DLQ", `
topology: {dlq: all.dlq}
subscriptions: [{queue: {name: a}}, {queue: {name: b}}]`, []string{`subscriptions[1].queue.name: its DLQ "all.dlq" is already used`}, nil},
		{"own keys", `
subscriptions:
  - queue: {name: a, type: fifo}
    path: billing
    consumer: {prefetch: -1}
    retry: {tiers: ["5s", "1s"], onExpired: keep, outcomes: {"999": retry}}
    bindings: [{exchange: ex, type: topic}]`, []string{
			`subscriptions[0].queue.type: must be classic, quorum or stream, got "fifo"`,
			`subscriptions[0].path: must start with /, got "billing"`,
			`subscriptions[0].consumer.prefetch: must be between 1 and 65535, or 0 to follow the concurrency limit; got -1`,
			`subscriptions[0].retry.tiers[1]: tiers must be in increasing order`,
			`subscriptions[0].retry.onExpired: must be dlq or drop, got "keep"`,
			`subscriptions[0].retry.outcomes`,
			`subscriptions[0].bindings[0].routingKeys`,
		}, nil},
		{"inherited problem once", `
consumer: {prefetch: -1}
subscriptions: [{queue: {name: a}}, {queue: {name: b}}]`, []string{"consumer.prefetch: must be between 1 and 65535"},
			[]string{"subscriptions[0].consumer.prefetch", "subscriptions[1].consumer.prefetch"}},
		{"exchange shared unlike", `
subscriptions:
  - queue: {name: a}
    bindings: [{exchange: events, type: fanout}]
  - queue: {name: b}
    bindings: [{exchange: events, type: fanout, durable: false}]
  - queue: {name: c}
    bindings: [{exchange: events, type: topic, routingKeys: ["#"]}]`, []string{
			`subscriptions[1].bindings: exchange "events" is bound as type=fanout durable=false, but subscriptions[0] binds it as type=fanout durable=true`,
			`subscriptions[2].bindings: exchange "events" is bound as type=topic durable=true, but subscriptions[0]`,
		}, nil},
		{"classic tiers inherited by a quorum subscription", `
queue: {tierType: classic}
subscriptions: [{queue: {name: a}}, {queue: {name: b, type: quorum}}]`, []string{
			"subscriptions[1].queue.tierType: classic tiers would hand a quorum work queue's retries back at most once",
		}, []string{"subscriptions[0].queue.tierType"}},
		{"unknown key", `
subscriptions: [{queue: {name: a}, prefetch: 3}]`, []string{"subscriptions[0].prefetch: unknown key"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parse(t, tc.doc)
			if err == nil {
				err = c.Validate()
			}
			mustContain(t, err, tc.want...)
			for _, n := range tc.not {
				if err != nil && strings.Contains(err.Error(), n) {
					t.Errorf("error mentions %q:\n%v", n, err)
				}
			}
		})
	}
}

// A config with subscriptions survives a YAML round trip.
func TestSubscriptionsRoundTrip(t *testing.T) {
	c, err := parse(t, twoQueues)
	if err != nil {
		t.Fatal(err)
	}
	again := config.Default()
	out, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := config.Parse(out, &again); err != nil {
		t.Fatalf("marshalled config does not parse back: %v\n%s", err, out)
	}
	if len(again.Subscriptions) != 2 || *again.Subscriptions[0].Retry.MaxAttempts != 3 || !*again.Subscriptions[1].Consumer.Ordered {
		t.Fatalf("round trip lost subscription keys:\n%s", out)
	}
}

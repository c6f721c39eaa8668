package topology_test

import (
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/topology"
)

// A partition's plan: its own work queue with a single active consumer and
// its own tiers that return to it, the shared DLQ, the hash exchange it is
// bound to with weight 1, and the operator's exchange bound to the hash
// exchange instead of a queue.
func TestPartitionPlan(t *testing.T) {
	c := config.Default()
	c.Queue.Name = "orders"
	c.Retry.Tiers = []config.Duration{config.Duration(5e9)}
	c.Topology.Partitions = config.Partitions{Count: 2, HashOn: "header:customer"}
	c.Topology.Bindings = []config.Binding{{Exchange: "shop", Type: "topic", RoutingKeys: []string{"order.*"}}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	cs := c.Consumed()
	p := topology.FromConfig(&cs[1])
	if p.Work.Name != "orders.p1" || p.Work.Args["x-single-active-consumer"] != true {
		t.Errorf("work %s %v", p.Work.Name, p.Work.Args)
	}
	if p.Work.Args["x-dead-letter-routing-key"] != "orders.dlq" || p.DLQ.Name != "orders.dlq" {
		t.Errorf("dlq %s, work dead-letters to %v", p.DLQ.Name, p.Work.Args["x-dead-letter-routing-key"])
	}
	if len(p.Tiers) != 1 || p.Tiers[0].Name != "orders.p1.retry.5s" || p.Tiers[0].Args["x-dead-letter-routing-key"] != "orders.p1" {
		t.Errorf("tiers %+v", p.Tiers)
	}
	if !p.Partitioned() || len(p.Exchanges) != 2 {
		t.Fatalf("exchanges %+v", p.Exchanges)
	}
	if e := p.Exchanges[0]; e.Name != "orders.partitions" || e.Type != "x-consistent-hash" || !e.Durable || e.Args["hash-header"] != "customer" {
		t.Errorf("hash exchange %+v", e)
	}
	want := []topology.Binding{
		{Exchange: "orders.partitions", Queue: "orders.p1", RoutingKey: "1"},
		{Exchange: "shop", ToExchange: "orders.partitions", RoutingKey: "order.*"},
	}
	if len(p.Bindings) != len(want) {
		t.Fatalf("bindings %+v", p.Bindings)
	}
	for i := range want {
		if b := p.Bindings[i]; b.Exchange != want[i].Exchange || b.Queue != want[i].Queue || b.ToExchange != want[i].ToExchange || b.RoutingKey != want[i].RoutingKey {
			t.Errorf("binding %d: %+v, want %+v", i, b, want[i])
		}
	}
	text := p.String()
	for _, s := range []string{"exchange orders.partitions type=x-consistent-hash durable=true hash-header=customer",
		"rabbitmq-plugins enable rabbitmq_consistent_hash_exchange", "binding shop -> exchange orders.partitions", `binding orders.partitions -> orders.p1 routingKey="1"`} {
		if !strings.Contains(text, s) {
			t.Errorf("plan text lacks %q:\n%s", s, text)
		}
	}
	// Unpartitioned, the same config binds the queue itself.
	c.Topology.Partitions.Count = 0
	if p := topology.FromConfig(&c); p.Partitioned() || p.Bindings[0].Queue != "orders" || p.Work.Args["x-single-active-consumer"] != nil {
		t.Errorf("unpartitioned plan %+v", p)
	}
}

func TestPartitionExchangeOfQueue(t *testing.T) {
	for q, want := range map[string]string{"orders.p0": "orders.partitions", "a.b.p63": "a.b.partitions", "orders.p64": "", "orders.p": "",
		"orders.p01": "", "orders": "", "orders.px": "", ".p1": "", "orders.p-1": ""} {
		got, ok := topology.PartitionExchange(q)
		if got != want || ok != (want != "") {
			t.Errorf("%q: %q %t, want %q", q, got, ok, want)
		}
	}
}

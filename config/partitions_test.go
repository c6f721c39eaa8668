package config_test

import (
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/config"
)

// Bad partition settings are reported under their key path, each with
// what is accepted.
func TestPartitionsValidation(t *testing.T) {
	for _, tc := range []struct {
		doc, want string
	}{
		{"topology:\n  partitions:\n    count: 65\n", "topology.partitions.count: must be between 0 (off) and 64, got 65"},
		{"topology:\n  partitions:\n    count: -1\n", "topology.partitions.count: must be between 0 (off) and 64, got -1"},
		{"topology:\n  partitions:\n    count: 4\n    hashOn: key\n", `topology.partitions.hashOn: must be routingKey or header:NAME, got "key"`},
		{"topology:\n  partitions:\n    count: 4\n    hashOn: 'header:'\n", "topology.partitions.hashOn: header: needs the header's name"},
		{"subscriptions:\n- queue: {name: a}\n  partitions: {count: 100}\n", "subscriptions[0].partitions.count: must be between 0 (off) and 64, got 100"},
		{"topology:\n  retryQueue: 'wms.retry.{delay}'\n  partitions:\n    count: 4\n", `topology.retryQueue: with topology.partitions each partition needs tier queues of its own`},
	} {
		c, err := parse(t, "queue:\n  name: orders\n"+tc.doc)
		if strings.HasPrefix(tc.doc, "subscriptions") {
			c, err = parse(t, tc.doc)
		}
		if err != nil {
			t.Fatalf("%q: parse: %v", tc.doc, err)
		}
		verr := c.Validate()
		if verr == nil || !strings.Contains(verr.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.doc, verr, tc.want)
		}
	}
	for _, doc := range []string{
		"queue:\n  name: orders\ntopology:\n  partitions:\n    count: 64\n    hashOn: header:customer-id\n",
		"queue:\n  name: orders\ntopology:\n  partitions:\n    count: 1\n",
	} {
		c, err := parse(t, doc)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%q: %v", doc, err)
		}
	}
}

// A partitioned queue is consumed as one queue per partition, each with the
// subscription's consumer and retry settings, its own tiers by name and
// the one DLQ named from the partitioned queue; an unpartitioned
// subscription beside it stays one queue.
func TestConsumedExpandsPartitions(t *testing.T) {
	c, err := parse(t, `subscriptions:
- queue: {name: orders}
  partitions: {count: 3, hashOn: "header:customer"}
  consumer: {ordered: true}
  retry: {maxAttempts: 4}
- queue: {name: audit}
`)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	got := c.Consumed()
	var names []string
	for _, e := range got {
		names = append(names, e.Queue.Name)
	}
	if strings.Join(names, " ") != "orders.p0 orders.p1 orders.p2 audit" {
		t.Fatalf("consumed %v", names)
	}
	for _, e := range got[:3] {
		if e.Topology.PartitionOf != "orders" || e.Topology.DLQ != "orders.dlq" || !e.Consumer.Ordered || e.Retry.MaxAttempts != 4 ||
			e.Topology.Partitions.HashHeader() != "customer" {
			t.Errorf("%s: partitionOf=%q dlq=%q ordered=%t maxAttempts=%d header=%q", e.Queue.Name, e.Topology.PartitionOf,
				e.Topology.DLQ, e.Consumer.Ordered, e.Retry.MaxAttempts, e.Topology.Partitions.HashHeader())
		}
	}
	if a := got[3]; a.Topology.PartitionOf != "" || a.Topology.Partitions.On() || a.Consumer.Ordered {
		t.Errorf("audit inherited the partitions of orders: %+v", a.Topology)
	}
	// A queue another subscription names as a partition is refused.
	c.Subscriptions[1].Queue.Name = "orders.p1"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `subscriptions[1].queue.name: queue "orders.p1" is already used by subscriptions[0]`) {
		t.Errorf("a subscription on a partition queue: %v", err)
	}
}

func TestPartitionNames(t *testing.T) {
	if q, x := config.PartitionQueue("orders", 7), config.PartitionExchange("orders"); q != "orders.p7" || x != "orders.partitions" {
		t.Errorf("%s %s", q, x)
	}
}

package main_test

import (
	"strings"
	"testing"
)

// topology plan prints the partitions: the hash exchange, every partition
// queue with its own tiers, the one DLQ and the bindings.
func TestTopologyPlanPartitions(t *testing.T) {
	cfg := configFile(t, `queue: {name: orders}
retry: {tiers: [5s]}
topology:
  partitions: {count: 3, hashOn: "header:customer"}
  bindings: [{exchange: shop, type: topic, routingKeys: ["order.#"]}]
`)
	r := hopper(t, "topology", "plan", "--config", cfg)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	for _, want := range []string{
		`== queue "orders.p0" ==`, `== queue "orders.p2" ==`,
		"work  orders.p1 durable=true", "x-single-active-consumer=true",
		"tier  orders.p2.retry.5s", "x-dead-letter-routing-key=orders.p2",
		"dlq   orders.dlq",
		"exchange orders.partitions type=x-consistent-hash durable=true hash-header=customer",
		`binding orders.partitions -> orders.p1 routingKey="1"`,
		"binding shop -> exchange orders.partitions",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("plan lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "orders.p3") || strings.Contains(r.stdout, "binding shop -> orders\n") {
		t.Errorf("plan has a fourth partition or binds the unpartitioned queue:\n%s", r.stdout)
	}
}

// Without the consistent-hash plugin, apply and run stop with an error
// that gives the command enabling it, and run does not wait for it.
func TestPartitionsWithoutPluginNameTheCommand(t *testing.T) {
	url, _ := hangingApp(t)
	q := queueName(t)
	const command = "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange"
	r := hopper(t, "topology", "apply", "--broker-url", rabbit.URL(), "--queue", q, "--set", "topology.partitions.count=2")
	if r.code == 0 || !strings.Contains(r.stderr, command) {
		t.Errorf("apply: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	r = hopper(t, append([]string{"run"}, runArgs(q, url, "--set", "topology.partitions.count=2")...)...)
	if r.code == 0 || !strings.Contains(r.stderr, command) {
		t.Errorf("run: exit %d, stderr:\n%s", r.code, r.stderr)
	}
}

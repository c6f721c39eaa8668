package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/topology"
)

// partitionedConfig is a queue split into count partitions, fed by a topic
// exchange the publishers already use.
func partitionedConfig(t *testing.T, count int, hashOn string) config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Queue.Name = fmt.Sprintf("bx%d.parts", queueSeq.Add(1))
	cfg.Retry.Tiers = []config.Duration{config.Duration(time.Minute)}
	cfg.Topology.Partitions = config.Partitions{Count: count, HashOn: hashOn}
	cfg.Topology.Bindings = []config.Binding{{Exchange: cfg.Queue.Name + ".in", Type: "topic", RoutingKeys: []string{"order.#"}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func partitionPlans(cfg *config.Config) []topology.Plan {
	var plans []topology.Plan
	for _, c := range cfg.Consumed() {
		plans = append(plans, topology.FromConfig(&c))
	}
	return plans
}

// Applying the partitions' plans on a broker with the consistent-hash
// plugin gives a topology that spreads keys over every partition and sends
// each key to one partition only, from the exchange the publishers use;
// applying again and verifying accept it as it is.
func TestPartitionsRouteEachKeyToOnePartition(t *testing.T) {
	b := testbroker.MustStartWith(t, testbroker.Options{Quiet: true, Plugins: []string{"rabbitmq_consistent_hash_exchange"}})
	o := Options{URLs: []string{b.URL()}, ConnectTimeout: 5 * time.Second}
	cfg := partitionedConfig(t, 4, "routingKey")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	plans := partitionPlans(&cfg)
	if len(plans) != 4 {
		t.Fatalf("%d plans, want 4", len(plans))
	}
	for _, declare := range []bool{true, true, false} {
		for i := range plans {
			if err := Apply(ctx, o, &plans[i], declare); err != nil {
				t.Fatalf("apply (declare=%t) %s: %v", declare, plans[i].Work.Name, err)
			}
		}
	}
	conn, err := amqp.Dial(b.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil { // noWait=false
		t.Fatal(err)
	}
	const keys, rounds = 200, 3
	for r := range rounds {
		for k := range keys {
			c, err := ch.PublishWithDeferredConfirmWithContext(ctx, cfg.Queue.Name+".in", fmt.Sprintf("order.k%d", k),
				true, false, amqp.Publishing{Body: fmt.Appendf(nil, "%d", r)}) // mandatory=true, immediate=false
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := c.WaitContext(ctx); !ok || err != nil {
				t.Fatalf("publish not confirmed: %v", err)
			}
		}
	}
	where := map[string]string{} // routing key → the partition it landed in
	total := 0
	for i := range 4 {
		q := config.PartitionQueue(cfg.Queue.Name, i)
		n := takeByKey(t, ch, q, where, func(d amqp.Delivery) string { return d.RoutingKey })
		if n == 0 {
			t.Errorf("partition %s received nothing of %d keys", q, keys)
		}
		t.Logf("%s: %d messages", q, n)
		total += n
	}
	if total != keys*rounds || len(where) != keys {
		t.Errorf("%d messages of %d keys arrived, want %d of %d", total, len(where), keys*rounds, keys)
	}
	// Each partition is single-active-consumer, so one replica at a time
	// delivers its messages.
	q := config.PartitionQueue(cfg.Queue.Name, 0)
	info, err := b.Ctl("list_queues", "name", "arguments", "--no-table-headers", "--silent")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, line := range strings.Split(info, "\n") {
		if name, args, ok := strings.Cut(line, "\t"); ok && name == q {
			found = true
			if !strings.Contains(args, "x-single-active-consumer") {
				t.Errorf("partition queue declared without single active consumer: %s", line)
			}
		}
	}
	if !found {
		t.Errorf("rabbitmqctl list_queues does not list %s:\n%s", q, info)
	}
}

// A partitions exchange hashing a header sends every message with one
// value of that header to one partition, whatever its routing key.
func TestPartitionsHashOnHeader(t *testing.T) {
	b := testbroker.MustStartWith(t, testbroker.Options{Quiet: true, Plugins: []string{"rabbitmq_consistent_hash_exchange"}})
	o := Options{URLs: []string{b.URL()}, ConnectTimeout: 5 * time.Second}
	cfg := partitionedConfig(t, 3, "header:customer")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	plans := partitionPlans(&cfg)
	for i := range plans {
		if err := Apply(ctx, o, &plans[i], true); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := amqp.Dial(b.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil { // noWait=false
		t.Fatal(err)
	}
	const customers = 60
	for i := range customers * 2 {
		// A different routing key every time: only the header may decide.
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, cfg.Queue.Name+".in", fmt.Sprintf("order.m%d", i), true, false, // mandatory, immediate
			amqp.Publishing{Headers: amqp.Table{"customer": fmt.Sprintf("c%d", i%customers)}})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}
	where := map[string]string{}
	used := 0
	for i := range 3 {
		q := config.PartitionQueue(cfg.Queue.Name, i)
		n := takeByKey(t, ch, q, where, func(d amqp.Delivery) string { cust, _ := d.Headers["customer"].(string); return cust })
		if n > 0 {
			used++
		}
	}
	if len(where) != customers || used < 2 {
		t.Errorf("%d customers seen over %d partitions, want %d over at least 2", len(where), used, customers)
	}
}

// Without the consistent-hash plugin, apply fails before declaring any
// exchange with an error that names the command enabling it.
func TestPartitionsNeedThePlugin(t *testing.T) {
	needBroker(t)
	cfg := partitionedConfig(t, 2, "routingKey")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	plans := partitionPlans(&cfg)
	for _, declare := range []bool{true, false} {
		err := Apply(ctx, opts(), &plans[0], declare)
		if !errors.Is(err, ErrPluginMissing) || !errors.Is(err, ErrTopology) {
			t.Fatalf("declare=%t: %v, want ErrPluginMissing", declare, err)
		}
		if !strings.Contains(err.Error(), "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange") {
			t.Errorf("declare=%t: error does not give the command: %v", declare, err)
		}
	}
	// The operator's exchange was not declared either: nothing half done.
	conn, err := amqp.Dial(rabbit.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclarePassive(cfg.Queue.Name+".in", "topic", true, false, false, false, nil); err == nil {
		t.Errorf("exchange %s.in was declared although the plan cannot be completed", cfg.Queue.Name)
	}
}

// takeByKey takes every message of partition queue q and records, per key
// (keyOf), the partition it landed in; a key seen in another partition
// before is an error. It returns how many messages q held.
func takeByKey(t *testing.T, ch *amqp.Channel, q string, where map[string]string, keyOf func(amqp.Delivery) string) int {
	t.Helper()
	n := 0
	for {
		d, ok, err := ch.Get(q, true) // autoAck=true
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return n
		}
		n++
		k := keyOf(d)
		if prev, seen := where[k]; seen && prev != q {
			t.Errorf("key %s reached %s and %s", k, prev, q)
		}
		where[k] = q
	}
}

package dlq_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

// A message dead-lettered from a partition is replayed through the
// partitions exchange with its original routing key, and so lands in the
// partition it came from; the one DLQ the partitions share is emptied.
func TestCLIReplayPartitionedLandsInItsPartition(t *testing.T) {
	rb := testbroker.MustStartWith(t, testbroker.Options{Quiet: true, Plugins: []string{"rabbitmq_consistent_hash_exchange"}})
	e := newEnvOn(t, rb)
	// Queues of Hopper's own declaring, beside the env's plain ones.
	e.Work += ".orders"
	e.DLQ = e.Work + ".dlq"
	const parts = 4
	cfgPath := filepath.Join(t.TempDir(), "hopper.yaml")
	doc := fmt.Sprintf("queue:\n  name: %s\ntopology:\n  partitions:\n    count: %d\n", e.Work, parts)
	if err := os.WriteFile(cfgPath, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := config.Load(cfgPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range cfg.Consumed() {
		p := topology.FromConfig(&c)
		if err := broker.Apply(ctx, e.opts, &p, true); err != nil {
			t.Fatal(err)
		}
	}
	// Where the exchange puts each key, seen by publishing through it.
	const keys = 40
	for k := range keys {
		if err := e.pub.PublishTo(ctx, config.PartitionExchange(e.Work), fmt.Sprintf("key-%d", k), &msg.Message{MessageID: fmt.Sprintf("probe-%d", k)}); err != nil {
			t.Fatal(err)
		}
	}
	partitionOf := map[string]string{}
	for i := range parts {
		q := config.PartitionQueue(e.Work, i)
		for _, m := range e.getAll(q, true) {
			partitionOf[m.RoutingKey] = q
		}
	}
	if len(partitionOf) != keys {
		t.Fatalf("%d of %d keys routed", len(partitionOf), keys)
	}
	// Each key's message dead-lettered from its partition, as Hopper does.
	for k := range keys {
		rk := fmt.Sprintf("key-%d", k)
		e.fill(e.DLQ, deadMsg(fmt.Sprintf("m-%d", k), partitionOf[rk], rk, "max-attempts", 500, time.Minute))
	}
	res, r := e.replayJSON("--config", cfgPath)
	if r.code != 0 || res.Recovered != keys {
		t.Fatalf("exit %d, result %+v\n%s", r.code, res, r.stderr)
	}
	if n := e.depth(e.DLQ); n != 0 {
		t.Errorf("%d messages left in %s", n, e.DLQ)
	}
	got := 0
	for i := range parts {
		q := config.PartitionQueue(e.Work, i)
		for _, m := range e.getAll(q, true) {
			got++
			rk := msg.OriginalRoutingKey(m)
			if partitionOf[rk] != q {
				t.Errorf("%s (key %s) replayed into %s, it came from %s", m.MessageID, rk, q, partitionOf[rk])
			}
			if m.Exchange != config.PartitionExchange(e.Work) || m.RoutingKey != rk {
				t.Errorf("%s arrived from exchange %q with key %q, want the partitions exchange with its key %q", m.MessageID, m.Exchange, m.RoutingKey, rk)
			}
		}
	}
	if got != keys {
		t.Errorf("%d of %d replayed messages found in the partitions", got, keys)
	}
}

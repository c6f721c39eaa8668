package topology_test

import (
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/topology"
)

// A stream subscription's plan is that of the queue beside the stream,
// where retries come back; the stream itself is named apart, with the
// retention Hopper declares it with, and is none of the queues.
func TestStreamPlan(t *testing.T) {
	c := config.Default()
	c.Queue.Name = "events"
	c.Queue.Type = config.QueueTypeStream
	c.Queue.Stream.Consumer = "billing"
	c.Queue.Stream.MaxAge = config.Duration(7 * 24 * time.Hour)
	c.Queue.Stream.MaxLengthBytes = 1 << 30
	c.Retry.Tiers = []config.Duration{config.Duration(time.Second)}
	p := topology.FromConfig(&c)
	if p.Work.Name != "events.billing" || p.Work.Args["x-queue-type"] != "quorum" {
		t.Fatalf("work queue %s %v", p.Work.Name, p.Work.Args)
	}
	if len(p.Tiers) != 1 || p.Tiers[0].Name != "events.billing.retry.1s" || p.Tiers[0].Args["x-dead-letter-routing-key"] != "events.billing" {
		t.Fatalf("tiers %+v", p.Tiers)
	}
	if p.DLQ.Name != "events.billing.dlq" {
		t.Fatalf("DLQ %s", p.DLQ.Name)
	}
	st := p.Stream
	if st == nil || st.Name != "events" || st.Consumer != "billing" ||
		st.Args["x-max-age"] != "604800s" || st.Args["x-max-length-bytes"] != int64(1<<30) {
		t.Fatalf("stream %+v", st)
	}
	for _, q := range p.Queues() {
		if q.Name == "events" {
			t.Fatal("the stream is among the queues declared over AMQP")
		}
	}
	if !strings.Contains(p.String(), "stream events read as consumer billing") {
		t.Fatalf("plan text does not name the stream:\n%s", p.String())
	}
	if d := p.Document(); d.Stream == nil || d.Stream.Name != "events" {
		t.Fatalf("plan document stream %+v", d.Stream)
	}
	q := config.Default()
	q.Queue.Name = "orders"
	if p := topology.FromConfig(&q); p.Stream != nil || p.Document().Stream != nil {
		t.Fatal("a queue's plan names a stream")
	}
}

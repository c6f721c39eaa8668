package broker

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

// x-delivery-limit -1 lifts the limit only where the broker reads it so:
// RabbitMQ 3.x drops a message at its first return under it.
func TestUnlimitedDeliveries(t *testing.T) {
	for _, tc := range []struct {
		version string
		want    int32
		ok      bool
	}{
		{"3.10.8", 0, false}, {"3.13.7", 0, false}, {"4.0.5", -1, true}, {"4.2.0", -1, true},
		{"10.0.0", -1, true}, {"", 0, false}, {"x.y", 0, false},
	} {
		if v, ok := unlimitedDeliveries(tc.version); v != tc.want || ok != tc.ok {
			t.Errorf("%q: %d %t, want %d %t", tc.version, v, ok, tc.want, tc.ok)
		}
	}
}

// On the installed broker a quorum DLQ and tier declared by Hopper keep a
// message however often it is returned, and declaring again (or verifying)
// accepts the queues as they are.
func TestQuorumDLQHasNoDeliveryLimit(t *testing.T) {
	needBroker(t)
	name := "topo-q-" + strconv.FormatInt(queueSeq.Add(1), 10)
	q := func(role string, n string) topology.Queue {
		return topology.Queue{Name: n, Role: role, Args: map[string]any{"x-queue-type": "quorum"}, Owned: true, Unbounded: true}
	}
	plan := topology.Plan{Work: topology.Queue{Name: name, Role: topology.RoleWork, Args: map[string]any{"x-queue-type": "quorum"}, Owned: true},
		Tiers: []topology.Queue{q(topology.RoleTier, name+".tier")}, DLQ: q(topology.RoleDLQ, name+".dlq"), Declare: true}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, declare := range []bool{true, true, false} {
		if err := Apply(ctx, opts(), &plan, declare); err != nil {
			t.Fatal(err)
		}
	}
	pub := NewPublisher(PublisherOptions{Options: opts(), ConfirmTimeout: 5 * time.Second})
	defer pub.Close()
	if err := pub.Publish(ctx, plan.DLQ.Name, &msg.Message{MessageID: "m", Body: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(rabbit.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 25 {
		d, ok, err := ch.Get(plan.DLQ.Name, false) // autoAck=false
		if err != nil || !ok {
			t.Fatalf("return %d: message gone (%v)", i, err)
		}
		if err := d.Nack(false, true); err != nil { // multiple=false, requeue=true
			t.Fatal(err)
		}
	}
}

// The queue type probe tells classic, quorum and stream queues apart, also
// while a tool owns the queue, and reads nothing away: every message stays
// where it was, and none of a quorum queue's is counted as returned.
func TestQueueTypeOf(t *testing.T) {
	needBroker(t)
	ctx := context.Background()
	classic := declareTyped(t, "classic", 2)
	quorum := declareTyped(t, "quorum", 2)
	stream := declareArgs(t, amqp.Table{"x-queue-type": "stream"})
	for _, tc := range []struct {
		queue string
		want  QueueType
	}{{classic, Classic}, {quorum, Quorum}, {stream, Stream}} {
		got, err := QueueTypeOf(ctx, opts(), tc.queue)
		if err != nil || got != tc.want {
			t.Errorf("%s: %q %v, want %q", tc.queue, got, err, tc.want)
		}
	}
	// Owned by a tool: empty queues of their own, since an owner holding
	// a message of a quorum queue would hand it back when it closes.
	for _, q := range []struct {
		name string
		want QueueType
	}{{declareTyped(t, "classic", 0), Classic}, {declareTyped(t, "quorum", 0), Quorum}} {
		owner, err := OpenExclusive(ctx, opts(), q.name, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := QueueTypeOf(ctx, opts(), q.name); err != nil || got != q.want {
			t.Errorf("%s owned by a tool: %q %v, want %q", q.name, got, err, q.want)
		}
		if err := owner.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := QueueTypeOf(ctx, opts(), "no-such-queue-"+t.Name()); !errors.Is(err, ErrNoQueue) {
		t.Errorf("missing queue: %v", err)
	}
	for _, q := range []string{classic, quorum} {
		if got := browse(t, q); !slices.Equal(got, []string{"0", "1"}) {
			t.Errorf("%s after the probe: %v", q, got)
		}
	}
	// The quorum queue's messages were never returned by the probe.
	in, err := OpenInspector(ctx, opts())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	d, ok, err := in.Get(quorum)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if n, _ := d.Message().Int(msg.HeaderDeliveryCount); n > 1 {
		t.Errorf("delivery count %d after the probes and one browse", n)
	}
}

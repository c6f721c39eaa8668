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

// The queue type probe tells quorum from classic queues, also while a tool
// owns the classic one, and reads nothing away.
func TestIsQuorum(t *testing.T) {
	needBroker(t)
	ctx := context.Background()
	classic := declareTyped(t, "classic", 2)
	quorum := declareTyped(t, "quorum", 2)
	for _, tc := range []struct {
		queue string
		want  bool
	}{{classic, false}, {quorum, true}} {
		got, err := IsQuorum(ctx, opts(), tc.queue)
		if err != nil || got != tc.want {
			t.Errorf("%s: %t %v, want %t", tc.queue, got, err, tc.want)
		}
	}
	owner, err := OpenExclusive(ctx, opts(), classic, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := IsQuorum(ctx, opts(), classic); err != nil || got {
		t.Errorf("owned classic queue: %t %v", got, err)
	}
	if err := owner.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := IsQuorum(ctx, opts(), "no-such-queue-"+t.Name()); !errors.Is(err, ErrNoQueue) {
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
		t.Errorf("delivery count %d after the probe and one browse", n)
	}
}

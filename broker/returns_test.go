package broker

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// Which ways of handing a message back to a quorum queue count against its
// delivery limit, per release: on RabbitMQ 3.x every one does
// (x-delivery-count); on 4.x every one counts in x-acquired-count, but
// x-delivery-count, the one the limit reads, counts a basic.reject with
// requeue and a return by a closed channel, and not a basic.nack with
// requeue. Hopper never leans on the difference (a quorum give-back is a
// republished copy on every release); this pins what the broker does.
func TestWhichReturnsCount(t *testing.T) {
	needBroker(t)
	four := rabbit.Series() >= 4
	for _, tc := range []struct {
		way          string
		giveBack     func(ch *amqp.Channel, d amqp.Delivery) error
		delivery     int64 // x-delivery-count after one return
		deliveryOn3x int64
	}{
		{"nack requeue", func(_ *amqp.Channel, d amqp.Delivery) error { return d.Nack(false, true) }, 0, 1},
		{"reject requeue", func(_ *amqp.Channel, d amqp.Delivery) error { return d.Reject(true) }, 1, 1},
		{"channel closed", func(ch *amqp.Channel, _ amqp.Delivery) error { return ch.Close() }, 1, 1},
	} {
		t.Run(tc.way, func(t *testing.T) {
			q := declareArgs(t, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int32(5)})
			pub := NewPublisher(PublisherOptions{Options: opts(), Channels: 1, ConfirmTimeout: 5 * time.Second})
			defer pub.Close()
			if err := pub.Publish(context.Background(), q, &msg.Message{MessageID: "m", Body: []byte("b")}); err != nil {
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
			d, ok, err := ch.Get(q, false) // autoAck=false
			if err != nil || !ok {
				t.Fatal(ok, err)
			}
			if err := tc.giveBack(ch, d); err != nil {
				t.Fatal(err)
			}
			in, err := OpenInspector(context.Background(), opts())
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			var back *Delivery
			waitfor.Until(t, 10*time.Second, "the message back in the queue", func() bool {
				d, ok, err := in.Get(q)
				if err != nil {
					t.Fatal(err)
				}
				back = d
				return ok
			})
			m := back.Message()
			dc, _ := m.Int(msg.HeaderDeliveryCount)
			ac, hasAcquired := m.Int(msg.HeaderAcquiredCount)
			want := tc.deliveryOn3x
			if four {
				want = tc.delivery
				if !hasAcquired || ac != 1 {
					t.Errorf("RabbitMQ %s: x-acquired-count %d (present %t), want 1", rabbit.Version(), ac, hasAcquired)
				}
			}
			if dc != want {
				t.Errorf("RabbitMQ %s: x-delivery-count %d after one %s, want %d", rabbit.Version(), dc, tc.way, want)
			}
			if err := back.Ack(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

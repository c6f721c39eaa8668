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

// Why Hopper does not retry through a quorum queue's own delayed redelivery
// (x-delayed-retry-type, RabbitMQ 4.3): the message is not republished, so
// Hopper's own headers (attempts, first failure) cannot change with it, and
// a consumer that dies holding the message counts against it exactly as a
// failed attempt does, so a Hopper crash would spend an app attempt.
func TestBrokerDelayedRetryKeepsNoHopperState(t *testing.T) {
	needBroker(t)
	if rabbit.Series() < 4 {
		t.Skip("delayed redelivery of quorum queues is new in RabbitMQ 4.3")
	}
	q := declareArgs(t, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int32(50),
		"x-delayed-retry-type": "failed", "x-delayed-retry-min": int32(1), "x-delayed-retry-max": int32(10)})
	conn, err := amqp.Dial(rabbit.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pubCh, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := pubCh.Publish("", q, false, false, amqp.Publishing{MessageId: "m", Body: []byte("b"), // mandatory, immediate
		Headers: amqp.Table{msg.HeaderRetryCount: int32(0)}}); err != nil {
		t.Fatal(err)
	}
	consume := func() (*amqp.Channel, <-chan amqp.Delivery) {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Qos(1, 0, false); err != nil { // prefetchCount=1, prefetchSize=0, global=false
			t.Fatal(err)
		}
		ds, err := ch.Consume(q, "", false, false, false, false, nil) // autoAck, exclusive, noLocal, noWait
		if err != nil {
			t.Fatal(err)
		}
		return ch, ds
	}
	next := func(ds <-chan amqp.Delivery) amqp.Delivery {
		select {
		case d := <-ds:
			return d
		case <-time.After(30 * time.Second):
			t.Fatal("no delivery")
			return amqp.Delivery{}
		}
	}
	ch, ds := consume()
	d := next(ds)
	if err := d.Reject(true); err != nil { // an attempt that failed: requeue=true
		t.Fatal(err)
	}
	d = next(ds)
	if dc, _ := d.Headers[msg.HeaderDeliveryCount].(int64); dc != 1 {
		t.Errorf("after one failed attempt x-delivery-count = %v, want 1", d.Headers[msg.HeaderDeliveryCount])
	}
	if rc := d.Headers[msg.HeaderRetryCount]; rc != int32(0) {
		t.Errorf("x-retry-count = %v: the broker's redelivery should carry the headers as published", rc)
	}
	// The consumer dies holding it: counted like a failed attempt.
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	_, ds = consume()
	d = next(ds)
	if dc, _ := d.Headers[msg.HeaderDeliveryCount].(int64); dc != 2 {
		t.Errorf("after a failed attempt and a closed channel x-delivery-count = %v, want 2", d.Headers[msg.HeaderDeliveryCount])
	}
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}
}

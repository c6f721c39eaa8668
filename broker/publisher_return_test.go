package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/msg"
)

// Two publishes in flight on one channel that look alike in everything a
// basic.return carries back (exchange, routing key, message id, body), one
// routed to a queue that exists and one addressed to a queue that does not:
// a headers exchange routes on the "dest" header alone. Round after round,
// each Publish must report its own fate: the unroutable one ErrReturned,
// the routed one nil. A return credited to the wrong publish would report
// a lost copy as confirmed (and its original would be acked).
func TestPublisherReturnGoesToItsOwnPublish(t *testing.T) {
	needBroker(t)
	q := declareQueue(t, 0)
	missing := fmt.Sprintf("bx-missing-%d", queueSeq.Add(1))
	exchange := fmt.Sprintf("bx-headers-%d", queueSeq.Add(1))
	conn, err := amqp.Dial(rabbit.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// durable, autoDelete=false, internal=false, noWait=false
	if err := ch.ExchangeDeclare(exchange, "headers", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q, "", exchange, false, amqp.Table{"x-match": "all", "dest": q}); err != nil { // noWait=false
		t.Fatal(err)
	}

	pub := NewPublisher(PublisherOptions{Options: opts(), Channels: 1, ConfirmTimeout: 10 * time.Second})
	defer pub.Close()

	const rounds = 200
	routed := 0
	for i := range rounds {
		id := "same-id"
		if i%2 == 1 {
			id = "" // no message id at all
		}
		send := func(dest string) error {
			m := &msg.Message{MessageID: id, Body: []byte("same body"), Headers: map[string]any{"dest": dest}}
			return pub.PublishTo(context.Background(), exchange, "", m)
		}
		var toQueue, toMissing error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); toQueue = send(q) }()
		go func() { defer wg.Done(); toMissing = send(missing) }()
		wg.Wait()
		if toQueue != nil {
			t.Errorf("round %d: publish routed to %s: %v, want nil", i, q, toQueue)
		} else {
			routed++
		}
		if !errors.Is(toMissing, ErrReturned) {
			t.Errorf("round %d: publish to the missing queue: %v, want ErrReturned", i, toMissing)
		}
		if t.Failed() {
			break
		}
	}
	if got := len(browse(t, q)); got != routed {
		t.Errorf("queue holds %d copies, want the %d publishes reported confirmed", got, routed)
	}
}

// The header a publish is matched by stays on the broker side: a message
// read back carries the headers it was published with and nothing else.
func TestPublishIDNotDelivered(t *testing.T) {
	needBroker(t)
	q := declareQueue(t, 0)
	pub := NewPublisher(PublisherOptions{Options: opts(), Channels: 1, ConfirmTimeout: 10 * time.Second})
	defer pub.Close()
	m := &msg.Message{MessageID: "1", Body: []byte("x"), Headers: map[string]any{"k": "v"}}
	if err := pub.Publish(context.Background(), q, m); err != nil {
		t.Fatal(err)
	}
	if len(m.Headers) != 1 {
		t.Errorf("publish changed the caller's headers: %v", m.Headers)
	}
	in, err := OpenInspector(context.Background(), opts())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	d, ok, err := in.Get(q)
	if err != nil || !ok {
		t.Fatalf("get: ok=%v err=%v", ok, err)
	}
	if h := d.Message().Headers; len(h) != 1 || h["k"] != "v" {
		t.Errorf("delivered headers %v, want only k=v", h)
	}
}

package faults

import (
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestFaultQuorumReturnOrderBrokerAlone checks, with the broker alone,
// what ordered delivery on a quorum queue rests on across a SIGKILL of
// Hopper: a quorum queue holds 300 messages; a consumer takes 50
// (prefetch 50), acks the first 10 and its TCP connection is cut with no
// close handshake, as when its process dies; a new consumer attaches at
// once. It must get the cut consumer's 40 unacked messages back first and
// everything in publish order.
func TestFaultQuorumReturnOrderBrokerAlone(t *testing.T) {
	url := rabbit.URL()
	for round := range 3 {
		q := fmt.Sprintf("faults.returnorder.%d", queueSeq.Add(1))
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Fatal(err)
		}
		ch, _ := conn.Channel()
		if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatal(err)
		}
		_ = ch.Confirm(false)
		const n, prefetch = 300, 50
		for i := range n {
			dc, err := ch.PublishWithDeferredConfirm("", q, false, false, amqp.Publishing{DeliveryMode: 2, MessageId: fmt.Sprint(i)})
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := dc.WaitContext(t.Context()); !ok || err != nil {
				t.Fatalf("confirm %d: %v %v", i, ok, err)
			}
		}
		conn.Close()
		var raw net.Conn
		c1, err := amqp.DialConfig(url, amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
			c, err := net.Dial(network, addr)
			raw = c
			return c, err
		}})
		if err != nil {
			t.Fatal(err)
		}
		ch1, _ := c1.Channel()
		_ = ch1.Qos(prefetch, 0, false)
		ds, err := ch1.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for d := range ds {
			k++
			if k == 10 {
				_ = d.Ack(true)
			}
			if k == prefetch {
				break
			}
		}
		raw.Close() // cut, no close handshake
		c2, err := amqp.Dial(url)
		if err != nil {
			t.Fatal(err)
		}
		ch2, _ := c2.Channel()
		_ = ch2.Qos(prefetch, 0, false)
		ds2, err := ch2.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got []int
		timeout := time.After(20 * time.Second)
	read:
		for len(got) < n-10 {
			select {
			case d := <-ds2:
				v, _ := strconv.Atoi(d.MessageId)
				got = append(got, v)
				_ = d.Ack(false)
			case <-timeout:
				break read
			}
		}
		c2.Close()
		inv := 0
		for i := 1; i < len(got); i++ {
			if got[i] < got[i-1] {
				inv++
			}
		}
		t.Logf("round %d (RabbitMQ %s): %d read after the cut, %d out of order", round, rabbit.Version(), len(got), inv)
		if len(got) != n-10 || inv > 0 || got[0] != 10 {
			t.Fatalf("round %d: after the cut the queue handed %d of %d, %d out of order, starting at %d: %v",
				round, len(got), n-10, inv, got[0], got[:min(60, len(got))])
		}
	}
}

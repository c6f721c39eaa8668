package broker

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// Which ways of handing a message back to a quorum queue count against its
// delivery limit, per release, and when the broker drops the message: one
// message under a delivery-limit policy of 2 is taken (by basic.get, or
// pushed to a consumer) and handed back five times over, each way on its
// own, and each take records the x-delivery-count and x-acquired-count it
// sees. What the DLQ tools rely on (see the dlq package):
//
//   - on RabbitMQ 3.x every return counts, and the third return of the
//     message (a count past 2) drops it;
//   - on 4.x the same for a basic.reject with requeue and for a channel or
//     connection that ends with the message unacked — closed, cut, or its
//     process SIGKILLed — while a basic.nack with requeue is counted in
//     x-acquired-count only, which the limit does not read: that message
//     survives any number of them.
//
// So a tool that is killed spends one delivery of every message it held,
// on every release; one that ends normally and returns with a nack spends
// nothing on 4.x.
func TestWhichReturnsCount(t *testing.T) {
	needBroker(t)
	four := rabbit.Series() >= 4
	const limit, rounds = 2, 5
	counted := []int64{0, 1, 2, -1, -1} // x-delivery-count seen by each take; -1: gone
	free := []int64{0, 0, 0, 0, 0}
	type way struct {
		name     string
		free4    bool // not counted on 4.x
		giveBack func(t *testing.T, q string) amqp.Table
	}
	var ways []way
	for _, consume := range []bool{false, true} {
		how := "get"
		if consume {
			how = "consumer"
		}
		dial := func(t *testing.T) (*amqp.Connection, *amqp.Channel) {
			conn, err := amqp.Dial(rabbit.URL())
			if err != nil {
				t.Fatal(err)
			}
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			return conn, ch
		}
		ways = append(ways,
			way{how + ", channel closed", false, func(t *testing.T, q string) amqp.Table {
				conn, ch := dial(t)
				defer conn.Close()
				d, _ := takeOne(t, ch, q, consume)
				ch.Close() //nolint:errcheck // the give-back under test
				return d.Headers
			}},
			way{how + ", connection closed", false, func(t *testing.T, q string) amqp.Table {
				conn, ch := dial(t)
				d, _ := takeOne(t, ch, q, consume)
				conn.Close() //nolint:errcheck // the give-back under test
				return d.Headers
			}},
			way{how + ", connection cut", false, func(t *testing.T, q string) amqp.Table {
				var raw net.Conn
				conn, err := amqp.DialConfig(rabbit.URL(), amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
					c, err := net.Dial(network, addr)
					raw = c
					return c, err
				}})
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				ch, err := conn.Channel()
				if err != nil {
					t.Fatal(err)
				}
				d, _ := takeOne(t, ch, q, consume)
				raw.Close() // no close handshake, as when the process dies
				return d.Headers
			}},
			way{how + ", basic.nack requeue", true, func(t *testing.T, q string) amqp.Table {
				conn, ch := dial(t)
				defer conn.Close()
				d, stop := takeOne(t, ch, q, consume)
				stop()
				if err := ch.Nack(0, true, true); err != nil { // every delivery of the channel: multiple, requeue
					t.Fatal(err)
				}
				awaitNoReader(t, q)
				return d.Headers
			}},
			way{how + ", basic.reject requeue", false, func(t *testing.T, q string) amqp.Table {
				conn, ch := dial(t)
				defer conn.Close()
				d, stop := takeOne(t, ch, q, consume)
				stop()
				if err := d.Reject(true); err != nil {
					t.Fatal(err)
				}
				awaitNoReader(t, q)
				return d.Headers
			}},
		)
	}
	ways = append(ways, way{"get, process SIGKILLed", false, func(t *testing.T, q string) amqp.Table {
		cmd := exec.Command(os.Args[0], "-test.run=^TestReturnsHelperProcess$")
		cmd.Env = append(os.Environ(), returnsHelperEnv+"="+rabbit.URL()+" "+q)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var errb strings.Builder
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Wait() //nolint:errcheck // killed
		sc := bufio.NewScanner(stdout)
		var h amqp.Table
		if !sc.Scan() || json.Unmarshal(sc.Bytes(), &h) != nil {
			cmd.Process.Kill() //nolint:errcheck // the helper failed
			t.Fatalf("helper said %q\n%s", sc.Text(), errb.String())
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for k, v := range h {
			if f, ok := v.(float64); ok {
				h[k] = int64(f)
			}
		}
		return h
	}})
	for _, w := range ways {
		t.Run(w.name, func(t *testing.T) {
			seen := giveBackRounds(t, limit, rounds, w.giveBack)
			want := counted
			if four && w.free4 {
				want = free
			}
			var got []int64
			for _, r := range seen {
				got = append(got, r.delivery)
			}
			t.Logf("RabbitMQ %s: x-delivery-count seen by each take (-1: dropped): %v; x-acquired-count: %v", rabbit.Version(), got, acquired(seen))
			if !slices.Equal(got, want) {
				t.Errorf("RabbitMQ %s: x-delivery-count seen by each take %v, want %v", rabbit.Version(), got, want)
			}
			for i, r := range seen {
				if r.delivery < 0 {
					continue
				}
				switch {
				case !four && r.hasAcquired:
					t.Errorf("RabbitMQ %s: take %d has x-acquired-count %d", rabbit.Version(), i+1, r.acquired)
				case four && i > 0 && (!r.hasAcquired || r.acquired != int64(i)):
					t.Errorf("RabbitMQ %s: take %d: x-acquired-count %d (present %t), want %d", rabbit.Version(), i+1, r.acquired, r.hasAcquired, i)
				}
			}
		})
	}
}

// returnsHelperEnv makes the test binary a reader that takes one message
// and waits to be killed (see TestReturnsHelperProcess).
const returnsHelperEnv = "HOPPER_RETURNS_HELPER"

// TestReturnsHelperProcess is not a test: run by TestWhichReturnsCount with
// returnsHelperEnv set to "url queue", it takes one message of queue with
// basic.get, writes its headers as JSON on standard output, and waits for
// the SIGKILL that hands it back.
func TestReturnsHelperProcess(t *testing.T) {
	arg := os.Getenv(returnsHelperEnv)
	if arg == "" {
		t.Skip("a helper process of TestWhichReturnsCount")
	}
	url, queue, _ := strings.Cut(arg, " ")
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	d, ok, err := ch.Get(queue, false) // autoAck=false
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	line, err := json.Marshal(d.Headers)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(string(line))
	select {} // until killed
}

// giveBackRound is what one take saw: the message's counts, or delivery
// -1 when it was gone.
type giveBackRound struct {
	delivery, acquired int64
	hasAcquired        bool
}

func acquired(rs []giveBackRound) []int64 {
	var out []int64
	for _, r := range rs {
		out = append(out, r.acquired)
	}
	return out
}

// giveBackRounds puts one message in a fresh quorum queue under a
// delivery-limit policy of limit and, rounds times, lets giveBack take it
// and hand it back, recording what each take saw.
func giveBackRounds(t *testing.T, limit, rounds int, giveBack func(t *testing.T, q string) amqp.Table) []giveBackRound {
	t.Helper()
	q := declareArgs(t, amqp.Table{"x-queue-type": "quorum"})
	policy := fmt.Sprintf("dl-%d", queueSeq.Add(1))
	if out, err := rabbit.Ctl("set_policy", "--apply-to", "queues", policy, "^"+regexp.QuoteMeta(q)+"$",
		fmt.Sprintf(`{"delivery-limit":%d}`, limit)); err != nil {
		t.Fatalf("set_policy: %v\n%s", err, out)
	}
	t.Cleanup(func() { rabbit.Ctl("clear_policy", policy) }) //nolint:errcheck // the node is private to the test run
	pub := NewPublisher(PublisherOptions{Options: opts(), Channels: 1, ConfirmTimeout: 5 * time.Second})
	defer pub.Close()
	if err := pub.Publish(context.Background(), q, &msg.Message{MessageID: "m", Body: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	in, err := OpenInspector(context.Background(), opts())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var out []giveBackRound
	for range rounds {
		awaitNoReader(t, q)
		ready, err := in.Depth(q)
		if err != nil {
			t.Fatal(err)
		}
		if ready == 0 {
			out = append(out, giveBackRound{delivery: -1})
			continue
		}
		h := giveBack(t, q)
		r := giveBackRound{}
		r.delivery, _ = msg.AsInt(h[msg.HeaderDeliveryCount])
		r.acquired, r.hasAcquired = msg.AsInt(h[msg.HeaderAcquiredCount])
		out = append(out, r)
	}
	return out
}

// awaitNoReader waits until q has no consumer: a quorum queue counts each
// reader that holds messages as one (a basic.get's too) and drops it in
// the same step as it takes back what the reader held.
func awaitNoReader(t *testing.T, q string) {
	t.Helper()
	in, err := OpenInspector(context.Background(), opts())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	waitfor.Until(t, 20*time.Second, "no reader on "+q, func() bool {
		n, err := in.Consumers(q)
		return err == nil && n == 0
	})
}

// takeOne takes the message of q, by basic.get or from a consumer; stop
// cancels the consumer (so that a return does not come straight back to
// it), and is a no-op for a get.
func takeOne(t *testing.T, ch *amqp.Channel, q string, consume bool) (d amqp.Delivery, stop func()) {
	t.Helper()
	if !consume {
		d, ok, err := ch.Get(q, false) // autoAck=false
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		return d, func() {}
	}
	if err := ch.Qos(1, 0, false); err != nil { // prefetchCount=1, prefetchSize=0, global=false
		t.Fatal(err)
	}
	const tag = "returns-test"
	ds, err := ch.Consume(q, tag, false, false, false, false, nil) // autoAck, exclusive, noLocal, noWait
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d = <-ds:
	case <-time.After(10 * time.Second):
		t.Fatal("no push within 10s")
	}
	return d, func() {
		if err := ch.Cancel(tag, false); err != nil { // noWait=false
			t.Fatal(err)
		}
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

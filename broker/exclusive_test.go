package broker

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// node is started only by the tests that need a broker (needBroker), so the
// acker and publisher-state tests run without RabbitMQ.
var (
	node   testbroker.Lazy
	rabbit *testbroker.Broker
)

func TestMain(m *testing.M) { os.Exit(testbroker.RunLazy(m, &node)) }

// needBroker starts the package's node if it is not running yet.
func needBroker(t *testing.T) {
	t.Helper()
	rabbit = node.Get(t)
}

var queueSeq atomic.Int64

func opts() Options {
	return Options{URLs: []string{rabbit.URL()}, ConnectTimeout: 5 * time.Second, ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond}
}

// declareQueue declares a durable classic queue with a name no other test
// uses and fills it with n persistent messages whose ids are "0".."n-1".
func declareQueue(t *testing.T, n int) string {
	t.Helper()
	return declareTyped(t, "classic", n)
}

func declareTyped(t *testing.T, typ string, n int) string {
	t.Helper()
	name := declareArgs(t, amqp.Table{"x-queue-type": typ})
	pub := NewPublisher(PublisherOptions{Options: opts(), Channels: 4, ConfirmTimeout: 5 * time.Second})
	defer pub.Close()
	for i := range n {
		if err := pub.Publish(context.Background(), name, &msg.Message{MessageID: strconv.Itoa(i), Body: []byte("m" + strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	return name
}

// browse reads every ready message without removing any and returns their
// ids in queue order.
func browse(t *testing.T, queue string) []string {
	t.Helper()
	in, err := OpenInspector(context.Background(), opts())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var ids []string
	for {
		d, ok, err := in.Get(queue)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return ids
		}
		ids = append(ids, d.Message().MessageID)
	}
}

// waitReady waits until the queue has n ready and no unacked messages:
// requeueing after a close is asynchronous on the broker.
func waitReady(t *testing.T, queue string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ready, unacked, err := rabbit.QueueCounts(queue)
		if err != nil {
			t.Fatal(err)
		}
		if ready == n && unacked == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %s: ready=%d unacked=%d, want ready=%d unacked=0", queue, ready, unacked, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func seq(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, strconv.Itoa(i))
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// take returns the next message of e, failing the test when none comes
// within 5 s; i names it in the failure.
func take(t *testing.T, e *Exclusive, i int) *ExclusiveDelivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, ok, err := e.Next(ctx)
	if err != nil || !ok {
		t.Fatalf("message %d: ok=%v err=%v", i, ok, err)
	}
	return d
}

func TestExclusiveRefusesSecondOwner(t *testing.T) {
	needBroker(t)
	q := declareQueue(t, 3)
	ctx := context.Background()
	first, err := OpenExclusive(ctx, opts(), q, 2)
	if err != nil {
		t.Fatal(err)
	}
	if first.Present() != 3 {
		t.Errorf("Present = %d, want 3", first.Present())
	}
	_, err = OpenExclusive(ctx, opts(), q, 2)
	if !errors.Is(err, ErrInUse) {
		t.Fatalf("second owner: err = %v, want ErrInUse", err)
	}
	// basic.get by another connection is not a consumer and still works:
	// peek and stats can look at a DLQ while a replay runs.
	in, err := OpenInspector(ctx, opts())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := in.Get(q); err != nil {
		t.Fatalf("get while an exclusive consumer runs: %v", err)
	} else if !ok {
		t.Log("exclusive consumer had taken every message")
	}
	in.Close()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	// Once the owner is gone another one may take over.
	again, err := OpenExclusive(ctx, opts(), q, 2)
	if err != nil {
		t.Fatalf("after close: %v", err)
	}
	again.Close()
}

func TestExclusiveMissingQueue(t *testing.T) {
	needBroker(t)
	_, err := OpenExclusive(context.Background(), opts(), "no-such-queue-"+t.Name(), 1)
	if !errors.Is(err, ErrNoQueue) {
		t.Fatalf("err = %v, want ErrNoQueue", err)
	}
}

// Holding more messages than the prefetch window must not stall Next: past
// the window it takes them with basic.get. Close returns every held one to
// its original place.
func TestExclusiveHoldsBeyondPrefetchAndReturnsInOrder(t *testing.T) {
	needBroker(t)
	const n = 40
	q := declareQueue(t, n)
	e, err := OpenExclusive(context.Background(), opts(), q, 4)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for range n {
		d := take(t, e, len(got))
		got = append(got, d.Message().MessageID)
	}
	if !equal(got, seq(0, n)) {
		t.Fatalf("order taken = %v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	if _, ok, err := e.Next(ctx); ok || err != nil {
		t.Fatalf("empty queue: ok=%v err=%v", ok, err)
	}
	cancel()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, q, n)
	if ids := browse(t, q); !equal(ids, seq(0, n)) {
		t.Fatalf("after close the queue holds %v, want the original order", ids)
	}
}

// Acked messages leave, held ones come back in place; pushed and got
// deliveries mix freely.
func TestExclusiveAckSomeHoldOthers(t *testing.T) {
	needBroker(t)
	const n = 30
	q := declareQueue(t, n)
	e, err := OpenExclusive(context.Background(), opts(), q, 3)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for i := range n {
		d := take(t, e, i)
		id, _ := strconv.Atoi(d.Message().MessageID)
		if id%3 == 0 {
			kept = append(kept, d.Message().MessageID)
			continue
		}
		if err := d.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	e.Close()
	waitReady(t, q, len(kept))
	if ids := browse(t, q); !equal(ids, kept) {
		t.Fatalf("queue holds %v, want %v", ids, kept)
	}
}

// Acks from many workers in any order, past held messages and with the
// window full enough that basic.get takes over, leave exactly the held
// messages, in place: coalesced acks never cover one that was not acked.
func TestExclusiveConcurrentAcksPastHolds(t *testing.T) {
	needBroker(t)
	const n = 600
	q := declareQueue(t, n)
	e, err := OpenExclusive(context.Background(), opts(), q, 32)
	if err != nil {
		t.Fatal(err)
	}
	work := make(chan *ExclusiveDelivery)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range work {
				if err := d.Ack(); err != nil {
					errs <- err
				}
			}
		}()
	}
	var kept []string
	for i := range n {
		d := take(t, e, i)
		// Hold every 7th, and a run of 40 in the middle, which fills the
		// window so that the rest come by basic.get.
		id, _ := strconv.Atoi(d.Message().MessageID)
		if id%7 == 0 || (id >= 300 && id < 340) {
			kept = append(kept, d.Message().MessageID)
			continue
		}
		work <- d
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("ack: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, q, len(kept))
	if ids := browse(t, q); !equal(ids, kept) {
		t.Fatalf("queue holds %d messages %v, want the %d held %v", len(ids), ids, len(kept), kept)
	}
}

// A browse (basic.get without ack, then close) leaves the queue as it was,
// order included. The DLQ tools' stats and peek rely on it.
func TestBrowseKeepsOrder(t *testing.T) {
	needBroker(t)
	const n = 25
	q := declareQueue(t, n)
	for range 3 {
		if ids := browse(t, q); !equal(ids, seq(0, n)) {
			t.Fatalf("browse = %v", ids)
		}
		waitReady(t, q, n)
	}
}

// Losing the connection ends Next with an error and returns held messages.
func TestExclusiveConnectionLoss(t *testing.T) {
	needBroker(t)
	q := declareQueue(t, 5)
	o := opts()
	o.Name = "exclusive-loss-" + t.Name()
	e, err := OpenExclusive(context.Background(), o, q, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, ok, err := e.Next(ctx); !ok || err != nil {
		t.Fatalf("ok=%v err=%v", ok, err)
	}
	if err := rabbit.CloseAllConnections(); err != nil {
		t.Fatal(err)
	}
	for {
		_, ok, err := e.Next(ctx)
		if err != nil {
			break
		}
		if !ok {
			t.Fatal("Next did not report the lost connection")
		}
	}
	waitReady(t, q, 5)
}

// A quorum DLQ works the same: exclusive consumer, holding past the window,
// everything back in order on close.
func TestExclusiveQuorumQueue(t *testing.T) {
	needBroker(t)
	const n = 20
	q := declareTyped(t, "quorum", n)
	e, err := OpenExclusive(context.Background(), opts(), q, 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenExclusive(context.Background(), opts(), q, 3); !errors.Is(err, ErrInUse) {
		t.Fatalf("second owner of a quorum queue: %v", err)
	}
	var got []string
	for range n {
		d := take(t, e, len(got))
		got = append(got, d.Message().MessageID)
		if len(got)%4 == 0 {
			if err := d.Ack(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !equal(got, seq(0, n)) {
		t.Fatalf("order taken = %v", got)
	}
	e.Close()
	var want []string
	for i := range n {
		if (i+1)%4 != 0 {
			want = append(want, strconv.Itoa(i))
		}
	}
	waitReady(t, q, len(want))
	// A quorum queue returns messages in an order of its own (pushed and
	// got ones separately): nothing is lost, the order may change.
	ids := browse(t, q)
	slices.SortFunc(ids, func(a, b string) int {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return x - y
	})
	if !equal(ids, want) {
		t.Fatalf("quorum queue after close holds %v, want %v", ids, want)
	}
}

// GetOnly takes from a quorum queue without a consumer window: closing
// returns only the message taken and not settled, so only that one has a
// return counted against the queue's delivery limit.
func TestExclusiveGetOnlyReturnsOnlyWhatItTook(t *testing.T) {
	needBroker(t)
	q := declareTyped(t, "quorum", 6)
	e, err := OpenExclusive(context.Background(), opts(), q, GetOnly)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 2 {
		d, ok, err := e.Next(ctx)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if i == 0 {
			if err := d.Ack(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	in, err := OpenInspector(context.Background(), opts())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	counts := map[string]int64{}
	for {
		d, ok, err := in.Get(q)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		counts[d.Message().MessageID] = returnsCounted(d.Message())
		if err := d.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]int64{"1": 1, "2": 0, "3": 0, "4": 0, "5": 0}
	if len(counts) != len(want) {
		t.Fatalf("queue after: %v", counts)
	}
	for id, n := range want {
		if counts[id] != n {
			t.Errorf("message %s: delivery count %d, want %d (all %v)", id, counts[id], n, counts)
		}
	}
}

// returnsCounted is how often a quorum queue took a message back after
// handing it out. RabbitMQ 3.x counts every return in x-delivery-count;
// 4.x counts each in x-acquired-count and only some in x-delivery-count
// (a basic.nack with requeue is not one of them).
func returnsCounted(m *msg.Message) int64 {
	if rabbit.Series() >= 4 {
		n, _ := m.Int(msg.HeaderAcquiredCount)
		return n
	}
	n, _ := m.Int(msg.HeaderDeliveryCount)
	return n
}

// deliveryCounts takes every message of queue for good and returns each
// id's x-delivery-count, in queue order.
func deliveryCounts(t *testing.T, queue string) ([]string, map[string]int64) {
	t.Helper()
	in, err := OpenInspector(context.Background(), opts())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	// A consumer whose channel ended leaves a quorum queue in the same
	// step as its messages return.
	waitfor.Until(t, 20*time.Second, "no consumer on "+queue, func() bool {
		n, err := in.Consumers(queue)
		if err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	var ids []string
	counts := map[string]int64{}
	for {
		d, ok, err := in.Get(queue)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return ids, counts
		}
		n, _ := d.Message().Int(msg.HeaderDeliveryCount)
		ids = append(ids, d.Message().MessageID)
		counts[d.Message().MessageID] = n
		if err := d.Ack(); err != nil {
			t.Fatal(err)
		}
	}
}

// A browser over a quorum queue whose pass took and acked every message
// present makes the broker push nothing past them, even with more
// messages ready: Stop has nothing to hand back, and the messages that
// came meanwhile stay where they are, their delivery count unspent.
func TestBrowseStopsAtPresent(t *testing.T) {
	needBroker(t)
	q := declareTyped(t, "quorum", 10)
	e, err := OpenBrowse(context.Background(), opts(), q, 64, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if e.Present() != 10 {
		t.Fatalf("present %d, want 10", e.Present())
	}
	pub := NewPublisher(PublisherOptions{Options: opts(), ConfirmTimeout: 5 * time.Second})
	defer pub.Close()
	for i := 10; i < 15; i++ {
		if err := pub.Publish(context.Background(), q, &msg.Message{MessageID: strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for i := range 10 {
		d := take(t, e, i)
		got = append(got, d.Message().MessageID)
		if err := d.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if !equal(got, seq(0, 10)) {
		t.Fatalf("taken %v", got)
	}
	rest, err := e.Stop(context.Background())
	if err != nil || len(rest) != 0 {
		t.Fatalf("Stop: %d pushed past the present messages, %v", len(rest), err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	ids, counts := deliveryCounts(t, q)
	if !equal(ids, seq(10, 15)) {
		t.Fatalf("queue after the pass holds %v, want the 5 that came after it started", ids)
	}
	for id, n := range counts {
		if n != 0 {
			t.Errorf("message %s: delivery count %d", id, n)
		}
	}
}

// What the broker pushed and the pass did not take comes back from Stop,
// in order, for the caller to hand back; nothing goes back by the close,
// and on an empty queue the pass ends (Next says so) rather than waits.
func TestBrowseStopReturnsWhatWasPushed(t *testing.T) {
	needBroker(t)
	q := declareTyped(t, "quorum", 0)
	e, err := OpenBrowse(context.Background(), opts(), q, 64, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if d, ok, err := e.Next(context.Background()); ok || err != nil {
		t.Fatalf("empty queue: Next gave %v, %v, %v", d, ok, err)
	}
	pub := NewPublisher(PublisherOptions{Options: opts(), ConfirmTimeout: 5 * time.Second})
	defer pub.Close()
	for i := range 3 {
		if err := pub.Publish(context.Background(), q, &msg.Message{MessageID: strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	rest, err := e.Stop(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The window of an empty queue is one message; Stop may also find
	// the others with basic.get. Each is handed back at the tail.
	if len(rest) == 0 {
		t.Fatal("Stop returned nothing, want at least the message pushed")
	}
	var handed []string
	for _, d := range rest {
		handed = append(handed, d.Message().MessageID)
		if err := pub.Publish(context.Background(), q, msg.KeepCopy(d.Message())); err != nil {
			t.Fatal(err)
		}
		if err := d.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if !equal(handed, seq(0, len(rest))) {
		t.Fatalf("Stop returned %v, want the head of the queue in order", handed)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	ids, counts := deliveryCounts(t, q)
	if want := slices.Concat(seq(len(rest), 3), seq(0, len(rest))); !equal(ids, want) {
		t.Fatalf("queue holds %v, want %v", ids, want)
	}
	for id, n := range counts {
		if n != 0 {
			t.Errorf("message %s: delivery count %d", id, n)
		}
	}
}

// A tool run right after another ends must be able to own the queue: the
// lock queue is gone once Close returns, not some time after.
func TestExclusiveNextOwnerRightAfterClose(t *testing.T) {
	needBroker(t)
	q := declareQueue(t, 3)
	ctx := context.Background()
	for i := range 40 {
		e, err := OpenExclusive(ctx, opts(), q, 2)
		if err != nil {
			t.Fatalf("owner %d: %v", i, err)
		}
		take(t, e, 0)
		if i%2 == 1 {
			e.ReturnByClosing()
		}
		if err := e.Close(); err != nil {
			t.Fatalf("owner %d: close: %v", i, err)
		}
	}
	in, err := OpenInspector(ctx, opts())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	waitfor.Until(t, 30*time.Second, "all 3 messages back in the queue", func() bool {
		n, err := in.Depth(q)
		return err == nil && n == 3
	})
}

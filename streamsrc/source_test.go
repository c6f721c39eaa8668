package streamsrc

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

var node = testbroker.Lazy{Options: testbroker.Options{Quiet: true, Streams: true}}

func TestMain(m *testing.M) { os.Exit(testbroker.RunLazy(m, &node)) }

// publish writes n messages to the stream with the stream protocol and
// waits for their confirms; message i has id "m<i>" and body "body <i>".
func publish(t *testing.T, o Options, first, n int) {
	t.Helper()
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetHost(o.Host).SetPort(o.Port))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer env.Close()
	p, err := env.NewProducer(o.Stream, stream.NewProducerOptions())
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer p.Close()
	var msgs []*amqp.AMQP10
	for i := first; i < first+n; i++ {
		m := amqp.NewMessage([]byte(fmt.Sprintf("body %d", i)))
		m.Properties = &amqp.MessageProperties{MessageID: fmt.Sprintf("m%d", i), ContentType: "text/plain"}
		m.ApplicationProperties = map[string]any{"k": int64(i)}
		msgs = append(msgs, m)
	}
	for _, r := range sendConfirmed(t, p, msgs) {
		if !r {
			t.Fatal("a publish was not confirmed")
		}
	}
}

func sendConfirmed(t *testing.T, p *stream.Producer, msgs []*amqp.AMQP10) []bool {
	t.Helper()
	confirms := p.NotifyPublishConfirmation()
	var batch []message.StreamMessage
	for _, m := range msgs {
		batch = append(batch, m)
	}
	if err := p.BatchSend(batch); err != nil {
		t.Fatalf("send: %v", err)
	}
	var out []bool
	deadline := time.After(20 * time.Second)
	for len(out) < len(msgs) {
		select {
		case cs := <-confirms:
			for _, c := range cs {
				out = append(out, c.IsConfirmed())
			}
		case <-deadline:
			t.Fatalf("%d of %d confirms", len(out), len(msgs))
		}
	}
	return out
}

func options(t *testing.T, b *testbroker.Broker) Options {
	return Options{
		Port: b.StreamPort(), Stream: "s." + t.Name(), Consumer: "c1", Declare: true,
		StoreEvery: 50 * time.Millisecond, ReconnectMin: 100 * time.Millisecond, ReconnectMax: time.Second,
		RedeliverAfter: 50 * time.Millisecond,
	}
}

// The source hands every message in offset order with the stream's name
// and the offset as headers, and stores on the broker only the offset
// below which everything is settled, whatever order they settle in.
func TestSourceStoresOnlySettledOffsets(t *testing.T) {
	b := node.Get(t)
	if b.StreamPort() == 0 {
		t.Fatal("the test broker serves no stream port")
	}
	o := options(t, b)
	src := New(o)
	var mu sync.Mutex
	var got []*Delivery
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func(d *Delivery) { mu.Lock(); got = append(got, d); mu.Unlock() }) }()
	waitfor.Until(t, 20*time.Second, "the source subscribes", src.Connected)
	publish(t, o, 0, 10)
	waitfor.Until(t, 10*time.Second, "10 deliveries", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 10 })
	for i, d := range got {
		m := d.Message()
		if m.MessageID != fmt.Sprintf("m%d", i) || string(m.Body) != fmt.Sprintf("body %d", i) || m.ContentType != "text/plain" {
			t.Fatalf("delivery %d: id %q body %q type %q", i, m.MessageID, m.Body, m.ContentType)
		}
		if m.String(msg.HeaderStream) != o.Stream || m.Headers[msg.HeaderStreamOffset] != d.Offset() {
			t.Fatalf("delivery %d: stream headers %v", i, m.Headers)
		}
		if n, _ := m.Int("k"); n != int64(i) {
			t.Fatalf("delivery %d: application property k = %v", i, m.Headers["k"])
		}
	}
	// Settle all but the fourth, out of order.
	for i := 9; i >= 0; i-- {
		if i != 3 {
			if err := got[i].Ack(); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := got[2].Offset()
	waitfor.Until(t, 5*time.Second, "the stored offset reaches the one before the unsettled message", func() bool {
		off, ok, err := StoredOffset(o)
		return err == nil && ok && off == want
	})
	time.Sleep(200 * time.Millisecond)
	if off, _, _ := StoredOffset(o); off != want {
		t.Fatalf("stored offset %d passed the unsettled %d", off, got[3].Offset())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	// A new source of the same consumer name starts at the unsettled one.
	src2 := New(o)
	var got2 []*Delivery
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	go src2.Run(ctx2, func(d *Delivery) { mu.Lock(); got2 = append(got2, d); mu.Unlock() }) //nolint:errcheck // ends with ctx2
	waitfor.Until(t, 10*time.Second, "7 deliveries after the restart", func() bool { mu.Lock(); defer mu.Unlock(); return len(got2) == 7 })
	mu.Lock()
	first := got2[0].Message().MessageID
	mu.Unlock()
	if first != "m3" {
		t.Fatalf("after the restart the first delivery is %s, want m3", first)
	}
	for _, d := range got2 {
		d.Ack() //nolint:errcheck // each once
	}
	cancel2()
	if err := src2.Close(); err != nil {
		t.Fatal(err)
	}
	if off, ok, err := StoredOffset(o); err != nil || !ok || off != got[9].Offset() {
		t.Fatalf("stored offset after Close %d %t %v, want %d", off, ok, err, got[9].Offset())
	}
}

// A delivery given back comes back at the same offset, flagged
// redelivered, and holds the stored offset until it is settled.
func TestSourceRedeliversWhatIsGivenBack(t *testing.T) {
	b := node.Get(t)
	o := options(t, b)
	src := New(o)
	var mu sync.Mutex
	seen := map[string]int{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go src.Run(ctx, func(d *Delivery) { //nolint:errcheck // ends with ctx
		mu.Lock()
		id := d.Message().MessageID
		seen[id]++
		n := seen[id]
		mu.Unlock()
		if id == "m1" && n == 1 {
			if d.Message().Redelivered {
				t.Error("first delivery flagged redelivered")
			}
			d.Nack(true) //nolint:errcheck // never fails with requeue
			return
		}
		if id == "m1" && !d.Message().Redelivered {
			t.Error("second delivery of m1 not flagged redelivered")
		}
		d.Ack() //nolint:errcheck // once
	})
	waitfor.Until(t, 20*time.Second, "the source subscribes", src.Connected)
	src.Pause()
	publish(t, o, 0, 3)
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	n := len(seen)
	mu.Unlock()
	if n != 0 {
		t.Fatalf("%d messages handed while paused", n)
	}
	src.Resume(0)
	waitfor.Until(t, 10*time.Second, "m1 twice, m2 once", func() bool { mu.Lock(); defer mu.Unlock(); return seen["m1"] == 2 && seen["m2"] == 1 })
	waitfor.Until(t, 5*time.Second, "everything settled", func() bool { off, ok := src.Settled(); return ok && off == 2 })
	cancel()
	src.Close() //nolint:errcheck // checked by the stored offset
	if off, ok, err := StoredOffset(o); err != nil || !ok || off != 2 {
		t.Fatalf("stored offset %d %t %v, want 2", off, ok, err)
	}
}

// The broker restarting under a reader: the source subscribes again after
// the last offset it read, so every message is handed over once, none
// skipped, and the stored offset ends at the last one.
func TestSourceResumesAfterBrokerRestart(t *testing.T) {
	b := testbroker.MustStartWith(t, testbroker.Options{Quiet: true, Streams: true})
	o := options(t, b)
	src := New(o)
	var mu sync.Mutex
	seen := map[string]int{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- src.Run(ctx, func(d *Delivery) {
			mu.Lock()
			seen[d.Message().MessageID]++
			mu.Unlock()
			d.Ack() //nolint:errcheck // once
		})
	}()
	waitfor.Until(t, 20*time.Second, "the source subscribes", src.Connected)
	publish(t, o, 0, 20)
	waitfor.Until(t, 10*time.Second, "20 delivered", func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) == 20 })
	if err := b.Restart(); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 60*time.Second, "the source subscribes again", src.Connected)
	publish(t, o, 20, 20)
	waitfor.Until(t, 20*time.Second, "40 delivered", func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) == 40 })
	mu.Lock()
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s handed over %d times", id, n)
		}
	}
	mu.Unlock()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	off, ok, err := StoredOffset(o)
	last, _ := src.Settled()
	if err != nil || !ok || off != last {
		t.Fatalf("stored offset %d %t %v, want the last settled %d", off, ok, err, last)
	}
}

// The loop never holds more of the stream's deliveries, unsettled, than
// the prefetch: the next waits until one is settled.
func TestSourceHandsOverNoMoreThanThePrefetch(t *testing.T) {
	b := node.Get(t)
	o := options(t, b)
	o.Prefetch = 3
	src := New(o)
	var mu sync.Mutex
	var got []*Delivery
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go src.Run(ctx, func(d *Delivery) { mu.Lock(); got = append(got, d); mu.Unlock() }) //nolint:errcheck // ends with ctx
	waitfor.Until(t, 20*time.Second, "the source subscribes", src.Connected)
	publish(t, o, 0, 10)
	waitfor.Until(t, 10*time.Second, "3 deliveries", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 3 })
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	n := len(got)
	first := got[0]
	mu.Unlock()
	if held, _ := src.Held(); n != 3 || held != 3 {
		t.Fatalf("%d handed over, %d held, with a prefetch of 3 and nothing settled", n, held)
	}
	first.Ack() //nolint:errcheck // once
	waitfor.Until(t, 10*time.Second, "a fourth once one is settled", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 4 })
	cancel()
	src.Close() //nolint:errcheck // nothing checked after
}

// Two readers of one consumer name as single active consumers: the broker
// delivers to one; when it goes away with a message unsettled, the other
// is promoted and starts at that message, skipping none.
func TestSourceSingleActiveConsumer(t *testing.T) {
	b := node.Get(t)
	if b.Series() < 4 {
		t.Skip("a single active consumer on a stream needs RabbitMQ 3.11 or later; this node runs 3.x before it")
	}
	o := options(t, b)
	o.SingleActive = true
	var mu sync.Mutex
	got := map[string][]*Delivery{}
	run := func(name string) (*Source, context.CancelFunc, chan error) {
		src := New(o)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- src.Run(ctx, func(d *Delivery) { mu.Lock(); got[name] = append(got[name], d); mu.Unlock() })
		}()
		return src, cancel, done
	}
	a, stopA, doneA := run("a")
	waitfor.Until(t, 20*time.Second, "a subscribes and is promoted", a.Active)
	bb, stopB, doneB := run("b")
	defer stopB()
	waitfor.Until(t, 20*time.Second, "b subscribes", bb.Connected)
	if bb.Active() {
		t.Fatal("two active readers of one consumer name")
	}
	publish(t, o, 0, 6)
	waitfor.Until(t, 10*time.Second, "a gets all 6", func() bool { mu.Lock(); defer mu.Unlock(); return len(got["a"]) == 6 })
	mu.Lock()
	for i, d := range got["a"] {
		if i != 2 {
			d.Ack() //nolint:errcheck // once
		}
	}
	unsettled := got["a"][2].Message().MessageID
	nb := len(got["b"])
	mu.Unlock()
	if nb != 0 {
		t.Fatalf("the standby got %d deliveries", nb)
	}
	waitfor.Until(t, 5*time.Second, "a stores the offset before its unsettled message", func() bool {
		off, ok, err := StoredOffset(o)
		want, _ := a.Settled()
		return err == nil && ok && off == want
	})
	// a goes away (as a pod does) without settling m2.
	stopA()
	<-doneA
	a.Close() //nolint:errcheck // checked through b
	waitfor.Until(t, 20*time.Second, "b is promoted", bb.Active)
	waitfor.Until(t, 10*time.Second, "b gets m2 to m5", func() bool { mu.Lock(); defer mu.Unlock(); return len(got["b"]) == 4 })
	mu.Lock()
	first := got["b"][0].Message().MessageID
	mu.Unlock()
	if first != unsettled {
		t.Fatalf("the promoted reader starts at %s, want the unsettled %s", first, unsettled)
	}
	stopB()
	<-doneB
	bb.Close() //nolint:errcheck // nothing checked after
}

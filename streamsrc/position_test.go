package streamsrc

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
)

// A running reader's position: with 100 messages in the stream, all read
// and the first 40 settled, the stored offset is 39, the last 99 and the
// lag 60; Inspect counts the same, exactly, from the broker alone.
func TestSourcePositionAndInspect(t *testing.T) {
	b := node.Get(t)
	o := options(t, b)
	o.PositionEvery = 50 * time.Millisecond
	o.Prefetch = 200
	src := New(o)
	var mu sync.Mutex
	var got []*Delivery
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func(d *Delivery) { mu.Lock(); got = append(got, d); mu.Unlock() }) }()
	waitfor.Until(t, 20*time.Second, "the source subscribes", src.Connected)
	publish(t, o, 0, 100)
	waitfor.Until(t, 10*time.Second, "100 deliveries", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 100 })
	for _, d := range got[:40] {
		if err := d.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	want := Position{Stored: 39, First: 0, Last: 99, Lag: 60}
	waitfor.Until(t, 5*time.Second, "position 39/99, lag 60", func() bool {
		p, ok := src.Position()
		p.At = time.Time{}
		return ok && p == want
	})
	st, err := Inspect(o)
	if err != nil {
		t.Fatal(err)
	}
	if st.Stored != 39 || !st.HasStored || st.First != 0 || st.Last != 99 || st.Lag != 60 {
		t.Fatalf("inspect: %+v", st)
	}
	for _, d := range got[40:] {
		d.Ack() //nolint:errcheck // each once
	}
	waitfor.Until(t, 5*time.Second, "lag 0 once all is settled", func() bool {
		p, ok := src.Position()
		return ok && p.Lag == 0 && p.Stored == 99
	})
	cancel()
	<-done
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	// A consumer name that never stored: its lag is the whole stream.
	o2 := o
	o2.Consumer = "never"
	if st, err := Inspect(o2); err != nil || st.HasStored || st.Lag != 100 {
		t.Fatalf("inspect of a new consumer name: %+v %v", st, err)
	}
}

func TestParseTarget(t *testing.T) {
	for in, want := range map[string]Target{
		"first": {Kind: "first"}, "last": {Kind: "last"}, "42": {Kind: "offset", Offset: 42},
		"2026-11-28T09:00:00Z": {Kind: "time", Time: time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)},
	} {
		got, err := ParseTarget(in)
		if err != nil || got.Kind != want.Kind || got.Offset != want.Offset || !got.Time.Equal(want.Time) {
			t.Errorf("%q: %+v %v", in, got, err)
		}
	}
	for _, in := range []string{"-1", "next", "09:00", "4x"} {
		if _, err := ParseTarget(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// A super stream's partition is named by its stream or its index, and
// an offset is refused without one before anything is looked up.
func TestSeekPartitionNamed(t *testing.T) {
	st := Status{Stream: "orders", Partitions: []Status{{Stream: "orders-0"}, {Stream: "orders-1"}, {Stream: "orders-2"}}}
	for in, want := range map[string]string{"orders-2": "orders-2", "1": "orders-1", "0": "orders-0"} {
		if p, err := partitionNamed(st, in); err != nil || p.Stream != want {
			t.Errorf("%q: %+v %v, want %s", in, p, err, want)
		}
	}
	for _, in := range []string{"3", "-1", "orders-3", "01", "orders"} {
		if _, err := partitionNamed(st, in); !errors.Is(err, ErrNoPartition) || !strings.Contains(err.Error(), "orders-0, orders-1, orders-2") {
			t.Errorf("%q: %v", in, err)
		}
	}
	o := Options{Stream: "orders", SuperStream: true, Consumer: "c", Port: 1}
	if _, err := Seek(o, Target{Kind: "offset", Offset: 4}, true); !errors.Is(err, ErrPartitionNeeded) {
		t.Errorf("seek of a super stream to a bare offset: %v", err)
	}
	o.SuperStream = false
	if _, err := Seek(o, Target{Kind: "first", Partition: "1"}, true); err == nil || !strings.Contains(err.Error(), "no partitions") {
		t.Errorf("seek of a stream's partition: %v", err)
	}
}

// Seek moves the stored offset to first, an offset, a time and last; a
// reader then resumes at the message named. A dry run stores nothing.
func TestSeek(t *testing.T) {
	b := node.Get(t)
	o := options(t, b)
	declare(t, o)
	publish(t, o, 0, 50)
	time.Sleep(1100 * time.Millisecond) // the next chunk is a second younger
	mid := time.Now()
	publish(t, o, 50, 30)

	firstRead := func() string {
		t.Helper()
		src := New(o)
		got := make(chan string, 200)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- src.Run(ctx, func(d *Delivery) { got <- d.Message().MessageID; d.Ack() }) //nolint:errcheck // once
		}()
		defer func() {
			cancel()
			<-done
			src.Close() //nolint:errcheck // test
		}()
		select {
		case id := <-got:
			return id
		case <-time.After(10 * time.Second):
			return ""
		}
	}

	mv, err := Seek(o, Target{Kind: "offset", Offset: 20}, true)
	if err != nil || mv.Next != 20 || mv.NewStored != 19 || mv.LagAfter != 60 || mv.Done {
		t.Fatalf("dry run: %+v %v", mv, err)
	}
	if _, ok, _ := StoredOffset(o); ok {
		t.Fatal("the dry run stored an offset")
	}
	for _, c := range []struct {
		to      Target
		next    int64
		firstID string
	}{
		{Target{Kind: "offset", Offset: 20}, 20, "m20"},
		{Target{Kind: "first"}, 0, "m0"},
		{Target{Kind: "time", Time: mid}, 50, "m50"},
		{Target{Kind: "offset", Offset: 77}, 77, "m77"},
	} {
		mv, err := Seek(o, c.to, false)
		if err != nil || mv.Next != c.next || !mv.Done {
			t.Fatalf("seek %+v: %+v %v", c.to, mv, err)
		}
		if off, ok, err := StoredOffset(o); err != nil || !ok || off != c.next-1 {
			t.Fatalf("seek %+v: stored %d %t %v", c.to, off, ok, err)
		}
		if id := firstRead(); id != c.firstID {
			t.Fatalf("after seek %+v the first read is %q, want %s", c.to, id, c.firstID)
		}
	}
	mv, err = Seek(o, Target{Kind: "last"}, false)
	if err != nil || mv.Next != 80 || mv.LagAfter != 0 {
		t.Fatalf("seek last: %+v %v", mv, err)
	}
	if st, err := Inspect(o); err != nil || st.Stored != 79 || st.Lag != 0 {
		t.Fatalf("after seek last: %+v %v", st, err)
	}
}

// With a single active reader of the name running, Seek refuses: the
// reader would store its own offset over the new one.
func TestSeekRefusedWhileSingleActiveReaderRuns(t *testing.T) {
	b := node.Get(t)
	o := options(t, b)
	o.SingleActive = true
	declare(t, o)
	publish(t, o, 0, 5)
	if b.Series() < 4 {
		// RabbitMQ 3.10 has no single active consumer on streams: the
		// reader stops at once, and Seek refuses, saying so.
		if err := New(o).Run(context.Background(), func(*Delivery) {}); !errors.Is(err, ErrNoSingleActive) {
			t.Fatalf("Run on RabbitMQ %s: %v", b.Version(), err)
		}
		if _, err := Seek(o, Target{Kind: "first"}, false); !errors.Is(err, ErrNoSingleActive) {
			t.Fatalf("Seek on RabbitMQ %s: %v", b.Version(), err)
		}
		return
	}
	src := New(o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func(d *Delivery) { d.Ack() }) }() //nolint:errcheck // once
	waitfor.Until(t, 20*time.Second, "the reader is active", src.Active)
	waitfor.Until(t, 5*time.Second, "offset 4 stored", func() bool {
		off, ok, _ := StoredOffset(o)
		return ok && off == 4
	})
	if _, err := Seek(o, Target{Kind: "first"}, false); !errors.Is(err, ErrReaderActive) {
		t.Fatalf("seek with a reader running: %v", err)
	}
	cancel()
	<-done
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	mv, err := Seek(o, Target{Kind: "first"}, false)
	if err != nil || !mv.Done {
		t.Fatalf("seek once the reader stopped: %+v %v", mv, err)
	}
	if off, _, _ := StoredOffset(o); off != -1 {
		t.Fatalf("stored %d after seek first, want -1", off)
	}
}

func declare(t *testing.T, o Options) {
	t.Helper()
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetHost(o.Host).SetPort(o.Port))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer env.Close()
	if err := env.DeclareStream(o.Stream, stream.NewStreamOptions()); err != nil {
		t.Fatalf("declare: %v", err)
	}
}

// A backlog written in large chunks is read at the speed of the machine,
// not of a socket buffer: with the client's default 8 KiB buffers a chunk
// of 512 messages of 256 B took about two seconds to arrive, so these
// 10,000 took some forty.
func TestSourceReadsLargeChunksQuickly(t *testing.T) {
	b := node.Get(t)
	o := options(t, b)
	o.Prefetch = 1000
	declare(t, o)
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetHost(o.Host).SetPort(o.Port).SetReadBuffer(0).SetWriteBuffer(0))
	if err != nil {
		t.Fatal(err)
	}
	p, err := env.NewProducer(o.Stream, stream.NewProducerOptions())
	if err != nil {
		t.Fatal(err)
	}
	const n = 10_000
	body := make([]byte, 256)
	for i := 0; i < n; i += 1000 {
		var batch []*amqp.AMQP10
		for range 1000 {
			batch = append(batch, amqp.NewMessage(body))
		}
		sendConfirmed(t, p, batch)
	}
	p.Close()
	env.Close()
	src := New(o)
	var got atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- src.Run(ctx, func(d *Delivery) { got.Add(1); d.Ack() }) }() //nolint:errcheck // once
	waitfor.Until(t, 15*time.Second, "10,000 messages read", func() bool { return got.Load() == n })
	t.Logf("%d messages read in %s", n, time.Since(start).Round(time.Millisecond))
	cancel()
	<-done
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
}

// Whether the broker answers stream stats is told without a request the
// broker could leave unanswered: yes from RabbitMQ 3.11 on, no before.
func TestSince311(t *testing.T) {
	b := node.Get(t)
	o := options(t, b)
	declare(t, o)
	publish(t, o, 0, 1)
	env, err := connect(o)
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	want := stream.IsVersionGreaterOrEqual(b.Version(), "3.11.0")
	if got := since311(env, o.Stream); got != want {
		t.Fatalf("3.11 or later %v on RabbitMQ %s, want %v", got, b.Version(), want)
	}
}

package streamsrc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// superOptions are the options of a super stream source of three
// partitions, declared by the source.
func superOptions(t *testing.T, o Options) Options {
	o.Stream = "ss." + t.Name()
	o.SuperStream, o.Partitions = true, 3
	return o
}

// partition is the options naming one partition as a stream, to publish
// to it and ask for its stored offset.
func partition(o Options, i int) Options {
	o.Stream, o.SuperStream = fmt.Sprintf("%s-%d", o.Stream, i), false
	return o
}

// collector gathers deliveries by partition.
type collector struct {
	mu  sync.Mutex
	got map[string][]*Delivery
}

func (c *collector) add(d *Delivery) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.got == nil {
		c.got = map[string][]*Delivery{}
	}
	c.got[d.Stream()] = append(c.got[d.Stream()], d)
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ds := range c.got {
		n += len(ds)
	}
	return n
}

func (c *collector) of(stream string) []*Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got[stream])
}

// A super stream's partitions are each read in offset order, each message
// naming its partition and offset, and each partition's offset is stored
// only up to its own first unsettled message: a new reader of the name
// goes on in each partition where it stopped.
func TestSuperStreamSourceStoresSettledOffsetsPerPartition(t *testing.T) {
	b := node.Get(t)
	o := superOptions(t, options(t, b))
	src := New(o)
	var c collector
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, c.add) }()
	if b.Series() < 4 {
		// RabbitMQ 3.10: no super streams, and none declared.
		select {
		case err := <-done:
			if !errors.Is(err, ErrNoSuperStream) || !strings.Contains(err.Error(), "3.13") {
				t.Fatalf("Run on RabbitMQ %s: %v, want the refusal of a super stream", b.Version(), err)
			}
			t.Logf("RabbitMQ %s: %v", b.Version(), err)
		case <-time.After(30 * time.Second):
			t.Fatalf("Run on RabbitMQ %s did not refuse the super stream", b.Version())
		}
		cancel()
		src.Close() //nolint:errcheck // nothing subscribed
		return
	}
	waitfor.Until(t, 20*time.Second, "the source subscribes", src.Connected)
	for i := range 3 {
		publish(t, partition(o, i), 100*i, 5)
	}
	waitfor.Until(t, 10*time.Second, "15 deliveries", func() bool { return c.count() == 15 })
	for i := range 3 {
		p := partition(o, i)
		ds := c.of(p.Stream)
		if len(ds) != 5 {
			t.Fatalf("%s: %d deliveries, want 5", p.Stream, len(ds))
		}
		for j, d := range ds {
			m := d.Message()
			if m.MessageID != fmt.Sprintf("m%d", 100*i+j) {
				t.Fatalf("%s delivery %d: %s, out of order", p.Stream, j, m.MessageID)
			}
			if m.String(msg.HeaderStream) != p.Stream || m.Headers[msg.HeaderStreamOffset] != d.Offset() {
				t.Fatalf("%s delivery %d: stream headers %v", p.Stream, j, m.Headers)
			}
			if i == 1 && j == 2 {
				continue // left unsettled
			}
			if err := d.Ack(); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := map[string]int64{}
	for i := range 3 {
		ds := c.of(partition(o, i).Stream)
		want[partition(o, i).Stream] = ds[4].Offset()
	}
	p1 := partition(o, 1).Stream
	want[p1] = c.of(p1)[1].Offset()
	for i := range 3 {
		p := partition(o, i)
		waitfor.Until(t, 10*time.Second, p.Stream+" stores its settled offset", func() bool {
			off, ok, err := StoredOffset(p)
			return err == nil && ok && off == want[p.Stream]
		})
	}
	pos := src.Partitions()
	if len(pos) != 3 {
		waitfor.Until(t, 10*time.Second, "a position per partition", func() bool { return len(src.Partitions()) == 3 })
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if off, _, _ := StoredOffset(partition(o, 1)); off != want[p1] {
		t.Fatalf("%s: stored offset %d after Close passed the unsettled message (want %d)", p1, off, want[p1])
	}
	st, err := Inspect(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Partitions) != 3 || st.Lag < 3 {
		t.Fatalf("Inspect: %+v, want 3 partitions and a lag of at least the 3 unsettled in %s", st, p1)
	}

	// A new reader of the name: only the unsettled message of partition 1
	// and the two after it.
	src2 := New(o)
	var c2 collector
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	go src2.Run(ctx2, c2.add) //nolint:errcheck // ends with ctx2
	waitfor.Until(t, 20*time.Second, "3 deliveries after the restart", func() bool { return c2.count() == 3 })
	var ids []string
	for _, d := range c2.of(p1) {
		ids = append(ids, d.Message().MessageID)
		d.Ack() //nolint:errcheck // once
	}
	if fmt.Sprint(ids) != "[m102 m103 m104]" {
		t.Fatalf("after the restart %s gave %v, want m102 to m104", p1, ids)
	}
	waitfor.Until(t, 10*time.Second, "the last offset of "+p1+" stored", func() bool {
		off, ok, err := StoredOffset(partition(o, 1))
		return err == nil && ok && off == c2.of(p1)[2].Offset()
	})
	cancel2()
	src2.Close() //nolint:errcheck // checked above
	if c2.count() != 3 {
		t.Fatalf("%d deliveries after the restart, want 3", c2.count())
	}
}

// Two single active readers of one name share a super stream's
// partitions, each partition read by one of them; when one goes away,
// the other takes its partitions over after the offsets stored, reading
// again what the first left unsettled and skipping nothing.
func TestSuperStreamSourceSharesPartitions(t *testing.T) {
	b := node.Get(t)
	if b.Series() < 4 {
		t.Skip("RabbitMQ 3.10 has no super streams: TestSuperStreamSourceStoresSettledOffsetsPerPartition checks the refusal")
	}
	o := superOptions(t, options(t, b))
	o.SingleActive = true
	run := func(c *collector) (*Source, context.CancelFunc, chan error) {
		src := New(o)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- src.Run(ctx, c.add) }()
		return src, cancel, done
	}
	var ca, cb collector
	a, stopA, doneA := run(&ca)
	waitfor.Until(t, 20*time.Second, "a reads all three partitions", func() bool { return len(a.ActivePartitions()) == 3 })
	bb, stopB, doneB := run(&cb)
	defer stopB()
	waitfor.Until(t, 20*time.Second, "the broker gives b some of the partitions", func() bool {
		na, nb := len(a.ActivePartitions()), len(bb.ActivePartitions())
		return nb > 0 && na > 0 && na+nb == 3
	})
	for _, p := range a.ActivePartitions() {
		if slices.Contains(bb.ActivePartitions(), p) {
			t.Fatalf("%s read by both", p)
		}
	}
	for i := range 3 {
		publish(t, partition(o, i), 100*i, 4)
	}
	waitfor.Until(t, 10*time.Second, "12 deliveries between them", func() bool { return ca.count()+cb.count() == 12 })
	// a settles all but the first message of each of its partitions.
	unsettled := map[string]string{}
	for _, p := range a.ActivePartitions() {
		for j, d := range ca.of(p) {
			if j == 0 {
				unsettled[p] = d.Message().MessageID
				continue
			}
			d.Ack() //nolint:errcheck // once
		}
	}
	for _, p := range bb.ActivePartitions() {
		if n := len(ca.of(p)); n != 0 {
			t.Fatalf("a got %d messages of %s, which b reads", n, p)
		}
		for _, d := range cb.of(p) {
			d.Ack() //nolint:errcheck // once
		}
	}
	stopA()
	<-doneA
	a.Close() //nolint:errcheck // checked through b
	waitfor.Until(t, 30*time.Second, "b takes every partition over", func() bool { return len(bb.ActivePartitions()) == 3 })
	waitfor.Until(t, 10*time.Second, "b reads again what a left", func() bool {
		for p := range unsettled {
			if len(cb.of(p)) != 4 {
				return false
			}
		}
		return true
	})
	for p, id := range unsettled {
		if first := cb.of(p)[0].Message().MessageID; first != id {
			t.Fatalf("%s: b starts at %s, want %s, the message a left unsettled", p, first, id)
		}
	}
	stopB()
	<-doneB
	bb.Close() //nolint:errcheck // nothing checked after
}

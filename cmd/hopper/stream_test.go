package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/streamsrc"
)

// streamReader reads name as consumer billing until stop: it settles the
// messages keep says, leaves the others unsettled, and records the first
// message id it was handed.
type streamReader struct {
	src   *streamsrc.Source
	stop  func()
	mu    sync.Mutex
	ids   []string
	count int
}

func readStream(t *testing.T, b *testbroker.Broker, name string, sac bool, keep func(int64) bool) *streamReader {
	t.Helper()
	r := &streamReader{src: streamsrc.New(streamsrc.Options{Port: b.StreamPort(), Stream: name, Consumer: "billing",
		StoreEvery: 50 * time.Millisecond, Prefetch: 500, SingleActive: sac, Declare: true})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.src.Run(ctx, func(d *streamsrc.Delivery) { //nolint:errcheck // ends with ctx
			r.mu.Lock()
			r.ids = append(r.ids, d.Message().MessageID)
			r.count++
			r.mu.Unlock()
			if keep(d.Offset()) {
				d.Ack() //nolint:errcheck // once
			}
		})
	}()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			<-done
			if err := r.src.Close(); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(r.stop)
	return r
}

func (r *streamReader) first(t *testing.T) string {
	t.Helper()
	waitfor.Until(t, 10*time.Second, "a delivery", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.ids) > 0 })
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ids[0]
}

// TestStreamStatusAndSeek: `hopper stream status` reports the figures of a
// stream of 100 messages read by a consumer name that settled the first
// 40 (stored offset 39, first 0, last 99, lag 60), exactly; `seek`
// refuses without --force when no single active consumer tells whether a
// Hopper reads, a dry run stores nothing, and seeks to an offset, to
// first and to a time make a reader of the name resume at the message
// named; with a single active reader running, seek refuses (75) and
// stores nothing, and once it stopped seek works.
func TestStreamStatusAndSeek(t *testing.T) {
	sb := testbroker.MustStartWith(t, testbroker.Options{Quiet: true, Streams: true})
	name := "events"
	cfgPath := configFile(t, fmt.Sprintf(`broker:
  urls: [%q]
queue:
  name: %s
  type: stream
  stream:
    consumer: billing
    port: %d
log:
  level: error
`, sb.URL(), name, sb.StreamPort()))
	pub := broker.NewPublisher(broker.PublisherOptions{Options: broker.Options{URLs: []string{sb.URL()}}, Channels: 1, ConfirmTimeout: 5 * time.Second})
	t.Cleanup(func() { pub.Close() })
	publish := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			if err := pub.PublishTo(context.Background(), "", name, &msg.Message{MessageID: fmt.Sprintf("%s%d", prefix, i), Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	status := func(args ...string) streamsrc.Status {
		t.Helper()
		r := hopper(t, append([]string{"stream", "status", "-c", cfgPath, "-o", "json"}, args...)...)
		if r.code != 0 {
			t.Fatalf("status: exit %d\n%s", r.code, r.stderr)
		}
		var st streamsrc.Status
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
			t.Fatalf("status output: %v\n%s", err, r.stdout)
		}
		return st
	}

	// A reader declares the stream (and stores nothing); then 100
	// messages, read by a reader that settles the first 40. (A store
	// while they are published would take an offset between them.)
	rd := readStream(t, sb, name, false, func(int64) bool { return false })
	waitfor.Until(t, 20*time.Second, "the reader subscribes", rd.src.Connected)
	rd.stop()
	publish("m", 100)
	rd = readStream(t, sb, name, false, func(off int64) bool { return off < 40 })
	waitfor.Until(t, 20*time.Second, "100 read", func() bool { rd.mu.Lock(); defer rd.mu.Unlock(); return rd.count == 100 })
	rd.stop()
	st := status()
	if st.Stream != name || st.Consumer != "billing" || !st.HasStored || st.Stored != 39 || st.First != 0 || st.Last != 99 || st.Lag != 60 {
		t.Fatalf("status: %+v, want stored 39, first 0, last 99, lag 60", st)
	}
	text := hopper(t, "stream", "status", "-c", cfgPath)
	for _, want := range []string{"stored offset  39 (reading resumes at 40)", "last offset    99", "lag            60"} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("status text lacks %q:\n%s", want, text.stdout)
		}
	}

	// Without a single active consumer and without --force: refused.
	if r := hopper(t, "stream", "seek", "20", "-c", cfgPath); r.code != 64 || !strings.Contains(r.stderr, "--force") {
		t.Fatalf("seek without --force: exit %d\n%s", r.code, r.stderr)
	}
	// A dry run says what it would do and stores nothing.
	r := hopper(t, "stream", "seek", "20", "--dry-run", "-c", cfgPath)
	if r.code != 0 || !strings.Contains(r.stdout, "39 -> 19 (reading resumes at 20)") || !strings.Contains(r.stdout, "lag            60 -> 80") ||
		!strings.Contains(r.stdout, "dry run: nothing stored") {
		t.Fatalf("dry run: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if st := status(); st.Stored != 39 {
		t.Fatalf("the dry run moved the stored offset to %d", st.Stored)
	}
	if r := hopper(t, "stream", "seek", "nonsense", "-c", cfgPath); r.code != 64 {
		t.Fatalf("seek nonsense: exit %d\n%s", r.code, r.stderr)
	}

	resumesAt := func(target, wantID string) {
		t.Helper()
		if r := hopper(t, "stream", "seek", target, "--force", "-c", cfgPath); r.code != 0 {
			t.Fatalf("seek %s: exit %d\n%s", target, r.code, r.stderr)
		}
		rd := readStream(t, sb, name, false, func(int64) bool { return false })
		if got := rd.first(t); got != wantID {
			t.Fatalf("after seek %s the reader starts at %s, want %s", target, got, wantID)
		}
		rd.stop()
	}
	resumesAt("20", "m20")
	resumesAt("first", "m0")
	time.Sleep(1100 * time.Millisecond)
	since := time.Now().UTC().Format(time.RFC3339Nano)
	publish("n", 10)
	resumesAt(since, "n0")
	resumesAt("70", "m70")

	// With a single active reader of the name running, seek refuses and
	// stores nothing; once it stopped, seek works without --force.
	sac := []string{"-c", cfgPath, "--set", "queue.stream.singleActiveConsumer=true"}
	if sb.Series() < 4 {
		// RabbitMQ 3.10 has none: seek says so, and stores nothing.
		before := status()
		if r := hopper(t, append([]string{"stream", "seek", "first"}, sac...)...); r.code != 65 || !strings.Contains(r.stderr, "3.11") {
			t.Fatalf("seek as a single active consumer on RabbitMQ %s: exit %d\n%s", sb.Version(), r.code, r.stderr)
		}
		if st := status(); st.Stored != before.Stored {
			t.Fatalf("the refused seek moved the stored offset from %d to %d", before.Stored, st.Stored)
		}
	} else {
		rd = readStream(t, sb, name, true, func(int64) bool { return true })
		waitfor.Until(t, 20*time.Second, "the single active reader is active", rd.src.Active)
		waitfor.Until(t, 10*time.Second, "everything settled", func() bool {
			off, ok := rd.src.Settled()
			return ok && off >= 99
		})
		before := status()
		if r := hopper(t, append([]string{"stream", "seek", "first"}, sac...)...); r.code != 75 || !strings.Contains(r.stderr, "stop the Hoppers") {
			t.Fatalf("seek with a reader running: exit %d\n%s", r.code, r.stderr)
		}
		rd.stop()
		if r := hopper(t, append([]string{"stream", "seek", "first"}, sac...)...); r.code != 0 {
			t.Fatalf("seek after the reader stopped: exit %d\n%s", r.code, r.stderr)
		}
		if st := status(); st.Stored != -1 || st.Lag != st.Last+1 {
			t.Fatalf("after seek first: %+v (before: %+v)", st, before)
		}
	}

	// No stream listener: unavailable; a queue that is no stream: usage.
	if r := hopper(t, "stream", "status", "--broker-url", "amqp://127.0.0.1:1/", "--queue", "x", "--set", "queue.type=stream",
		"--set", "queue.stream.consumer=a", "--set", "queue.stream.port=1"); r.code != 69 {
		t.Fatalf("status without a listener: exit %d\n%s", r.code, r.stderr)
	}
	if r := hopper(t, "stream", "status", "--broker-url", sb.URL(), "--queue", "x"); r.code != 64 || !strings.Contains(r.stderr, "not a stream") {
		t.Fatalf("status of a queue: exit %d\n%s", r.code, r.stderr)
	}
	// A stream that does not exist: bad data.
	if r := hopper(t, "stream", "status", "-c", cfgPath, "--set", "queue.name=nosuch"); r.code != 65 {
		t.Fatalf("status of a missing stream: exit %d\n%s", r.code, r.stderr)
	}

	superStreamStatus(t, sb, cfgPath, pub)
}

// superStreamStatus: `hopper stream status` of a super stream shows each
// partition's stored offset, last offset and lag, and the total; then
// superStreamSeek. RabbitMQ 3.10 has no super streams: status and seek
// say so (65).
func superStreamStatus(t *testing.T, sb *testbroker.Broker, cfgPath string, pub *broker.Publisher) {
	args := func(cmd ...string) []string {
		return append(cmd, "-c", cfgPath, "--set", "queue.name=orders", "--set", "queue.stream.superStream=true")
	}
	if sb.Series() < 4 {
		for _, cmd := range [][]string{{"stream", "status"}, {"stream", "seek", "first", "--force"}} {
			if r := hopper(t, args(cmd...)...); r.code != 65 || !strings.Contains(r.stderr, "not found") {
				t.Fatalf("%s of a super stream on RabbitMQ %s: exit %d\n%s", cmd[1], sb.Version(), r.code, r.stderr)
			}
		}
		return
	}
	read := func(settle func(*streamsrc.Delivery) bool, sac bool) (*streamsrc.Source, func()) {
		src := streamsrc.New(streamsrc.Options{Port: sb.StreamPort(), Stream: "orders", Consumer: "billing", SuperStream: true,
			Partitions: 3, Declare: true, StoreEvery: 50 * time.Millisecond, SingleActive: sac})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			src.Run(ctx, func(d *streamsrc.Delivery) { //nolint:errcheck // ends with ctx
				if settle(d) {
					d.Ack() //nolint:errcheck // once
				}
			})
		}()
		return src, func() { cancel(); <-done; src.Close() } //nolint:errcheck // checked by status
	}
	// Declared (nothing stored), then 10 messages by routing key: 4 to
	// orders-0, 3 to each other; a reader settles those of orders-0 and
	// orders-1 only.
	src, stop := read(func(*streamsrc.Delivery) bool { return false }, false)
	waitfor.Until(t, 20*time.Second, "the super stream is declared and read", src.Connected)
	stop()
	for i := range 10 {
		if err := pub.PublishTo(context.Background(), "orders", fmt.Sprint(i%3), &msg.Message{MessageID: fmt.Sprintf("o%d", i), Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	src, stop = read(func(d *streamsrc.Delivery) bool { return d.Stream() != "orders-2" }, false)
	waitfor.Until(t, 20*time.Second, "orders-0 and orders-1 settled", func() bool {
		a, okA := src.SettledOf("orders-0")
		b, okB := src.SettledOf("orders-1")
		return okA && okB && a == 3 && b == 2
	})
	stop()
	r := hopper(t, args("stream", "status", "-o", "json")...)
	if r.code != 0 {
		t.Fatalf("status: exit %d\n%s", r.code, r.stderr)
	}
	var st streamsrc.Status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status output: %v\n%s", err, r.stdout)
	}
	want := []struct {
		stored, last, lag int64
		has               bool
	}{{3, 3, 0, true}, {2, 2, 0, true}, {-1, 2, 3, false}}
	if len(st.Partitions) != 3 || st.Lag != 3 {
		t.Fatalf("status: %+v, want 3 partitions and a lag of 3", st)
	}
	for i, w := range want {
		p := st.Partitions[i]
		if p.Stream != fmt.Sprintf("orders-%d", i) || p.Stored != w.stored || p.HasStored != w.has || p.Last != w.last || p.Lag != w.lag {
			t.Errorf("partition %d: %+v, want %+v", i, p, w)
		}
	}
	text := hopper(t, args("stream", "status")...)
	for _, w := range []string{"super stream  orders (3 partitions)", "orders-2", "total"} {
		if !strings.Contains(text.stdout, w) {
			t.Errorf("status text lacks %q:\n%s", w, text.stdout)
		}
	}
	superStreamSeek(t, args, pub, read)
}

// superStreamSeek: `hopper stream seek` of a super stream moves every
// partition to its own first, last and first message at or after a time,
// and with --partition one partition only, to an offset too; a bare
// offset is refused (64), a dry run stores nothing, and with a single
// active reader of the name running seek refuses (75) and stores nothing
// in any partition.
func superStreamSeek(t *testing.T, args func(...string) []string, pub *broker.Publisher,
	read func(func(*streamsrc.Delivery) bool, bool) (*streamsrc.Source, func())) {
	status := func() []streamsrc.Status {
		t.Helper()
		r := hopper(t, args("stream", "status", "-o", "json")...)
		var st streamsrc.Status
		if err := json.Unmarshal([]byte(r.stdout), &st); r.code != 0 || err != nil || len(st.Partitions) != 3 {
			t.Fatalf("status: exit %d, %v\n%s%s", r.code, err, r.stdout, r.stderr)
		}
		return st.Partitions
	}
	// check compares each partition's stored offset with what want says
	// of it, given its status before.
	check := func(what string, before []streamsrc.Status, want func(i int, before streamsrc.Status) int64) {
		t.Helper()
		for i, p := range status() {
			if w := want(i, before[i]); p.Stored != w || !p.HasStored || p.Lag != p.Last-w {
				t.Errorf("%s: %s stored %d, lag %d (last %d), want stored %d", what, p.Stream, p.Stored, p.Lag, p.Last, w)
			}
		}
	}
	seek := func(want func(i int, before streamsrc.Status) int64, target ...string) {
		t.Helper()
		before := status()
		if r := hopper(t, args(append([]string{"stream", "seek", "--force"}, target...)...)...); r.code != 0 {
			t.Fatalf("seek %v: exit %d\n%s", target, r.code, r.stderr)
		}
		check(fmt.Sprint("seek ", target), before, want)
	}
	// only moves partition i to off, leaving the others as they were.
	only := func(i int, off int64) func(int, streamsrc.Status) int64 {
		return func(j int, p streamsrc.Status) int64 {
			if j == i {
				return off
			}
			return p.Stored
		}
	}
	was := status()

	// A bare offset names no partition: refused; one for a stream too.
	if r := hopper(t, args("stream", "seek", "1", "--force")...); r.code != 64 || !strings.Contains(r.stderr, "--partition") {
		t.Fatalf("seek to a bare offset: exit %d\n%s", r.code, r.stderr)
	}
	if r := hopper(t, args("stream", "seek", "first", "--force", "--partition", "7")...); r.code != 64 || !strings.Contains(r.stderr, "orders-2") {
		t.Fatalf("seek of partition 7: exit %d\n%s", r.code, r.stderr)
	}

	// A dry run says each partition's move and the total, stores nothing.
	r := hopper(t, args("stream", "seek", "first", "--dry-run")...)
	if r.code != 0 || !strings.Contains(r.stdout, "orders-2") || !strings.Contains(r.stdout, "none -> -1 (reading resumes at 0)  3 -> 3") ||
		!strings.Contains(r.stdout, "3 -> 10") || !strings.Contains(r.stdout, "dry run: nothing stored") {
		t.Fatalf("dry run: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = hopper(t, args("stream", "seek", "first", "--dry-run", "-o", "json")...)
	var mv streamsrc.Move
	if err := json.Unmarshal([]byte(r.stdout), &mv); err != nil || r.code != 0 {
		t.Fatalf("dry run json: exit %d, %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	if len(mv.Partitions) != 3 || mv.Done || mv.Lag != 3 || mv.LagAfter != 10 {
		t.Fatalf("dry run json: %+v", mv)
	}
	for i, p := range mv.Partitions {
		if p.Stream != fmt.Sprintf("orders-%d", i) || p.Stored != was[i].Stored || p.NewStored != -1 || p.Next != 0 || p.LagAfter != p.Last+1 || p.Done {
			t.Errorf("dry run json, partition %d: %+v", i, p)
		}
	}
	for i, p := range status() {
		if p.Stored != was[i].Stored || p.HasStored != was[i].HasStored {
			t.Fatalf("the dry run moved %s to %d", p.Stream, p.Stored)
		}
	}

	seek(func(int, streamsrc.Status) int64 { return -1 }, "first")
	seek(func(_ int, p streamsrc.Status) int64 { return p.Last }, "last")
	seek(only(1, 0), "--partition", "1", "1")
	seek(only(2, -1), "--partition", "orders-2", "first")

	// A time: two messages to each partition after it, each partition
	// then resumes at its first of them. (Every chunk before was written
	// in an earlier millisecond.)
	since := time.Now().Truncate(time.Millisecond).Add(time.Millisecond)
	waitfor.Until(t, time.Second, "the clock passes the time sought", func() bool { return time.Now().After(since) })
	for i := range 6 {
		if err := pub.PublishTo(context.Background(), "orders", fmt.Sprint(i%3), &msg.Message{MessageID: fmt.Sprintf("p%d", i), Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	seek(func(_ int, p streamsrc.Status) int64 { return p.Last - 2 }, since.UTC().Format(time.RFC3339Nano))

	// A single active reader of the name reads every partition to its
	// end: seek refuses and stores nothing; once it stopped, seek works.
	src, stop := read(func(*streamsrc.Delivery) bool { return true }, true)
	waitfor.Until(t, 20*time.Second, "the reader is active on every partition and stored its end", func() bool {
		if len(src.ActivePartitions()) != 3 {
			return false
		}
		for _, p := range status() {
			if p.Stored != p.Last {
				return false
			}
		}
		return true
	})
	sac := append(args("stream", "seek", "first"), "--set", "queue.stream.singleActiveConsumer=true")
	before := status()
	if r := hopper(t, sac...); r.code != 75 || !strings.Contains(r.stderr, "nothing was stored in any partition") {
		t.Fatalf("seek with a reader running: exit %d\n%s", r.code, r.stderr)
	}
	stop()
	check("the refused seek", before, func(_ int, p streamsrc.Status) int64 { return p.Last })
	if r := hopper(t, sac...); r.code != 0 {
		t.Fatalf("seek once the reader stopped: exit %d\n%s", r.code, r.stderr)
	}
	check("seek first as the single active consumer", before, func(int, streamsrc.Status) int64 { return -1 })
}

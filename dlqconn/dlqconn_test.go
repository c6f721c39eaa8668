package dlqconn_test

// Browsing a quorum DLQ on a real broker: every pass must leave the DLQ
// with the same messages, once each, in their order, and with their
// delivery count unspent, whatever the broker pushed ahead of the pass.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/dlqconn"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

var node testbroker.Lazy

func TestMain(m *testing.M) { os.Exit(testbroker.RunLazy(m, &node)) }

var seq atomic.Int64

type env struct {
	t    *testing.T
	rb   *testbroker.Broker
	opts broker.Options
	pub  *broker.Publisher
}

func newEnv(t *testing.T) *env {
	t.Helper()
	rb := node.Get(t)
	e := &env{t: t, rb: rb, opts: broker.Options{URLs: []string{rb.URL()}, ConnectTimeout: 5 * time.Second,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond, Name: "test " + t.Name()}}
	// One channel: copies sent from one goroutine keep their order.
	e.pub = broker.NewPublisher(broker.PublisherOptions{Options: e.opts, Channels: 1, ConfirmTimeout: 30 * time.Second})
	t.Cleanup(func() { e.pub.Close() })
	return e
}

// quorumDLQ declares a quorum queue under a policy that sets its delivery
// limit, as an operator's policy would.
func (e *env) quorumDLQ(limit int) string {
	e.t.Helper()
	name := fmt.Sprintf("qscan%d.dlq", seq.Add(1))
	plan := topology.Plan{Work: topology.Queue{Name: name, Role: topology.RoleWork, Args: map[string]any{"x-queue-type": "quorum"}, Owned: true}, Declare: true}
	plan.DLQ = plan.Work
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := broker.Apply(ctx, e.opts, &plan, true); err != nil {
		e.t.Fatal(err)
	}
	policy := "dl-" + name
	if out, err := e.rb.Ctl("set_policy", "--apply-to", "queues", policy, "^"+regexp.QuoteMeta(name)+"$",
		fmt.Sprintf(`{"delivery-limit":%d}`, limit)); err != nil {
		e.t.Fatalf("set_policy: %v\n%s", err, out)
	}
	e.t.Cleanup(func() { e.rb.Ctl("clear_policy", policy) }) //nolint:errcheck // the node is private to the test run
	return name
}

// fill publishes ids prefix0…prefix(n-1) to queue in that order, each
// confirmed.
func (e *env) fill(queue, prefix string, from, n int) []string {
	e.t.Helper()
	var waits []func() error
	var ids []string
	// The publisher keeps at most 256 publishes awaiting their confirm.
	settle := func(keep int) {
		for len(waits) > keep {
			if err := waits[0](); err != nil {
				e.t.Fatal(err)
			}
			waits = waits[1:]
		}
	}
	for i := from; i < from+n; i++ {
		id := prefix + strconv.Itoa(i)
		m := &msg.Message{MessageID: id, Headers: map[string]any{"n": int64(i)}, Body: []byte(`{"id":"` + id + `"}`)}
		waits = append(waits, e.pub.Send(context.Background(), "", queue, m))
		ids = append(ids, id)
		settle(128)
	}
	settle(0)
	return ids
}

// drain takes every message of queue for good and returns them in order.
func (e *env) drain(queue string) []*msg.Message {
	e.t.Helper()
	in, err := broker.OpenInspector(context.Background(), e.opts)
	if err != nil {
		e.t.Fatal(err)
	}
	defer in.Close()
	var out []*msg.Message
	for {
		d, ok, err := in.Get(queue)
		if err != nil {
			e.t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d.Message())
		if err := d.Ack(); err != nil {
			e.t.Fatal(err)
		}
	}
}

// settled waits until no consumer is left on queue: a quorum queue
// removes a consumer whose channel ended together with returning what it
// held, so what a closed pass left is then all ready to be read.
func (e *env) settled(queue string) {
	e.t.Helper()
	in, err := broker.OpenInspector(context.Background(), e.opts)
	if err != nil {
		e.t.Fatal(err)
	}
	defer in.Close()
	waitfor.Until(e.t, 30*time.Second, "no consumer left on "+queue, func() bool {
		n, err := in.Consumers(queue)
		if err != nil {
			e.t.Fatal(err)
		}
		return n == 0
	})
}

// ready is the queue's ready count, as the broker answers it now.
func (e *env) ready(queue string) int {
	e.t.Helper()
	in, err := broker.OpenInspector(context.Background(), e.opts)
	if err != nil {
		e.t.Fatal(err)
	}
	defer in.Close()
	n, err := in.Depth(queue)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *env) opener() *dlqconn.Opener {
	return &dlqconn.Opener{Opts: e.opts, ConfirmTimeout: 30 * time.Second}
}

// scan runs one pass the way the console's scan does, calling each with
// every message shown, and closes it.
func (e *env) scan(ctx context.Context, queue string, each func(*msg.Message)) (dlq.BrowseResult, int, error) {
	e.t.Helper()
	p, err := e.opener().Browse(ctx, queue)
	if err != nil {
		e.t.Fatal(err)
	}
	if p.Rotate == nil {
		e.t.Fatalf("%s is a quorum queue, and the pass does not rotate", queue)
	}
	res, err := dlq.Browse(ctx, p.Source, dlq.BrowseOptions{Limit: p.Present, Bound: p.Present, Rotate: p.Rotate}, func(m *msg.Message) error {
		each(m)
		return nil
	})
	p.Close()
	return res, p.Present, err
}

// check drains queue and compares it with want: same ids, each once, in
// order, none returned by the broker.
func (e *env) check(queue string, want []string) {
	e.t.Helper()
	e.settled(queue)
	got := e.drain(queue)
	gotIDs := make([]string, len(got))
	for i, m := range got {
		gotIDs[i] = m.MessageID
		if n, ok := m.Int(msg.HeaderDeliveryCount); ok && n > 0 {
			e.t.Errorf("message %s: delivery count %d spent", m.MessageID, n)
		}
	}
	if !slices.Equal(gotIDs, want) {
		seen := map[string]int{}
		for _, id := range gotIDs {
			seen[id]++
		}
		var lost, dup []string
		for _, id := range want {
			switch seen[id] {
			case 0:
				lost = append(lost, id)
			case 1:
			default:
				dup = append(dup, id)
			}
		}
		e.t.Fatalf("queue holds %d messages, want %d in order; lost %d %v, twice or more %d %v, first %v",
			len(gotIDs), len(want), len(lost), lost[:min(len(lost), 5)], len(dup), dup[:min(len(dup), 5)], gotIDs[:min(len(gotIDs), 5)])
	}
}

// Three full passes over a quorum DLQ whose delivery limit is 2: a
// message handed back by a return even twice would be dropped. Each pass
// shows every message present, once, in order, and leaves the DLQ as it
// was.
func TestQuorumScanKeepsEveryMessageInOrder(t *testing.T) {
	e := newEnv(t)
	q := e.quorumDLQ(2)
	const n = 2000
	want := e.fill(q, "m", 0, n)
	for pass := range 3 {
		var shown []string
		began := time.Now()
		res, present, err := e.scan(context.Background(), q, func(m *msg.Message) { shown = append(shown, m.MessageID) })
		if err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		t.Logf("pass %d: %d messages in %v (%.0f msg/s)", pass, res.Taken, time.Since(began), float64(res.Taken)/time.Since(began).Seconds())
		if present != n || res.Taken != n || !slices.Equal(shown, want) {
			t.Fatalf("pass %d: present %d, taken %d, shown %d (first %v), want the %d messages in order", pass, present, res.Taken, len(shown), shown[:min(len(shown), 5)], n)
		}
		e.settled(q)
		if ready := e.ready(q); ready != n {
			t.Fatalf("pass %d: %d ready, want %d", pass, ready, n)
		}
	}
	e.check(q, want)
}

// The pass takes its messages from a consumer, which the broker feeds
// ahead of the pass, rather than asking for each in a round trip.
func TestQuorumScanReadsThroughAConsumer(t *testing.T) {
	e := newEnv(t)
	q := e.quorumDLQ(2)
	want := e.fill(q, "c", 0, 300)
	in, err := broker.OpenInspector(context.Background(), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	consumers := -1
	_, _, err = e.scan(context.Background(), q, func(m *msg.Message) {
		if m.MessageID == "c150" {
			n, cerr := in.Consumers(q)
			if cerr != nil {
				t.Error(cerr)
			}
			consumers = n
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if consumers != 1 {
		t.Errorf("%s had %d consumer(s) in the middle of a pass, want the pass's one", q, consumers)
	}
	e.check(q, want)
}

// Dead letters that arrive while a pass runs are neither lost nor shown
// twice, the pass still ends, and they stay behind the messages that were
// there before.
func TestQuorumScanWithArrivals(t *testing.T) {
	e := newEnv(t)
	q := e.quorumDLQ(2)
	const n = 2000
	want := e.fill(q, "a", 0, n)
	late := make(chan []string, 1)
	var shown int
	res, present, err := e.scan(context.Background(), q, func(m *msg.Message) {
		shown++
		if shown == n/2 {
			late <- e.fill(q, "late", 0, 300)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if present != n || res.Taken != n {
		t.Fatalf("present %d, taken %d, want %d", present, res.Taken, n)
	}
	arrived := <-late
	// The pass rotated the first half before the arrivals came, the second
	// half after them.
	all := slices.Concat(arrived, want)
	e.settled(q)
	got := e.drain(q)
	seen := map[string]int{}
	for _, m := range got {
		seen[m.MessageID]++
		if c, ok := m.Int(msg.HeaderDeliveryCount); ok && c > 0 {
			t.Errorf("message %s: delivery count %d spent", m.MessageID, c)
		}
	}
	for _, id := range all {
		if seen[id] != 1 {
			t.Errorf("message %s is in the DLQ %d times, want once", id, seen[id])
		}
	}
	if len(got) != len(all) {
		t.Errorf("DLQ holds %d messages, want %d", len(got), len(all))
	}
	// Each group keeps its own order.
	var gotOld, gotLate []string
	for _, m := range got {
		if regexp.MustCompile(`^late`).MatchString(m.MessageID) {
			gotLate = append(gotLate, m.MessageID)
		} else {
			gotOld = append(gotOld, m.MessageID)
		}
	}
	if !slices.Equal(gotOld, want) || !slices.Equal(gotLate, arrived) {
		t.Errorf("order not kept: first old %v, first late %v", gotOld[:min(5, len(gotOld))], gotLate[:min(5, len(gotLate))])
	}
}

// A pass cancelled in the middle stops, and every message is still in the
// DLQ once, its delivery count unspent; the DLQ is rotated, not reordered.
func TestQuorumScanCancelled(t *testing.T) {
	e := newEnv(t)
	q := e.quorumDLQ(2)
	const n = 2000
	want := e.fill(q, "x", 0, n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	shown := 0
	res, _, err := e.scan(ctx, q, func(*msg.Message) {
		shown++
		if shown == 700 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled pass ended with %v, want context.Canceled", err)
	}
	if res.Taken >= n {
		t.Fatalf("the cancelled pass took all %d messages", res.Taken)
	}
	e.settled(q)
	got := e.drain(q)
	ids := make([]string, len(got))
	for i, m := range got {
		ids[i] = m.MessageID
		if c, ok := m.Int(msg.HeaderDeliveryCount); ok && c > 0 {
			t.Errorf("message %s: delivery count %d spent", m.MessageID, c)
		}
	}
	// Whatever was rotated is at the tail in order: the DLQ is want
	// rotated by some k.
	k := slices.Index(want, ids[0])
	if k < 0 || len(ids) != n || !slices.Equal(ids, slices.Concat(want[k:], want[:k])) {
		t.Fatalf("after a cancelled pass the DLQ holds %d messages starting %v, want the %d once each, in rotated order", len(ids), ids[:min(5, len(ids))], n)
	}
}

// BrowseInPlace refuses a quorum DLQ before reading anything (no consumer,
// nothing published, every message where it was) and reads a classic one
// as Browse does, handing every message back in place.
func TestBrowseInPlace(t *testing.T) {
	e := newEnv(t)
	q := e.quorumDLQ(2)
	want := e.fill(q, "q", 0, 20)
	p, err := e.opener().BrowseInPlace(context.Background(), q)
	if !errors.Is(err, dlq.ErrRotates) || p.Source != nil {
		t.Fatalf("BrowseInPlace of a quorum DLQ: %+v, %v; want dlq.ErrRotates", p, err)
	}
	if ready := e.ready(q); ready != len(want) {
		t.Fatalf("%d ready after the refusal, want %d", ready, len(want))
	}
	e.check(q, want)

	classic := fmt.Sprintf("cinplace%d.dlq", seq.Add(1))
	plan := topology.Plan{Work: topology.Queue{Name: classic, Role: topology.RoleWork, Args: map[string]any{"x-queue-type": "classic"}, Owned: true}, Declare: true}
	plan.DLQ = plan.Work
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := broker.Apply(ctx, e.opts, &plan, true); err != nil {
		t.Fatal(err)
	}
	want = e.fill(classic, "c", 0, 20)
	p, err = e.opener().BrowseInPlace(ctx, classic)
	if err != nil || p.Rotate != nil {
		t.Fatalf("BrowseInPlace of a classic DLQ: rotates %v, %v", p.Rotate != nil, err)
	}
	var shown []string
	res, err := dlq.Browse(ctx, p.Source, dlq.BrowseOptions{Limit: p.Present, Bound: p.Present}, func(m *msg.Message) error {
		shown = append(shown, m.MessageID)
		return nil
	})
	p.Close()
	if err != nil || res.Taken != len(want) || !slices.Equal(shown, want) {
		t.Fatalf("classic pass: taken %d, shown %v, %v", res.Taken, shown, err)
	}
	waitfor.Until(t, 30*time.Second, "the classic DLQ's messages back", func() bool { return e.ready(classic) == len(want) })
	var back []string
	for _, m := range e.drain(classic) {
		back = append(back, m.MessageID)
	}
	if !slices.Equal(back, want) {
		t.Fatalf("classic DLQ after the pass: %v, want %v in order", back, want)
	}
}

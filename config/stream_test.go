package config_test

import (
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
)

func TestStreamSubscriptionRunsBesideItsOwnQueue(t *testing.T) {
	c, err := parse(t, `
queue:
  name: events
  type: stream
  stream: {consumer: billing, maxAge: 24h}
`)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	consumed := c.Consumed()
	if len(consumed) != 1 {
		t.Fatalf("%d consumed configs, want 1", len(consumed))
	}
	e := consumed[0]
	// Retries come back to events.billing, a quorum queue unless said
	// otherwise; the tiers and the DLQ are named from it.
	if e.Queue.Name != "events.billing" || e.Queue.Type != "quorum" || e.Queue.Stream.Name != "events" ||
		!e.IsStream() || e.Queue.Stream.MaxAge.D() != 24*time.Hour || e.Queue.Stream.Port != 5552 || e.Queue.Stream.Offset != "first" {
		t.Fatalf("effective config: queue %+v", e.Queue)
	}
	if !c.IsStream() {
		t.Fatal("the file's config does not say it reads a stream")
	}
	if got := c.ForStream(); got.Queue.Name != e.Queue.Name {
		t.Fatalf("ForStream names %s, Consumed %s", got.Queue.Name, e.Queue.Name)
	}
	if q := (&config.Config{Queue: config.Queue{Name: "orders", Type: "classic"}}).ForStream(); q.Queue.Name != "orders" || q.IsStream() {
		t.Fatalf("ForStream changed a queue's config: %+v", q.Queue)
	}
}

func TestStreamStart(t *testing.T) {
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		in   string
		want config.StreamStart
		bad  bool
	}{
		{in: "first", want: config.StreamStart{Kind: "first"}},
		{in: "last", want: config.StreamStart{Kind: "last"}},
		{in: "next", want: config.StreamStart{Kind: "next"}},
		{in: "1234", want: config.StreamStart{Kind: "offset", Offset: 1234}},
		{in: "2026-11-01T12:00:00Z", want: config.StreamStart{Kind: "time", Time: at}},
		{in: "-1", bad: true},
		{in: "yesterday", bad: true},
		{in: "", bad: true},
	} {
		got, err := config.Stream{Offset: c.in}.Start()
		if (err != nil) != c.bad {
			t.Errorf("%q: error %v, want an error: %t", c.in, err, c.bad)
			continue
		}
		if !c.bad && (got.Kind != c.want.Kind || got.Offset != c.want.Offset || !got.Time.Equal(c.want.Time)) {
			t.Errorf("%q: %+v, want %+v", c.in, got, c.want)
		}
	}
}

func TestStreamValidation(t *testing.T) {
	c, err := parse(t, `
broker: {urls: ["amqps://h/"]}
queue:
  name: events
  type: stream
  deliveryLimit: 5
  stream: {offset: sometime, port: 0, queueType: stream, storeEvery: "0s", maxAge: "500ms", maxLengthBytes: -1}
topology:
  partitions: {count: 2}
`)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, c.Validate(),
		"queue.stream.consumer: required",
		`queue.stream.offset: must be first, last, next, an offset or an RFC 3339 time, got "sometime"`,
		"queue.stream.port: must be a TCP port",
		`queue.stream.queueType: must be quorum or classic, got "stream"`,
		"queue.stream.storeEvery: must be positive",
		"queue.stream.maxAge: the broker counts it in whole seconds",
		"queue.stream.maxLengthBytes: must not be negative",
		"queue.deliveryLimit: not with queue.type stream",
		"topology.partitions: not with queue.type stream",
	)
}

// Two consumer names may read one stream, each with queues of its own; a
// subscription's stream keys are laid over the top-level ones.
func TestStreamSubscriptions(t *testing.T) {
	c, err := parse(t, `
queue:
  stream: {port: 5553, offset: last}
subscriptions:
  - queue: {name: events, type: stream, stream: {consumer: billing}}
  - queue: {name: events, type: stream, stream: {consumer: audit, offset: first, queueType: classic}}
  - queue: {name: orders}
`)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	got := c.Consumed()
	want := []struct{ name, typ, stream, offset string }{
		{"events.billing", "quorum", "events", "last"},
		{"events.audit", "classic", "events", "first"},
		{"orders", "classic", "", "last"},
	}
	for i, w := range want {
		q := got[i].Queue
		if q.Name != w.name || q.Type != w.typ || q.Stream.Name != w.stream || (w.stream != "" && (q.Stream.Offset != w.offset || q.Stream.Port != 5553)) {
			t.Errorf("subscription %d: %+v, want %+v", i, q, w)
		}
	}
	dup, _ := parse(t, `
subscriptions:
  - queue: {name: events, type: stream, stream: {consumer: billing}}
  - queue: {name: events, type: stream, stream: {consumer: billing}}
`)
	mustContain(t, dup.Validate(), `subscriptions[1].queue.name: queue "events.billing" is already used by subscriptions[0]`)
}

// A super stream is a stream subscription with partitions: 3 unless said,
// refused where it cannot be read.
func TestSuperStreamConfig(t *testing.T) {
	c, err := parse(t, `
queue:
  name: events
  type: stream
  stream: {consumer: billing, superStream: true}
`)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	e := c.ForStream()
	if st := e.Queue.Stream; !st.SuperStream || st.Partitions != 3 || st.Name != "events" || e.Queue.Name != "events.billing" {
		t.Fatalf("effective stream config %+v, queue %s", st, e.Queue.Name)
	}
	for _, bad := range []struct{ queue, want string }{
		{"{name: events, type: quorum, stream: {superStream: true}}", "queue.stream.superStream: only with queue.type stream"},
		{"{name: events, type: stream, stream: {consumer: billing, superStream: true, partitions: 0}}", "queue.stream.partitions: must be 1 to 64, got 0"},
		{"{name: events, type: stream, stream: {consumer: billing, superStream: true, partitions: 65}}", "queue.stream.partitions: must be 1 to 64, got 65"},
	} {
		c, err := parse(t, "queue: "+bad.queue+"\n")
		if err != nil {
			t.Fatal(err)
		}
		mustContain(t, c.Validate(), bad.want)
	}
	sub, err := parse(t, `
subscriptions:
  - queue: {name: events, type: stream, stream: {consumer: billing, superStream: true, partitions: 5}}
  - queue: {name: events, type: stream, stream: {consumer: audit}}
`)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Validate(); err != nil {
		t.Fatal(err)
	}
	got := sub.Consumed()
	if st := got[0].Queue.Stream; !st.SuperStream || st.Partitions != 5 {
		t.Fatalf("subscription 0: %+v", st)
	}
	if st := got[1].Queue.Stream; st.SuperStream {
		t.Fatalf("subscription 1: %+v", st)
	}
}

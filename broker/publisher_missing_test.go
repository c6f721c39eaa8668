package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

// testPlan is the topology of a fresh work queue with two delay tiers,
// declared on the broker.
func testPlan(t *testing.T, declare bool) *topology.Plan {
	t.Helper()
	cfg := config.Default()
	cfg.Queue.Name = fmt.Sprintf("bx%d.work", queueSeq.Add(1))
	cfg.Retry.Tiers = []config.Duration{config.Duration(time.Minute), config.Duration(2 * time.Minute)}
	cfg.Topology.Declare = true
	p := topology.FromConfig(&cfg)
	if err := Apply(context.Background(), opts(), &p, true); err != nil {
		t.Fatal(err)
	}
	p.Declare = declare
	p.Work.Owned = declare
	return &p
}

func deleteQueue(t *testing.T, name string) {
	t.Helper()
	if out, err := rabbit.Ctl("delete_queue", name); err != nil {
		t.Fatalf("delete queue %s: %v\n%s", name, err, out)
	}
}

func queueExists(t *testing.T, name string) bool {
	t.Helper()
	_, err := rabbit.QueueDepth(name)
	if errors.Is(err, testbroker.ErrNoQueue) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// logBuffer collects JSON log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// events returns the log records whose event is name.
func (l *logBuffer) events(t *testing.T, name string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["event"] == name {
			out = append(out, rec)
		}
	}
	return out
}

// A delay tier and the DLQ deleted under a running publisher, with
// topology.declare true: a move to either comes back unroutable, the
// publisher declares the queue again with its planned arguments and
// publishes the copy once more, so the move succeeds and the copy is in
// the queue. A queue the plans do not name is never created.
func TestPublisherRedeclaresDeletedPlannedQueue(t *testing.T) {
	needBroker(t)
	plan := testPlan(t, true)
	var logs logBuffer
	o := opts()
	o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	pub := NewPublisher(PublisherOptions{Options: o, Channels: 1, ConfirmTimeout: 10 * time.Second, Topology: []*topology.Plan{plan}})
	defer pub.Close()
	// A publish before the deletion: the channel is open and warm.
	if err := pub.Publish(context.Background(), plan.Tiers[0].Name, &msg.Message{MessageID: "before", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	deleteQueue(t, plan.Tiers[0].Name)
	deleteQueue(t, plan.DLQ.Name)

	for _, q := range []string{plan.Tiers[0].Name, plan.DLQ.Name} {
		if err := pub.Publish(context.Background(), q, &msg.Message{MessageID: "after", Body: []byte("x")}); err != nil {
			t.Errorf("publish to deleted %s: %v, want it declared again and the copy confirmed", q, err)
		}
		if got := browse(t, q); !slices.Equal(got, []string{"after"}) {
			t.Errorf("queue %s holds %v, want the copy published after it was deleted", q, got)
		}
		if ev := logs.events(t, "QUEUE_REDECLARED"); !slices.ContainsFunc(ev, func(r map[string]any) bool { return r["queue"] == q }) {
			t.Errorf("no QUEUE_REDECLARED event names %s: %v", q, ev)
		}
	}
	// Declared with the planned arguments: verifying the plan passes.
	if err := Apply(context.Background(), opts(), plan, false); err != nil {
		t.Errorf("verify after re-declare: %v", err)
	}
	stranger := fmt.Sprintf("bx-stranger-%d", queueSeq.Add(1))
	if err := pub.Publish(context.Background(), stranger, &msg.Message{MessageID: "s", Body: []byte("x")}); !errors.Is(err, ErrReturned) {
		t.Errorf("publish to a queue no plan names: %v, want ErrReturned", err)
	}
	if queueExists(t, stranger) {
		t.Errorf("queue %s, which no plan names, was created", stranger)
	}
}

// With topology.declare false the publisher creates nothing: a move to a
// deleted DLQ fails as returned, the publisher lists the queue as missing
// and logs an event naming it, until a publish to it goes through again.
func TestPublisherReportsDeletedPlannedQueue(t *testing.T) {
	needBroker(t)
	plan := testPlan(t, false)
	var logs logBuffer
	o := opts()
	o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	pub := NewPublisher(PublisherOptions{Options: o, Channels: 1, ConfirmTimeout: 10 * time.Second, Topology: []*topology.Plan{plan}})
	defer pub.Close()
	deleteQueue(t, plan.DLQ.Name)

	for range 2 {
		err := pub.Publish(context.Background(), plan.DLQ.Name, &msg.Message{MessageID: "m", Body: []byte("x")})
		if !errors.Is(err, ErrReturned) {
			t.Fatalf("publish to the deleted DLQ: %v, want ErrReturned", err)
		}
		if !strings.Contains(err.Error(), plan.DLQ.Name) {
			t.Errorf("error does not name the missing queue: %v", err)
		}
	}
	if got := pub.MissingQueues(); !slices.Equal(got, []string{plan.DLQ.Name}) {
		t.Errorf("missing queues %v, want [%s]", got, plan.DLQ.Name)
	}
	ev := logs.events(t, "QUEUE_MISSING")
	if len(ev) != 1 || ev[0]["queue"] != plan.DLQ.Name || ev[0]["role"] != topology.RoleDLQ {
		t.Errorf("QUEUE_MISSING events %v, want one naming %s", ev, plan.DLQ.Name)
	}
	if queueExists(t, plan.DLQ.Name) {
		t.Fatal("the publisher created the DLQ with topology.declare false")
	}

	// The operator brings it back: the next move goes through.
	back := *plan
	back.Declare = true
	if err := Apply(context.Background(), opts(), &back, true); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(context.Background(), plan.DLQ.Name, &msg.Message{MessageID: "m", Body: []byte("x")}); err != nil {
		t.Fatalf("publish after the DLQ came back: %v", err)
	}
	if got := pub.MissingQueues(); len(got) != 0 {
		t.Errorf("missing queues %v after a publish to it went through, want none", got)
	}
}

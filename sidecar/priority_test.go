package sidecar_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

// priorityConfig is a test config whose work queue is a priority queue
// (x-max-priority 10), declared before Hopper runs so that messages can
// wait in it.
func priorityConfig(t *testing.T, app *scriptApp) config.Config {
	t.Helper()
	cfg := testConfig(t, app.URL)
	cfg.Queue.Arguments = map[string]config.Argument{"x-max-priority": config.IntArgument(10)}
	// One message at a time, so the app sees them in the order the broker
	// gives them (ordered delivery would retry in place, not through the
	// tiers).
	cfg.Consumer.Prefetch = 1
	cfg.Consumer.Workers = 1
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := topology.FromConfig(&cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := broker.Apply(ctx, broker.ConfigOptions(cfg.Broker, testLogger(t), "test"), &plan, true); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// publishWithPriority publishes ids to the work queue with the priorities
// given, while no one consumes.
func publishWithPriority(t *testing.T, cfg config.Config, ids []string, prios []uint8) {
	t.Helper()
	pub := broker.NewPublisher(broker.PublisherOptions{Options: broker.ConfigOptions(cfg.Broker, testLogger(t), "test"), ConfirmTimeout: 5 * time.Second})
	defer pub.Close()
	for i, id := range ids {
		m := &msg.Message{MessageID: id, Headers: map[string]any{}, Body: []byte("body-" + id), Priority: prios[i]}
		if err := pub.Publish(context.Background(), cfg.Queue.Name, m); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPriorityQueueDeliversUrgentFirst: on a work queue declared with
// x-max-priority, a priority-9 message published after a priority-1 one
// while Hopper was not consuming reaches the app first.
func TestPriorityQueueDeliversUrgentFirst(t *testing.T) {
	app := newScriptApp(t)
	cfg := priorityConfig(t, app)
	publishWithPriority(t, cfg, []string{"low", "high"}, []uint8{1, 9})
	r := start(t, cfg)
	waitfor.Until(t, 30*time.Second, "both delivered", func() bool { return len(app.callsFor("low")) == 1 && len(app.callsFor("high")) == 1 })
	if got := app.order(func(call) bool { return true }); !slices.Equal(got, []string{"high", "low"}) {
		t.Fatalf("app saw %v, want the priority-9 message first", got)
	}
	r.settled(0)
}

// TestPriorityKeptThroughRetry: a priority-9 message retried through a
// delay tier comes back to the work queue, and reaches the DLQ, with
// priority 9; on its second attempt it again goes before a priority-1
// message that waited meanwhile.
//
// Nothing here depends on how fast the machine is: the urgent message's
// first attempt is held at the app until the blocker and the low message
// wait in the queue, the blocker has the highest priority, so it is
// delivered next even if the urgent message is already back from its tier,
// and the app's timeout is longer than any of the test's waits, so no
// held request is cut off and retried meanwhile.
func TestPriorityKeptThroughRetry(t *testing.T) {
	app := newScriptApp(t)
	cfg := priorityConfig(t, app)
	cfg.Retry.MaxAttempts = 2
	app.script("urgent", 503, 503)
	releaseUrgent := app.hold("urgent")
	release := app.hold("blocker")
	publishWithPriority(t, cfg, []string{"urgent"}, []uint8{9})
	r := start(t, cfg)
	waitfor.Until(t, 30*time.Second, "first attempt", func() bool { return len(app.callsFor("urgent")) == 1 })
	// Both are in the queue once their publishes are confirmed.
	publishWithPriority(t, cfg, []string{"blocker", "low"}, []uint8{10, 1})
	// The first attempt fails: the message waits in the tier while the
	// blocker holds the one worker and the low message waits behind it.
	releaseUrgent()
	waitfor.Until(t, 30*time.Second, "blocker at the app", func() bool { return len(app.callsFor("blocker")) == 1 })
	waitfor.Until(t, 30*time.Second, "urgent back from the tier", func() bool {
		ready, _, err := rabbit.QueueCounts(cfg.Queue.Name)
		return err == nil && ready == 2
	})
	release()
	r.settled(1)
	if got := app.order(func(c call) bool { return c.ID != "blocker" }); !slices.Equal(got, []string{"urgent", "low"}) ||
		len(app.callsFor("urgent")) != 2 {
		t.Errorf("app saw %v (urgent %d times), want urgent's second attempt before low", got, len(app.callsFor("urgent")))
	}
	dead := r.drain(r.sc.Plan().DLQ.Name)
	m, ok := dead["urgent"]
	if !ok {
		t.Fatalf("urgent not in the DLQ: %v", dead)
	}
	if m.Priority != 9 {
		t.Errorf("urgent reached the DLQ with priority %d, want 9", m.Priority)
	}
}

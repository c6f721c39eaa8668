package sidecar_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// TestQuorumFailedMoveSpendsNoDeliveryLimit: a DLQ full with
// reject-publish refuses the dead-lettering of a message the app rejected.
// Hopper keeps its decision and retries the move while it holds the
// delivery: the app is not called again, the quorum queue's delivery limit
// is not spent (more failed moves than the limit allows), consuming pauses
// and says why, and once there is room the message lands in the DLQ with
// its one failed attempt counted.
func TestQuorumFailedMoveSpendsNoDeliveryLimit(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Queue.Type = "quorum"
	cfg.Queue.DeliveryLimit = 3
	cfg.Topology.DLQMaxLength = 1
	cfg.Broker.MoveRetryMin = config.Duration(20 * time.Millisecond)
	cfg.Broker.MoveRetryMax = config.Duration(50 * time.Millisecond)
	r := start(t, cfg)
	dlqName := r.sc.Plan().DLQ.Name
	app.script("second", 400)
	// Fill the DLQ until it refuses a publish: a quorum queue applies its
	// length limit once it is over it, so that may take more than one.
	fillers := 0
	for {
		err := r.pub.PublishTo(context.Background(), "", dlqName,
			&msg.Message{MessageID: fmt.Sprintf("filler-%d", fillers), Headers: map[string]any{}, Body: []byte("x")})
		if errors.Is(err, broker.ErrNacked) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if fillers++; fillers > 10 {
			t.Fatal("the DLQ never refused a publish")
		}
	}
	r.publish("second")
	waitfor.Until(t, 15*time.Second, "more failed moves than the delivery limit", func() bool {
		return r.sc.Stats().MoveFailed.Load() >= int64(2*cfg.Queue.DeliveryLimit)
	})
	waitfor.Until(t, 15*time.Second, "consuming paused for failing moves", func() bool {
		return r.sc.Paused() && strings.Contains(strings.Join(r.sc.PauseReasons(), ","), "moves failing")
	})
	if n := r.sc.Stats().MovesFailing.Load(); n != 1 {
		t.Fatalf("%d deliveries held on a failing move, want 1", n)
	}
	if calls := app.callsFor("second"); len(calls) != 1 {
		t.Fatalf("the app was called %d times for a message whose fate was decided", len(calls))
	}
	// Make room: the held move goes through, consuming resumes.
	if got := r.drain(dlqName); len(got) != fillers {
		t.Fatalf("DLQ held %d messages, want the %d fillers", len(got), fillers)
	}
	r.settled(1)
	waitfor.Until(t, 15*time.Second, "consuming resumed", r.sc.Consuming)
	got := r.drain(dlqName)["second"]
	if got == nil {
		t.Fatal("second lost")
	}
	if n, _ := got.Int(msg.HeaderFinalRetryCount); n != 1 {
		t.Errorf("x-final-retry-count %d, want 1 (the failed attempt)", n)
	}
	if n, _ := got.Int(msg.HeaderRetryCount); n != 1 {
		t.Errorf("x-retry-count %d, want 1", n)
	}
	if calls := app.callsFor("second"); len(calls) != 1 {
		t.Fatalf("the app was called %d times", len(calls))
	}
}

// TestQuorumShutdownsSpendNoDeliveryLimit: rolling restarts while messages
// are prefetched and in flight. On a quorum queue every nack (and every
// unacked delivery of a closed channel) counts against the delivery limit;
// Hopper gives messages back by republishing them, so three shutdowns with
// a limit of 2 lose nothing and send nothing to the DLQ, and no attempt is
// spent.
func TestQuorumShutdownsSpendNoDeliveryLimit(t *testing.T) {
	var started atomic.Int64
	var serve atomic.Bool
	release := make(chan struct{})
	app := newScriptApp(t)
	inner := app.srv.Handler
	app.srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if serve.Load() {
			inner.ServeHTTP(w, r)
			return
		}
		started.Add(1)
		select { // in flight until the grace period cuts it off
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) })
	cfg := testConfig(t, app.URL)
	cfg.Queue.Type = "quorum"
	cfg.Queue.DeliveryLimit = 2
	cfg.Consumer.Prefetch = 5
	cfg.Consumer.Workers = 1
	cfg.App.Timeout = config.Duration(time.Minute)
	cfg.Shutdown.Grace = config.Duration(100 * time.Millisecond)
	cfg.Breaker.Enabled = false
	ids := []string{"a", "b", "c", "d", "e"}
	for round := range 3 {
		before := started.Load()
		r := start(t, cfg)
		queue, dlqName := r.cfg.Queue.Name, r.sc.Plan().DLQ.Name
		if round == 0 {
			for _, id := range ids {
				r.publish(id)
			}
		}
		waitfor.Until(t, 15*time.Second, "one delivery in flight", func() bool { return started.Load() > before })
		waitfor.Until(t, 15*time.Second, "the rest prefetched", func() bool { return r.sc.Stats().Received.Load() == int64(len(ids)) })
		if err := r.shutdown(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		st := r.sc.Stats()
		if st.Retried.Load() != 0 || st.DeadLettered.Load() != 0 {
			t.Fatalf("round %d: shutdown spent attempts: retried=%d dlq=%d", round, st.Retried.Load(), st.DeadLettered.Load())
		}
		waitfor.Until(t, 15*time.Second, "every message back in the work queue", func() bool {
			d := allDepths(t)
			return d[queue] == len(ids) && d[dlqName] == 0
		})
	}
	serve.Store(true)
	r := start(t, cfg)
	r.settled(0)
	for _, id := range ids {
		if got := app.attempts(id); len(got) != 1 || got[0] != 1 {
			t.Errorf("%s: attempts %v, want one first attempt", id, got)
		}
	}
}

// TestConsumerCancelKeepsConnection: a broker-side consumer cancel (here the
// queue deleted) is handled on the same connection: Hopper declares the
// queue again and consumes anew without reconnecting, so deliveries held on
// that channel stay settleable.
func TestConsumerCancelKeepsConnection(t *testing.T) {
	app := newScriptApp(t)
	r := start(t, testConfig(t, app.URL))
	before := connectionField(t, "hopper-consumer "+r.cfg.Queue.Name, "peer_port")
	if before == "" {
		t.Fatal("no consumer connection listed")
	}
	if _, err := rabbit.Ctl("delete_queue", r.cfg.Queue.Name); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 15*time.Second, "queue re-declared and consumed", func() bool {
		_, ok := allDepths(t)[r.cfg.Queue.Name]
		return ok && r.sc.Consuming()
	})
	if after := connectionField(t, "hopper-consumer "+r.cfg.Queue.Name, "peer_port"); after != before {
		t.Fatalf("consumer connection replaced after a cancel: port %s, then %s", before, after)
	}
	app.script("again", 200)
	publishRetrying(t, r, "again")
	r.settled(0)
	if len(app.callsFor("again")) != 1 {
		t.Fatal("not delivered after the queue came back")
	}
}

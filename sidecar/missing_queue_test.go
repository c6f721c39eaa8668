package sidecar_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/topology"
)

func deleteQueue(t *testing.T, name string) {
	t.Helper()
	if out, err := rabbit.Ctl("delete_queue", name); err != nil {
		t.Fatalf("delete queue %s: %v\n%s", name, err, out)
	}
}

// A delay tier and the DLQ deleted while Hopper runs with
// topology.declare true: the failing messages still reach them. The move
// that finds a queue gone declares it again with its planned arguments
// and goes through at once: the retried message passes the re-declared
// tier (its TTL brings it back as attempt 2), the rejected one lands in the
// re-declared DLQ, no move fails and consuming never pauses.
func TestDeletedTierAndDLQDeclaredAgain(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	r := start(t, cfg)
	plan := r.sc.Plan()
	deleteQueue(t, plan.Tiers[0].Name)
	deleteQueue(t, plan.DLQ.Name)

	app.script("retried", 500, 200)
	app.script("rejected", 400)
	r.publish("retried")
	r.publish("rejected")
	r.settled(1)
	if got := app.attempts("retried"); !slices.Equal(got, []int{1, 2}) {
		t.Errorf("retried: attempts %v, want [1 2] through the re-declared tier", got)
	}
	if _, ok := r.drain(plan.DLQ.Name)["rejected"]; !ok {
		t.Error("rejected is not in the re-declared DLQ")
	}
	if err := broker.Apply(context.Background(), broker.ConfigOptions(cfg.Broker, testLogger(t), "verify"), plan, false); err != nil {
		t.Errorf("the re-declared queues do not match the plan: %v", err)
	}
	if n := r.sc.Stats().MoveFailed.Load(); n != 0 {
		t.Errorf("%d moves failed, want none: the queue is declared again within the move", n)
	}
}

// With topology.declare false Hopper creates nothing: a move to a deleted
// DLQ keeps failing, consuming pauses, and /readyz names the missing
// queue. Once the operator declares it again the held move goes through
// and consuming resumes.
func TestDeletedDLQReportedWithoutDeclare(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Admin.Listen = "127.0.0.1:0"
	cfg.Broker.MoveRetryMin = config.Duration(20 * time.Millisecond)
	cfg.Broker.MoveRetryMax = config.Duration(100 * time.Millisecond)
	declared := cfg
	plan := topology.FromConfig(&declared)
	bo := broker.ConfigOptions(cfg.Broker, testLogger(t), "declare")
	if err := broker.Apply(context.Background(), bo, &plan, true); err != nil {
		t.Fatal(err)
	}
	cfg.Topology.Declare = false
	r := start(t, cfg)
	deleteQueue(t, plan.DLQ.Name)

	app.script("rejected", 400)
	r.publish("rejected")
	var body string
	waitfor.Until(t, 15*time.Second, "/readyz naming the missing DLQ", func() bool {
		var code int
		code, body = readyz(t, r.sc)
		return code == http.StatusOK && strings.Contains(body, "moves failing") &&
			strings.Contains(body, plan.DLQ.Name) && strings.Contains(body, "does not exist")
	})
	if !r.sc.Paused() {
		t.Errorf("consuming not paused while the DLQ is missing: %s", body)
	}
	if n := r.depth(plan.Work.Name); n != 1 {
		t.Errorf("work queue holds %d, want the held message", n)
	}

	if err := broker.Apply(context.Background(), bo, &plan, true); err != nil {
		t.Fatal(err)
	}
	r.settled(1)
	waitfor.Until(t, 15*time.Second, "consuming resumed", r.sc.Consuming)
	if _, ok := r.drain(plan.DLQ.Name)["rejected"]; !ok {
		t.Error("rejected is not in the DLQ once it is back")
	}
	if calls := app.callsFor("rejected"); len(calls) != 1 {
		t.Errorf("the app was called %d times, want once", len(calls))
	}
	if _, body := readyz(t, r.sc); strings.Contains(body, plan.DLQ.Name) {
		t.Errorf("/readyz still names the DLQ after it came back: %s", body)
	}
}

package proxy

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/topology"
)

// gatedApp holds every request until release is closed, counting the
// requests at it.
type gatedApp struct {
	at      atomic.Int64
	arrived chan struct{}
	release chan struct{}
}

func (a *gatedApp) Deliver(context.Context, *msg.Message, msg.Info) retry.Outcome {
	a.at.Add(1)
	a.arrived <- struct{}{}
	<-a.release
	a.at.Add(-1)
	return retry.Outcome{Kind: retry.Response, Status: 200}
}

func (a *gatedApp) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	return eachOf(ctx, a.Deliver, r)
}

// TestWorkerCapBoundsWorkers: with WorkerCap, deliveries beyond its bound
// wait in the hand-off buffer instead of each starting a worker, a rise of
// the bound starts more, and every delivery is still delivered and acked.
func TestWorkerCapBoundsWorkers(t *testing.T) {
	base, _, j := newTestProxy(t, retry.Outcome{}, nil)
	app := &gatedApp{arrived: make(chan struct{}, 16), release: make(chan struct{})}
	var limit atomic.Int64
	limit.Store(2)
	o := base.o
	o.App = app
	o.Workers = 8
	o.Queue = 16
	o.WorkerCap = func() int { return int(limit.Load()) }
	p := New(o)
	pl, ok := p.disp.(*pool)
	if !ok {
		t.Fatalf("dispatcher %T, want the worker pool", p.disp)
	}
	p.Start(context.Background())
	for range 5 {
		p.Handle(&fakeDelivery{m: msgWith(nil), j: j, alive: true})
	}
	<-app.arrived
	<-app.arrived
	if n := pl.crew.running.Load(); n != 2 {
		t.Fatalf("%d workers started for a cap of 2, want 2", n)
	}
	limit.Store(3)
	p.Handle(&fakeDelivery{m: msgWith(nil), j: j, alive: true})
	<-app.arrived
	if n := pl.crew.running.Load(); n != 3 {
		t.Fatalf("%d workers after the cap rose to 3, want 3", n)
	}
	if n := app.at.Load(); n != 3 {
		t.Fatalf("%d requests at the app, want 3", n)
	}
	close(app.release)
	for range 3 {
		<-app.arrived
	}
	if !p.Shutdown(context.Background()) {
		t.Fatal("shutdown did not finish in flight deliveries")
	}
	acks := 0
	for _, e := range j.all() {
		if e == "ack" {
			acks++
		}
	}
	if acks != 6 {
		t.Fatalf("%d acks, want 6: %v", acks, j.all())
	}
}

// holdApp answers 425 to the message "held" and 200 to the others,
// telling which reached it.
type holdApp struct{ reached chan string }

func (a *holdApp) Deliver(_ context.Context, m *msg.Message, _ msg.Info) retry.Outcome {
	a.reached <- m.MessageID
	if m.MessageID == "held" {
		return retry.Outcome{Kind: retry.Response, Status: 425}
	}
	return retry.Outcome{Kind: retry.Response, Status: 200}
}

func (a *holdApp) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	return eachOf(ctx, a.Deliver, r)
}

// TestWorkerCapLeavesOutWaitingWorkers: a worker holding a 425 before its
// requeue has no request at the app, so under a cap of 1 the next delivery
// still gets a worker of its own and reaches the app during the hold.
func TestWorkerCapLeavesOutWaitingWorkers(t *testing.T) {
	cfg := config.Default()
	cfg.Queue.Name = "orders"
	cfg.Requeue.MinHold, cfg.Requeue.MaxHold = config.Duration(time.Hour), config.Duration(time.Hour)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := topology.FromConfig(&cfg)
	j := &journal{}
	app := &holdApp{reached: make(chan string, 4)}
	p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: app, Pub: &fakePub{j: j, fails: -1},
		Workers: 4, Queue: 8, WorkerCap: func() int { return 1 }, MoveHoldMax: 24 * time.Hour})
	p.Start(context.Background())
	p.Handle(&fakeDelivery{m: &msg.Message{MessageID: "held", Headers: map[string]any{}}, j: j, alive: true})
	if id := <-app.reached; id != "held" {
		t.Fatalf("first at the app: %q", id)
	}
	waitfor.Until(t, 10*time.Second, "the 425 held by its worker", func() bool { return p.waiting.Load() == 1 })
	p.Handle(&fakeDelivery{m: &msg.Message{MessageID: "next", Headers: map[string]any{}}, j: j, alive: true})
	select {
	case id := <-app.reached:
		if id != "next" {
			t.Fatalf("second at the app: %q", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the next delivery did not reach the app while the 425 was held: the waiting worker took the cap")
	}
	waitfor.Until(t, 10*time.Second, "next acked", func() bool { return slices.Contains(j.all(), "ack") })
	if !p.Shutdown(context.Background()) {
		t.Fatal("shutdown did not finish")
	}
}

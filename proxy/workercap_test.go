package proxy

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
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

package app

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// crashApp holds every request until crash is closed, then cuts them all
// and reports the app down, as one crash cuts every request in flight.
type crashApp struct {
	started atomic.Int64
	crash   chan struct{}
	health  *fakeHealth
}

func (a *crashApp) Deliver(ctx context.Context, m *msg.Message, in msg.Info) retry.Outcome {
	a.started.Add(1)
	<-a.crash
	return retry.Outcome{Kind: retry.Unavailable, Cut: true, Error: "EOF"}
}

func suspectRig(t *testing.T, next Deliverer, health *fakeHealth) *Breaker {
	t.Helper()
	b := NewBreaker(next, BreakerOptions{Failures: 5, OpenTimeout: time.Hour, ProbeInterval: time.Second,
		Health: health, Gate: &fakeGate{}, Clock: &fakeClock{now: time.Unix(0, 0)}})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go b.Run(ctx)
	return b
}

// A crash that cuts several requests at once cannot say which message
// killed the app: none of them is charged a crash, each comes back as a
// suspect, to be delivered again on its own.
func TestCrashWithCompanyMakesSuspects(t *testing.T) {
	health := &fakeHealth{}
	app := &crashApp{crash: make(chan struct{}), health: health}
	b := suspectRig(t, app, health)
	outs := make(chan retry.Outcome, 3)
	for range 3 {
		go func() { outs <- b.Deliver(context.Background(), &msg.Message{}, msg.Info{Attempt: 1}) }()
	}
	waitfor.Until(t, 10*time.Second, "three requests in flight", func() bool { return app.started.Load() == 3 })
	health.set(errors.New("connection refused"))
	close(app.crash)
	for range 3 {
		o := <-outs
		if o.Crashed || !o.CrashSuspect {
			t.Fatalf("outcome %+v: one of three requests cut by one crash, want a suspect and no crash charged", o)
		}
	}
}

// A request alone in flight when the app died did kill it: the crash is
// charged to its message.
func TestCrashAloneIsCharged(t *testing.T) {
	health := &fakeHealth{}
	app := &crashApp{crash: make(chan struct{}), health: health}
	b := suspectRig(t, app, health)
	health.set(errors.New("connection refused"))
	close(app.crash)
	o := b.Deliver(context.Background(), &msg.Message{}, msg.Info{Attempt: 1, Suspect: true})
	if !o.Crashed || o.CrashSuspect {
		t.Fatalf("outcome %+v, want the crash charged", o)
	}
}

// gateApp lets the test hold and release each request by message id.
type gateApp struct {
	mu      sync.Mutex
	holds   map[string]chan struct{}
	running map[string]bool
}

func (a *gateApp) Deliver(_ context.Context, m *msg.Message, _ msg.Info) retry.Outcome {
	a.mu.Lock()
	a.running[m.MessageID] = true
	h := a.holds[m.MessageID]
	a.mu.Unlock()
	if h != nil {
		<-h
	}
	a.mu.Lock()
	a.running[m.MessageID] = false
	a.mu.Unlock()
	return retry.Outcome{Kind: retry.Response, Status: 200}
}

func (a *gateApp) isRunning(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.running[id]
}

// A suspect is delivered in isolation: it waits for the requests in
// flight to finish, and no other request starts while it is at the app.
func TestSuspectDeliveredInIsolation(t *testing.T) {
	app := &gateApp{holds: map[string]chan struct{}{}, running: map[string]bool{}}
	holdA, holdS := make(chan struct{}), make(chan struct{})
	app.holds["a"], app.holds["suspect"] = holdA, holdS
	b := suspectRig(t, app, &fakeHealth{})
	done := make(chan string, 3)
	deliver := func(id string, suspect bool) {
		b.Deliver(context.Background(), &msg.Message{MessageID: id}, msg.Info{Attempt: 1, Suspect: suspect})
		done <- id
	}
	go deliver("a", false)
	waitfor.Until(t, 10*time.Second, "a at the app", func() bool { return app.isRunning("a") })
	go deliver("suspect", true)
	// The suspect waits for a; b, sent after it, waits for the suspect.
	waitfor.Until(t, 10*time.Second, "the suspect waiting for isolation", func() bool { return b.crash.suspectsWaiting() > 0 })
	go deliver("b", false)
	close(holdA)
	if id := <-done; id != "a" {
		t.Fatalf("%s finished first, want a", id)
	}
	waitfor.Until(t, 10*time.Second, "the suspect at the app", func() bool { return app.isRunning("suspect") })
	if app.isRunning("b") {
		t.Fatal("b reached the app while the suspect was there")
	}
	close(holdS)
	for range 2 {
		<-done
	}
}

// Several requests cut at once while the health check passes look like a
// restart quicker than the check, not like messages failing: none spends
// an attempt, each goes back to be tried alone. One cut alone with the app
// healthy is the message's doing.
func TestCutTogetherWhileHealthyMakesSuspects(t *testing.T) {
	health := &fakeHealth{}
	app := &crashApp{crash: make(chan struct{}), health: health}
	b := suspectRig(t, app, health)
	outs := make(chan retry.Outcome, 2)
	for range 2 {
		go func() { outs <- b.Deliver(context.Background(), &msg.Message{}, msg.Info{Attempt: 1}) }()
	}
	waitfor.Until(t, 10*time.Second, "two requests in flight", func() bool { return app.started.Load() == 2 })
	close(app.crash) // both cut; the health check keeps passing
	for range 2 {
		if o := <-outs; o.Kind == retry.Cut || !o.CrashSuspect || o.Crashed {
			t.Fatalf("outcome %+v: cut together with another while healthy, want a suspect, no attempt", o)
		}
	}
	if o := b.Deliver(context.Background(), &msg.Message{}, msg.Info{Attempt: 1, Suspect: true}); o.Kind != retry.Cut {
		t.Fatalf("outcome %+v: cut alone while healthy, want a Cut (an attempt)", o)
	}
}

// A request cut alone while the health check passes is a crash all the
// same when the app's idle connections were closed too: its process ended
// and came back quicker than the check.
func TestCutAloneAfterRestartIsACrash(t *testing.T) {
	health := &fakeHealth{}
	app := &crashApp{crash: make(chan struct{}), health: health}
	close(app.crash)
	b := NewBreaker(app, BreakerOptions{Failures: 5, OpenTimeout: time.Hour, ProbeInterval: time.Second,
		Health: health, Gate: &fakeGate{}, Clock: &fakeClock{now: time.Unix(0, 0)}, Restarted: func() bool { return true }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go b.Run(ctx)
	if o := b.Deliver(context.Background(), &msg.Message{}, msg.Info{Attempt: 1}); !o.Crashed || o.Kind == retry.Cut {
		t.Fatalf("outcome %+v: the app restarted, want a crash, not an attempt", o)
	}
}

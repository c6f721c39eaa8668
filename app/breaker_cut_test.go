package app

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// A request the app takes and then cuts while its health check keeps
// passing (a handler that panics on one input, a server write timeout
// shorter than the handler) is that message failing, not the app: it comes
// back as a Cut outcome (an attempt), and the breaker never opens on it,
// however often it happens.
func TestBreakerCutWhileHealthy(t *testing.T) {
	r := newRig(t)
	r.app.set(retry.Outcome{Kind: retry.Unavailable, Cut: true, Error: "connection reset by peer"})
	for i := range 50 {
		o := r.deliver(1)
		if o.Kind != retry.Cut || o.Crashed {
			t.Fatalf("cut %d with a healthy app: outcome %+v, want kind Cut, not crashed", i, o)
		}
	}
	if r.b.State() != "closed" || r.gate.isPaused() {
		t.Fatalf("state %s, paused %v after cuts from a healthy app", r.b.State(), r.gate.isPaused())
	}
	if pauses, _ := r.gate.counts(); pauses != 0 {
		t.Fatalf("consumer paused %d times", pauses)
	}
}

// The breaker can close without the probe: after the open timeout a
// delivery already queued (or an ordered in-place retry) goes through and
// succeeds. That close must resume consuming, or the queue stays paused for
// good with the app healthy.
func TestBreakerCloseWithoutProbeResumes(t *testing.T) {
	r := newRig(t)
	r.open(t)
	waitfor.Until(t, 10*time.Second, "the consumer paused", r.gate.isPaused)
	// No clock tick: the probe never runs. A delivery after the open
	// timeout (1ns here) is let through half-open and answered.
	r.app.set(retry.Outcome{Kind: retry.Response, Status: 200})
	r.deliver(1)
	r.waitState(t, "closed")
	waitfor.Until(t, 10*time.Second, "the consumer resumed after the breaker closed", func() bool { return !r.gate.isPaused() })
}

// Half-open lets one request through to learn whether the app is back. A
// timeout does not say it is: the breaker stays half-open (the next
// request gets to answer) rather than closing on it.
func TestBreakerHalfOpenTimeoutIsNoSuccess(t *testing.T) {
	r := newRig(t)
	r.open(t)
	r.app.set(retry.Outcome{Kind: retry.Timeout, Error: "timeout"})
	if o := r.deliver(1); o.Kind != retry.Timeout {
		t.Fatalf("outcome %+v, want the timeout passed on", o)
	}
	if s := r.b.State(); s == "closed" {
		t.Fatal("a timeout in half-open closed the breaker")
	}
	r.app.set(retry.Outcome{Kind: retry.Response, Status: 503})
	r.deliver(1)
	r.waitState(t, "closed")
}

// Recovery starts with one message at a time: half-open resumes the
// consumer with prefetch 1 (a full prefetch would have the broker push
// deliveries half-open refuses at once, a tight return loop), and the close
// restores the full prefetch.
func TestBreakerHalfOpenResumesWithPrefetchOne(t *testing.T) {
	r := newRig(t)
	r.health.set(errors.New("down"))
	r.open(t)
	r.health.set(nil)
	r.clock.tick(time.Second)
	waitfor.Until(t, 10*time.Second, "the probe resumed consuming", func() bool { return !r.gate.isPaused() })
	r.gate.mu.Lock()
	first := r.gate.resume[len(r.gate.resume)-1]
	r.gate.mu.Unlock()
	if first != 1 {
		t.Fatalf("half-open resumed with prefetch %d, want 1", first)
	}
	r.app.set(retry.Outcome{Kind: retry.Response, Status: 200})
	r.deliver(1)
	r.waitState(t, "closed")
	waitfor.Until(t, 10*time.Second, "the full prefetch restored", func() bool {
		r.gate.mu.Lock()
		defer r.gate.mu.Unlock()
		return r.gate.resume[len(r.gate.resume)-1] == 50
	})
}

// A delivery refused because half-open lets one through at a time says so:
// the app is not "unavailable" then, it is being tried.
func TestBreakerHalfOpenRefusalSaysWhy(t *testing.T) {
	r := newRig(t)
	r.open(t)
	release := make(chan struct{})
	inFlight := make(chan struct{})
	r.b.next = deliverFunc(func(context.Context, *msg.Message, msg.Info) retry.Outcome {
		close(inFlight)
		<-release
		return retry.Outcome{Kind: retry.Response, Status: 200}
	})
	go r.b.Deliver(context.Background(), &msg.Message{}, msg.Info{})
	<-inFlight
	o := r.b.Deliver(context.Background(), &msg.Message{}, msg.Info{})
	close(release)
	if !o.Refused || !strings.Contains(o.Error, "half-open") || strings.Contains(o.Error, "unavailable") {
		t.Fatalf("refusal in half-open: %+v, want it to say half-open, not unavailable", o)
	}
}

package app

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// fakeClock fires After channels only when the test says so.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []chan time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.waiters = append(c.waiters, ch)
	return ch
}

// tick waits for someone to wait on the clock, moves it by d and fires.
func (c *fakeClock) tick(d time.Duration) {
	for {
		c.mu.Lock()
		if len(c.waiters) > 0 {
			c.now = c.now.Add(d)
			for _, w := range c.waiters {
				w <- c.now
			}
			c.waiters = nil
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		runtime.Gosched()
	}
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type fakeHealth struct {
	err   atomic.Pointer[error]
	calls atomic.Int64
}

func (h *fakeHealth) set(err error) { h.err.Store(&err) }
func (h *fakeHealth) Check(context.Context) error {
	h.calls.Add(1)
	if p := h.err.Load(); p != nil {
		return *p
	}
	return nil
}

type fakeGate struct {
	mu     sync.Mutex
	paused bool
	pauses int
	resume []int
	// onResume, when set, runs inside Resume (on the probe's goroutine).
	onResume func()
}

func (g *fakeGate) Pause() { g.mu.Lock(); g.paused = true; g.pauses++; g.mu.Unlock() }
func (g *fakeGate) Resume(p int) {
	g.mu.Lock()
	g.paused = false
	g.resume = append(g.resume, p)
	hook := g.onResume
	g.mu.Unlock()
	if hook != nil {
		hook()
	}
}

func (g *fakeGate) counts() (pauses, resumes int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pauses, len(g.resume)
}
func (g *fakeGate) isPaused() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.paused }

type scripted struct {
	out   atomic.Pointer[retry.Outcome]
	calls atomic.Int64
}

func (s *scripted) set(o retry.Outcome) { s.out.Store(&o) }
func (s *scripted) Deliver(context.Context, *msg.Message, msg.Info) retry.Outcome {
	s.calls.Add(1)
	return *s.out.Load()
}

type breakerRig struct {
	b      *Breaker
	app    *scripted
	health *fakeHealth
	gate   *fakeGate
	clock  *fakeClock
	lim    *Limiter
	states chan string
}

func newRig(t *testing.T) *breakerRig { return newRigOpen(t, time.Nanosecond) }

// newRigOpen makes a rig whose breaker stays open at least openTimeout
// (the wall clock, as the open timeout is measured: tests use 1ns, or an
// hour to pin it open).
func newRigOpen(t *testing.T, openTimeout time.Duration) *breakerRig {
	t.Helper()
	r := &breakerRig{app: &scripted{}, health: &fakeHealth{}, gate: &fakeGate{}, clock: &fakeClock{now: time.Unix(0, 0)},
		states: make(chan string, 64)}
	r.lim = NewLimiter(nil, LimiterOptions{Max: 50})
	r.b = NewBreaker(r.app, BreakerOptions{
		Failures: 5, OpenTimeout: openTimeout, ProbeInterval: time.Second, Prefetch: 50,
		Health: r.health, Gate: r.gate, Limiter: r.lim, Clock: r.clock,
		OnState: func(s string) { r.states <- s },
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go r.b.Run(ctx)
	return r
}

func (r *breakerRig) deliver(n int) (last retry.Outcome) {
	for range n {
		last = r.b.Deliver(context.Background(), &msg.Message{}, msg.Info{})
	}
	return last
}

func (r *breakerRig) waitState(t *testing.T, want string) {
	t.Helper()
	for {
		select {
		case s := <-r.states:
			if s == want {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("breaker never reached %s (now %s)", want, r.b.State())
		}
	}
}

var refused = retry.Outcome{Kind: retry.Unavailable, Error: "connection refused"}

// open opens the breaker the way an app that went away does: Failures
// refused connections in a row.
func (r *breakerRig) open(t *testing.T) {
	t.Helper()
	r.app.set(refused)
	r.deliver(5)
	r.waitState(t, "open")
}

// Failing messages from an app whose health check passes never open the
// breaker: the health check is asked, at most once per probe interval.
func TestBreakerMessagesFailingHealthyApp(t *testing.T) {
	r := newRig(t)
	r.app.set(retry.Outcome{Kind: retry.Response, Status: 503})
	r.deliver(200)
	waitfor.Until(t, 10*time.Second, "the condition", func() bool { return r.health.calls.Load() == 1 })
	r.deliver(200)
	if r.b.State() != "closed" || r.gate.isPaused() {
		t.Fatalf("state %s, paused %v after 503s from a healthy app", r.b.State(), r.gate.isPaused())
	}
	if n := r.health.calls.Load(); n != 1 {
		t.Fatalf("health asked %d times within one probe interval", n)
	}
	r.clock.advance(time.Second)
	r.deliver(5)
	waitfor.Until(t, 10*time.Second, "the condition", func() bool { return r.health.calls.Load() == 2 })
	if r.app.calls.Load() != 405 {
		t.Fatalf("app called %d times, want every message delivered", r.app.calls.Load())
	}
}

// Failing messages and a failing health check: the app is down.
func TestBreakerMessagesFailingUnhealthyApp(t *testing.T) {
	r := newRig(t)
	r.health.set(errors.New("health: 500"))
	r.app.set(retry.Outcome{Kind: retry.Response, Status: 500})
	r.deliver(5)
	r.waitState(t, "open")
	waitfor.Until(t, 10*time.Second, "the condition", r.gate.isPaused)
}

// Refused connections open the breaker after Failures in a row; then
// deliveries are refused without calling the app.
func TestBreakerOpensOnUnavailableAndRefuses(t *testing.T) {
	r := newRigOpen(t, time.Hour)
	r.health.set(errors.New("refused"))
	r.app.set(refused)
	r.deliver(4)
	if r.b.State() != "closed" {
		t.Fatal("opened before Failures results")
	}
	r.deliver(1)
	r.waitState(t, "open")
	before := r.app.calls.Load()
	for range 10 {
		if o := r.deliver(1); !o.Refused || !o.Given() {
			t.Fatalf("outcome %+v while open, want refused", o)
		}
	}
	if r.app.calls.Load() != before {
		t.Fatal("a refused delivery reached the app")
	}
}

// A request cut by the app dying, then a failing health check: the message
// counts a crash and the breaker opens at once. A cut with a healthy app
// afterwards is not a crash.
func TestBreakerCrash(t *testing.T) {
	r := newRig(t)
	r.app.set(retry.Outcome{Kind: retry.Unavailable, Cut: true, Error: "EOF"})
	if o := r.deliver(1); o.Crashed {
		t.Fatal("a cut request with a healthy app counted as a crash")
	}
	r.health.set(errors.New("refused"))
	if o := r.deliver(1); !o.Crashed {
		t.Fatalf("outcome %+v, want crashed", o)
	}
	r.waitState(t, "open")
}

// Recovery is decided by health: while the check fails the consumer stays
// paused; once it passes deliveries resume one at a time (prefetch 1, the
// limiter from 1), the first answer closes the breaker and brings the full
// prefetch back; a message failing in half-open does not reopen.
func TestBreakerRecovery(t *testing.T) {
	r := newRig(t)
	r.health.set(errors.New("down"))
	r.app.set(refused)
	r.deliver(5)
	r.waitState(t, "open")
	for range 3 {
		r.clock.tick(time.Second)
	}
	waitfor.Until(t, 10*time.Second, "the condition", func() bool { return r.health.calls.Load() >= 3 })
	if !r.gate.isPaused() {
		t.Fatal("resumed while the health check fails")
	}
	r.health.set(nil)
	r.clock.tick(time.Second)
	waitfor.Until(t, 10*time.Second, "the condition", func() bool { return !r.gate.isPaused() })
	if got := r.gate.resume[len(r.gate.resume)-1]; got != 1 {
		t.Fatalf("half-open resumed with prefetch %d, want 1", got)
	}
	if r.lim.Limit() != 1 {
		t.Fatalf("limiter at %d after recovery, want 1", r.lim.Limit())
	}
	r.app.set(retry.Outcome{Kind: retry.Response, Status: 503})
	r.deliver(1)
	r.waitState(t, "closed")
	waitfor.Until(t, 10*time.Second, "the full prefetch back after the close", func() bool {
		r.gate.mu.Lock()
		defer r.gate.mu.Unlock()
		return r.gate.resume[len(r.gate.resume)-1] == 50
	})
	r.deliver(3)
	if r.b.State() != "closed" {
		t.Fatalf("state %s after failing messages from a healthy app", r.b.State())
	}
}

// The app dies again right after the probe resumed consuming, before the
// probe has finished: the breaker reopens while its last probe is still
// returning. That reopening must get a probe of its own, or consuming stays
// paused for good with the app healthy again.
func TestBreakerReopenWhileProbeResumes(t *testing.T) {
	r := newRig(t)
	r.health.set(errors.New("down"))
	r.app.set(refused)
	r.deliver(5)
	r.waitState(t, "open")
	waitfor.Until(t, 10*time.Second, "consuming paused", r.gate.isPaused)

	var once sync.Once
	r.gate.onResume = func() {
		once.Do(func() {
			// The first delivery after resuming is refused: the app is
			// down again, and the half-open breaker reopens at once.
			r.deliver(1)
		})
	}
	r.health.set(nil)
	r.clock.tick(time.Second) // the probe: half-open, the check passes, resume (and the reopening)
	waitfor.Until(t, 10*time.Second, "the reopening paused consuming", func() bool {
		p, _ := r.gate.counts()
		return p == 2
	})

	waitfor.Until(t, 10*time.Second, "a probe of the reopened breaker waiting on the clock", func() bool {
		r.clock.mu.Lock()
		defer r.clock.mu.Unlock()
		return len(r.clock.waiters) > 0
	})
	r.clock.tick(time.Second)
	waitfor.Until(t, 10*time.Second, "consuming resumed after the reopening", func() bool {
		_, resumes := r.gate.counts()
		return resumes == 2 && !r.gate.isPaused()
	})
}

// deliverFunc is a Deliverer made of a function, for tests that hold one
// request while others run.
type deliverFunc func(ctx context.Context, m *msg.Message, in msg.Info) retry.Outcome

func (f deliverFunc) Deliver(ctx context.Context, m *msg.Message, in msg.Info) retry.Outcome {
	return f(ctx, m, in)
}

// A message kills the app, but its goroutine only gets to the health check
// after the app is back (a slow machine, a fast restart). Requests sent
// after it were refused meanwhile and opened the breaker: that is the app
// seen down after the message was sent, so the cut still counts as a crash.
func TestBreakerCrashCountedWhenAppBackBeforeCheck(t *testing.T) {
	r := newRig(t)
	sent, release := make(chan struct{}), make(chan struct{})
	r.b.next = deliverFunc(func(_ context.Context, m *msg.Message, _ msg.Info) retry.Outcome {
		if m.MessageID == "killer" {
			close(sent)
			<-release
			return retry.Outcome{Kind: retry.Unavailable, Cut: true, Error: "EOF"}
		}
		return refused
	})
	got := make(chan retry.Outcome, 1)
	go func() { got <- r.b.Deliver(context.Background(), &msg.Message{MessageID: "killer"}, msg.Info{}) }()
	<-sent
	// The app died with the killer: the requests after it are refused.
	r.deliver(5)
	r.waitState(t, "open")
	// The app is back before the killer's goroutine asks about it.
	r.health.set(nil)
	close(release)
	if o := <-got; !o.Crashed {
		t.Fatalf("outcome %+v: the app was seen down after the message was sent, want crashed", o)
	}
}

// A health check already running when a message was sent says nothing
// about whether the app died with it: the cut request asks a check of its
// own instead of taking that one's passing answer.
func TestBreakerCrashNotAnsweredByEarlierCheck(t *testing.T) {
	r := newRig(t)
	h := &blockingHealth{started: make(chan struct{}, 4), release: make(chan struct{})}
	r.b.crash.health = h
	r.app.set(retry.Outcome{Kind: retry.Response, Status: 500})
	r.deliver(5) // failing messages ask the health check; it hangs
	<-h.started

	r.app.set(retry.Outcome{Kind: retry.Unavailable, Cut: true, Error: "EOF"})
	got := make(chan retry.Outcome, 1)
	go func() { got <- r.b.Deliver(context.Background(), &msg.Message{}, msg.Info{}) }()
	// The app dies now: every check from here on fails. The one that
	// started earlier answers "healthy" once released.
	h.fail.Store(true)
	select {
	case <-h.started:
	case <-time.After(10 * time.Second):
		close(h.release)
		t.Fatalf("the cut request waits for the check that started before it was sent (then: %+v)", <-got)
	}
	close(h.release)
	if o := <-got; !o.Crashed {
		t.Fatalf("outcome %+v, want crashed", o)
	}
}

// blockingHealth holds its first check until released; that check passes.
// Later checks fail once fail is set.
type blockingHealth struct {
	started chan struct{}
	release chan struct{}
	calls   atomic.Int64
	fail    atomic.Bool
}

func (h *blockingHealth) Check(context.Context) error {
	first := h.calls.Add(1) == 1
	h.started <- struct{}{}
	if first {
		<-h.release
		return nil
	}
	if h.fail.Load() {
		return errors.New("connection refused")
	}
	return nil
}

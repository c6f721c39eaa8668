package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// machine is a breaker driven by hand: the open timeout's clock is moved
// by the test, the observer's effects are taken after every step in the
// test's goroutine, and the probe's rounds are run when a step says so.
// The probe goroutine an opening starts waits on a clock that never fires.
type machine struct {
	b       *Breaker
	app     *scripted
	health  *fakeHealth
	lim     *Limiter
	now     time.Time
	ctx     context.Context
	effects []string
	last    retry.Outcome
	held    uint64 // the generation of the request hold let through
}

// recordGate writes the gate's calls into the machine's effects.
type recordGate struct{ m *machine }

func (g recordGate) Pause()       { g.m.effects = append(g.m.effects, "pause") }
func (g recordGate) Resume(p int) { g.m.effects = append(g.m.effects, fmt.Sprintf("resume %d", p)) }

func newMachine(t *testing.T, prefetch int) *machine {
	t.Helper()
	m := &machine{app: &scripted{}, health: &fakeHealth{}, now: time.Unix(1000, 0)}
	m.lim = NewLimiter(nil, LimiterOptions{Max: 50})
	m.b = NewBreaker(m.app, BreakerOptions{
		Failures: 3, OpenTimeout: 5 * time.Second, ProbeInterval: time.Second, Prefetch: prefetch,
		Health: m.health, Gate: recordGate{m}, Limiter: m.lim, Clock: &fakeClock{now: time.Unix(0, 0)},
		OnState: func(s string) { m.effects = append(m.effects, "→"+s) },
		Logger:  slog.New(slog.DiscardHandler),
	})
	m.b.now = func() time.Time { return m.now }
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	m.ctx = ctx
	return m
}

// settle acts on the transitions made so far, as Run does.
func (m *machine) settle() {
	for _, c := range m.b.takeChanges() {
		m.b.observe(m.ctx, c)
	}
}

type step func(t *testing.T, m *machine)

func deliver(o retry.Outcome, n int) step {
	return func(t *testing.T, m *machine) {
		m.app.set(o)
		for range n {
			m.last = m.b.Deliver(context.Background(), &msg.Message{}, msg.Info{})
		}
	}
}

var (
	answer200   = deliver(retry.Outcome{Kind: retry.Response, Status: 200}, 1)
	answer503   = deliver(retry.Outcome{Kind: retry.Response, Status: 503}, 1)
	timeout     = deliver(retry.Outcome{Kind: retry.Timeout, Error: "timeout"}, 1)
	unavailable = func(n int) step { return deliver(refused, n) }
	openIt      = unavailable(3)
	healthy     = func(t *testing.T, m *machine) { m.health.set(nil) }
	unhealthy   = func(t *testing.T, m *machine) { m.health.set(errors.New("connection refused")) }
	trip        = func(t *testing.T, m *machine) { m.b.trip() }
	wait        = func(d time.Duration) step { return func(t *testing.T, m *machine) { m.now = m.now.Add(d) } }
	pastTimeout = wait(5*time.Second + time.Nanosecond)
	// look asks the state, as /readyz does: an open breaker past its
	// timeout moves to half-open.
	look = func(t *testing.T, m *machine) { m.b.State() }
)

// probe runs one round of the probe and checks whether it said it is done.
func probe(done bool) step {
	return func(t *testing.T, m *machine) {
		if got := m.b.probeOnce(m.ctx); got != done {
			t.Fatalf("probe round done = %v, want %v", got, done)
		}
	}
}

// crash delivers a request the app cuts, then fails its health check.
func crash(t *testing.T, m *machine) {
	unhealthy(t, m)
	deliver(retry.Outcome{Kind: retry.Unavailable, Cut: true, Error: "EOF"}, 1)(t, m)
	if !m.last.Crashed {
		t.Fatalf("outcome %+v, want crashed", m.last)
	}
}

// refusedWith checks that the last delivery was refused, saying why, and
// never reached the app.
func refusedWith(why string) step {
	return func(t *testing.T, m *machine) {
		calls := m.app.calls.Load()
		deliver(retry.Outcome{Kind: retry.Response, Status: 200}, 1)(t, m)
		if !m.last.Refused || !strings.Contains(m.last.Error, why) || m.app.calls.Load() != calls {
			t.Fatalf("outcome %+v (app called %d times more), want refused saying %q", m.last, m.app.calls.Load()-calls, why)
		}
	}
}

// hold lets a request through and keeps it out, until answerHeld gives
// its verdict. The machine holds one at a time.
func hold(t *testing.T, m *machine) {
	gen, why, ok := m.b.allow()
	if !ok {
		t.Fatalf("request refused (%s), want it let through", why)
	}
	m.held = gen
}

func answerHeld(v appVerdict) step {
	return func(t *testing.T, m *machine) { m.b.done(m.held, v) }
}

func limiterAt(n int) step {
	return func(t *testing.T, m *machine) {
		if got := m.lim.Limit(); got != n {
			t.Fatalf("concurrency limit %d, want %d", got, n)
		}
	}
}

func probing(want bool) step {
	return func(t *testing.T, m *machine) {
		m.b.mu.Lock()
		defer m.b.mu.Unlock()
		if m.b.probing != want {
			t.Fatalf("probing %v, want %v", m.b.probing, want)
		}
	}
}

// Every transition of the breaker, with what the observer does on it.
// The consumer's gate is told "pause" and "resume N" (0: each consumer's
// own prefetch, which it caps to its byte budget); OnState is told "→s".
func TestBreakerTransitions(t *testing.T) {
	opened := []string{"→open", "pause"}
	halfOpened := append(slices.Clone(opened), "→half-open")
	tried := append(slices.Clone(halfOpened), "resume 1")
	for _, c := range []struct {
		name     string
		prefetch int
		steps    []step
		state    string
		effects  []string
	}{
		{name: "closed: fewer unavailable in a row than Failures",
			steps: []step{unavailable(2)}, state: "closed"},
		{name: "closed → open: Failures unavailable in a row",
			steps: []step{unavailable(3)}, state: "open", effects: opened},
		{name: "closed: an answer, whatever the status, ends the row",
			steps: []step{unavailable(2), answer503, unavailable(2)}, state: "closed"},
		{name: "closed: a timeout neither ends the row nor counts",
			steps: []step{unavailable(2), timeout, unavailable(1)}, state: "open", effects: opened},
		{name: "closed → open: trip (the health check failed)",
			steps: []step{trip}, state: "open", effects: opened},
		{name: "closed → open: a request cut by a crash",
			steps: []step{crash}, state: "open", effects: opened},
		{name: "open: refuses without calling the app; trip changes nothing",
			steps: []step{openIt, refusedWith("circuit breaker open"), trip}, state: "open", effects: opened},
		{name: "open: the probe waits for the open timeout",
			steps: []step{openIt, wait(5 * time.Second), probe(false), refusedWith("circuit breaker open")},
			state: "open", effects: opened},
		{name: "open → half-open: the open timeout has passed",
			steps: []step{openIt, pastTimeout, look}, state: "half-open", effects: halfOpened},
		{name: "half-open → closed without a probe: resume at the consumer's byte-capped prefetch",
			steps: []step{openIt, pastTimeout, answer200}, state: "closed",
			effects: append(slices.Clone(halfOpened), "→closed", "resume 0")},
		{name: "half-open → closed without a probe: resume at the full prefetch", prefetch: 50,
			steps: []step{openIt, pastTimeout, answer503}, state: "closed",
			effects: append(slices.Clone(halfOpened), "→closed", "resume 50")},
		{name: "half-open: a timeout is no verdict, the next request gets to answer",
			steps: []step{openIt, pastTimeout, timeout, look}, state: "half-open", effects: halfOpened},
		{name: "half-open: after a timeout, the next answer closes",
			steps: []step{openIt, pastTimeout, timeout, answer503}, state: "closed",
			effects: append(slices.Clone(halfOpened), "→closed", "resume 0")},
		{name: "half-open → open: the request let through finds the app unavailable",
			steps: []step{openIt, pastTimeout, unavailable(1)}, state: "open",
			effects: append(slices.Clone(halfOpened), "→open", "pause")},
		{name: "half-open: one request at a time",
			steps: []step{openIt, pastTimeout, hold, refusedWith("half-open: one delivery at a time")},
			state: "half-open", effects: halfOpened},
		{name: "half-open: trip waits for the answer of the request out",
			steps: []step{openIt, pastTimeout, hold, trip, look}, state: "half-open", effects: halfOpened},
		{name: "half-open → open: trip with no request out",
			steps: []step{openIt, pastTimeout, look, trip}, state: "open",
			effects: append(slices.Clone(halfOpened), "→open", "pause")},
		{name: "half-open: the probe's check fails, consuming stays paused",
			steps: []step{openIt, pastTimeout, unhealthy, probe(false)}, state: "half-open", effects: halfOpened},
		{name: "half-open → trial: the probe's check passes; one at a time, the limiter from 1",
			steps: []step{openIt, pastTimeout, probe(true), limiterAt(1), probing(false)}, state: "half-open", effects: tried},
		{name: "trial → closed: an answer brings the full prefetch back", prefetch: 50,
			steps: []step{openIt, pastTimeout, probe(true), answer503}, state: "closed",
			effects: append(slices.Clone(tried), "→closed", "resume 50")},
		{name: "trial → open: unavailable again; the opening gets a probe of its own",
			steps: []step{openIt, pastTimeout, probe(true), probing(false), unavailable(1), probing(true)}, state: "open",
			effects: append(slices.Clone(tried), "→open", "pause")},
		{name: "trial goes on with half-open's request: its answer closes",
			steps: []step{openIt, pastTimeout, hold, probe(true), answerHeld(appUp)}, state: "closed",
			effects: append(slices.Clone(tried), "→closed", "resume 0")},
		{name: "the probe ends when the breaker closed without it",
			steps: []step{openIt, pastTimeout, answer200, probe(true), probing(false)}, state: "closed",
			effects: append(slices.Clone(halfOpened), "→closed", "resume 0")},
		{name: "an answer to a request let through before the last transition is not counted",
			steps: []step{hold, openIt, pastTimeout, answerHeld(appUp), look}, state: "half-open", effects: halfOpened},
		{name: "a failure before the last transition is not counted either",
			steps: []step{hold, unavailable(2), trip, pastTimeout, look, answerHeld(appDown), look}, state: "half-open", effects: halfOpened},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMachine(t, c.prefetch)
			for _, s := range c.steps {
				s(t, m)
				m.settle()
			}
			if got := m.b.State(); got != c.state {
				t.Fatalf("state %s, want %s", got, c.state)
			}
			m.settle()
			if !slices.Equal(m.effects, c.effects) {
				t.Fatalf("effects %q, want %q", m.effects, c.effects)
			}
		})
	}
}

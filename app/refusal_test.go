package app

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

var unauthorized = retry.Outcome{Kind: retry.Response, Status: 401, Error: "HTTP 401: invalid token"}

type refusalRig struct {
	r       *Refusal
	app     *scripted
	gate    *fakeGate
	clock   *fakeClock
	changed atomic.Bool
	asked   atomic.Int64 // times CredentialsChanged was asked
	mu      sync.Mutex
	changes []bool
}

func newRefusalRig(t *testing.T) *refusalRig {
	t.Helper()
	g := &refusalRig{app: &scripted{}, gate: &fakeGate{}, clock: &fakeClock{now: time.Unix(0, 0)}}
	g.r = NewRefusal(g.app, RefusalOptions{
		Gate: g.gate, ProbeMin: time.Second, ProbeMax: 8 * time.Second, Clock: g.clock,
		Logger:             slog.New(slog.NewTextHandler(io.Discard, nil)),
		CredentialsChanged: func() bool { g.asked.Add(1); return g.changed.Swap(false) },
		OnChange:           func(refused bool) { g.mu.Lock(); g.changes = append(g.changes, refused); g.mu.Unlock() },
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go g.r.Run(ctx)
	return g
}

// deliver sends one message as the delivery loop does: through the
// Refusal, then the loop's decision on the answer back to it (pause for
// a 401, as the default outcome table decides).
func (g *refusalRig) deliver() retry.Outcome {
	o := g.r.Deliver(context.Background(), &msg.Message{}, msg.Info{})
	if pause := o.Kind == retry.Response && o.Status == 401; pause || o.Probe {
		g.r.Judged(o, pause)
	}
	return o
}

func (g *refusalRig) lastResume() (int, bool) {
	g.gate.mu.Lock()
	defer g.gate.mu.Unlock()
	if g.gate.paused || len(g.gate.resume) == 0 {
		return 0, false
	}
	return g.gate.resume[len(g.gate.resume)-1], true
}

// probing moves the clock a second at a time until the Refusal resumes
// consuming for a probe.
func (g *refusalRig) probing(t *testing.T) {
	t.Helper()
	waitfor.Until(t, 10*time.Second, "consuming resumed with prefetch 1 for a probe", func() bool {
		if p, ok := g.lastResume(); ok {
			if p != 1 {
				t.Fatalf("resumed with prefetch %d for a probe, want 1", p)
			}
			return true
		}
		g.clock.tick(time.Second)
		return false
	})
}

// The first 401 pauses consuming; while refused no request reaches the
// app and each goes back refused (no attempt); a probe refused again
// pauses again; the first probe the app judges on its merits resumes
// the full prefetch.
func TestRefusalPausesUntilAProbeIsAccepted(t *testing.T) {
	g := newRefusalRig(t)
	g.app.set(unauthorized)
	if o := g.deliver(); o.Given() {
		t.Fatalf("the first request was refused before reaching the app: %+v", o)
	}
	if !g.r.Refusing() || !g.gate.isPaused() {
		t.Fatalf("refusing %v, paused %v after a 401", g.r.Refusing(), g.gate.isPaused())
	}
	for range 5 {
		if o := g.deliver(); !o.Refused || !o.Given() || o.Probe {
			t.Fatalf("outcome %+v while refused, want refused without a call", o)
		}
	}
	if n := g.app.calls.Load(); n != 1 {
		t.Fatalf("the app was called %d times, want only the first request", n)
	}

	g.probing(t)
	if o := g.deliver(); !o.Probe || o.Status != 401 {
		t.Fatalf("probe outcome %+v, want the app's 401 marked as the probe", o)
	}
	if !g.gate.isPaused() || !g.r.Refusing() {
		t.Fatal("a refused probe did not pause consuming again")
	}

	g.probing(t)
	g.app.set(retry.Outcome{Kind: retry.Response, Status: 200})
	if o := g.deliver(); !o.Probe || o.Status != 200 {
		t.Fatalf("probe outcome %+v", o)
	}
	if g.r.Refusing() {
		t.Fatal("still refusing after an accepted probe")
	}
	if p, ok := g.lastResume(); !ok || p != 0 {
		t.Fatalf("after the accepted probe: resumed %v with prefetch %d, want the full one (0)", ok, p)
	}
	if o := g.deliver(); o.Probe || o.Status != 200 {
		t.Fatalf("outcome %+v after the refusal ended", o)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.changes) != 2 || !g.changes[0] || g.changes[1] {
		t.Fatalf("OnChange told %v, want [true false]", g.changes)
	}
}

// While the probe is at the app the other requests wait for its verdict
// (a resumed consumer must not spin on deliveries refused at once), then
// go to the app when the probe is accepted.
func TestRefusalRequestsWaitForTheProbe(t *testing.T) {
	g := newRefusalRig(t)
	g.app.set(unauthorized)
	g.deliver()
	g.probing(t)

	release := make(chan struct{})
	var calls atomic.Int64
	g.r.next = deliverFunc(func(context.Context, *msg.Message, msg.Info) retry.Outcome {
		if calls.Add(1) == 1 {
			<-release
		}
		return retry.Outcome{Kind: retry.Response, Status: 200}
	})
	probe := make(chan retry.Outcome, 1)
	go func() { probe <- g.deliver() }()
	waitfor.Until(t, 10*time.Second, "the probe at the app", func() bool { return calls.Load() == 1 })
	waiting := make(chan retry.Outcome, 3)
	for range 3 {
		go func() { waiting <- g.deliver() }()
	}
	select {
	case o := <-waiting:
		t.Fatalf("a request went on before the probe's verdict: %+v", o)
	default:
	}
	if calls.Load() != 1 {
		t.Fatalf("%d requests at the app while the probe is out", calls.Load())
	}
	close(release)
	if o := <-probe; !o.Probe {
		t.Fatalf("probe outcome %+v", o)
	}
	for range 3 {
		if o := <-waiting; o.Given() || o.Status != 200 {
			t.Fatalf("a waiting request came back %+v, want the app's answer", o)
		}
	}
	if calls.Load() != 4 {
		t.Fatalf("app called %d times, want the probe and the 3 that waited", calls.Load())
	}
}

// A probe refused again sends the requests that waited for it back
// refused, without calling the app.
func TestRefusalProbeRefusedAgainRefusesTheWaiting(t *testing.T) {
	g := newRefusalRig(t)
	g.app.set(unauthorized)
	g.deliver()
	g.probing(t)
	release := make(chan struct{})
	var calls atomic.Int64
	g.r.next = deliverFunc(func(context.Context, *msg.Message, msg.Info) retry.Outcome {
		if calls.Add(1) == 1 {
			<-release
		}
		return unauthorized
	})
	probe := make(chan retry.Outcome, 1)
	go func() { probe <- g.deliver() }()
	waitfor.Until(t, 10*time.Second, "the probe at the app", func() bool { return calls.Load() == 1 })
	waiting := make(chan retry.Outcome, 1)
	go func() { waiting <- g.deliver() }()
	close(release)
	<-probe
	if o := <-waiting; !o.Refused {
		t.Fatalf("a request that waited for a refused probe came back %+v, want refused", o)
	}
	if calls.Load() != 1 || !g.gate.isPaused() {
		t.Fatalf("calls %d, paused %v after the probe was refused again", calls.Load(), g.gate.isPaused())
	}
}

// A probe without an answer to judge (a timeout, the app away) says
// nothing of the credentials: consuming pauses again and another probe
// follows.
func TestRefusalProbeWithoutAnswer(t *testing.T) {
	g := newRefusalRig(t)
	g.app.set(unauthorized)
	g.deliver()
	g.probing(t)
	g.app.set(retry.Outcome{Kind: retry.Timeout, Error: "timeout"})
	if o := g.deliver(); !o.Probe || o.Kind != retry.Timeout {
		t.Fatalf("probe outcome %+v", o)
	}
	if !g.gate.isPaused() || !g.r.Refusing() {
		t.Fatal("a probe without an answer ended the refusal or left consuming on")
	}
	g.probing(t)
	g.app.set(retry.Outcome{Kind: retry.Response, Status: 404})
	g.deliver()
	if g.r.Refusing() {
		t.Fatal("a 404 to the probe (the app judged the message) did not end the refusal")
	}
}

// A credential file that changes is worth a probe at once, before the
// backoff is over.
func TestRefusalProbesWhenCredentialsChange(t *testing.T) {
	g := newRefusalRig(t)
	g.app.set(unauthorized)
	g.deliver()
	for i := int64(1); i <= 3; i++ {
		g.clock.tick(time.Millisecond)
		waitfor.Until(t, 10*time.Second, "the credential files looked at", func() bool { return g.asked.Load() >= i })
	}
	if _, ok := g.lastResume(); ok {
		t.Fatal("probed before the backoff was over with no credential changed")
	}
	g.changed.Store(true)
	waitfor.Until(t, 10*time.Second, "a probe after the credential file changed", func() bool {
		if _, ok := g.lastResume(); ok {
			return true
		}
		g.clock.tick(time.Millisecond)
		return false
	})
	if !g.clock.Now().Before(time.Unix(0, 0).Add(500 * time.Millisecond)) {
		t.Fatalf("probe came at %v, after the backoff", g.clock.Now())
	}
	if d := g.r.Describe(); d == "" {
		t.Fatal("Describe is empty while probing")
	}
}

// A batch is refused whole while the app refuses Hopper, each entry
// given back.
func TestRefusalRefusesBatches(t *testing.T) {
	g := newRefusalRig(t)
	g.app.set(unauthorized)
	g.deliver()
	a := g.r.DeliverBatch(context.Background(), &batch.Request{Messages: make([]*msg.Message, 3), Infos: make([]msg.Info, 3)})
	if !a.Whole.Refused || len(a.Entries) != 3 {
		t.Fatalf("batch answer %+v while refused", a)
	}
	for i, o := range a.Entries {
		if !o.Refused || !o.Given() {
			t.Fatalf("entry %d: %+v, want refused", i, o)
		}
	}
}

// Only a decision to pause starts a refusal: a 401 decided as a message
// outcome (retry.outcomes "401": dlq) never does.
func TestRefusalOnlyOnPause(t *testing.T) {
	g := newRefusalRig(t)
	g.app.set(unauthorized)
	o := g.r.Deliver(context.Background(), &msg.Message{}, msg.Info{})
	g.r.Judged(unauthorized, false)
	if g.r.Refusing() || g.gate.isPaused() || o.Probe {
		t.Fatal("a 401 the table made a message outcome paused consuming")
	}
}

// Auth.Changed reads a replaced file again at once and says so, once.
func TestAuthChanged(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	if err := os.WriteFile(path, []byte("old-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := NewAuth(AuthOptions{TokenFile: path})
	if err != nil {
		t.Fatal(err)
	}
	if a.Changed() {
		t.Fatal("changed with the file untouched")
	}
	// As a Secret update lands: a new file put in place of the old one.
	tmp := filepath.Join(dir, "token.new")
	if err := os.WriteFile(tmp, []byte("new-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if !a.Changed() {
		t.Fatal("a replaced token file not seen")
	}
	if got := *a.token.value.Load(); got != "new-token" {
		t.Fatalf("token %q after Changed, want the new one", got)
	}
	if a.Changed() {
		t.Fatal("changed again with nothing new")
	}
}

// panicOnce is an app side whose next request panics (a defect below the
// Refusal, recovered at the worker), then answers as scripted.
type panicOnce struct {
	*scripted
	armed atomic.Bool
}

func (p *panicOnce) Deliver(ctx context.Context, m *msg.Message, in msg.Info) retry.Outcome {
	if p.armed.Swap(false) {
		panic("app side defect")
	}
	return p.scripted.Deliver(ctx, m, in)
}

func (p *panicOnce) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	return asBatch(ctx, p.Deliver, r)
}

// A probe request that panics ends its round without a verdict, as one
// that got no answer does: the requests waiting for the verdict go on, and
// a later probe can still be accepted.
func TestRefusalProbeThatPanicsEndsTheRound(t *testing.T) {
	for _, batched := range []bool{false, true} {
		g := newRefusalRig(t)
		app := &panicOnce{scripted: g.app}
		g.r.next = app
		send := func() retry.Outcome {
			if !batched {
				return g.deliver()
			}
			req := &batch.Request{Messages: []*msg.Message{{}}, Infos: []msg.Info{{}}}
			a := g.r.DeliverBatch(context.Background(), req)
			o := a.Whole
			if pause := o.Kind == retry.Response && o.Status == 401; pause || o.Probe {
				g.r.Judged(o, pause)
			}
			return o
		}
		g.app.set(unauthorized)
		send()
		g.probing(t)

		app.armed.Store(true)
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("the probe did not panic")
				}
			}()
			send()
		}()

		// A request after the panic must not wait on the lost probe.
		done := make(chan retry.Outcome, 1)
		go func() { done <- send() }()
		select {
		case o := <-done:
			if o.Status == 200 {
				t.Fatalf("batched %v: after the panicking probe a request reached the app without a probe round: %+v", batched, o)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("batched %v: a request still waits for the verdict of a probe that panicked", batched)
		}
		g.probing(t)
		g.app.set(retry.Outcome{Kind: retry.Response, Status: 200})
		if o := send(); !o.Probe || o.Status != 200 || g.r.Refusing() {
			t.Fatalf("batched %v: probe after the panic: %+v, refusing %v", batched, o, g.r.Refusing())
		}
	}
}

// A refusal that lasts past MaxRefused is overdue (/readyz answers 503)
// and logged once as such; probing goes on, and an accepted probe ends it.
func TestRefusalOverdue(t *testing.T) {
	g := newRefusalRig(t)
	var logs syncBuffer
	g.r.o.MaxRefused = 5 * time.Second
	g.r.log = slog.New(slog.NewJSONHandler(&logs, nil))
	g.app.set(unauthorized)
	g.deliver()
	if !g.r.Refusing() || g.r.Overdue() {
		t.Fatalf("refusing %v, overdue %v at the first 401", g.r.Refusing(), g.r.Overdue())
	}
	waitfor.Until(t, 10*time.Second, "the refusal overdue and logged", func() bool {
		if g.r.Overdue() && strings.Contains(logs.String(), "APP_CREDENTIALS_REFUSED_TOO_LONG") {
			return true
		}
		// Probes come and are refused as the clock moves.
		if p, ok := g.lastResume(); ok && p == 1 {
			g.deliver()
		}
		g.clock.tick(time.Second)
		return false
	})
	g.probing(t)
	g.app.set(retry.Outcome{Kind: retry.Response, Status: 200})
	g.deliver()
	if g.r.Refusing() || g.r.Overdue() {
		t.Fatalf("after an accepted probe: refusing %v, overdue %v", g.r.Refusing(), g.r.Overdue())
	}
	if n := strings.Count(logs.String(), "APP_CREDENTIALS_REFUSED_TOO_LONG"); n != 1 {
		t.Errorf("APP_CREDENTIALS_REFUSED_TOO_LONG logged %d times, want once", n)
	}
}

// syncBuffer is a log destination the Refusal's goroutine and the test
// share.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

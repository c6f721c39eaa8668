package app

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// Deliverer sends a message to the app and classifies what happened; the
// breaker and the limiter decorate one.
type Deliverer interface {
	Deliver(ctx context.Context, m *msg.Message, in msg.Info) retry.Outcome
	// DeliverBatch sends several messages in one request.
	DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer
}

// Gate starts and stops the flow of deliveries. The broker consumer
// implements it; the breaker holds it shut while the app is down, so
// messages wait in the queue instead of cycling through Hopper.
type Gate interface {
	Pause()
	Resume(prefetch int)
}

// Checker says whether the app is healthy (the readiness check).
type Checker interface {
	Check(ctx context.Context) error
}

// Clock is the time the breaker waits on. Tests inject one they move by
// hand instead of sleeping.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time                         { return time.Now() }
func (wallClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// BreakerOptions configure a Breaker. Zero values take the defaults named.
type BreakerOptions struct {
	// Failures is the number of consecutive app-unavailable results
	// (connection refused, reset before an answer, connect timeout) that
	// open the breaker; also the number of consecutive failed messages
	// (5xx, 429, timeout) after which the health check is asked. Default 5.
	Failures int
	// OpenTimeout is the least time the breaker stays open. Default 5s.
	OpenTimeout time.Duration
	// ProbeInterval is how often the health check runs while open, and the
	// least time between two checks asked for by failing messages.
	// Default 1s.
	ProbeInterval time.Duration
	// Prefetch is the full prefetch the gate resumes with on recovery.
	// Default 0: the gate's own (each consumer its configured prefetch).
	Prefetch int
	// Health is the app's health check. Required.
	Health Checker
	// Restarted, when set, says whether the app's process ended since
	// Hopper's idle connections to it were opened (the client can tell:
	// a dying process closes them all). A request cut alone while the
	// health check passes is then taken for a crash with a quick restart,
	// not for the message failing. Default nil: never.
	Restarted func() bool
	// Gate pauses and resumes consuming. Required.
	Gate Gate
	// Limiter, when set, ramps concurrency up after an outage (slow start
	// from 1); without it the breaker resumes with prefetch 1 until the
	// first answer closes it. Default nil.
	Limiter *Limiter
	// Clock defaults to the wall clock.
	Clock  Clock
	Logger *slog.Logger
	// OnState is told every state change ("closed", "open", "half-open").
	OnState func(state string)
}

// Breaker decorates a Deliverer with a circuit breaker that trips on the
// app, never on messages:
//
//	signal                                        reaction
//	connection refused / reset, connect timeout   a failure; Failures in a row open
//	the health check failing                      opens at once
//	5xx, 429, timeout from the app                a message outcome (tiers, DLQ);
//	                                              Failures in a row ask the health check
//	request cut, then the health check failing    opens; the message counts a crash when
//	                                              it was alone at the app, else it becomes
//	                                              a suspect, next delivered on its own
//	request cut while the health check passes     a message outcome (Cut: an attempt) when it
//	                                              was alone at the app; cut with others (a
//	                                              quick restart), a suspect
//	timeout                                       a message outcome; no verdict on the app
//	any answer from the app                       a success
//
// While open it answers "refused" without calling the app (the loop gives
// those messages back without spending an attempt), pauses the consumer and
// polls the health check. After OpenTimeout a passing check lets deliveries
// through again (half-open, consuming with prefetch 1): the first answer of
// any status closes it, every close resumes the full prefetch, and the
// limiter ramps concurrency up from 1. A message that fails while the
// app's health passes never reopens it.
type Breaker struct {
	next  Deliverer
	o     BreakerOptions
	cb    *gobreaker.TwoStepCircuitBreaker[struct{}]
	log   *slog.Logger
	clock Clock

	changes chan gobreaker.State
	// resumeMu orders the probe's resume with prefetch 1 and the close's
	// full one, so a probe finishing late never shrinks a closed breaker's
	// prefetch.
	resumeMu sync.Mutex
	mu       sync.Mutex
	probing  bool
	// reprobe says the breaker opened again while a probe was finishing:
	// that probe goes on instead of ending.
	reprobe bool

	// tripNow makes the next reported failure open the breaker: the health
	// check failed.
	tripNow atomic.Bool
	// failing counts consecutive failed messages from an app whose health
	// was not yet asked about them.
	failing   atomic.Int64
	checkMu   sync.Mutex
	checking  *healthCheck
	lastCheck time.Time

	// seq orders requests and health checks by when they started; downAt
	// is the seq of the latest one that found the app down. A request cut
	// by the app dying is a crash when anything that started after it
	// found the app down, even if the app is back (restarted quickly) by
	// the time the cut request gets to ask.
	seq    atomic.Uint64
	downAt atomic.Uint64

	// isolate lets a crash suspect reach the app alone: every other
	// request holds it shared, a suspect holds it exclusively (waiting for
	// the requests in flight to finish, and keeping new ones out until it
	// is answered). isolating counts suspects waiting for it or holding it.
	isolate   sync.RWMutex
	isolating atomic.Int64
	// inflight counts requests sent to the app and not yet back. A cut
	// request that comes back with others still in flight was cut in a
	// crowd; crowdedAt is the seq of the latest such return, so a cut of
	// the same crash that comes back last, alone, still knows it had
	// company (the crowd was seen after it was sent).
	inflight  atomic.Int64
	crowdedAt atomic.Uint64
}

// healthCheck is one run of the health check, shared by everyone who asks
// while it runs: a crash cuts every request in flight at once.
type healthCheck struct {
	seq  uint64 // when it started, on the breaker's seq
	done chan struct{}
	err  error
}

// errAppFailed marks an outcome that counts against the app's health.
var errAppFailed = errors.New("app unavailable")

// errNoVerdict marks an outcome that says nothing about the app's health
// either way: a timeout. The breaker neither counts it as a failure nor
// lets it close a half-open breaker (the next request gets to answer).
var errNoVerdict = errors.New("no verdict on the app")

// NewBreaker wraps next.
func NewBreaker(next Deliverer, o BreakerOptions) *Breaker {
	if o.Failures < 1 {
		o.Failures = 5
	}
	if o.OpenTimeout <= 0 {
		o.OpenTimeout = 5 * time.Second
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = time.Second
	}
	if o.Clock == nil {
		o.Clock = wallClock{}
	}
	b := &Breaker{next: next, o: o, log: o.Logger, clock: o.Clock, changes: make(chan gobreaker.State, 16)}
	if b.log == nil {
		b.log = slog.Default()
	}
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name: "app",
		// Half-open lets one request through; its answer, whatever the
		// status, closes the breaker. The limiter does the ramp.
		MaxRequests: 1,
		Timeout:     o.OpenTimeout,
		IsExcluded:  func(err error) bool { return errors.Is(err, errNoVerdict) },
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return b.tripNow.Load() || c.ConsecutiveFailures >= uint32(o.Failures)
		},
		// Called under the breaker's lock: only hand the change over.
		OnStateChange: func(_ string, _, to gobreaker.State) {
			select {
			case b.changes <- to:
			default:
			}
		},
	})
	return b
}

// State is the breaker's current state name.
func (b *Breaker) State() string { return stateName(b.cb.State()) }

func stateName(s gobreaker.State) string {
	switch s {
	case gobreaker.StateOpen:
		return "open"
	case gobreaker.StateHalfOpen:
		return "half-open"
	}
	return "closed"
}

// Run acts on state changes until ctx ends: pause on open, probe, resume.
func (b *Breaker) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case to := <-b.changes:
			b.changed(ctx, to)
		}
	}
}

func (b *Breaker) changed(ctx context.Context, to gobreaker.State) {
	if b.o.OnState != nil {
		b.o.OnState(stateName(to))
	}
	switch to {
	case gobreaker.StateOpen:
		b.log.Warn("circuit breaker open: app unavailable; consumer paused, messages stay in the queue",
			"event", "BREAKER_OPEN", "failures", b.o.Failures)
		b.o.Gate.Pause()
		b.startProbe(ctx)
	case gobreaker.StateHalfOpen:
		b.log.Info("circuit breaker half-open: the open timeout has passed; one delivery at a time once the health check passes", "event", "BREAKER_HALF_OPEN")
	case gobreaker.StateClosed:
		b.failing.Store(0)
		b.log.Info("circuit breaker closed: app answering", "event", "BREAKER_CLOSED")
		// Every close resumes with the full prefetch, whoever closed it:
		// the probe's first delivery, or one that was queued (or held in
		// place) and went through after the open timeout without a probe.
		b.resumeMu.Lock()
		b.o.Gate.Resume(b.o.Prefetch)
		b.resumeMu.Unlock()
	}
}

// startProbe polls the health check while the breaker is open; once the
// open timeout has passed and the check passes, deliveries go through
// again, concurrency ramping up from 1. One probe runs at a time: when the
// breaker opens again while a probe is finishing (the app died right after
// the probe let deliveries through), that probe goes on, so every opening
// is probed and consuming never stays paused for an app that is back.
func (b *Breaker) startProbe(ctx context.Context) {
	b.mu.Lock()
	if b.probing {
		b.reprobe = true
		b.mu.Unlock()
		return
	}
	b.probing = true
	b.mu.Unlock()
	go func() {
		for {
			b.probe(ctx)
			b.mu.Lock()
			if !b.reprobe || ctx.Err() != nil {
				b.probing, b.reprobe = false, false
				b.mu.Unlock()
				return
			}
			b.reprobe = false
			b.mu.Unlock()
		}
	}()
}

// probe waits until the breaker is closed, or until it may let deliveries
// through again and the health check passes, then resumes consuming.
func (b *Breaker) probe(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.clock.After(b.o.ProbeInterval):
		}
		// State() moves an open breaker past its timeout to half-open.
		switch b.cb.State() {
		case gobreaker.StateClosed:
			return
		case gobreaker.StateOpen:
			continue
		}
		if err := b.check(ctx, b.seq.Load()); err != nil {
			continue
		}
		// Half-open lets one request through and refuses the rest: resume
		// with prefetch 1, or the broker would push deliveries that are
		// refused at once and returned, round and round. The close
		// restores the full prefetch; the limiter ramps up from 1.
		b.resumeMu.Lock()
		if b.cb.State() != gobreaker.StateClosed {
			if b.o.Limiter != nil {
				b.o.Limiter.Reset(1)
			}
			b.o.Gate.Resume(1)
		}
		b.resumeMu.Unlock()
		return
	}
}

// check runs the health check, or waits for one already running that
// started after after (a value of b.seq). A check that began before a
// request was sent cannot say whether the app died with that request.
func (b *Breaker) check(ctx context.Context, after uint64) error {
	b.checkMu.Lock()
	hc := b.checking
	if hc == nil || hc.seq <= after {
		hc = &healthCheck{seq: b.seq.Add(1), done: make(chan struct{})}
		b.checking = hc
		b.lastCheck = b.clock.Now()
		b.checkMu.Unlock()
		hc.err = b.o.Health.Check(ctx)
		if hc.err != nil {
			b.sawDown(hc.seq)
		}
		b.checkMu.Lock()
		if b.checking == hc {
			b.checking = nil
		}
		b.checkMu.Unlock()
		close(hc.done)
		return hc.err
	}
	b.checkMu.Unlock()
	select {
	case <-hc.done:
		return hc.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sawDown records that something which started at seq found the app down:
// a failing health check, or a request whose connection was refused.
func (b *Breaker) sawDown(seq uint64) {
	for {
		cur := b.downAt.Load()
		if cur >= seq || b.downAt.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// trip opens the breaker now: the health check failed.
func (b *Breaker) trip() {
	b.tripNow.Store(true)
	defer b.tripNow.Store(false)
	if done, err := b.cb.Allow(); err == nil {
		done(errAppFailed)
	}
}

// Deliver asks the breaker first; an open breaker answers "refused"
// without calling the app.
func (b *Breaker) Deliver(ctx context.Context, m *msg.Message, in msg.Info) retry.Outcome {
	return b.around(ctx, in.Suspect, func(ctx context.Context) retry.Outcome { return b.next.Deliver(ctx, m, in) })
}

// DeliverBatch is Deliver for a batch request: the breaker counts it as
// one request, and what it makes of the request's end (a crash, a cut
// while the app is healthy) is the outcome of every entry.
func (b *Breaker) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	var a batch.Answer
	whole := b.around(ctx, r.Alone, func(ctx context.Context) retry.Outcome {
		a = b.next.DeliverBatch(ctx, r)
		return a.Whole
	})
	return batch.Classified(a, whole, r.Len())
}

// around runs one request to the app through the breaker. suspect
// requests run alone at the app.
func (b *Breaker) around(ctx context.Context, suspect bool, call func(context.Context) retry.Outcome) retry.Outcome {
	done, err := b.cb.Allow()
	if err != nil {
		why := "circuit breaker open: app unavailable"
		if errors.Is(err, gobreaker.ErrTooManyRequests) {
			why = "circuit breaker half-open: one delivery at a time until the app answers"
		}
		return retry.Outcome{Kind: retry.Unavailable, Error: why, Refused: true}
	}
	if suspect {
		b.isolating.Add(1)
		b.isolate.Lock()
		defer func() { b.isolate.Unlock(); b.isolating.Add(-1) }()
	} else {
		b.isolate.RLock()
		defer b.isolate.RUnlock()
	}
	sent := b.seq.Add(1)
	b.inflight.Add(1)
	o := call(ctx)
	company := o.Kind == retry.Unavailable && o.Cut && b.cutInCrowd(sent)
	b.inflight.Add(-1)
	switch {
	case o.Given():
		done(nil) // Hopper's own doing: says nothing about the app
	case o.Kind == retry.Unavailable:
		if !o.Cut {
			b.sawDown(sent) // not even a connection was taken
			done(errAppFailed)
			return o
		}
		if down, why := b.diedSince(ctx, sent); down {
			// The app went away while it had the request, and was seen
			// down after it was sent: it died handling it. Alone at the
			// app, the message is charged a crash; with other requests in
			// flight any of them may be the cause, so none is charged and
			// each becomes a suspect, delivered next on its own. Open at
			// once either way.
			if company {
				o.CrashSuspect = true
				o.Error += "; then " + why + " (other requests were in flight: delivered again on its own)"
			} else {
				o.Crashed = true
				o.Error += "; then " + why
			}
			done(nil)
			b.trip()
			return o
		}
		if company {
			// Several requests cut at once and the app up again: a
			// restart quicker than the check, more likely than several
			// messages breaking their connections together. Nobody is
			// charged; each goes back to be delivered on its own, where a
			// message that breaks its connection is caught alone.
			o.CrashSuspect = true
			o.Error += "; cut together with other requests, the app's health check passing (delivered again on its own)"
			done(nil)
			return o
		}
		// The app took the request alone and broke the connection, and it
		// is up: this message is what failed (a handler that dies on one
		// input, a server write timeout shorter than the handler). It
		// spends an attempt like a timeout; the app is not down, so the
		// breaker stays as it is.
		o.Kind = retry.Cut
		o.Error += "; the app's health check passes"
		done(nil)
		b.messageFailed(ctx)
	case o.Kind == retry.Timeout:
		done(errNoVerdict) // a slow answer says nothing about the app being up
		b.messageFailed(ctx)
	case assess(o).FailedMessage():
		done(nil) // the app answered: it is up
		b.messageFailed(ctx)
	default:
		done(nil)
		b.failing.Store(0)
	}
	return o
}

// cutInCrowd is called by a cut request sent at sent, before it counts
// itself out of inflight. One crash cuts every request at the app at once;
// the first of them back sees the others still in flight and records the
// crowd, the last one back finds that record newer than its own send. A
// request refused meanwhile counts as company too while in flight: a
// crash wrongly called crowded only costs the message a delivery on its
// own, where a crash wrongly charged could send it to the DLQ.
func (b *Breaker) cutInCrowd(sent uint64) bool {
	if b.inflight.Load() > 1 {
		now := b.seq.Load()
		for cur := b.crowdedAt.Load(); cur < now && !b.crowdedAt.CompareAndSwap(cur, now); cur = b.crowdedAt.Load() {
		}
		return true
	}
	return b.crowdedAt.Load() >= sent
}

// diedSince says whether the app was seen down by anything that started
// after sent: a refused request or failed check already recorded, or else
// a health check run now.
func (b *Breaker) diedSince(ctx context.Context, sent uint64) (bool, string) {
	if b.downAt.Load() > sent {
		return true, "the app was found down (refused connections or a failing health check)"
	}
	if err := b.check(context.WithoutCancel(ctx), sent); err != nil {
		return true, "the health check failed: " + err.Error()
	}
	if b.o.Restarted != nil && b.o.Restarted() {
		return true, "the app closed its idle connections too (its process ended and came back)"
	}
	return false, ""
}

// messageFailed is told of a failed message from an app that answered.
// Failures in a row make it ask the health check, at most once per
// ProbeInterval; only a failing check opens the breaker.
func (b *Breaker) messageFailed(ctx context.Context) {
	if b.failing.Add(1) < int64(b.o.Failures) {
		return
	}
	b.checkMu.Lock()
	now := b.clock.Now()
	due := b.checking == nil && now.Sub(b.lastCheck) >= b.o.ProbeInterval
	if due {
		b.lastCheck = now // claimed here, so concurrent failures ask once
	}
	b.checkMu.Unlock()
	if !due {
		return
	}
	b.failing.Store(0)
	go func() {
		if err := b.check(context.WithoutCancel(ctx), b.seq.Load()); err != nil {
			b.log.Warn("messages failing and the app's health check fails too", "event", "APP_UNHEALTHY", "error", err.Error())
			b.trip()
		}
	}()
}

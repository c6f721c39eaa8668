package app

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

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
	// Clock paces the probe and the health checks asked for by failing
	// messages. The open timeout is measured on the wall clock whatever
	// Clock is. Defaults to the wall clock.
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
//
// It is one state machine under one lock:
//
//	from        to          when
//	closed      open        Failures app-unavailable results in a row, or trip
//	                        (the health check failed, a request was cut by a crash)
//	open        half-open   the open timeout has passed (seen by a delivery, the
//	                        probe or State)
//	half-open   trial       the probe's health check passed
//	half-open,  closed      the request let through is answered, whatever the status
//	trial
//	half-open,  open        the request let through found the app unavailable, or
//	trial                   trip while no request is out
//
// Every transition is made by setState, and one observer (Run) acts on
// them in order: it pauses the consumer on open and starts the probe, and
// resumes it on trial (prefetch 1, the limiter from 1) and on close (the
// full prefetch). Since the resumes are effects of transitions taken in
// order, a trial that comes late never shrinks a closed breaker's
// prefetch. What a cut request means (a crash, a suspect, a message that
// failed) is the crashDetector's to say.
type Breaker struct {
	next  Deliverer
	o     BreakerOptions
	log   *slog.Logger
	crash *crashDetector
	// now is the clock of the open timeout. It is the wall clock even
	// with another Clock, which only paces the probe and the health checks
	// asked for by failing messages.
	now func() time.Time

	mu    sync.Mutex
	state breakerState
	// generation changes with every transition but trial's: an answer to
	// a request let through in an earlier one is not counted.
	generation uint64
	// openUntil is when an open breaker may let a request through again.
	openUntil time.Time
	// unavailable counts app-unavailable results in a row (closed).
	unavailable int
	// out is whether half-open let its one request through and waits for
	// its answer.
	out bool
	// failing counts consecutive failed messages from an app whose health
	// was not yet asked about them.
	failing int
	// probing says a probe runs: one at a time, until it moves the
	// breaker to trial or finds it closed.
	probing bool
	// changes are the transitions the observer has yet to act on, in the
	// order they were made; changed tells it there are some.
	changes []change
	changed chan struct{}
}

// breakerState is where the breaker is. Trial is half-open after the
// probe's passing health check, with consuming resumed at prefetch 1; it
// is named "half-open" too.
type breakerState int

const (
	// stateClosed: requests go to the app.
	stateClosed breakerState = iota
	// stateOpen: the app is down; requests are refused and consuming is
	// paused until the open timeout has passed.
	stateOpen
	// stateHalfOpen: the open timeout has passed; one request at a time
	// may go to the app (one already queued, or held in place), consuming
	// still paused.
	stateHalfOpen
	// stateTrial: half-open after the probe's passing health check, with
	// consuming resumed at prefetch 1.
	stateTrial
)

func (s breakerState) String() string {
	switch s {
	case stateOpen:
		return "open"
	case stateHalfOpen, stateTrial:
		return "half-open"
	}
	return "closed"
}

// change is one transition, as the observer is told of it.
type change struct{ from, to breakerState }

// appVerdict is what the end of one request says about the app.
type appVerdict int

const (
	// appUp: the app answered (whatever the status), or Hopper let the
	// request go, which says nothing against the app.
	appUp appVerdict = iota
	// appDown: no connection was even taken.
	appDown
	// noVerdict: a timeout says nothing about the app being up either
	// way. It does not close a half-open breaker (the next request gets to
	// answer), nor count as a failure.
	noVerdict
)

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
	b := &Breaker{next: next, o: o, log: o.Logger, now: time.Now, changed: make(chan struct{}, 1),
		crash: &crashDetector{health: o.Health, restarted: o.Restarted, clock: o.Clock}}
	if b.log == nil {
		b.log = slog.Default()
	}
	return b
}

// State is the breaker's current state name ("closed", "open",
// "half-open").
func (b *Breaker) State() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.currentLocked().String()
}

// currentLocked is the state now: an open breaker whose timeout has passed
// moves to half-open.
func (b *Breaker) currentLocked() breakerState {
	if b.state == stateOpen && b.now().After(b.openUntil) {
		b.setState(stateHalfOpen)
	}
	return b.state
}

// setState makes every transition: the state's own bookkeeping, and the
// change handed to the observer. Called with mu held.
func (b *Breaker) setState(to breakerState) {
	from := b.state
	if from == to {
		return
	}
	b.state = to
	if to != stateTrial {
		// Trial goes on with half-open's request: its answer still
		// closes the breaker.
		b.generation++
		b.unavailable, b.out = 0, false
	}
	switch to {
	case stateOpen:
		b.openUntil = b.now().Add(b.o.OpenTimeout)
	case stateClosed:
		b.failing = 0
	}
	b.changes = append(b.changes, change{from: from, to: to})
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

// Run acts on state changes until ctx ends: pause on open, probe, resume.
// It is the one observer of the breaker's transitions.
func (b *Breaker) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.changed:
		}
		for _, c := range b.takeChanges() {
			b.observe(ctx, c)
		}
	}
}

// takeChanges hands the observer the transitions made since it last
// looked.
func (b *Breaker) takeChanges() []change {
	b.mu.Lock()
	defer b.mu.Unlock()
	cs := b.changes
	b.changes = nil
	return cs
}

// observe acts on one transition.
func (b *Breaker) observe(ctx context.Context, c change) {
	if b.o.OnState != nil && c.from.String() != c.to.String() {
		b.o.OnState(c.to.String())
	}
	switch c.to {
	case stateOpen:
		b.log.Warn("circuit breaker open: app unavailable; consumer paused, messages stay in the queue",
			"event", "BREAKER_OPEN", "failures", b.o.Failures)
		b.o.Gate.Pause()
		b.startProbe(ctx)
	case stateHalfOpen:
		b.log.Info("circuit breaker half-open: the open timeout has passed; one delivery at a time once the health check passes", "event", "BREAKER_HALF_OPEN")
	case stateTrial:
		// Half-open lets one request through and refuses the rest: resume
		// with prefetch 1, or the broker would push deliveries that are
		// refused at once and returned, round and round. The close
		// restores the full prefetch; the limiter ramps up from 1.
		if b.o.Limiter != nil {
			b.o.Limiter.Reset(1)
		}
		b.o.Gate.Resume(1)
	case stateClosed:
		b.log.Info("circuit breaker closed: app answering", "event", "BREAKER_CLOSED")
		// Every close resumes with the full prefetch, whoever closed it:
		// the probe's first delivery, or one that was queued (or held in
		// place) and went through after the open timeout without a probe.
		b.o.Gate.Resume(b.o.Prefetch)
	}
}

// startProbe polls the health check while the breaker is open, unless a
// probe runs already: that one goes on until it moves the breaker to trial
// or finds it closed, so every opening is probed and consuming never stays
// paused for an app that is back.
func (b *Breaker) startProbe(ctx context.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.probing {
		return
	}
	b.probing = true
	go b.probe(ctx)
}

// probe runs probeOnce every ProbeInterval until it is done or ctx ends.
func (b *Breaker) probe(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			b.mu.Lock()
			b.probing = false
			b.mu.Unlock()
			return
		case <-b.o.Clock.After(b.o.ProbeInterval):
		}
		if b.probeOnce(ctx) {
			return
		}
	}
}

// probeOnce is one round of the probe: once the open timeout has passed
// and the health check passes, the breaker moves to trial. It reports
// whether the probe is done (the breaker in trial, or closed meanwhile);
// it ends probing in the same step, so an opening after it gets a probe
// of its own.
func (b *Breaker) probeOnce(ctx context.Context) bool {
	b.mu.Lock()
	switch b.currentLocked() {
	case stateOpen:
		b.mu.Unlock()
		return false
	case stateClosed, stateTrial:
		b.probing = false
		b.mu.Unlock()
		return true
	}
	b.mu.Unlock()
	if err := b.crash.check(ctx, b.crash.latest()); err != nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case stateOpen:
		return false // opened again while the check ran: go on
	case stateHalfOpen:
		b.setState(stateTrial)
	}
	b.probing = false
	return true
}

// allow asks to send one request: an open breaker refuses, a half-open
// one lets one request through at a time. It returns the generation the
// request's verdict is for.
func (b *Breaker) allow() (uint64, string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.currentLocked() {
	case stateOpen:
		return 0, "circuit breaker open: app unavailable", false
	case stateHalfOpen, stateTrial:
		if b.out {
			return 0, "circuit breaker half-open: one delivery at a time until the app answers", false
		}
		b.out = true
	}
	return b.generation, "", true
}

// done takes the verdict of a request allowed in generation gen.
func (b *Breaker) done(gen uint64, v appVerdict) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.currentLocked()
	if gen != b.generation {
		return
	}
	switch {
	case v == noVerdict:
		b.out = false // the next request gets to answer
	case s == stateClosed && v == appUp:
		b.unavailable = 0
	case s == stateClosed:
		if b.unavailable++; b.unavailable >= b.o.Failures {
			b.setState(stateOpen)
		}
	case v == appUp:
		b.setState(stateClosed)
	default:
		b.setState(stateOpen)
	}
}

// trip opens the breaker now: the health check failed. A half-open
// breaker whose request is out waits for that request's answer instead.
func (b *Breaker) trip() {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.currentLocked() {
	case stateClosed:
		b.setState(stateOpen)
	case stateHalfOpen, stateTrial:
		if !b.out {
			b.setState(stateOpen)
		}
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
	gen, why, ok := b.allow()
	if !ok {
		return retry.Outcome{Kind: retry.Unavailable, Error: why, Refused: true}
	}
	sent := b.crash.send(suspect)
	defer b.crash.release(suspect)
	o := call(ctx)
	cut := o.Kind == retry.Unavailable && o.Cut
	crowded := b.crash.back(sent, cut)
	switch {
	case o.Given():
		b.done(gen, appUp) // Hopper's own doing: says nothing about the app
	case cut:
		var down bool
		o, down = b.crash.cut(ctx, o, sent, crowded)
		b.done(gen, appUp) // the app took the request: it was up then
		if down {
			b.trip()
		} else if o.Kind == retry.Cut {
			b.messageFailed(ctx)
		}
	case o.Kind == retry.Unavailable:
		b.crash.sawDown(sent) // not even a connection was taken
		b.done(gen, appDown)
	case o.Kind == retry.Timeout:
		b.done(gen, noVerdict) // a slow answer says nothing about the app being up
		b.messageFailed(ctx)
	case assess(o).FailedMessage():
		b.done(gen, appUp) // the app answered: it is up
		b.messageFailed(ctx)
	default:
		b.done(gen, appUp)
		b.mu.Lock()
		b.failing = 0
		b.mu.Unlock()
	}
	return o
}

// messageFailed is told of a failed message from an app that answered.
// Failures in a row make it ask the health check, at most once per
// ProbeInterval; only a failing check opens the breaker.
func (b *Breaker) messageFailed(ctx context.Context) {
	b.mu.Lock()
	b.failing++
	n := b.failing
	b.mu.Unlock()
	if n < b.o.Failures || !b.crash.claimCheck(b.o.ProbeInterval) {
		return
	}
	b.mu.Lock()
	b.failing = 0
	b.mu.Unlock()
	go func() {
		if err := b.crash.check(context.WithoutCancel(ctx), b.crash.latest()); err != nil {
			b.log.Warn("messages failing and the app's health check fails too", "event", "APP_UNHEALTHY", "error", err.Error())
			b.trip()
		}
	}()
}

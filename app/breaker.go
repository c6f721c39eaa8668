package app

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

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

// BreakerOptions configure a Breaker.
type BreakerOptions struct {
	// Failures is the number of consecutive failures (unavailable, 5xx,
	// timeout) that opens the breaker.
	Failures int
	// OpenTimeout is how long the breaker stays open before a probe
	// delivery may go through (half-open).
	OpenTimeout time.Duration
	// ProbeInterval is how often the health check runs while open.
	ProbeInterval time.Duration
	// Prefetch is restored when the breaker closes.
	Prefetch int
	Health   Checker
	Gate     Gate
	Logger   *slog.Logger
	// OnState is told every state change ("closed", "open", "half-open").
	OnState func(state string)
}

// Breaker decorates a Deliverer with a circuit breaker: an app that is
// down is not a message that failed. While it is open, deliveries
// are answered "unavailable" without calling the app — the proxy returns
// them to the queue without spending an attempt — and the consumer is
// paused. A health probe and then a single delivery (half-open) decide when
// full prefetch resumes.
type Breaker struct {
	next Deliverer
	o    BreakerOptions
	cb   *gobreaker.TwoStepCircuitBreaker[struct{}]
	log  *slog.Logger

	changes chan gobreaker.State
	mu      sync.Mutex
	probing bool
}

// errAppFailed marks an outcome that counts against the app's health.
var errAppFailed = errors.New("app failed")

// NewBreaker wraps next.
func NewBreaker(next Deliverer, o BreakerOptions) *Breaker {
	if o.Failures < 1 {
		o.Failures = 5
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = time.Second
	}
	b := &Breaker{next: next, o: o, log: o.Logger, changes: make(chan gobreaker.State, 16)}
	if b.log == nil {
		b.log = slog.Default()
	}
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "app",
		MaxRequests: 1,
		Timeout:     o.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= uint32(o.Failures)
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
			name := stateName(to)
			if b.o.OnState != nil {
				b.o.OnState(name)
			}
			switch to {
			case gobreaker.StateOpen:
				b.log.Warn("circuit breaker open: app unavailable; consumer paused, messages stay in the queue",
					"event", "BREAKER_OPEN", "failures", b.o.Failures)
				b.o.Gate.Pause()
				b.startProbe(ctx)
			case gobreaker.StateHalfOpen:
				b.log.Info("circuit breaker half-open: one delivery will probe the app", "event", "BREAKER_HALF_OPEN")
			case gobreaker.StateClosed:
				b.log.Info("circuit breaker closed: app healthy; full prefetch resumed", "event", "BREAKER_CLOSED")
				b.o.Gate.Resume(b.o.Prefetch)
			}
		}
	}
}

// startProbe polls the health check while the breaker is open; once it
// passes and the open timeout has elapsed, one delivery is let through.
func (b *Breaker) startProbe(ctx context.Context) {
	b.mu.Lock()
	if b.probing {
		b.mu.Unlock()
		return
	}
	b.probing = true
	b.mu.Unlock()
	go func() {
		defer func() { b.mu.Lock(); b.probing = false; b.mu.Unlock() }()
		t := time.NewTicker(b.o.ProbeInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			// State() moves an expired open breaker to half-open.
			switch b.cb.State() {
			case gobreaker.StateClosed:
				return
			case gobreaker.StateOpen:
				continue
			}
			if b.o.Health != nil {
				if err := b.o.Health.Check(ctx); err != nil {
					continue
				}
			}
			b.o.Gate.Resume(1)
			return
		}
	}()
}

// Deliver asks the breaker first; an open breaker answers "unavailable"
// without calling the app.
func (b *Breaker) Deliver(ctx context.Context, m *msg.Message, in msg.Info) retry.Outcome {
	done, err := b.cb.Allow()
	if err != nil {
		return retry.Outcome{Kind: retry.Unavailable, Error: "circuit breaker " + b.State() + ": app marked unavailable", Refused: true}
	}
	o := b.next.Deliver(ctx, m, in)
	if failed(o) {
		done(errAppFailed)
	} else {
		done(nil)
	}
	return o
}

// failed says whether an outcome counts against the app's health: it did
// not answer, or answered with a server error. A 4xx is the app working.
func failed(o retry.Outcome) bool {
	switch o.Kind {
	case retry.Unavailable, retry.Timeout:
		return true
	}
	return o.Status >= 500 || o.Status == 0
}

// Deliverer sends a message to the app and classifies what happened; the
// breaker decorates one.
type Deliverer interface {
	Deliver(ctx context.Context, m *msg.Message, in msg.Info) retry.Outcome
}

package app

import (
	"context"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// Deliverer sends a message to the app and classifies what happened. The
// client is one; the pacer, the refusal, the breaker and the limiter each
// decorate one.
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

// Clock is the time the breaker and the pacer wait on. Tests inject one
// they move by hand instead of sleeping.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time                         { return time.Now() }
func (wallClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

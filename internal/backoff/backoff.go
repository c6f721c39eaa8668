// Package backoff holds the two waits every retry loop in Hopper needs: a
// jittered exponential backoff, and a sleep that ends early when its
// context does.
package backoff

import (
	"context"
	"time"

	cbackoff "github.com/cenkalti/backoff/v5"
)

// Backoff is jittered exponential backoff between Min and Max, on the
// maintained cenkalti/backoff. Zero values take the defaults named.
type Backoff struct {
	// Min is the first step. Default 500ms.
	Min time.Duration
	// Max caps the step. Default Min.
	Max time.Duration
	eb  *cbackoff.ExponentialBackOff
}

// Next returns the next wait: drawn from the upper half of a step that
// doubles from Min up to Max, so that many sidecars (or many held
// deliveries) retrying together do not do so in lockstep, and no wait is
// ever much shorter than the step. The library draws around an interval
// (interval ± factor): an interval of 3/4 of the step with a factor of 1/3
// is that upper half.
func (b *Backoff) Next() time.Duration {
	if b.eb == nil {
		lo, hi := b.Min, b.Max
		if lo <= 0 {
			lo = 500 * time.Millisecond
		}
		if hi < lo {
			hi = lo
		}
		b.eb = &cbackoff.ExponentialBackOff{
			InitialInterval:     lo * 3 / 4,
			RandomizationFactor: 1.0 / 3,
			Multiplier:          2,
			MaxInterval:         hi * 3 / 4,
		}
		b.eb.Reset()
	}
	return b.eb.NextBackOff()
}

// Reset starts over after a success.
func (b *Backoff) Reset() {
	if b.eb != nil {
		b.eb.Reset()
	}
}

// Sleep waits d, or until ctx is done (then it returns ctx's error).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

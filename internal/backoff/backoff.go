// Package backoff holds the two waits every retry loop in Hopper needs: a
// jittered exponential backoff, and a sleep that ends early when its
// context does.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is jittered exponential backoff between Min and Max. Zero values
// take the defaults named.
type Backoff struct {
	// Min is the first step. Default 500ms.
	Min time.Duration
	// Max caps the step. Default Min.
	Max time.Duration
	// Rand returns a number in [0, 1); default math/rand. Tests inject one.
	Rand func() float64
	n    int
}

// Next returns the next wait: drawn from the upper half of a step that
// doubles from Min up to Max, so that many sidecars (or many held
// deliveries) retrying together do not do so in lockstep, and no wait is
// ever much shorter than the step.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = 500 * time.Millisecond
	}
	if hi < lo {
		hi = lo
	}
	step := lo
	for i := 0; i < b.n && step < hi; i++ {
		step *= 2
	}
	step = min(step, hi)
	b.n++
	r := b.Rand
	if r == nil {
		r = rand.Float64
	}
	return step/2 + time.Duration(r()*float64(step-step/2))
}

// Reset starts over after a success.
func (b *Backoff) Reset() { b.n = 0 }

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

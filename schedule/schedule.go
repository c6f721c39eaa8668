// Package schedule decides when a message that names its own delivery time
// may reach the app, and how it waits until then.
//
// A message may say "not before" (an absolute time, or a delay counted
// from when Hopper first receives it). One that is not due yet is parked:
// moved, without a request to the app and without spending an attempt,
// into a parking queue whose message TTL dead-letters it back to the work
// queue. RabbitMQ expires messages only at the head of a queue, so each
// parking delay has a queue of its own: a ladder of delays, each twice the
// one before, from Policy.Step up to Policy.Max. Every hop takes the
// longest step that does not pass the due time, and the due time travels
// with the message as an absolute time, so each hop starts again from what
// is left: the broker's time per hop never adds up, and a message reaches
// its due time within half the shortest step (plus one hop's latency).
//
//	received ─(due, or less than Step/2 left)→ delivered
//	    │
//	    ├─(more than Max left, first seen)→ DLQ, or due time pulled in to now+Max
//	    │
//	    └─(not due)→ parked in the longest step ≤ what is left
//	                 ─(step's TTL runs out)→ received again
//
// The package is pure: the clock is the caller's.
package schedule

import (
	"errors"
	"fmt"
	"time"
)

// PastMax is what becomes of a message whose due time is further away
// than the longest delay accepted.
type PastMax int

const (
	// DeadLetter moves it to the DLQ (reason schedule-too-far): nothing
	// reaches the app before the time it asked for.
	DeadLetter PastMax = iota
	// AtLongest pulls its due time in to the longest delay accepted.
	AtLongest
)

// Policy is how a queue parks messages that are not due.
type Policy struct {
	// Step is the shortest parking delay, and twice the precision: a
	// message with less than Step/2 left is delivered, one with more
	// waits at least Step. Required, at least 1ms.
	Step time.Duration
	// Max is the longest delay accepted from when Hopper first sees a
	// message. Required, at least Step.
	Max time.Duration
	// PastMax decides about a due time further away than Max. Default
	// DeadLetter.
	PastMax PastMax
}

// Validate reports a policy the ladder cannot be built from.
func (p Policy) Validate() error {
	var errs []error
	if p.Step < time.Millisecond {
		errs = append(errs, fmt.Errorf("step %s is under 1ms", p.Step))
	}
	if p.Max < p.Step {
		errs = append(errs, fmt.Errorf("longest delay %s is shorter than the step %s", p.Max, p.Step))
	}
	return errors.Join(errs...)
}

// Steps are the parking delays, shortest first: Step, 2×Step, 4×Step and
// so on, the longest not beyond Max. Any wait up to Max is a sum of
// distinct steps, so a message hops at most len(Steps) times, plus once
// more for the rounding of the last.
func (p Policy) Steps() []time.Duration {
	if p.Step <= 0 {
		return nil
	}
	var out []time.Duration
	for s := p.Step; s <= p.Max && s > 0; s *= 2 {
		out = append(out, s)
	}
	return out
}

// Action is what to do with a message now.
type Action int

const (
	// Deliver: it is due (or was never scheduled).
	Deliver Action = iota
	// Park: move it to the parking queue of Decision.Step.
	Park
	// TooFar: its due time is beyond Max; the DLQ takes it.
	TooFar
)

func (a Action) String() string {
	switch a {
	case Deliver:
		return "deliver"
	case Park:
		return "park"
	case TooFar:
		return "too-far"
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// When is what a message says about its due time, as read from its
// headers.
type When struct {
	// Due is when it may be delivered; zero when it says nothing.
	Due time.Time
	// Pinned says Hopper wrote Due on an earlier hop: it was accepted
	// then, and Max is not applied again (a due time pulled in to Max
	// stays as it was pulled in).
	Pinned bool
}

// Decision is the schedule's verdict on one receipt of a message.
type Decision struct {
	Action Action
	// Due is the due time to carry on (Park), pulled in to now+Max under
	// AtLongest.
	Due time.Time
	// Step is the parking delay (Park).
	Step time.Duration
	// Left is how long until Due at the time of the decision; negative
	// when Due has passed (how late the message is).
	Left time.Duration
}

// Decide says what to do with a message received at now.
func (p Policy) Decide(w When, now time.Time) Decision {
	if w.Due.IsZero() {
		return Decision{Action: Deliver}
	}
	due := w.Due
	left := due.Sub(now)
	if !w.Pinned && left > p.Max {
		if p.PastMax == DeadLetter {
			return Decision{Action: TooFar, Due: due, Left: left}
		}
		due, left = now.Add(p.Max), p.Max
	}
	if left < p.Step/2 {
		return Decision{Action: Deliver, Due: due, Left: left}
	}
	return Decision{Action: Park, Due: due, Step: p.stepFor(left), Left: left}
}

// stepFor is the longest step not beyond left; with less than the
// shortest step left (but at least half of it), the shortest: the message
// is then at most Step/2 late rather than that early.
func (p Policy) stepFor(left time.Duration) time.Duration {
	best := p.Step
	for s := p.Step; s <= p.Max && s > 0; s *= 2 {
		if s > left {
			break
		}
		best = s
	}
	return best
}

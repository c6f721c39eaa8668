package app

import "github.com/hopper-sidecar/hopper/retry"

// Assessment is what one outcome says about the app's work: whether it
// answered at all, whether the message failed, and whether the app said
// it has too much to do. The breaker, the limiter and the pacer each act
// on it in their own way, but they read an outcome the same way.
type Assessment int

// Assessments, from the least to the most the outcome says against the
// app.
const (
	// NoAnswer: no answer to judge. Hopper let the message go (refused
	// by the breaker or the app's refusal, cut off by shutdown), or the
	// app was unavailable (refused, reset before an answer): whether it
	// is down is the breaker's to judge, not a verdict on the message.
	NoAnswer Assessment = iota
	// Success: a 2xx.
	Success
	// Answer: any other answer that is no failure (1xx, 3xx, 4xx but
	// 429): the app working, whatever it made of the message.
	Answer
	// Failure: a failed message from an app that is not saying it is
	// overloaded: 5xx but 503, an answer without a readable status, a
	// request the app cut while its health check passed.
	Failure
	// Overload: a failed message that also says the app has too much to
	// do: 429, 503, or no answer within the timeout.
	Overload
)

// assess reads an outcome for the breaker, the limiter and the pacer. It
// is the one place that says which statuses are failed messages and which
// are overload.
func assess(o retry.Outcome) Assessment {
	switch {
	case o.Given(), o.Kind == retry.Unavailable:
		return NoAnswer
	case o.Kind == retry.Timeout, o.Status == 429, o.Status == 503:
		return Overload
	case o.Kind == retry.Cut, o.Status >= 500, o.Status == 0:
		return Failure
	case o.Kind == retry.Response && o.Status >= 200 && o.Status <= 299:
		return Success
	}
	return Answer
}

// FailedMessage says whether the outcome is a failed message (a failure
// or overload): what the breaker counts before asking the app's health,
// and the pacer before slowing a queue down.
func (a Assessment) FailedMessage() bool { return a == Failure || a == Overload }

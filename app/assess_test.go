package app

import (
	"testing"

	"github.com/hopper-sidecar/hopper/retry"
)

// Every outcome is read once, the same way, by the breaker, the limiter
// and the pacer. Each row says what the three make of it: a failed
// message (the breaker counts it before asking the app's health, the
// pacer before slowing the queue), and the limiter's signal. The limiter
// takes concurrency away on overload only: a 500 is a failed message but
// an answer in time.
func TestAssess(t *testing.T) {
	resp := func(status int) retry.Outcome { return retry.Outcome{Kind: retry.Response, Status: status} }
	for _, c := range []struct {
		name   string
		o      retry.Outcome
		want   Assessment
		failed bool
		signal Signal
	}{
		{"200", resp(200), Success, false, Answered},
		{"204", resp(204), Success, false, Answered},
		{"301", resp(301), Answer, false, Answered},
		{"400", resp(400), Answer, false, Answered},
		{"404", resp(404), Answer, false, Answered},
		{"409", resp(409), Answer, false, Answered},
		{"429", resp(429), Overload, true, Overloaded},
		{"500", resp(500), Failure, true, Answered},
		{"502", resp(502), Failure, true, Answered},
		{"503", resp(503), Overload, true, Overloaded},
		{"504", resp(504), Failure, true, Answered},
		{"no readable status", resp(0), Failure, true, Answered},
		{"timeout", retry.Outcome{Kind: retry.Timeout}, Overload, true, Overloaded},
		{"cut while healthy", retry.Outcome{Kind: retry.Cut}, Failure, true, Answered},
		{"unavailable", retry.Outcome{Kind: retry.Unavailable}, NoAnswer, false, Ignore},
		{"cut by a crash", retry.Outcome{Kind: retry.Unavailable, Cut: true, Crashed: true}, NoAnswer, false, Ignore},
		{"refused by the breaker", retry.Outcome{Kind: retry.Unavailable, Refused: true}, NoAnswer, false, Ignore},
		{"cut off by shutdown", retry.Outcome{Kind: retry.Unavailable, CutOff: true}, NoAnswer, false, Ignore},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := assess(c.o)
			if a != c.want {
				t.Fatalf("assess = %d, want %d", a, c.want)
			}
			if a.FailedMessage() != c.failed {
				t.Fatalf("failed message %v, want %v", a.FailedMessage(), c.failed)
			}
			if s := SignalOf(c.o); s != c.signal {
				t.Fatalf("limiter signal %d, want %d", s, c.signal)
			}
		})
	}
}

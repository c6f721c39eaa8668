package proxy

import (
	"slices"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// An ordered delivery answered 425 is held where it is and delivered
// again, its requeue counted: republishing it to the work queue would put
// it behind every message after it.
func TestOrderedTooEarlyHoldsInPlace(t *testing.T) {
	var requeues []int
	rec := appFunc(func(m *msg.Message) retry.Outcome {
		requeues = append(requeues, msg.Read(m, "orders", "", time.Now()).Requeues)
		if len(requeues) < 3 {
			return retry.Outcome{Kind: retry.Response, Status: 425}
		}
		return retry.Outcome{Kind: retry.Response, Status: 200}
	})
	p, pub, j := newInPlaceProxy(t, rec, []time.Duration{time.Millisecond}, time.Minute)
	run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
	if len(pub.to) != 0 {
		t.Errorf("published to %v: an ordered 425 must not leave its place", pub.to)
	}
	if got := j.all(); !slices.Equal(got, []string{"ack"}) {
		t.Errorf("settles %v, want one ack", got)
	}
	if !slices.Equal(requeues, []int{0, 1, 2}) {
		t.Errorf("requeue counts seen %v, want [0 1 2]", requeues)
	}
}

// An ordered delivery the app could not take (unavailable, or refused by
// an open breaker) waits where it is and goes again, instead of being
// given back (which on a quorum queue is a republish to the tail).
func TestOrderedUnavailableHoldsInPlace(t *testing.T) {
	for _, quorum := range []bool{false, true} {
		app := &scriptedApp{outs: []retry.Outcome{
			{Kind: retry.Unavailable, Error: "connection refused"},
			{Kind: retry.Unavailable, Refused: true, Error: "circuit breaker open"},
			{Kind: retry.Response, Status: 200}}}
		p, pub, j := newInPlaceProxy(t, app, []time.Duration{time.Millisecond}, time.Minute)
		p.o.Quorum, p.o.UnavailableBackoff = quorum, time.Millisecond
		run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
		if len(pub.to) != 0 {
			t.Errorf("quorum %v: published to %v; an ordered message the app could not take stays in place", quorum, pub.to)
		}
		if got := j.all(); !slices.Equal(got, []string{"ack"}) {
			t.Errorf("quorum %v: settles %v, want one ack", quorum, got)
		}
		if !slices.Equal(app.attempts, []int{1, 1, 1}) {
			t.Errorf("quorum %v: attempts %v, want [1 1 1]: no attempt spent", quorum, app.attempts)
		}
	}
}

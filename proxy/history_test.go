package proxy

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// An ordered retry held in place records the same history a retry through
// a tier does: the app's second attempt sees the first failure's time, and
// the DLQ copy carries first and last failure and the last status.
func TestInPlaceRetryRecordsHistory(t *testing.T) {
	var firstSeen []string
	app := appFunc(func(m *msg.Message) retry.Outcome {
		firstSeen = append(firstSeen, m.String(msg.HeaderFirstFailureTime))
		return retry.Outcome{Kind: retry.Response, Status: 503}
	})
	p, pub, j := newInPlaceProxy(t, app, []time.Duration{time.Millisecond}, time.Minute)
	run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
	if len(firstSeen) != 4 || firstSeen[0] != "" || firstSeen[1] == "" || firstSeen[3] != firstSeen[1] {
		t.Fatalf("first-failure time seen by attempts 1..4: %q; want none, then the same one", firstSeen)
	}
	if !slices.Equal(pub.to, []string{"orders.dlq"}) {
		t.Fatalf("published to %v, want the DLQ once", pub.to)
	}
	cp := pub.got[0]
	if cp.String(msg.HeaderFirstFailureTime) != firstSeen[1] {
		t.Errorf("DLQ copy's first failure %q, want %q", cp.String(msg.HeaderFirstFailureTime), firstSeen[1])
	}
	if n, _ := cp.Int(msg.HeaderLastStatusCode); n != 503 {
		t.Errorf("x-last-status-code %d, want 503", n)
	}
}

// A message whose deadline comes from its AMQP expiration, given back on a
// classic queue, must not have its deadline counted again from the next
// receipt: the give-back republishes it with the deadline pinned instead
// of a nack, which would bring it back with nothing but the expiration.
func TestClassicGiveBackPinsDeadline(t *testing.T) {
	p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Unavailable, Error: "refused"}, nil)
	m := msgWith(nil)
	m.Expiration = "60000"
	received := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	p.o.Now = func() time.Time { return received }
	p.handle(context.Background(), &fakeDelivery{m: m, j: j, alive: true}, false)
	if got := j.all(); !slices.Equal(got, []string{"publish orders", "ack"}) {
		t.Fatalf("settles %v, want the copy with the pinned deadline published, then the ack", got)
	}
	if ms, _ := pub.got[0].Int(msg.HeaderDeadline); ms != received.Add(time.Minute).UnixMilli() {
		t.Errorf("pinned deadline %d, want %d", ms, received.Add(time.Minute).UnixMilli())
	}

	// Without an expiration (or with the deadline already pinned) a nack
	// keeps everything: no republish.
	p, pub, j = newTestProxy(t, retry.Outcome{Kind: retry.Unavailable, Error: "refused"}, nil)
	p.handle(context.Background(), &fakeDelivery{m: msgWith(nil), j: j, alive: true}, false)
	if got := j.all(); !slices.Equal(got, []string{"nack-requeue"}) || len(pub.got) != 0 {
		t.Fatalf("settles %v, want a nack", got)
	}
}

package proxy

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/retry"
)

// A move whose publish failed waits its backoff before the next publish;
// when the delivery's channel closes during that wait, the broker has the
// message back and redelivers it: another copy would be a duplicate. The
// move looks at the channel before each publish, not only after a failed
// one.
func TestMoveChecksTheChannelBeforeEachPublish(t *testing.T) {
	p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 500}, errors.New("nacked"))
	pub.fails = 1
	p.o.MoveRetryMin, p.o.MoveRetryMax = 200*time.Millisecond, 200*time.Millisecond
	ch := &fakeChannel{}
	d := &chanDelivery{m: msgWith(nil), j: j, ch: ch}
	d.m.MessageID = "m0"
	done := make(chan struct{})
	go func() { defer close(done); run(p, d) }()

	waitfor.Until(t, 10*time.Second, "the move waiting out its backoff", func() bool { return p.waiting.Load() == 1 })
	ch.closed.Store(true)
	waitReturned(t, done, "the delivery handled")

	if n := countOf(j.all(), "publish orders.retry.1s"); n != 1 {
		t.Errorf("%d copies published, want the first only: the channel closed before the second (journal %v)", n, j.all())
	}
	for _, e := range j.all() {
		if strings.Contains(e, "on a closed channel") {
			t.Errorf("%s: the broker has the message back", e)
		}
	}
}

// A delivery is unacked from its receipt, and MoveHoldMax bounds that
// time, under the broker's consumer timeout: a move that keeps failing
// gives the delivery back once MoveHoldMax has passed since receipt, not
// since the move started. One received a MoveHoldMax ago whose move fails
// is given back after that failure.
func TestMoveHoldIsBoundedFromReceipt(t *testing.T) {
	p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 500}, errors.New("nacked"))
	p.o.MoveHoldMax = time.Hour
	p.o.MoveRetryMin, p.o.MoveRetryMax = time.Millisecond, time.Millisecond
	d := &fakeDelivery{m: msgWith(nil), j: j, alive: true}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.handleSince(context.Background(), d, false, p.o.Now().Add(-time.Hour))
	}()
	waitReturned(t, done, "the delivery given back")

	pub.mu.Lock()
	tries := pub.failed
	pub.mu.Unlock()
	if tries != 1 {
		t.Errorf("%d publishes tried, want 1: the delivery was received a MoveHoldMax ago", tries)
	}
	if got := j.all(); countOf(got, "nack-requeue") != 1 {
		t.Errorf("journal %v, want the delivery given back (nack-requeue)", got)
	}
}

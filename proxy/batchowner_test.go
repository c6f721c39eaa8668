package proxy

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// countedGate holds every publish to a delay tier until open is closed, and
// counts the publishes it holds, each also told on held, so a test can
// wait until moves are under way; other publishes go through at once.
type countedGate struct {
	j       *journal
	open    chan struct{}
	held    chan string
	holding atomic.Int64
}

func (p *countedGate) Publish(_ context.Context, queue string, m *msg.Message) error {
	if strings.Contains(queue, ".retry.") {
		p.holding.Add(1)
		p.held <- m.MessageID
		<-p.open
	}
	p.j.add("publish " + queue + " " + m.MessageID)
	return nil
}

// A panic in the request of a message sent alone, after its batch timed
// out as a whole, is recovered where it happened: that message alone is
// the cause, so it is dead-lettered as a single delivery's would be, and
// the goroutine that sent it ends. Nothing waits for itself.
func TestBatchPanicInAloneRequestSettlesItsMessage(t *testing.T) {
	app := &channelApp{answer: func(n int, ids []string) batch.Answer {
		if len(ids) > 1 {
			return each(ids, retry.Outcome{Kind: retry.Timeout, Error: "timeout"})
		}
		panic("broke on the message sent alone")
	}}
	p, _ := newChannelLoop(t, app, 2, false, false, time.Second)
	j := &journal{}
	open := make(chan struct{})
	close(open)
	p.o.Pub = &gatedPub{j: j, open: open}
	done := handleBatchAsync(p, onChannel(&fakeChannel{}, j, 2))
	waitReturned(t, done, "the batch and its alone requests ended")

	got := j.all()
	for _, id := range []string{"m0", "m1"} {
		if n := countOf(got, "ack "+id); n != 1 {
			t.Errorf("%s acked %d times, want once (journal %v)", id, n, got)
		}
		if n := countOf(got, "publish orders.dlq "+id); n != 1 {
			t.Errorf("%s dead-lettered %d times, want once (journal %v)", id, n, got)
		}
	}
	if n := p.Stats.InternalErrors.Load(); n != 2 {
		t.Errorf("internal errors %d, want 2 (one per alone request)", n)
	}
}

// A message sent alone whose move is under way belongs to that move: a
// panic in its batch's own goroutine afterwards must not give it back as
// well, or it would be in its tier and in the work queue, its delivery
// acked twice. The batch's recovery returns only what it still owns.
func TestBatchPanicLeavesAloneMovesToTheirOwner(t *testing.T) {
	var gate *countedGate
	app := &channelApp{answer: func(n int, ids []string) batch.Answer {
		switch {
		case len(ids) > 1:
			return each(ids, retry.Outcome{Kind: retry.Timeout, Error: "timeout"})
		case ids[0] != "m2":
			return each(ids, retry.Outcome{Kind: retry.Response, Status: 503})
		}
		// m2 goes alone (a crash suspect), after m0 and m1 were sent alone:
		// it breaks once both their moves are under way.
		for range 2 {
			select {
			case <-gate.held:
			case <-time.After(10 * time.Second):
				panic("the moves of the messages sent alone never started")
			}
		}
		panic("broke on the suspect")
	}}
	p, _ := newChannelLoop(t, app, 3, false, false, time.Second)
	j := &journal{}
	gate = &countedGate{j: j, open: make(chan struct{}), held: make(chan string, 8)}
	p.o.Pub = gate
	ds := onChannel(&fakeChannel{}, j, 3)
	ds[2].Message().Headers[msg.HeaderCrashSuspect] = true
	done := handleBatchAsync(p, ds)

	// The moves are held until the recovery has done what it does.
	waitfor.Until(t, 10*time.Second, "the suspect's panic recovered", func() bool {
		return p.Stats.InternalErrors.Load() > 0 && gate.holding.Load() == 2
	})
	waitfor.Until(t, 10*time.Second, "the suspect settled", func() bool {
		return slices.Contains(j.all(), "ack m2")
	})
	close(gate.open)
	waitReturned(t, done, "the batch concluded")

	got := j.all()
	movedOnce(t, got, []string{"m0", "m1", "m2"}, "m0", "m1")
	if n := countOf(got, "publish orders.dlq m2"); n != 1 {
		t.Errorf("the suspect dead-lettered %d times, want once (journal %v)", n, got)
	}
}

package proxy

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// lockedBuffer is a log destination safe for the goroutines of a batch.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// gatedPub holds every publish to a delay tier until open is closed, as a
// slow broker would; other publishes go through at once.
type gatedPub struct {
	mu   sync.Mutex
	j    *journal
	open chan struct{}
}

func (p *gatedPub) Publish(_ context.Context, queue string, m *msg.Message) error {
	if strings.Contains(queue, ".retry.") {
		<-p.open
	}
	p.j.add("publish " + queue + " " + m.MessageID)
	return nil
}

// ackPanicObserver panics when it is told of an ack: a fault of Hopper's
// own while a batch is concluded.
type ackPanicObserver struct{ countingObserver }

func (o *ackPanicObserver) Decided(_ retry.Outcome, _ bool, dec retry.Decision, _ time.Duration) {
	if dec.Action == retry.Ack {
		panic("observer broke after the ack")
	}
}

// A panic while a batch is concluded, with moves of its other messages
// under way (their copies awaiting a slow confirm), must not give those
// messages back as well: each would end up in the work queue and in its
// tier, its delivery settled twice. The worker handed each move, and its
// message, to a goroutine of its own: its recovery returns only what it
// still holds.
func TestBatchPanicLeavesMovesUnderWayToTheirOwner(t *testing.T) {
	app := &channelApp{answer: func(_ int, ids []string) batch.Answer {
		a := each(ids, retry.Outcome{Kind: retry.Response, Status: 503})
		a.Entries[2] = retry.Outcome{Kind: retry.Response, Status: 200}
		return a
	}}
	p, _ := newChannelLoop(t, app, 3, false, false, time.Second)
	logs := &lockedBuffer{}
	p.log = slog.New(slog.NewTextHandler(logs, nil))
	p.obs = &ackPanicObserver{}
	j := &journal{}
	pub := &gatedPub{j: j, open: make(chan struct{})}
	p.o.Pub = pub
	done := handleBatchAsync(p, onChannel(&fakeChannel{}, j, 3))

	// The tier copies are held until the recovery has done what it does.
	waitfor.Until(t, 10*time.Second, "the panic recovered", func() bool {
		return strings.Contains(logs.String(), "event=HOPPER_INTERNAL_ERROR")
	})
	close(pub.open)
	waitReturned(t, done, "the batch concluded")

	movedOnce(t, j.all(), []string{"m0", "m1", "m2"}, "m0", "m1")
	if n := p.Stats.InternalErrors.Load(); n != 1 {
		t.Errorf("internal errors %d, want 1", n)
	}
}

// movedOnce checks, in the journal got, that each of acked was acked once
// and that each of moved was copied to its tier once and never given back
// to the work queue beside that copy.
func movedOnce(t *testing.T, got, acked []string, moved ...string) {
	t.Helper()
	for _, id := range acked {
		if n := countOf(got, "ack "+id); n != 1 {
			t.Errorf("%s acked %d times, want once (journal %v)", id, n, got)
		}
	}
	for _, id := range moved {
		if n := countOf(got, "publish orders.retry.1s "+id); n != 1 {
			t.Errorf("%s copied to its tier %d times, want once (journal %v)", id, n, got)
		}
		if n := countOf(got, "publish orders "+id); n != 0 {
			t.Errorf("%s given back to the work queue beside its tier copy (journal %v)", id, got)
		}
	}
}

func countOf(log []string, e string) int {
	n := 0
	for _, got := range log {
		if got == e {
			n++
		}
	}
	return n
}

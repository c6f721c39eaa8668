package app

import (
	"context"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

func pacerRig(after int) (*Pacer, *scripted, *Activity, *fakeClock) {
	app := &scripted{}
	act := NewActivity()
	clock := &fakeClock{now: time.Unix(0, 0)}
	p := NewPacer(app, PacerOptions{Queue: "poison", Activity: act, After: after,
		Min: 10 * time.Millisecond, Max: 80 * time.Millisecond, Window: time.Second, Clock: clock})
	return p, app, act, clock
}

// A queue whose messages keep failing is paced only while another queue's
// messages succeed; the pause doubles with every further run of failures
// up to the maximum, and the first success ends it.
func TestPacerPacesFailingQueueBesideSucceedingOne(t *testing.T) {
	p, app, act, clock := pacerRig(3)
	ctx := context.Background()
	app.set(retry.Outcome{Kind: retry.Response, Status: 500})
	for range 3 {
		p.Deliver(ctx, &msg.Message{}, msg.Info{})
	}
	if d := p.Pause(); d != 0 {
		t.Fatalf("paused %s with no other queue succeeding", d)
	}

	act.Succeeded("healthy", clock.Now())
	for _, c := range []struct {
		failing int
		want    time.Duration
	}{{3, 10 * time.Millisecond}, {5, 10 * time.Millisecond}, {6, 20 * time.Millisecond},
		{9, 40 * time.Millisecond}, {12, 80 * time.Millisecond}, {300, 80 * time.Millisecond}} {
		p.failing.Store(int64(c.failing))
		if d := p.Pause(); d != c.want {
			t.Errorf("%d failed in a row: pause %s, want %s", c.failing, d, c.want)
		}
	}

	// The other queue went quiet: no pacing.
	clock.advance(2 * time.Second)
	if d := p.Pause(); d != 0 {
		t.Errorf("paused %s although the other queue has had no success for 2s", d)
	}
	act.Succeeded("healthy", clock.Now())
	if p.Pause() == 0 {
		t.Fatal("not paced again once the other queue succeeds")
	}

	// A success of its own ends the pacing.
	app.set(retry.Outcome{Kind: retry.Response, Status: 200})
	done := make(chan struct{})
	go func() { p.Deliver(ctx, &msg.Message{}, msg.Info{}); close(done) }()
	clock.tick(0) // the paced delivery's wait
	<-done
	if d := p.Pause(); d != 0 || p.failing.Load() != 0 {
		t.Errorf("after a 2xx: pause %s, failing %d", d, p.failing.Load())
	}
}

// Only failed messages count: refusals, 4xx and 425 neither pace a queue
// nor end its pacing; a queue's own successes never pace it.
func TestPacerCountsFailedMessagesOnly(t *testing.T) {
	p, app, act, _ := pacerRig(2)
	ctx := context.Background()
	act.Succeeded("healthy", time.Unix(0, 0))
	for _, o := range []retry.Outcome{
		{Kind: retry.Unavailable, Refused: true}, {Kind: retry.Response, Status: 404},
		{Kind: retry.Response, Status: 425}, {Kind: retry.Unavailable, Cut: true},
	} {
		app.set(o)
		p.Deliver(ctx, &msg.Message{}, msg.Info{})
	}
	if n := p.failing.Load(); n != 0 {
		t.Fatalf("counted %d failed messages among refusals, 4xx and 425", n)
	}
	app.set(retry.Outcome{Kind: retry.Timeout})
	p.Deliver(ctx, &msg.Message{}, msg.Info{})
	app.set(retry.Outcome{Kind: retry.Response, Status: 503})
	p.Deliver(ctx, &msg.Message{}, msg.Info{})
	if p.Pause() == 0 {
		t.Fatal("a timeout and a 503 in a row did not pace the queue (After 2)")
	}
	// Its own success is not another queue's.
	alone, app2, act2, clock := pacerRig(1)
	app2.set(retry.Outcome{Kind: retry.Response, Status: 200})
	alone.Deliver(ctx, &msg.Message{}, msg.Info{})
	alone.failing.Store(5)
	if d := alone.Pause(); d != 0 || !act2.OthersSucceeding("other", clock.Now(), time.Second) {
		t.Errorf("paced %s by its own success", d)
	}
}

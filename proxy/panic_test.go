package proxy

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

type panicApp struct{ why any }

func (a panicApp) Deliver(context.Context, *msg.Message, msg.Info) retry.Outcome { panic(a.why) }

type panicObserver struct {
	countingObserver
	internal int
}

func (o *panicObserver) Decided(out retry.Outcome, called bool, dec retry.Decision, l time.Duration) {
	o.countingObserver.Decided(out, called, dec, l)
	if dec.Action == retry.Ack {
		panic("observer broke after the ack")
	}
}
func (o *panicObserver) InternalError() { o.internal++ }

// A panic while handling one message is Hopper's fault, not the message's
// and not the app's: the worker survives, the message goes to the DLQ with
// reason hopper-error and the panic in x-final-error, and it is counted.
func TestPanicDeadLettersTheMessage(t *testing.T) {
	p, pub, j := newTestProxy(t, retry.Outcome{}, nil)
	obs := &panicObserver{}
	p.obs = obs
	p.o.App = panicApp{why: "index out of range [7] with length 6"}
	m := msgWith(map[string]any{msg.HeaderRetryCount: int64(2)})
	run(p, &fakeDelivery{m: m, j: j, alive: true})

	if got := j.all(); !equal(got, []string{"publish orders.dlq", "ack"}) {
		t.Fatalf("settles %v, want the DLQ copy confirmed, then the ack", got)
	}
	cp := pub.got[0]
	if r := cp.String(msg.HeaderDeadLetterReason); r != retry.ReasonHopperError {
		t.Errorf("reason %q, want %q", r, retry.ReasonHopperError)
	}
	if e := cp.String(msg.HeaderFinalError); !strings.Contains(e, "index out of range [7] with length 6") {
		t.Errorf("x-final-error %q does not carry the panic", e)
	}
	if string(cp.Body) != string(m.Body) || cp.MessageID != m.MessageID {
		t.Errorf("the DLQ copy lost the message: %+v", cp)
	}
	if obs.internal != 1 || p.Stats.InternalErrors.Load() != 1 {
		t.Errorf("internal errors counted %d (stats %d), want 1", obs.internal, p.Stats.InternalErrors.Load())
	}
	if len(obs.decided) != 1 || obs.decided[0] != retry.DLQ {
		t.Errorf("decisions %v, want one dlq", obs.decided)
	}
	if n := p.Stats.InFlight.Load(); n != 0 {
		t.Errorf("in flight %d after the panic, want 0", n)
	}
}

// A panic after the message was settled must not settle it again: the ack
// stands and nothing is published.
func TestPanicAfterSettleKeepsTheSettle(t *testing.T) {
	p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 200}, nil)
	obs := &panicObserver{}
	p.obs = obs
	run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
	if got := j.all(); !equal(got, []string{"ack"}) || len(pub.got) != 0 {
		t.Fatalf("settles %v, publishes %d; want the one ack", got, len(pub.got))
	}
	if obs.internal != 1 {
		t.Errorf("internal errors %d, want 1", obs.internal)
	}
}

// The workers survive a panic: deliveries handed to the loop after one are
// still delivered.
func TestWorkerSurvivesPanic(t *testing.T) {
	p, _, j := newTestProxy(t, retry.Outcome{}, nil)
	var calls atomic.Int64
	p.o.App = appFunc(func(m *msg.Message) retry.Outcome {
		calls.Add(1)
		if m.MessageID == "pill" {
			panic("boom")
		}
		return retry.Outcome{Kind: retry.Response, Status: 200}
	})
	p.Start(context.Background())
	pill := msgWith(nil)
	pill.MessageID = "pill"
	p.Handle(&fakeDelivery{m: pill, j: j, alive: true})
	for range 3 {
		p.Handle(&fakeDelivery{m: msgWith(nil), j: j, alive: true})
	}
	waitfor.Until(t, time.Minute, "the three messages after the panic acked", func() bool { return p.Stats.Acked.Load() == 3 })
	if !p.Shutdown(context.Background()) {
		t.Fatal("shutdown did not finish")
	}
	if calls.Load() != 4 || p.Stats.Acked.Load() != 3 || p.Stats.DeadLettered.Load() != 1 {
		t.Fatalf("calls %d, acked %d, dead-lettered %d; want 4, 3, 1 (log %v)", calls.Load(),
			p.Stats.Acked.Load(), p.Stats.DeadLettered.Load(), j.all())
	}
}

type appFunc func(m *msg.Message) retry.Outcome

func (f appFunc) Deliver(_ context.Context, m *msg.Message, _ msg.Info) retry.Outcome { return f(m) }

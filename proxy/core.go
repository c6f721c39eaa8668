package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/route"
)

// handleSince runs one delivery through deliver → decide → settle; an
// ordered one (InPlace, or keyed: its dispatcher keeps it in its key's
// line) repeats the delivery in place while it is held. A panic on the way
// is recovered here, so one message can never take the process (and with
// it every other message) down. The delivery was received at
// since: it is unacked from then on (also while it waited in its line),
// and its holds are bounded from there.
func (p *Loop) handleSince(ctx context.Context, d Delivery, keyed bool, since time.Time) {
	ordered := p.o.InPlace || keyed
	sd := &settleOnce{Delivery: d, ordered: ordered, since: since}
	defer p.recoverDelivery(ctx, sd)
	var rt routing
	for p.attempt(ctx, sd, since, ordered, &rt) {
	}
}

// recoverDelivery turns a panic while handling d into a dead-lettering
// with reason hopper-error: retrying would run into the same failure, and
// giving the message back would crash-loop on it. A delivery already
// settled stays as it is. The panic is logged with its stack and counted.
func (p *Loop) recoverDelivery(ctx context.Context, d *settleOnce) {
	if r := recover(); r != nil {
		p.internalError(ctx, d, r)
	}
}

// internalError dead-letters d after the panic r while it was handled,
// unless it was settled already.
func (p *Loop) internalError(ctx context.Context, d *settleOnce, r any) {
	p.Stats.InternalErrors.Add(1)
	p.obs.InternalError()
	m := d.Message()
	why := fmt.Sprintf("internal error: %v", r)
	p.log.Error("internal error while handling a message", "event", "HOPPER_INTERNAL_ERROR",
		"message_id", m.MessageID, "settled", d.settled.Load(), "error", msg.Truncate(why, msg.MaxErrorLen),
		"stack", string(debug.Stack()))
	if d.settled.Load() {
		return
	}
	defer func() {
		// Even the dead-lettering failed: the last safe thing is to let
		// the broker keep the message.
		if r := recover(); r != nil {
			p.log.Error("internal error while dead-lettering after an internal error; message left to the broker",
				"event", "HOPPER_INTERNAL_ERROR", "message_id", m.MessageID, "error", fmt.Sprint(r))
			if !d.settled.Load() {
				p.nack(d)
			}
		}
	}()
	in := p.safeHistory(m)
	dec := retry.Decision{Action: retry.DLQ, Reason: retry.ReasonHopperError, Retries: in.Retries, Requeues: in.Requeues, Crashes: in.Crashes}
	out := retry.Outcome{Error: why}
	if !p.settle(ctx, d, m, in, dec, out, d.since) {
		dec = retry.Decision{Action: retry.Return, Retries: in.Retries, Requeues: in.Requeues}
	}
	p.record(out, true, dec, 0)
}

// safeHistory reads m's history, or only its queue when reading it is
// what failed.
func (p *Loop) safeHistory(m *msg.Message) (in msg.Info) {
	defer func() {
		if recover() != nil {
			in = msg.Info{Queue: p.o.Plan.Work.Name, Exchange: m.Exchange, RoutingKey: m.RoutingKey, Attempt: 1}
		}
	}()
	in, _ = p.history(m, p.o.Now())
	return in
}

// attempt is one delivery attempt. It reports true when an in-place retry
// has waited out its delay and the app is to be called again; since is
// when the delivery was received, ordered whether it is held in place, rt
// the delivery's route decision (taken on its first attempt).
func (p *Loop) attempt(ctx context.Context, d Delivery, since time.Time, ordered bool, rt *routing) bool {
	p.inFlight(1)
	defer p.inFlight(-1)
	e := p.openAttempt(ctx, d, since, ordered, rt, nil)
	if e == nil {
		return false
	}
	defer e.span.End()
	start := time.Now()
	out := p.o.App.Deliver(e.ctx, e.m, e.in)
	return p.finish(e, p.judge(e, out, time.Since(start)), since, true)
}

// openAttempt starts an attempt of d, up to the request to the app: the steps a
// delivery takes whether it is sent alone or in a batch, whose request
// the batch makes. It returns nil when d is not to be sent: its channel
// died or Hopper is shutting down (given back), or it is settled at once,
// in its turn: left out by its route's filter (rt; nil in a batch, which
// routes do not combine with), or past its deadline. The attempt is
// written into at when it is set (a batch keeps its attempts in one
// array), else into an entry of its own.
func (p *Loop) openAttempt(ctx context.Context, d Delivery, since time.Time, ordered bool, rt *routing, at *entry) *entry {
	if !p.ready(ctx, d) {
		return nil
	}
	e := p.begin(ctx, d, rt, at)
	e.ordered = ordered
	var v verdict
	switch {
	case rt != nil && rt.decided && rt.d.Outcome != route.Deliver:
		// Settled in its turn, like any other message of its key.
		v = p.leftOut(e, rt.d)
	case e.expired():
		v = p.expire(e)
	default:
		return e
	}
	defer e.span.End()
	p.finish(e, v, since, false)
	return nil
}

// ready says whether a delivery is to be sent: not when its channel died
// while it waited (the broker has requeued it), nor during shutdown, when
// it is given back.
func (p *Loop) ready(ctx context.Context, d Delivery) bool {
	if !alive(d) {
		p.Stats.SettleFailed.Add(1)
		return false
	}
	if p.stopped() {
		p.Stats.ReturnedOnShutdown.Add(1)
		m := d.Message()
		in, _ := p.history(m, p.o.Now())
		p.giveBack(ctx, d, m, in)
		return false
	}
	return true
}

// entry is one attempt of one delivery: what its headers say, the policy
// it falls under, and the attempt's span.
type entry struct {
	d    Delivery
	m    *msg.Message
	in   msg.Info
	st   retry.State
	now  time.Time
	pol  *retry.Policy
	ctx  context.Context
	span trace.Span
	// ordered deliveries are held in place rather than moved behind
	// later messages.
	ordered bool
}

// begin starts an attempt of d: it reads the history, starts the
// attempt's CONSUMER span, parented on the context the message carries
// (the publisher's, or the previous attempt's move), takes the route
// decision (rt; nil in a batch, which routes do not combine with) and
// selects the policy: the route's own when it has one. The attempt is
// written into e when it is set, else into a new entry.
func (p *Loop) begin(ctx context.Context, d Delivery, rt *routing, e *entry) *entry {
	m := d.Message()
	if e == nil {
		e = new(entry)
	}
	*e = entry{d: d, m: m, now: p.o.Now()}
	e.in, e.st = p.history(m, e.now)
	if p.tracing {
		e.ctx = propagator.Extract(ctx, headerCarrier(m.Headers))
		e.ctx, e.span = p.tr.Start(e.ctx, "process "+e.in.Queue, trace.WithSpanKind(trace.SpanKindConsumer))
		if e.span.IsRecording() {
			e.span.SetAttributes(deliveryAttrs(d, m, e.in)...)
		}
	} else {
		// What a tracer that records nothing would give, without its
		// allocations: the message's own trace context still reaches
		// the app and the copies from its headers.
		e.ctx, e.span = ctx, noopSpan
	}
	if rt != nil && p.o.Routes != nil {
		p.route(e, rt)
		if r := rt.d.Route; r != nil {
			e.in.Route = r.Name
			if e.span.IsRecording() {
				e.span.SetAttributes(keyRoute.String(r.Name))
			}
			if r.Policy != nil {
				e.pol = r.Policy
				return e
			}
		}
	}
	e.pol = p.o.Selector.Default
	if len(p.o.Selector.Rules) == 0 {
		return e
	}
	e.pol = p.o.Selector.Select(retry.Subject{
		RoutingKey: e.in.RoutingKey,
		Type:       m.Type,
		Header: func(name string) (string, bool) {
			v, ok := m.Headers[name]
			if !ok {
				return "", false
			}
			s, _ := msg.Scalar(v)
			return s, true
		},
	})
	return e
}

// expired says whether the message is past its deadline: it is never
// delivered stale. A deadline of "now" (AMQP expiration 0: deliver at once
// or never) is still delivered on first receipt.
func (e *entry) expired() bool {
	return !e.st.Deadline.IsZero() && e.now.After(e.st.Deadline)
}

// verdict is what became of one attempt: the app's outcome (none when it
// was not called) and the decision taken on it.
type verdict struct {
	out     retry.Outcome
	dec     retry.Decision
	called  bool
	latency time.Duration
}

// expire is the verdict on a message past its deadline, not delivered.
func (p *Loop) expire(e *entry) verdict {
	return verdict{dec: retry.Expired(e.pol, e.st), out: retry.Outcome{Error: "deadline passed before delivery"}}
}

// judge decides on the app's outcome of an attempt.
func (p *Loop) judge(e *entry, out retry.Outcome, latency time.Duration) verdict {
	v := verdict{out: out, latency: latency, called: !out.Refused}
	v.dec = retry.Decide(e.pol, e.st, out, p.o.Now(), p.o.Rand)
	if p.o.Refusals != nil && (v.dec.Pause || out.Probe) {
		p.o.Refusals.Judged(out, v.dec.Pause)
	}
	if p.log.Enabled(e.ctx, slog.LevelDebug) {
		p.log.Debug("delivered", "event", "MESSAGE_DELIVERED", "message_id", e.m.MessageID,
			"attempt", e.in.Attempt, "status", out.Status, "decision", v.dec.Action.String(),
			"latency_ms", latency.Milliseconds(), "trace_id", traceID(e.span))
	}
	return v
}

// noopSpan is the span of an attempt when tracing is off.
var noopSpan = trace.SpanFromContext(context.Background())

func (p *Loop) inFlight(delta int) {
	p.Stats.InFlight.Add(int64(delta))
	p.obs.InFlight(delta)
}

// history reads the delivery's history from its headers, and the part of
// it the outcome table decides on.
func (p *Loop) history(m *msg.Message, now time.Time) (msg.Info, retry.State) {
	// A message without an id gets its own before anything is sent or
	// copied, so the app and every copy see the same one.
	msg.EnsureID(m)
	in := msg.Read(m, p.o.Plan.Work.Name, p.o.DeadlineHeader, now)
	if p.o.Schedule != nil {
		// Every copy carries the due time on, so a retry or a give-back
		// comes back due, whatever x-delay says.
		in.Due, _, _ = msg.When(m, now)
	}
	return in, retry.State{Retries: in.Retries, Requeues: in.Requeues, Crashes: in.Crashes, Deadline: in.Deadline, Suspect: in.Suspect}
}

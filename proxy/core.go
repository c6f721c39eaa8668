package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/route"
)

// handleSince runs one delivery through deliver → decide → settle; an ordered
// one (InPlace, or inLine: its dispatcher keeps it in a line, as a key's
// messages are) repeats the delivery in place while it is held. A panic on
// the way is recovered here, so one message can never take the process
// (and with it every other message) down. The delivery was received at
// since: it is unacked from then on (also while it waited in its line),
// and its holds are bounded from there.
func (p *Loop) handleSince(ctx context.Context, d Delivery, inLine bool, since time.Time) {
	ordered := p.o.InPlace || inLine
	sd := &settleOnce{Delivery: d, ordered: ordered}
	defer p.recoverDelivery(ctx, sd)
	var rt routing
	for p.attempt(ctx, sd, since, ordered, &rt) {
	}
}

// settleOnce remembers whether a delivery was acked or nacked, so that a
// panic after its settle does not settle it a second time. A batch also
// counts as settled a delivery whose channel closed (lost): the broker has
// it back.
type settleOnce struct {
	Delivery
	settled atomic.Bool
	// ordered deliveries must keep their place in line; leaving it is
	// reported.
	ordered bool
}

func (d *settleOnce) Ack() error              { d.settled.Store(true); return d.Delivery.Ack() }
func (d *settleOnce) Nack(requeue bool) error { d.settled.Store(true); return d.Delivery.Nack(requeue) }
func (d *settleOnce) Alive() bool             { return alive(d.Delivery) }
func (d *settleOnce) Ordered() bool           { return d.ordered }

// Unwrap is the delivery as the consumer handed it, for what it tells
// beyond the Delivery interface (its tag, the broker it came from).
func (d *settleOnce) Unwrap() Delivery { return d.Delivery }

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
	if !p.settle(ctx, d, m, in, dec, out) {
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
	if !p.ready(ctx, d) {
		return false
	}
	p.inFlight(1)
	defer p.inFlight(-1)

	e := p.begin(ctx, d, rt)
	e.ordered = ordered
	defer e.span.End()
	if rt.decided && rt.d.Outcome != route.Deliver {
		// Settled in its turn, like any other message of its key.
		return p.finish(e, p.leftOut(e, rt.d), since, false)
	}
	if e.expired() {
		return p.finish(e, p.expire(e), since, true)
	}
	start := time.Now()
	out := p.o.App.Deliver(e.ctx, e.m, e.in)
	return p.finish(e, p.judge(e, out, time.Since(start)), since, true)
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
// selects the policy: the route's own when it has one.
func (p *Loop) begin(ctx context.Context, d Delivery, rt *routing) *entry {
	m := d.Message()
	e := &entry{d: d, m: m, now: p.o.Now(), ordered: p.o.InPlace}
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

// beginBatched starts the attempt of one message of a batch request. A
// message past its deadline is settled at once and not sent: nil.
func (p *Loop) beginBatched(ctx context.Context, d Delivery, since time.Time) *entry {
	e := p.begin(ctx, d, nil)
	if e.expired() {
		p.finish(e, p.expire(e), since, false)
		e.span.End()
		return nil
	}
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

// finish carries out a verdict: it records it on the span, holds an
// ordered delivery in place, or settles, and counts what happened. It
// reports true when an in-place hold has waited out its delay and the app
// is to be called again. backoff says whether a return of a message the
// app could not take waits the unavailable backoff first (a batch waits it
// once for all its messages).
func (p *Loop) finish(e *entry, v verdict, since time.Time, backoff bool) bool {
	out, dec := v.out, v.dec
	if e.span.IsRecording() {
		e.span.SetAttributes(keyDecision.String(dec.Action.String()), statusAttr(out))
		if dec.Reason != "" {
			e.span.SetAttributes(keyReason.String(dec.Reason))
		}
	}
	if out.Error != "" && dec.Action != retry.Ack {
		e.span.SetStatus(codes.Error, msg.Truncate(out.Error, msg.MaxErrorLen))
		e.span.SetAttributes(semconv.ErrorTypeKey.String(errorType(out)))
	}
	if e.ordered {
		switch p.holdInPlace(e.ctx, e.d, e.m, e.in, dec, out, since) {
		case heldAgain:
			p.record(out, v.called, dec, v.latency)
			return true
		case heldThenGivenBack:
			p.record(out, v.called, retry.Decision{Action: retry.Return, Retries: dec.Retries, Requeues: dec.Requeues}, v.latency)
			return false
		}
	}
	if backoff && p.unavailable(dec, out) {
		p.wait(p.o.UnavailableBackoff)
	}
	// Counted once, after the settle, as what actually happened: a decision
	// the proxy had to let go of is counted as a return.
	if !p.settle(e.ctx, e.d, e.m, e.in, dec, out) {
		dec = retry.Decision{Action: retry.Return, Retries: e.in.Retries, Requeues: e.in.Requeues}
	}
	p.record(out, v.called, dec, v.latency)
	return false
}

// word is what a batch has to say about each of its messages between the
// verdict and its settle, which are the core's: a batch concludes each
// message through one call (conclude), and keeps its own part here.
type word interface {
	// judged is told that e's verdict is in, and whether it returns a
	// message the app could not take (unavailable); it says whether the
	// verdict is still carried out.
	judged(e *entry, unavailable bool) bool
	// beside runs carry beside the caller, and says whether it did;
	// false: the verdict is carried out at once. Only a verdict that
	// moves the message (anything but an ack) is offered.
	beside(e *entry, carry func()) bool
}

// conclude judges the app's outcome of one message of a batch and carries
// the verdict out, with the batch's word in between (w). It reports true
// when an in-place hold has waited out its delay and the message is to be
// delivered again.
func (p *Loop) conclude(e *entry, out retry.Outcome, latency time.Duration, since time.Time, w word) bool {
	v := p.judge(e, out, latency)
	if !w.judged(e, p.unavailable(v.dec, v.out)) {
		return false
	}
	if v.dec.Action != retry.Ack && w.beside(e, func() {
		defer e.span.End()
		p.finish(e, v, since, false)
	}) {
		return false
	}
	again := p.finish(e, v, since, false)
	e.span.End()
	return again
}

// unavailable says whether a decision returns a message the app could not
// take, which waits the unavailable backoff so that an app that is down
// is not spun on. A refusal does not wait, since the consumer is paused
// (unless it keeps consuming while paused), nor does a crash (the message
// goes back with its count).
func (p *Loop) unavailable(dec retry.Decision, out retry.Outcome) bool {
	if dec.Action != retry.Return || out.Crashed {
		return false
	}
	return !out.Given() || out.Refused && p.o.PausedKeepsConsuming
}

// holdResult is what holdInPlace did.
type holdResult int

const (
	notHeld           holdResult = iota // the retry goes through the tier queue
	heldAgain                           // waited out the delay: deliver again
	heldThenGivenBack                   // shutdown cut the hold short
)

// holdInPlace carries out a decision of an ordered delivery in place, so
// that no later message overtakes it: a retry waits out its tier's delay, a
// 425 its hold, a message the app could not take (down, or the breaker
// refusing) the unavailable backoff, with the delivery held unacked (the
// messages behind it wait), and is then delivered again. What the decision
// counts is written into the delivery's headers first, so the next attempt
// sees it as a moved copy would carry it. It leaves the decision to the
// usual path (notHeld) when the hold would keep the delivery unacked past
// MoveHoldMax, under the broker's consumer_timeout, and always at shutdown.
// A shutdown during the hold gives the delivery back.
func (p *Loop) holdInPlace(ctx context.Context, d Delivery, m *msg.Message, in msg.Info,
	dec retry.Decision, out retry.Outcome, since time.Time) holdResult {
	var wait time.Duration
	switch dec.Action {
	case retry.Retry:
		wait = dec.Tier
	case retry.Requeue:
		wait = max(dec.Hold, dec.Tier)
	case retry.Return:
		if out.CutOff || p.stopped() {
			return notHeld // Hopper is letting go of it
		}
		// Never spin on an app that refuses at once.
		wait = max(p.o.UnavailableBackoff, minUnavailableHold)
	default:
		return notHeld
	}
	now := p.o.Now()
	if now.Add(wait).Sub(since) >= p.o.MoveHoldMax {
		p.log.Warn("ordered message would be held too long in place; it takes the usual way and later messages overtake it",
			"event", "ORDERED_HOLD_EXHAUSTED", "message_id", m.MessageID, "held_ms", now.Sub(since).Milliseconds(),
			"wait", wait.String(), "decision", dec.Action.String())
		if dec.Action != retry.Return {
			// A return keeps its place on a classic queue; on a quorum
			// queue the republish reports it.
			p.orderBroken(OrderHoldExhausted)
		}
		return notHeld
	}
	if m.Headers == nil {
		m.Headers = map[string]any{}
	}
	switch dec.Action {
	case retry.Retry:
		// The failed attempt is written as a retry's copy would carry it,
		// so the next attempt and a later DLQ copy see the same history.
		msg.RecordFailure(m.Headers, dec.Retries, out.Status, now)
	case retry.Requeue:
		m.Headers[msg.HeaderRequeueCount] = int64(dec.Requeues)
	case retry.Return:
		if dec.Crashes > in.Crashes {
			m.Headers[msg.HeaderCrashCount] = int64(dec.Crashes)
		}
	}
	// The next attempt's span follows this one, as it would after a move.
	propagator.Inject(ctx, headerCarrier(m.Headers))
	if !p.waitHeld(wait, func() bool { return alive(d) }) {
		in.Retries, in.Requeues, in.Crashes = dec.Retries, dec.Requeues, dec.Crashes
		p.giveBack(ctx, d, m, in)
		return heldThenGivenBack
	}
	return heldAgain
}

// noopSpan is the span of an attempt when tracing is off.
var noopSpan = trace.SpanFromContext(context.Background())

// minUnavailableHold is the least an ordered delivery the app could not
// take waits before it goes again.
const minUnavailableHold = 10 * time.Millisecond

// record counts a settled delivery, once, as what happened: in Stats and
// through the Observer. It is the only place either is told of a decision.
func (p *Loop) record(out retry.Outcome, called bool, dec retry.Decision, latency time.Duration) {
	var c *atomic.Int64
	switch dec.Action {
	case retry.Ack:
		c = &p.Stats.Acked
	case retry.Drop:
		c = &p.Stats.Dropped
	case retry.Requeue:
		c = &p.Stats.Requeued
	case retry.Retry:
		c = &p.Stats.Retried
	case retry.DLQ:
		c = &p.Stats.DeadLettered
	case retry.Return:
		c = &p.Stats.Returned
	}
	if c != nil {
		c.Add(1)
	}
	p.obs.Decided(out, called, dec, latency)
}

func (p *Loop) inFlight(delta int) {
	p.Stats.InFlight.Add(int64(delta))
	p.obs.InFlight(delta)
}

// history reads the delivery's history from its headers, and the part of
// it the outcome table decides on.
func (p *Loop) history(m *msg.Message, now time.Time) (msg.Info, retry.State) {
	in := msg.Read(m, p.o.Plan.Work.Name, p.o.DeadlineHeader, now)
	return in, retry.State{Retries: in.Retries, Requeues: in.Requeues, Crashes: in.Crashes, Deadline: in.Deadline, Suspect: in.Suspect}
}

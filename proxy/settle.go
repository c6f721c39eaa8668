package proxy

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/hopper-sidecar/hopper/internal/backoff"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// settle carries out a decision. It is the one place where deliveries are
// acked, nacked or moved. It reports whether the decision was carried out;
// false means the delivery was given back (or its channel was lost) instead.
// The delivery was received at since: a move that keeps failing holds it
// until MoveHoldMax from then.
func (p *Loop) settle(ctx context.Context, d Delivery, m *msg.Message, in msg.Info,
	dec retry.Decision, out retry.Outcome, since time.Time) bool {
	switch dec.Action {
	case retry.Ack, retry.Drop:
		if err := d.Ack(); err != nil {
			p.settleFailed(m, "ack", err)
			return false
		}
		if dec.Action == retry.Drop {
			p.log.Info("message dropped", "event", "MESSAGE_DROPPED", "message_id", m.MessageID, "reason", dec.Reason)
		}
		return true

	case retry.Return:
		if dec.Crashes > in.Crashes {
			// The app died handling it: the new crash count must travel
			// with the message, which a nack cannot do.
			in.Crashes, in.Suspect = dec.Crashes, dec.Suspect
			if p.republish(ctx, d, m, in) {
				p.log.Warn("the app died handling this message; returned with its crash count", "event", "APP_CRASHED",
					"message_id", m.MessageID, "crashes", dec.Crashes, "error", msg.Truncate(out.Error, msg.MaxErrorLen))
			}
			return true
		}
		if dec.Suspect != in.Suspect {
			// The app died with this message and others in flight: it goes
			// back marked, to be delivered on its own, charged nothing.
			in.Suspect = dec.Suspect
			if p.republish(ctx, d, m, in) {
				p.log.Info("the app died with this message among others in flight; returned to be delivered on its own",
					"event", "APP_CRASH_SUSPECT", "message_id", m.MessageID, "error", msg.Truncate(out.Error, msg.MaxErrorLen))
			}
			return true
		}
		p.giveBack(ctx, d, m, in)
		return true

	case retry.Requeue:
		in.Suspect = dec.Suspect
		cp := msg.RequeueCopy(m, in, dec.Requeues)
		if dec.Tier > 0 {
			return p.toTier(ctx, d, m, in, cp, dec.Tier, "requeue", since)
		}
		if !p.wait(dec.Hold) {
			// Shutting down: back to the queue as it came.
			p.giveBack(ctx, d, m, in)
			return false
		}
		return p.move(ctx, d, m, in, p.o.Plan.Work.Name, cp, "requeue", since)

	case retry.Retry:
		in.Suspect = dec.Suspect
		cp := msg.RetryCopy(m, in, dec.Retries, out.Status, p.o.Now())
		return p.toTier(ctx, d, m, in, cp, dec.Tier, "retry", since)

	case retry.DLQ:
		tid := traceID(trace.SpanFromContext(ctx))
		in.Crashes, in.Suspect = dec.Crashes, dec.Suspect
		cp := msg.DLQCopy(m, in, msg.DeadLetter{
			Reason: dec.Reason, Status: out.Status, Error: out.Error, Retries: dec.Retries,
			TraceID: tid, Now: p.o.Now(),
		})
		if !p.move(ctx, d, m, in, p.o.Plan.DLQ.Name, cp, "dlq", since) {
			return false
		}
		level := slog.LevelWarn
		if dec.Reason == retry.ReasonFiltered {
			// Set aside on purpose, as the config asks: one line per
			// message would drown the log of a busy filter.
			level = slog.LevelDebug
		}
		if p.log.Enabled(ctx, level) {
			p.log.Log(ctx, level, "message dead-lettered", "event", retry.Event(dec.Reason), "message_id", m.MessageID,
				"routing_key", in.RoutingKey, "reason", dec.Reason,
				"status", out.Status, "retries", dec.Retries, "error", msg.Truncate(out.Error, msg.MaxErrorLen),
				"trace_id", tid)
		}
		return true
	}
	// A decision without an action is a bug; keep the message.
	p.log.Error("no action decided; message returned", "event", "DECISION_MISSING", "message_id", m.MessageID)
	p.giveBack(ctx, d, m, in)
	return false
}

// finish carries out a verdict, then counts what happened, once, and
// marks the verdict on the attempt's span. It reports true when an
// in-place hold has waited out its delay and the app is to be called
// again. backoff says whether a return of a message the app could not
// take waits the unavailable backoff first (a batch waits it once for all
// its messages).
func (p *Loop) finish(e *entry, v verdict, since time.Time, backoff bool) bool {
	// The span is marked even when carrying the verdict out panics: it
	// ends all the same.
	defer markVerdict(e.span, v)
	again, done := p.carryOut(e, v, since, backoff)
	p.record(v.out, v.called, done, v.latency)
	return again
}

// carryOut holds an ordered delivery in place, or settles it. It returns
// whether the app is to be called again, and the decision as it was
// carried out: a decision the proxy had to let go of is a return.
func (p *Loop) carryOut(e *entry, v verdict, since time.Time, backoff bool) (again bool, done retry.Decision) {
	out, dec := v.out, v.dec
	if e.ordered {
		switch p.holdInPlace(e.ctx, e.d, e.m, e.in, dec, out, since) {
		case heldAgain:
			return true, dec
		case heldThenGivenBack:
			return false, retry.Decision{Action: retry.Return, Retries: dec.Retries, Requeues: dec.Requeues}
		}
	}
	if backoff && p.unavailable(dec, out) {
		p.wait(p.o.UnavailableBackoff)
	}
	if !p.settle(e.ctx, e.d, e.m, e.in, dec, out, since) {
		return false, retry.Decision{Action: retry.Return, Retries: e.in.Retries, Requeues: e.in.Requeues}
	}
	return false, dec
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

// markVerdict writes what became of an attempt on its span: the decision,
// the app's status, and why the attempt failed.
func markVerdict(span trace.Span, v verdict) {
	out, dec := v.out, v.dec
	if span.IsRecording() {
		span.SetAttributes(keyDecision.String(dec.Action.String()), statusAttr(out))
		if dec.Reason != "" {
			span.SetAttributes(keyReason.String(dec.Reason))
		}
	}
	if out.Error != "" && dec.Action != retry.Ack {
		et := errorType(out)
		span.SetStatus(codes.Error, msg.Truncate(out.Error, msg.MaxErrorLen))
		span.SetAttributes(semconv.ErrorTypeKey.String(et))
	}
}

// errorType is the low-cardinality error.type of a failed attempt: the
// HTTP status code, or what went wrong before one came back.
func errorType(o retry.Outcome) string {
	switch {
	case o.Status > 0:
		return strconv.Itoa(o.Status)
	case o.Refused:
		return "refused"
	case o.Kind == retry.Timeout:
		return "timeout"
	case o.Kind == retry.Unavailable:
		return "unavailable"
	case o.Kind == retry.Cut:
		return "cut"
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

func statusAttr(o retry.Outcome) attribute.KeyValue {
	return semconv.HTTPResponseStatusCode(o.Status)
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

// minUnavailableHold is the least an ordered delivery the app could not
// take waits before it goes again.
const minUnavailableHold = 10 * time.Millisecond

// traceID is the span's trace id, or "" when there is none: a dead-lettered
// copy carries it, and the log lines about the attempt.
func traceID(span trace.Span) string {
	if sc := span.SpanContext(); sc.HasTraceID() {
		return sc.TraceID().String()
	}
	return ""
}

func (p *Loop) toTier(ctx context.Context, d Delivery, m *msg.Message, in msg.Info,
	cp *msg.Message, tier time.Duration, why string, since time.Time) bool {
	q, ok := p.o.Plan.TierQueue(tier)
	if !ok {
		// The selector only picks configured tiers; keep the message if not.
		p.log.Error("no queue for delay tier; message returned", "event", "TIER_MISSING", "tier", tier.String())
		p.giveBack(ctx, d, m, in)
		return false
	}
	return p.move(ctx, d, m, in, q, cp, why, since)
}

// move publishes cp to queue, waits for the confirm, then acks d. A failed
// publish is retried with backoff while the delivery is held; the decision
// is never taken again. The delivery is let go (given back) only when it
// must: shutdown, its channel lost, or held until MoveHoldMax from its
// receipt (since), which stays under the broker's consumer timeout,
// whatever held it before the move (a hold in place, a wait behind its
// key or for its batch). Its channel is looked at before each publish: a
// copy of a message the broker has back already would be a duplicate. It
// reports whether the move completed.
func (p *Loop) move(ctx context.Context, d Delivery, m *msg.Message, in msg.Info,
	queue string, cp *msg.Message, why string, since time.Time) bool {
	var (
		started = time.Now()
		bo      = backoff.Backoff{Min: p.o.MoveRetryMin, Max: p.o.MoveRetryMax}
		held    bool
	)
	defer func() {
		if held {
			p.movesFailing(-1)
		}
	}()
	for {
		if !alive(d) {
			// The broker has put the original back already.
			p.settleFailed(m, "move", errChannelClosed)
			return false
		}
		err := p.publish(ctx, queue, cp, why)
		if err == nil {
			break
		}
		p.moveFailed(why)
		if !held {
			held = true
			p.movesFailing(1)
			p.log.Error("move failed; holding the message and retrying the move", "event", "MOVE_FAILED",
				"message_id", m.MessageID, "to", queue, "why", why, "error", err.Error())
		}
		switch {
		case !alive(d):
			// The broker has put the original back already.
			p.settleFailed(m, "move", err)
			return false
		case p.stopped(), p.o.Now().Sub(since) >= p.o.MoveHoldMax:
			p.log.Warn("move still failing; message given back to the work queue", "event", "MOVE_ABANDONED",
				"message_id", m.MessageID, "to", queue, "why", why, "held_ms", time.Since(started).Milliseconds(),
				"unacked_ms", p.o.Now().Sub(since).Milliseconds(), "error", err.Error())
			p.giveBack(ctx, d, m, in)
			return false
		}
		p.wait(bo.Next())
	}
	if held {
		p.log.Info("move succeeded after failing", "event", "MOVE_RECOVERED", "message_id", m.MessageID,
			"to", queue, "why", why, "held_ms", time.Since(started).Milliseconds())
	}
	if err := d.Ack(); err != nil {
		// The copy exists and the original will be redelivered: a duplicate,
		// never a loss.
		p.settleFailed(m, "ack after move", err)
		return false
	}
	return true
}

// publish sends one copy and waits for its confirm. The publish finishes
// even during shutdown: a copy whose confirm is abandoned would become a
// duplicate. It has its own confirm timeout.
func (p *Loop) publish(ctx context.Context, queue string, cp *msg.Message, why string) error {
	pctx, span := startProducer(context.WithoutCancel(ctx), p.tr, queue, why, cp.Headers)
	err := p.o.Pub.Publish(pctx, queue, cp)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	return err
}

// startProducer opens the PRODUCER span of a move (a publish to queue
// through the default exchange) and writes its context into the copy's
// headers, so the next attempt's span joins the same trace.
func startProducer(ctx context.Context, tr trace.Tracer, queue, why string, headers map[string]any) (context.Context, trace.Span) {
	ctx, span := tr.Start(ctx, "send "+queue, trace.WithSpanKind(trace.SpanKindProducer))
	if span.IsRecording() {
		span.SetAttributes(semconv.MessagingSystemRabbitMQ, semconv.MessagingOperationName("send"),
			semconv.MessagingOperationTypeSend, semconv.MessagingDestinationName(defaultExchange),
			semconv.MessagingRabbitMQDestinationRoutingKey(queue), keyMove.String(why))
	}
	propagator.Inject(ctx, headerCarrier(headers))
	return ctx, span
}

func (p *Loop) movesFailing(delta int64) {
	n := p.Stats.MovesFailing.Add(delta)
	if p.o.OnMovesFailing == nil {
		return
	}
	switch {
	case delta > 0 && n == 1:
		p.o.OnMovesFailing(true)
	case delta < 0 && n == 0:
		p.o.OnMovesFailing(false)
	}
}

// giveBack returns a delivery to the work queue as it came, without
// spending an attempt: the app could not take it, or Hopper is letting go
// of it. On a classic queue that is a nack with requeue. On a quorum queue
// it is a republish (counters, origin and deadline kept) → confirm → ack,
// so the queue's delivery limit is not spent.
func (p *Loop) giveBack(ctx context.Context, d Delivery, m *msg.Message, in msg.Info) {
	if !p.o.Quorum && !unpinnedDeadline(m, in) {
		p.nack(d)
		return
	}
	p.republish(ctx, d, m, in)
}

// unpinnedDeadline says whether in's deadline was counted from m's AMQP
// expiration at this receipt and is written nowhere yet: a nack would
// bring the message back as it came, and the next receipt would count the
// expiration again, later. Such a give-back republishes with the deadline
// pinned, also on a classic queue.
func unpinnedDeadline(m *msg.Message, in msg.Info) bool {
	if in.Deadline.IsZero() || m.Expiration == "" {
		return false
	}
	_, pinned := m.Headers[msg.HeaderDeadline]
	return !pinned
}

// republish puts a copy of m, with the history in, back in the work queue,
// then acks the delivery. When the publish fails the delivery is nacked
// instead, the one way left to keep it, and it reports false: the new
// history was not kept.
func (p *Loop) republish(ctx context.Context, d Delivery, m *msg.Message, in msg.Info) bool {
	if !alive(d) {
		// The broker has put the message back already: a copy would be a
		// second one.
		p.settleFailed(m, "return", errChannelClosed)
		return false
	}
	if err := p.publish(ctx, p.o.Plan.Work.Name, msg.ReturnCopy(m, in), "return"); err != nil {
		p.moveFailed("return")
		p.log.Warn("could not republish a returned message; nacking it instead", "event", "RETURN_NACKED",
			"message_id", m.MessageID, "error", err.Error())
		p.nack(d)
		return false
	}
	if ordered(d) {
		p.log.Warn("ordered message returned to the tail of the work queue; later messages of its key may come first",
			"event", "ORDER_BROKEN", "message_id", m.MessageID, "reason", OrderReturned)
		p.orderBroken(OrderReturned)
	}
	if err := d.Ack(); err != nil {
		p.settleFailed(m, "ack after return", err)
	}
	return true
}

func (p *Loop) nack(d Delivery) {
	if err := d.Nack(true); err != nil {
		p.settleFailed(d.Message(), "nack", err)
	}
}

func (p *Loop) settleFailed(m *msg.Message, what string, err error) {
	p.Stats.SettleFailed.Add(1)
	p.log.Warn("could not settle delivery; the broker will redeliver it", "event", "SETTLE_FAILED",
		"op", what, "message_id", m.MessageID, "error", err.Error())
}

// errChannelClosed is why a delivery whose channel closed is not settled.
var errChannelClosed = errors.New("the delivery's channel is closed; the broker redelivers the message")

// ordered reports whether a delivery must keep its place in line.
func ordered(d Delivery) bool {
	o, ok := d.(interface{ Ordered() bool })
	return ok && o.Ordered()
}

// alive reports whether a delivery can still be settled. Deliveries that
// cannot tell are taken to be alive.
func alive(d Delivery) bool {
	a, ok := d.(interface{ Alive() bool })
	return !ok || a.Alive()
}

func (p *Loop) moveFailed(why string) {
	p.Stats.MoveFailed.Add(1)
	p.obs.MoveFailed(why)
}

// orderBroken counts an ordered message that left its place in line.
func (p *Loop) orderBroken(reason string) {
	p.Stats.OrderBroken.Add(1)
	p.obs.OrderBroken(reason)
}

package proxy

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/internal/backoff"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// Batch delivery. The consumer's deliveries go to a collector, which forms
// batches and hands each to a worker; the worker sends it in one request
// and has every message settled on its own from the app's answer, through
// the same steps a single delivery takes in the core: open the attempt,
// judge the app's outcome, finish (settle, move or give back).
//
//	consumer ─Handle→ pending ─collect→ batch ─worker→ one request
//	                                                   ├─ an outcome per message → judge → conclude each
//	                                                   └─ failed as a whole (no answer) → split in
//	                                                      halves, each delivered again, down to one
//
// A batch holds no message that must go alone (a crash count or the
// crash-suspect mark): such a message is delivered in a request of its own,
// between the runs of its batch, so order is kept, still written as a
// batch (of one), since that is what the app's handler takes.
//
// One goroutine at a time holds each message of a batch, and only the
// holder settles it. The worker holds the whole batch when it starts.
// It hands a message on in one call (handOver) when the message goes on
// beside it: a move after the app's answer, or a request of its own after
// the batch timed out; the goroutine that takes it then holds it, settles
// it, and recovers from its own panics. A panic recovered by a holder
// returns only what that holder still has.

// member is a message of a batch: a delivery settled once, as every
// delivery is.
type member = settleOnce

// batcher delivers the batches the collector forms.
type batcher struct {
	p *Loop
}

// owner is a goroutine that owns members of a batch: it alone may settle
// them. The worker owns the whole batch when it starts; a goroutine a
// member is handed over to owns that one. ms are the members it started
// with, in the order they were received, owns those it still owns; since
// is when the batch's first message was received, from which its holds
// are bounded.
type owner struct {
	b     *batcher
	ctx   context.Context
	since time.Time
	ms    []*member
	owns  map[*member]bool
	// beside says this goroutine may hand moves on to goroutines of their
	// own: the worker, which has the rest of the queue to get to. A
	// goroutine that holds one message carries its move out itself.
	beside bool
}

// own makes the owner of ms: the goroutine that runs it.
func (b *batcher) own(ctx context.Context, ms []*member, since time.Time, beside bool) *owner {
	h := &owner{b: b, ctx: ctx, since: since, ms: ms, owns: make(map[*member]bool, len(ms)), beside: beside}
	for _, d := range ms {
		h.owns[d] = true
	}
	return h
}

// handOver gives d up: from now on the goroutine it is passed to owns it.
func (h *owner) handOver(d *member) *member {
	delete(h.owns, d)
	return d
}

// deliver delivers a batch: runs of messages that may share a request go
// together, a message that must go alone goes by itself, in the order
// received. A panic on the way is recovered (recover): what the worker
// still holds goes back marked as a crash suspect, to be delivered on its
// own, where the single-message path sets the one that fails aside. The
// batch's first message was received at since: the batch has been unacked
// from then on (also while it filled and waited for a worker), and its
// holds (an in-place retry, a split) are bounded from there.
func (b *batcher) deliver(ctx context.Context, ds []Delivery, since time.Time) {
	// The members in one array: one allocation per batch, not one per
	// message.
	all := make([]member, len(ds))
	ms := make([]*member, len(ds))
	for i, d := range ds {
		all[i] = member{Delivery: d, ordered: b.p.o.InPlace, since: since}
		ms[i] = &all[i]
	}
	h := b.own(ctx, ms, since, true)
	defer h.recover()
	run := 0
	for i, d := range ms {
		if !mayCrash(d.Message()) {
			continue // the headers that make a message go alone are not there
		}
		if !batch.Alone(msg.Read(d.Message(), b.p.o.Plan.Work.Name, b.p.o.DeadlineHeader, since)) {
			continue
		}
		h.deliverRun(ms[run:i])
		// Still in the batch format: the app's handler takes batches.
		h.deliverRun(ms[i : i+1])
		run = i + 1
	}
	h.deliverRun(ms[run:])
}

// deliverRun delivers messages that go together, as one batch or, when it
// fails as a whole, as halves of it; an ordered loop keeps their order.
func (h *owner) deliverRun(ds []*member) {
	if len(ds) == 0 {
		return
	}
	p := h.b.p
	p.inFlight(len(ds))
	defer p.inFlight(-len(ds))
	defer sendAcks(ds[len(ds)-1])
	if p.o.InPlace {
		h.deliverOrdered(ds)
		return
	}
	h.deliverSplit(ds, false)
}

// sendAcks has the acks of d's channel that may go, go now: a run's
// messages are settled together, and their acks would otherwise wait to
// be coalesced with later ones, holding the prefetch the next batches are
// gathered from. Moves handed on are acked later, by their own
// goroutines, and their acks wait as single deliveries' do.
func sendAcks(d *member) {
	if s, ok := d.Delivery.(interface{ SendAcks() error }); ok {
		_ = s.SendAcks() // a channel gone: the broker redelivers, as for any ack lost with it
	}
}

// deliverSplit delivers ds in one request and settles each message from
// the answer. A request that failed as a whole without an answer is split,
// down to single messages, so that the message at fault ends up alone and
// is the only one charged. A cut (the connection broken, the app dying, an
// answer that is not HTTP) comes at once: the batch is split in halves,
// one after the other, each delivered the same way, which finds the
// message in few requests and keeps one of them at the app at a time. A
// timeout costs the app's whole timeout at every level of halving, every
// message held meanwhile: so a batch that timed out sends each of its
// messages again alone, all at once (sendAlone), and only the message
// that hangs waits for a second timeout. Every message is held unacked
// meanwhile; a split stops when the hold would reach half of MoveHoldMax,
// or at shutdown, and the failure is then each message's outcome.
// splitting says ds is a part of a split: while the breaker refuses it
// (the app died under the whole), it waits for the app rather than give
// up on the split.
func (h *owner) deliverSplit(ds []*member, splitting bool) {
	es, v := h.deliverOnce(ds, splitting)
	if es == nil {
		return
	}
	p := h.b.p
	splits := len(es) > 1 && batch.Splits(v.whole)
	switch {
	case splits && h.b.holdable(h.since) && v.whole.Kind == retry.Timeout:
		endUnsettled(es, "split")
		p.log.Info("batch timed out as a whole; delivering each of its messages alone, at once", "event", "BATCH_SPLIT",
			"size", len(es), "alone", len(es), "error", msg.Truncate(v.whole.Error, msg.MaxErrorLen))
		h.sendAlone(ds)
	case splits && h.b.holdable(h.since):
		endUnsettled(es, "split")
		half := batch.Half(len(ds))
		p.log.Info("batch failed as a whole; delivering it again in halves", "event", "BATCH_SPLIT",
			"size", len(ds), "halves", fmt.Sprintf("%d+%d", half, len(ds)-half), "error", msg.Truncate(v.whole.Error, msg.MaxErrorLen))
		h.deliverSplit(ds[:half], true)
		h.deliverSplit(ds[half:], true)
	case splits:
		h.concludeEach(es, unsplit(v))
	default:
		h.concludeEach(es, v)
	}
}

// sendAlone hands each message of ds not settled yet to a goroutine of its
// own, which sends it in a request of its own and settles it; the worker
// goes on without waiting: the neighbours are answered within a round
// trip, and the message that hangs waits out its second timeout without
// keeping a worker, or a slot of the concurrency limit
// (batch.Request.Split), from the rest of the queue. They are sent all at
// once; past the client's connections a request waits for one, as any
// request does. Each is counted in flight, and Shutdown waits for it,
// until it is settled; a panic while delivering one is recovered there
// and charged to that message alone.
func (h *owner) sendAlone(ds []*member) {
	p := h.b.p
	for _, d := range unsettled(ds) {
		alone := h.b.own(h.ctx, []*member{h.handOver(d)}, h.since, false)
		p.wg.Add(1)
		p.inFlight(1)
		go func() {
			defer p.wg.Done()
			defer p.inFlight(-1)
			defer alone.recover()
			alone.deliverSplit(alone.ms, true)
		}()
	}
}

// batchVerdict is what came of one batch request.
type batchVerdict struct {
	whole   retry.Outcome
	entries []retry.Outcome
	latency time.Duration
}

// deliverOnce sends ds as one request, opening an attempt of each in the
// core. Messages the core does not send (past their deadline, or at
// shutdown) it settles at once. It returns the attempts sent, in order,
// and the answer; nil when nothing was sent. While splitting, a request
// the breaker refuses is tried again after a growing pause, as long as
// the messages may be held.
func (h *owner) deliverOnce(ds []*member, splitting bool) ([]*entry, batchVerdict) {
	p := h.b.p
	bo := backoff.Backoff{Min: max(p.o.UnavailableBackoff/8, minUnavailableHold), Max: max(p.o.UnavailableBackoff, minUnavailableHold)}
	for {
		// The attempts in one array, one allocation per request.
		at := make([]entry, len(ds))
		es := make([]*entry, 0, len(ds))
		for i, d := range ds {
			if d.settled.Load() || h.b.channelLost(d) {
				continue
			}
			if e := p.openAttempt(h.ctx, d, h.since, d.ordered, nil, &at[i]); e != nil {
				es = append(es, e)
			}
		}
		if len(es) == 0 {
			return nil, batchVerdict{}
		}
		v := h.b.send(h.ctx, es, splitting)
		if !(splitting && v.whole.Refused && h.b.holdable(h.since)) || !p.waitHeld(bo.Next(), entriesHeld(es)) {
			// A refusal at shutdown goes back as a single refusal would.
			return es, v
		}
		endUnsettled(es, "refused")
	}
}

// send makes the batch request of es: one CONSUMER span for the batch,
// linked to each message's attempt span, under which the CLIENT span of
// the request runs; each entry carries its own attempt's trace context to
// the app. split says es are part of a batch that failed as a whole
// (batch.Request.Split).
func (b *batcher) send(ctx context.Context, es []*entry, split bool) batchVerdict {
	p := b.p
	r := &batch.Request{
		Alone:    len(es) == 1 && batch.Alone(es[0].in),
		Split:    split,
		Messages: make([]*msg.Message, len(es)),
		Infos:    make([]msg.Info, len(es)),
		Traces:   make([]trace.SpanContext, len(es)),
	}
	var links []trace.Link
	for i, e := range es {
		r.Messages[i], r.Infos[i] = e.m, e.in
		sc := e.span.SpanContext()
		if sc.IsValid() {
			r.Traces[i] = sc
		} else if parent := trace.SpanContextFromContext(e.ctx); parent.IsValid() {
			r.Traces[i] = parent
		}
		if e.span.IsRecording() {
			// Links only to spans that are kept: with tracing off none is.
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	bctx, span := p.tr.Start(ctx, "process "+es[0].in.Queue,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithNewRoot(), trace.WithLinks(links...))
	if span.IsRecording() {
		span.SetAttributes(semconv.MessagingSystemRabbitMQ, semconv.MessagingOperationTypeProcess,
			semconv.MessagingDestinationName(es[0].in.Queue), semconv.MessagingBatchMessageCount(len(es)))
	}
	p.obs.Batch(len(es))
	p.Stats.Batches.Add(1)
	p.Stats.BatchedMessages.Add(int64(len(es)))
	start := time.Now()
	a := p.o.App.DeliverBatch(bctx, r)
	latency := time.Since(start)
	if a.Unread != nil {
		p.log.Warn("the app's answer to a batch could not be read; every message in it is retried", "event", "BATCH_RESULTS_MALFORMED",
			"size", len(es), "status", a.Whole.Status, "error", msg.Truncate(a.Unread.Error(), msg.MaxErrorLen))
		span.SetStatus(codes.Error, "results body unreadable")
	}
	if a.Whole.Error != "" && !(a.Whole.Kind == retry.Response && a.Whole.Status >= 200 && a.Whole.Status <= 299) {
		span.SetStatus(codes.Error, msg.Truncate(a.Whole.Error, msg.MaxErrorLen))
	}
	span.End()
	return batchVerdict{whole: a.Whole, entries: a.Entries, latency: latency}
}

// unsplit is v for a batch that failed as a whole and is not split any
// further.
func unsplit(v batchVerdict) batchVerdict {
	v.entries = slices.Clone(v.entries)
	for i, o := range v.entries {
		v.entries[i] = batch.Unsplit(o)
	}
	return v
}

// concludeEach judges each message of a batch on its outcome and
// concludes it, in no order that must be kept. Acks are made in
// order, at once. A message that is moved (a copy published and confirmed
// before the ack, a 425's hold before it, a return) is handed, by the
// worker, to a goroutine of its own, which concludes it beside the worker,
// which goes on with the next batch without waiting: a hold or a slow
// confirm keeps only its own message, not the batch's worker, as it would
// keep only that message's worker without batching. Each such move is
// counted in flight, and Shutdown waits for it, until it has settled its
// message. A return of messages the app could not take waits the
// unavailable backoff once for the batch, before the first of them; a
// message whose channel closed is let go.
func (h *owner) concludeEach(es []*entry, v batchVerdict) {
	p := h.b.p
	vs := make([]verdict, len(es))
	for i, e := range es {
		vs[i] = p.judge(e, v.entries[i], v.latency)
	}
	waited := false
	for i, e := range es {
		if !waited && p.unavailable(vs[i].dec, vs[i].out) {
			p.waitHeld(p.o.UnavailableBackoff, entriesHeld(es[i:]))
			waited = true
		}
		d := e.d.(*member)
		switch {
		case h.b.channelLost(d):
			endUnsettled(es[i:i+1], "channel-closed")
		case !h.beside || vs[i].dec.Action == retry.Ack:
			h.b.conclude(e, vs[i], h.since)
		default:
			h.b.moveBeside(h.ctx, h.handOver(d), e, vs[i], h.since)
		}
	}
}

// conclude carries out the verdict on e, as a single delivery's attempt
// does, and ends the attempt. It reports true when an in-place hold has
// waited out its delay and the message is to be delivered again. The
// unavailable backoff is the batch's to wait, once for all its messages.
func (b *batcher) conclude(e *entry, v verdict, since time.Time) bool {
	defer e.span.End()
	return b.p.finish(e, v, since, false)
}

// moveBeside concludes e, whose delivery d the caller has handed over, in
// a goroutine of its own, which from then on holds d: a panic there is
// charged to d alone.
func (b *batcher) moveBeside(ctx context.Context, d *member, e *entry, v verdict, since time.Time) {
	p := b.p
	p.wg.Add(1)
	p.inFlight(1)
	go func() {
		defer p.wg.Done()
		defer p.inFlight(-1)
		defer p.recoverDelivery(ctx, d)
		b.conclude(e, v, since)
	}()
}

// deliverOrdered delivers ds as batches in queue order, every message
// settled in turn by the worker. The messages up to the first that fails
// are settled; that one is held in place as a single ordered delivery is
// (its retry waits out its delay), and the messages after it are not
// settled on this answer: they go again with it, in the next request, so
// none is acked ahead of it. A batch that failed as a whole without an
// answer is split: its first half goes next, alone.
func (h *owner) deliverOrdered(ds []*member) {
	p := h.b.p
	size := len(ds)
	for len(ds) > 0 {
		sub := ds[:min(size, len(ds))]
		es, v := h.deliverOnce(sub, size < len(ds))
		if es == nil {
			ds = unsettled(ds)
			size = len(ds)
			continue
		}
		if len(es) > 1 && batch.Splits(v.whole) && h.b.holdable(h.since) {
			endUnsettled(es, "split")
			size = batch.Half(len(es))
			p.log.Info("ordered batch failed as a whole; delivering its first half", "event", "BATCH_SPLIT",
				"size", len(es), "first", size, "error", msg.Truncate(v.whole.Error, msg.MaxErrorLen))
			ds = unsettled(ds)
			continue
		}
		if len(es) > 1 && batch.Splits(v.whole) {
			v = unsplit(v)
		}
		for i, e := range es {
			if h.b.channelLost(e.d.(*member)) {
				// Back in the queue already, ahead of what follows it.
				endUnsettled(es[i:i+1], "channel-closed")
				continue
			}
			if h.b.conclude(e, p.judge(e, v.entries[i], v.latency), h.since) {
				// Held in place: it and every message after it go again.
				endUnsettled(es[i+1:], "behind-failed")
				break
			}
			if p.stopped() {
				endUnsettled(es[i+1:], "shutdown")
				h.b.giveBackAll(h.ctx, asDeliveries(unsettled(ds)))
				return
			}
		}
		ds = unsettled(ds)
		size = len(ds)
	}
}

// holdable says whether deliveries received at since may be held for
// another attempt in place: not at shutdown, and not near MoveHoldMax,
// which stays under the broker's consumer timeout.
func (b *batcher) holdable(since time.Time) bool {
	return !b.p.stopped() && b.p.o.Now().Sub(since) < b.p.o.MoveHoldMax/2
}

// endUnsettled ends the attempt spans of entries whose answer is not
// acted on, saying why.
func endUnsettled(es []*entry, why string) {
	for _, e := range es {
		if e.span.IsRecording() {
			e.span.SetAttributes(keyDecision.String("none"), keyBatchAgain.String(why))
		}
		e.span.End()
	}
}

// channelLost says whether d's channel is closed, and the first time it
// finds so counts it and marks d settled: the broker has put the message
// back (and redelivers it), so nothing Hopper could still do with d would
// count, and another request with it would only reach the app with a
// message that can no longer be settled.
func (b *batcher) channelLost(d *member) bool {
	if d.Alive() {
		return false
	}
	if d.settled.CompareAndSwap(false, true) {
		b.p.Stats.SettleFailed.Add(1)
	}
	return true
}

// entriesHeld says whether any of es can still be settled: while one
// can, a wait for them goes on.
func entriesHeld(es []*entry) func() bool {
	return func() bool {
		for _, e := range es {
			if e.d.(*member).Alive() {
				return true
			}
		}
		return false
	}
}

// unsettled is the deliveries of ds not settled yet, in order.
func unsettled(ds []*member) []*member {
	out := ds[:0:0]
	for _, d := range ds {
		if !d.settled.Load() {
			out = append(out, d)
		}
	}
	return out
}

// asDeliveries is ds as the Delivery values they wrap.
func asDeliveries(ds []*member) []Delivery {
	out := make([]Delivery, len(ds))
	for i, d := range ds {
		out[i] = d
	}
	return out
}

// recover turns a panic in the goroutine of h into returning each message
// it still holds and has not settled as a crash suspect: which message
// the failure belongs to is unknown, and delivered on its own, the one at
// fault is dead-lettered with reason hopper-error. A message held alone
// is the cause: it is set aside as a single delivery's would be. What the
// goroutine handed over (a move beside it, a request of its own) is
// settled by the goroutine that holds it, never here. The panic is logged
// with its stack and counted.
func (h *owner) recover() {
	r := recover()
	if r == nil {
		return
	}
	p := h.b.p
	var left []*member
	for _, d := range h.ms {
		if h.owns[d] && !d.settled.Load() {
			left = append(left, d)
		}
	}
	if len(left) == 1 {
		p.internalError(h.ctx, left[0], r)
		return
	}
	p.Stats.InternalErrors.Add(1)
	p.obs.InternalError()
	p.log.Error("internal error while handling a batch; its messages not settled go back to be delivered each on its own", "event", "HOPPER_INTERNAL_ERROR",
		"size", len(h.ms), "returned", len(left), "error", msg.Truncate(fmt.Sprintf("internal error: %v", r), msg.MaxErrorLen), "stack", string(debug.Stack()))
	for _, d := range left {
		h.b.returnSuspect(h.ctx, d)
	}
}

// returnSuspect returns d marked as a crash suspect; when even that
// panics, d is nacked, the last safe thing.
func (b *batcher) returnSuspect(ctx context.Context, d *member) {
	p := b.p
	defer func() {
		if r := recover(); r != nil && !d.settled.Load() {
			p.nack(d)
		}
	}()
	m := d.Message()
	in := p.safeHistory(m)
	in.Suspect = true
	p.republish(ctx, d, m, in)
	p.record(retry.Outcome{}, false, retry.Decision{Action: retry.Return, Retries: in.Retries, Requeues: in.Requeues}, 0)
}

// mayCrash says whether a message carries a crash count or the
// crash-suspect mark: it will go alone. Only the headers' presence is
// looked at, which is all the collector needs.
func mayCrash(m *msg.Message) bool {
	_, crashed := m.Headers[msg.HeaderCrashCount]
	_, suspect := m.Headers[msg.HeaderCrashSuspect]
	return crashed || suspect
}

// giveBackAll returns deliveries that were never sent: shutdown.
func (b *batcher) giveBackAll(ctx context.Context, ds []Delivery) {
	p := b.p
	for _, d := range ds {
		if d == nil || !alive(d) {
			continue
		}
		p.Stats.ReturnedOnShutdown.Add(1)
		m := d.Message()
		in, _ := p.history(m, p.o.Now())
		p.giveBack(ctx, d, m, in)
	}
}

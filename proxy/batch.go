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
// and settles every message on its own from the app's answer, by the same
// decide → settle path a single delivery takes.
//
//	consumer ─Handle→ pending ─collect→ batch ─worker→ one request
//	                                                   ├─ an outcome per message → decide → settle each
//	                                                   └─ failed as a whole (no answer) → split in
//	                                                      halves, each delivered again, down to one
//
// A batch holds no message that must go alone (a crash count or the
// crash-suspect mark): such a message is delivered in a request of its own,
// between the runs of its batch, so order is kept, still written as a
// batch (of one), since that is what the app's handler takes.

// member is a delivery of a batch, settled once as every delivery is,
// with what the batch started for it beside the goroutine handling the
// batch, which the batch's recovery waits for (besides).
type member struct {
	settleOnce
	// moving, when not nil, is closed once the move a batch started for
	// the delivery beside the goroutine handling the batch has ended. Set
	// and first read by that goroutine.
	moving chan struct{}
	// away, when not nil, is closed once the delivery, sent in a request
	// of its own beside the worker of its batch (deliverAlone), is done
	// with. Set by that worker, closed by the goroutine sending it.
	away chan struct{}
}

// handleBatch delivers a batch: runs of messages that may share a request
// go together, a message that must go alone goes by itself, in the order
// received. A panic on the way is recovered: what is not yet settled goes
// back marked as a crash suspect, to be delivered on its own, where the
// single-message path sets the one that fails aside. The batch's first
// message was received at since: the batch has been unacked from then on
// (also while it filled and waited for a worker), and its holds (an
// in-place retry, a split) are bounded from there.
func (p *Loop) handleBatch(ctx context.Context, ds []Delivery, since time.Time) {
	sds := make([]*member, 0, len(ds))
	for _, d := range ds {
		if p.ready(ctx, d) {
			sds = append(sds, &member{settleOnce: settleOnce{Delivery: d, ordered: p.o.InPlace}})
		}
	}
	defer p.recoverBatch(ctx, sds)
	run := 0
	for i, d := range sds {
		if !mayCrash(d.Message()) {
			continue // the headers that make a message go alone are not there
		}
		if in, _ := p.history(d.Message(), since); !batch.Alone(in) {
			continue
		}
		p.deliverRun(ctx, sds[run:i], since)
		// Still in the batch format: the app's handler takes batches.
		p.deliverRun(ctx, sds[i:i+1], since)
		run = i + 1
	}
	p.deliverRun(ctx, sds[run:], since)
}

// deliverRun delivers messages that go together, as one batch or, when it
// fails as a whole, as halves of it; an ordered loop keeps their order.
func (p *Loop) deliverRun(ctx context.Context, ds []*member, since time.Time) {
	if len(ds) == 0 {
		return
	}
	p.inFlight(len(ds))
	defer p.inFlight(-len(ds))
	if p.o.InPlace {
		p.deliverOrdered(ctx, ds, since)
		return
	}
	p.deliverSplit(ctx, ds, since, false)
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
// messages again alone, all at once (deliverAlone), and only the message
// that hangs waits for a second timeout. Every message is held unacked
// meanwhile; a split stops when the hold would reach half of MoveHoldMax,
// or at shutdown, and the failure is then each message's outcome.
// splitting says ds is a part of a split: while the breaker refuses it
// (the app died under the whole), it waits for the app rather than give
// up on the split.
func (p *Loop) deliverSplit(ctx context.Context, ds []*member, since time.Time, splitting bool) {
	es, v := p.deliverOnce(ctx, ds, since, splitting)
	if es == nil {
		return
	}
	if len(es) > 1 && batch.Splits(v.whole) && p.holdable(since) && v.whole.Kind == retry.Timeout {
		p.endUnsettled(es, "split")
		p.log.Info("batch timed out as a whole; delivering each of its messages alone, at once", "event", "BATCH_SPLIT",
			"size", len(es), "alone", len(es), "error", msg.Truncate(v.whole.Error, msg.MaxErrorLen))
		p.deliverAlone(ctx, ds, since)
		return
	}
	if len(es) > 1 && batch.Splits(v.whole) && p.holdable(since) {
		p.endUnsettled(es, "split")
		h := batch.Half(len(ds))
		p.log.Info("batch failed as a whole; delivering it again in halves", "event", "BATCH_SPLIT",
			"size", len(ds), "halves", fmt.Sprintf("%d+%d", h, len(ds)-h), "error", msg.Truncate(v.whole.Error, msg.MaxErrorLen))
		p.deliverSplit(ctx, ds[:h], since, true)
		p.deliverSplit(ctx, ds[h:], since, true)
		return
	}
	if len(es) > 1 && batch.Splits(v.whole) {
		v = unsplit(v)
	}
	p.concludeEach(ctx, es, v, since)
}

// deliverAlone sends each message of ds not settled yet in a request of
// its own, all at once, beside the worker, which goes on without waiting
// for them: the neighbours are answered within a round trip, and the
// message that hangs waits out its second timeout without keeping a
// worker, or a slot of the concurrency limit (batch.Request.Split), from
// the rest of the queue. Each is counted in flight, and Shutdown waits for
// it, until it is settled; a panic while delivering one is recovered there
// and charged to that message alone.
func (p *Loop) deliverAlone(ctx context.Context, ds []*member, since time.Time) {
	for _, d := range unsettled(ds) {
		d.away = make(chan struct{})
		p.wg.Add(1)
		p.inFlight(1)
		go func() {
			defer p.wg.Done()
			defer p.inFlight(-1)
			defer close(d.away)
			alone := []*member{d}
			defer p.recoverBatch(ctx, alone)
			p.deliverSplit(ctx, alone, since, true)
		}()
	}
}

// batchVerdict is what came of one batch request.
type batchVerdict struct {
	whole   retry.Outcome
	entries []retry.Outcome
	latency time.Duration
}

// deliverOnce sends ds as one request, starting an attempt of each. Messages
// past their deadline are settled at once and not sent. It returns the
// attempts sent, in order, and the answer; nil when nothing was sent.
// While splitting, a request the breaker refuses is tried again after a
// growing pause, as long as the messages may be held.
func (p *Loop) deliverOnce(ctx context.Context, ds []*member, since time.Time, splitting bool) ([]*entry, batchVerdict) {
	bo := backoff.Backoff{Min: max(p.o.UnavailableBackoff/8, minUnavailableHold), Max: max(p.o.UnavailableBackoff, minUnavailableHold)}
	for {
		var es []*entry
		for _, d := range ds {
			if d.settled.Load() || p.lost(d) {
				continue
			}
			if e := p.beginBatched(ctx, d, since); e != nil {
				es = append(es, e)
			}
		}
		if len(es) == 0 {
			return nil, batchVerdict{}
		}
		v := p.send(ctx, es, splitting)
		if !(splitting && v.whole.Refused && p.holdable(since)) || !p.waitHeld(bo.Next(), entriesHeld(es)) {
			// A refusal at shutdown goes back as a single refusal would.
			return es, v
		}
		p.endUnsettled(es, "refused")
	}
}

// send makes the batch request of es: one CONSUMER span for the batch,
// linked to each message's attempt span, under which the CLIENT span of
// the request runs; each entry carries its own attempt's trace context to
// the app. split says es are part of a batch that failed as a whole
// (batch.Request.Split).
func (p *Loop) send(ctx context.Context, es []*entry, split bool) batchVerdict {
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

// concludeEach decides and settles each message of a batch from its
// outcome, each through the core's conclude. Acks are made in order, at
// once. The moves (a copy published and confirmed before the ack, a 425's
// hold before it, a return) run beside the worker, which goes on with the
// next batch without waiting for them: a hold or a slow confirm keeps only
// its own message, not the batch's worker, as it would keep only that
// message's worker without batching. Each move is counted in flight, and
// Shutdown waits for it, until it has settled its message. A return of
// messages the app could not take waits the unavailable backoff once for
// the batch.
func (p *Loop) concludeEach(ctx context.Context, es []*entry, v batchVerdict, since time.Time) {
	s := &spread{p: p, ctx: ctx}
	for i, e := range es {
		s.rest = es[i:]
		p.conclude(e, v.entries[i], v.latency, since, s)
	}
}

// spread is a batch's word on each of its messages as concludeEach
// settles them, in no order that must be kept: the batch waits the
// unavailable backoff once, before the first message that waits it, and
// lets go of a message whose channel closed; a message that is not acked
// is moved beside the worker.
type spread struct {
	p   *Loop
	ctx context.Context
	// rest is the entry being concluded and those after it.
	rest []*entry
	// waited says the batch has waited its unavailable backoff.
	waited bool
}

func (s *spread) judged(e *entry, unavailable bool) bool {
	if unavailable && !s.waited {
		s.p.waitHeld(s.p.o.UnavailableBackoff, entriesHeld(s.rest))
		s.waited = true
	}
	if s.p.lost(e.d.(*member)) {
		s.p.endUnsettled([]*entry{e}, "channel-closed")
		return false
	}
	return true
}

func (s *spread) beside(e *entry, carry func()) bool {
	p, sd := s.p, e.d.(*member)
	sd.moving = make(chan struct{})
	p.wg.Add(1)
	p.inFlight(1)
	go func() {
		defer p.wg.Done()
		defer p.inFlight(-1)
		defer close(sd.moving)
		defer func() {
			// This goroutine is past the batch's own recovery.
			if r := recover(); r != nil {
				p.internalError(s.ctx, &sd.settleOnce, r)
			}
		}()
		carry()
	}()
	return true
}

// inLine is an ordered batch's word on each of its messages: nothing
// between verdict and settle (its lost channels are looked at before the
// verdict), and every message settled in turn, by the worker.
type inLine struct{}

func (inLine) judged(*entry, bool) bool   { return true }
func (inLine) beside(*entry, func()) bool { return false }

// deliverOrdered delivers ds as batches in queue order. The messages up to
// the first that fails are settled; that one is held in place as a single
// ordered delivery is (its retry waits out its delay), and the messages
// after it are not settled on this answer: they go again with it, in the
// next request, so none is acked ahead of it. A batch that failed as a
// whole without an answer is split: its first half goes next, alone.
func (p *Loop) deliverOrdered(ctx context.Context, ds []*member, since time.Time) {
	size := len(ds)
	for len(ds) > 0 {
		sub := ds[:min(size, len(ds))]
		es, v := p.deliverOnce(ctx, sub, since, size < len(ds))
		if es == nil {
			ds = unsettled(ds)
			size = len(ds)
			continue
		}
		if len(es) > 1 && batch.Splits(v.whole) && p.holdable(since) {
			p.endUnsettled(es, "split")
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
			if p.lost(e.d.(*member)) {
				// Back in the queue already, ahead of what follows it.
				p.endUnsettled(es[i:i+1], "channel-closed")
				continue
			}
			if p.conclude(e, v.entries[i], v.latency, since, inLine{}) {
				// Held in place: it and every message after it go again.
				p.endUnsettled(es[i+1:], "behind-failed")
				break
			}
			if p.stopped() {
				p.endUnsettled(es[i+1:], "shutdown")
				p.giveBackAll(ctx, deliveries(unsettled(ds)))
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
func (p *Loop) holdable(since time.Time) bool {
	return !p.stopped() && p.o.Now().Sub(since) < p.o.MoveHoldMax/2
}

// endUnsettled ends the attempt spans of entries whose answer is not
// acted on, saying why.
func (p *Loop) endUnsettled(es []*entry, why string) {
	for _, e := range es {
		if e.span.IsRecording() {
			e.span.SetAttributes(keyDecision.String("none"), keyBatchAgain.String(why))
		}
		e.span.End()
	}
}

// lost says whether d's channel is closed, and the first time it finds so
// counts it and marks d settled: the broker has put the message back (and
// redelivers it), so nothing Hopper could still do with d would count,
// and another request with it would only reach the app with a message
// that can no longer be settled.
func (p *Loop) lost(d *member) bool {
	if alive(d.Delivery) {
		return false
	}
	if d.settled.CompareAndSwap(false, true) {
		p.Stats.SettleFailed.Add(1)
	}
	return true
}

// entriesHeld says whether any of es can still be settled: while one
// can, a wait for them goes on.
func entriesHeld(es []*entry) func() bool {
	return func() bool {
		for _, e := range es {
			if alive(e.d) {
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

// movesUnderWay is the number of ds whose move, or request of its own
// (deliverAlone), started beside the goroutine handling their batch, has
// not ended.
func movesUnderWay(ds []*member) int {
	n := 0
	for _, d := range ds {
		if c := d.besides(); c != nil {
			select {
			case <-c:
			default:
				n++
			}
		}
	}
	return n
}

// besides is closed when what was started for d beside the goroutine
// handling its batch has ended: its request of its own, or its move; nil
// when nothing was. Only that goroutine may ask.
func (d *member) besides() chan struct{} {
	if d.away != nil {
		// Sent away: its own goroutine moves it, and says when done.
		return d.away
	}
	return d.moving
}

func deliveries(ds []*member) []Delivery {
	out := make([]Delivery, len(ds))
	for i, d := range ds {
		out[i] = d
	}
	return out
}

// recoverBatch turns a panic while handling a batch into returning each
// message not settled yet as a crash suspect: which message the failure
// belongs to is unknown, and delivered on its own, the one at fault is
// dead-lettered with reason hopper-error. The panic is logged with its
// stack and counted.
//
// A message whose move was under way when the panic came (a batch's moves
// run beside the loop that concludes it), or that was sent in a request of
// its own beside the worker, is settled by that move or request; returned
// as well, it would be in two queues and its delivery settled twice. So
// the recovery first waits for those, and returns only what none of them
// settled.
func (p *Loop) recoverBatch(ctx context.Context, ds []*member) {
	r := recover()
	if r == nil {
		return
	}
	if n := movesUnderWay(ds); n > 0 {
		p.log.Warn("internal error while handling a batch; waiting for the moves under way before returning the rest", "event", "BATCH_RECOVERY_WAITING",
			"size", len(ds), "moves", n, "error", msg.Truncate(fmt.Sprintf("internal error: %v", r), msg.MaxErrorLen))
		for _, d := range ds {
			if c := d.besides(); c != nil {
				<-c
			}
		}
	}
	left := unsettled(ds)
	if len(left) == 1 {
		// Alone, the message is the cause: set aside as a single
		// delivery's would be.
		p.internalError(ctx, &left[0].settleOnce, r)
		return
	}
	p.Stats.InternalErrors.Add(1)
	p.obs.InternalError()
	p.log.Error("internal error while handling a batch; its messages not settled go back to be delivered each on its own", "event", "HOPPER_INTERNAL_ERROR",
		"size", len(ds), "returned", len(left), "error", msg.Truncate(fmt.Sprintf("internal error: %v", r), msg.MaxErrorLen), "stack", string(debug.Stack()))
	for _, d := range left {
		if d.settled.Load() {
			continue
		}
		func() {
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
		}()
	}
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
func (p *Loop) giveBackAll(ctx context.Context, ds []Delivery) {
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

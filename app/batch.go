package app

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/hopper-sidecar/hopper/batch"
)

// HdrBatchSize tells the app how many entries a batch request holds.
const HdrBatchSize = "Hopper-Batch-Size"

// bodies keeps the buffers batch requests are written into: a batch
// body is as large as its messages, and most batches are alike.
var bodies = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// fieldsPool keeps the storage of a batch's entry headers, all entries'
// in one array.
var fieldsPool = sync.Pool{New: func() any { h := make([]Header, 0, 32*24); return &h }}

// maxPooledFields is the most entry headers whose storage is kept.
const maxPooledFields = 64 << 10

// maxPooledBody is the largest batch body buffer kept for reuse.
const maxPooledBody = 4 << 20

// DeliverBatch POSTs the messages of r in one request and reads the app's
// answer into an outcome per message. Each entry carries the headers a
// request of its own would carry, within the same forwarding limits. The
// whole request is classified as a single one is, so the breaker, the
// limiter and the pacer count batch requests as they count requests.
func (a *Client) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)

	n := r.Len()
	ctx, span := a.opts.Tracer.Start(ctx, "POST", clientSpan)
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(a.spanAttrs...)
		span.SetAttributes(semconv.MessagingBatchMessageCount(n))
	}

	ids := batch.IDs(n, func(i int) string { return CloudEventID(r.Messages[i], r.Infos[i]) })
	entries := make([]batch.Entry, n)
	// One backing array for every entry's headers: an entry's are a
	// slice of it, which later appends (even ones that move it) leave
	// as they are.
	hp := fieldsPool.Get().(*[]Header)
	hdrs := (*hp)[:0]
	defer func() {
		if cap(hdrs) <= maxPooledFields {
			clear(hdrs[:cap(hdrs)])
			*hp = hdrs[:0]
			fieldsPool.Put(hp)
		}
	}()
	var om Omitted
	// One list of an entry's own headers for the whole batch: Build
	// copies them into the entry's, and a list of each entry's own would
	// be an allocation for every message.
	var extra traceHeaders
	for i, m := range r.Messages {
		in := r.Infos[i]
		extra = extra[:0]
		if a.opts.CloudEvents {
			extra = CloudEventHeaders(extra, m, in)
		}
		if sc := r.Traces[i]; sc.IsValid() {
			propagator.Inject(trace.ContextWithSpanContext(ctx, sc), &extra)
		}
		var o Omitted
		start := len(hdrs)
		hdrs, o = a.opts.Limits.Build(hdrs, m, in, extra, Head{})
		om.add(o)
		entries[i] = batch.Entry{ID: ids[i], Fields: hdrs[start:len(hdrs):len(hdrs)], ContentType: cut(cleanValue(m.ContentType), ownValueMax), Body: m.Body}
	}
	a.countOmitted(om)

	buf := bodies.Get().(*[]byte)
	defer func() {
		// A body grown for one outsized message is not kept for the next
		// batch.
		if cap(*buf) <= maxPooledBody {
			bodies.Put(buf)
		}
	}()
	ct := batch.ContentTypeJSON
	if a.opts.CloudEvents {
		ct = batch.ContentTypeCloudEvents
		*buf = batch.AppendCloudEvents((*buf)[:0], entries)
	} else {
		*buf = batch.AppendJSON((*buf)[:0], entries)
	}
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(a.url(r.Infos[0]))
	req.Header.SetContentType(ct)
	req.Header.Set(HdrBatchSize, strconv.Itoa(n))
	req.Header.Set(HdrQueue, cut(cleanValue(r.Infos[0].Queue), ownValueMax))
	var tp traceHeaders
	propagator.Inject(ctx, &tp)
	for _, h := range tp {
		req.Header.Set(h.Name, h.Value)
	}
	req.SetBodyRaw(*buf)
	var id string
	if a.opts.Auth.signs() {
		id = BatchDeliveryID(ids)
	}
	creds, _ := a.credentials(id)
	creds.authenticate(req)

	whole := a.exchange(ctx, span, req, resp)
	outs, err := batch.Read(whole, resp.Body(), ids, time.Now())
	if err != nil && span.IsRecording() {
		span.SetAttributes(attribute.String("hopper.batch.unread", err.Error()))
	}
	return batch.Answer{Whole: whole, Entries: outs, Unread: err}
}

// add sums what two requests' limits left out.
func (o *Omitted) add(p Omitted) {
	o.Invalid += p.Invalid
	o.ValueTooLong += p.ValueTooLong
	o.MaxHeaders += p.MaxHeaders
	o.MaxHeaderBytes += p.MaxHeaderBytes
}

// countOmitted records what the forwarding limits left out.
func (a *Client) countOmitted(om Omitted) {
	if om.Invalid > 0 {
		a.HeadersSkipped.Add(int64(om.Invalid))
	}
	for i, n := range [...]int{om.ValueTooLong, om.MaxHeaders, om.MaxHeaderBytes} {
		if n > 0 {
			a.omitted[i].Add(int64(n))
		}
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/valyala/fasthttp"

	happ "github.com/hopper-sidecar/hopper/app"
	hbatch "github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/msg"
)

// The batch path asks what delivering many messages per request buys, on
// the happy path's backlog and app. Each run drains the backlog five
// times (one more with --raw-contract, one more with --baseline-bin), in
// turn:
//
//   - raw: the happy path's raw worker, one POST per message, at --prefetch
//     and --workers: what a consumer gets without batching;
//   - floor: `hopperbench raw-worker --floor`, no app at all, a consumer
//     at --batch-prefetch acking with one multiple-ack every --batch-size
//     deliveries: what the broker alone hands out to a consumer of
//     Hopper's shape, which no consumer of this queue can beat. It is a
//     process of its own, started and measured as Hopper is: its window
//     runs from the request it sends the app at its first delivery to the
//     one it sends once the broker has taken its last ack, and its CPU is
//     its own. The rate it gets varies with the prefetch (at 32 about a
//     fifth less than at 256), with one ack per message instead of
//     multiple-acks (about a third less) and with what else the machine
//     runs (it needs about a core: the broker's queue process and the
//     consumer); it does not depend on whether the floor runs in this
//     process or its own, nor on whether its window starts at the consume
//     or at the first delivery (a few milliseconds);
//   - rawbatch: `hopperbench raw-worker --batch`, a hand-written batching
//     loop: on each of --batch-workers channels, take --batch-size
//     deliveries, POST them as one JSON envelope, multiple-ack after the
//     2xx. Its envelope carries only what the bench app reads (entry id,
//     message id, attempt, content type, body);
//   - rawbatchc (--raw-contract): the same loop sending, per batch, the
//     envelope Hopper's contract has (raw-worker --batch --contract, see
//     contractBatch): every entry with the headers a request of its own
//     would carry, built by Hopper's own functions, and the request
//     headers of Hopper's batch request, and nothing else of Hopper. Its
//     envelope is larger than rawbatch's (by about a third with 256-byte
//     bodies: six headers an entry instead of two), and the app parses
//     all of it on the same cores: against rawbatch it tells what the
//     contract's envelope costs a loop and its app, and against it Hopper
//     is held to what its contract requires rather than to a loop that
//     sends less;
//   - hopper: Hopper with consumer.batch.maxMessages = --batch-size at
//     --batch-prefetch and --batch-workers, the app acking every entry with
//     an empty 200;
//   - base: the same with --baseline-bin, when it is set;
//   - hopper-retry: the same Hopper, the app answering a results body in
//     which every batchRetryEvery-th message gets 503 the first time it is
//     seen, so it goes once through the retry path's delay tier (--tier)
//     before its 200.
//
// The lines are
//
//	bench: batch size=S hopper=R1/s raw=R2/s floor=R3/s of_floor=X ratio=Y cpu_ratio=C rss_mb=Z anon_mb=A
//	bench: batch-raw size=S rawbatch=R4/s ratio=X
//	bench: batch-retry size=S hopper=R5/s of_happy=X
//
// with ratio = hopper/raw on the first line and hopper/rawbatch on the
// second, of_floor = hopper/floor, of_happy = hopper-retry/hopper, all of
// medians; cpu_ratio is Hopper's CPU per message over the raw worker's,
// rss_mb Hopper's peak RSS and anon_mb its peak anonymous RSS. of_floor
// is the share of the broker's own ceiling for this shape of consumer,
// in this run and on this machine, that Hopper reaches with the app's
// round trips and its own work on the same cores; 1 would be a Hopper
// that costs the broker nothing more than taking and acking the
// messages. With --baseline-bin, the line
//
//	baseline: batch size=S base=R/s raw=R2/s floor=R3/s of_floor=X ratio=Y cpu_ratio=C rss_mb=Z anon_mb=A
//
// is the batch line of the baseline binary in the same run. With
// --raw-contract, the line
//
//	contract: batch size=S hopper=R1/s rawbatchc=R6/s ratio=X cpu_ratio=C raw_cpu_ratio=D rawbatchc_ratio=Y
//
// (and, with --baseline-bin, the same line with base= for hopper=) has
// ratio = hopper/rawbatchc and rawbatchc_ratio = rawbatchc/rawbatch, of
// medians, cpu_ratio = Hopper's CPU per message over rawbatchc's and
// raw_cpu_ratio = rawbatchc's over rawbatch's.

const (
	// batchRetryEvery: on the batch-retry run, the messages whose id ends
	// in a multiple of it are answered 503 once.
	batchRetryEvery = 10
	// rawBatchWait is how long the raw batching loop waits for a batch to
	// fill after its first delivery: only the last, partial batches of a
	// drain ever wait for it.
	rawBatchWait = 10 * time.Millisecond
)

// batchWho are the batch path's consumers, in the order each run drains;
// rawbatchc (--raw-contract) drains after rawbatch and base
// (--baseline-bin) after hopper, when they are set.
var batchWho = []string{"raw", "floor", "rawbatch", "rawbatchc", "hopper", "base", "hopper-retry"}

// batchEnvelope is the body of a batch request: the fields the app reads.
type batchEnvelope struct {
	Entries []batchEntry `json:"entries"`
}

type batchEntry struct {
	ID      string `json:"id"`
	Headers struct {
		MessageID string `json:"Hopper-Message-Id"`
		Attempt   string `json:"Hopper-Attempt"`
	} `json:"headers"`
	Data       json.RawMessage `json:"data"`
	DataBase64 *string         `json:"data_base64"`
}

// check tells what breaks the envelope's rules in an entry, or "".
func (en *batchEntry) check() string {
	switch {
	case en.ID == "":
		return "an entry without an id"
	case en.Headers.MessageID == "":
		return fmt.Sprintf("entry %s: no Hopper-Message-Id header", en.ID)
	case en.Headers.Attempt == "":
		return fmt.Sprintf("entry %s: no Hopper-Attempt header", en.ID)
	case (en.Data == nil) == (en.DataBase64 == nil):
		return fmt.Sprintf("entry %s: want exactly one of data and data_base64", en.ID)
	case en.DataBase64 != nil:
		if _, err := base64.StdEncoding.DecodeString(*en.DataBase64); err != nil {
			return fmt.Sprintf("entry %s: data_base64: %v", en.ID, err)
		}
	}
	return ""
}

// answer is the status of one message in a batch mode: 503 the first time
// a batchRetryEvery-th message is seen in modeBatchRetry, else 200.
func (r *appRun) answer(messageID []byte) int {
	if r.mode != modeBatchRetry {
		return fasthttp.StatusOK
	}
	i := idSeq(messageID)
	if i < 0 || i%batchRetryEvery != 0 || i >= len(r.seen) {
		return fasthttp.StatusOK
	}
	if !r.seen[i].Swap(true) {
		r.entries503.Add(1)
		return fasthttp.StatusServiceUnavailable
	}
	return fasthttp.StatusOK
}

// fail records the first thing the app found wrong with what it was sent;
// the run stops on it.
func (r *appRun) fail(why string) {
	r.badEntries.Add(1)
	r.brokenOnce.Do(func() {
		r.brokenWhy = why
		close(r.broken)
	})
}

// handleBatch answers a request in a batch mode and returns how many
// messages it answered 200. A request that is not a JSON envelope is one
// message sent alone (Hopper sends a crash suspect alone), answered as an
// entry would be.
func (a *app) handleBatch(ctx *fasthttp.RequestCtx, r *appRun) int64 {
	if !bytes.HasPrefix(ctx.Request.Header.ContentType(), []byte("application/json")) {
		if st := r.answer(ctx.Request.Header.Peek(hdrMessageID)); st != fasthttp.StatusOK {
			ctx.SetStatusCode(st)
			return 0
		}
		return 1
	}
	var env batchEnvelope
	if err := json.Unmarshal(ctx.PostBody(), &env); err != nil || len(env.Entries) == 0 {
		why := "no entries"
		if err != nil {
			why = err.Error()
		}
		r.fail("batch request: " + why)
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		return 0
	}
	r.batches.Add(1)
	r.entries.Add(int64(len(env.Entries)))
	for i := range env.Entries {
		if why := env.Entries[i].check(); why != "" {
			r.fail(why)
			ctx.SetStatusCode(fasthttp.StatusBadRequest)
			return 0
		}
	}
	if r.mode != modeBatchRetry {
		return int64(len(env.Entries)) // an empty 200 acks every entry
	}
	var ok int64
	b := make([]byte, 0, 16+40*len(env.Entries))
	b = append(b, `{"results":[`...)
	for i := range env.Entries {
		en := &env.Entries[i]
		st := r.answer([]byte(en.Headers.MessageID))
		if st == fasthttp.StatusOK {
			ok++
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, en.ID)
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(st), 10)
		b = append(b, '}')
	}
	b = append(b, "]}"...)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
	return ok
}

// appendJSONString appends s as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// isJSONType tells whether a content type says JSON (application/json or
// a */*+json type), parameters aside.
func isJSONType(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	ct = strings.ToLower(strings.TrimSpace(ct))
	return ct == "application/json" || (strings.HasSuffix(ct, "+json") && strings.Contains(ct, "/"))
}

// appendEnvelope appends the JSON envelope of deliveries, carrying the
// headers the bench app reads: the message id (also the entry id) and the
// attempt.
func appendEnvelope(b []byte, ds []amqp.Delivery) []byte {
	b = append(b, `{"entries":[`...)
	for i := range ds {
		d := &ds[i]
		if i > 0 {
			b = append(b, ',')
		}
		retries, _ := asInt(d.Headers["x-retry-count"])
		ct := d.ContentType
		if ct == "" {
			ct = "application/octet-stream"
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, d.MessageId)
		b = append(b, `,"headers":{"`+hdrMessageID+`":`...)
		b = appendJSONString(b, d.MessageId)
		b = append(b, `,"`+hdrAttempt+`":"`...)
		b = strconv.AppendInt(b, retries+1, 10)
		b = append(b, `"},"datacontenttype":`...)
		b = appendJSONString(b, ct)
		if isJSONType(ct) && json.Valid(d.Body) {
			b = append(b, `,"data":`...)
			b = append(b, d.Body...)
		} else {
			b = append(b, `,"data_base64":"`...)
			b = base64.StdEncoding.AppendEncode(b, d.Body)
			b = append(b, '"')
		}
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// contractBatch builds the body of a batch request as Hopper's contract
// has it, with the functions Hopper builds it with: each entry's id
// (batch.IDs over app.CloudEventID), the headers a request of its own
// would carry (app.BuildHeaders on the message as Hopper's consumer hands
// it over and msg.Read), its content type and its body, written by
// batch.AppendJSON. What it leaves out is the rest of Hopper: breaker,
// limiter, acker, spans, metrics. Against it, Hopper's CPU per message is
// what Hopper costs beyond the envelope its contract requires, and the app
// parses the same envelope from both.
//
// Hopper cleans an entry's content type and the Hopper-Queue value and
// cuts them at 512 bytes; app.SanitizeValue cleans them the same way and
// cuts at 4096. AMQP carries a content type and a queue name in at most
// 255 bytes, so the two give the same value for every delivery.
//
// Its storage is kept from one batch to the next, as Hopper keeps its
// entry headers' and body's.
type contractBatch struct {
	queue   string
	msgs    []*msg.Message
	infos   []msg.Info
	entries []hbatch.Entry
	fields  []happ.Header
}

// appendEnvelope appends the envelope of ds to dst, read as at now.
func (c *contractBatch) appendEnvelope(dst []byte, ds []amqp.Delivery, now time.Time) []byte {
	c.msgs, c.infos = c.msgs[:0], c.infos[:0]
	for i := range ds {
		m := deliveryMessage(&ds[i])
		c.msgs = append(c.msgs, m)
		c.infos = append(c.infos, msg.Read(m, c.queue, "", now))
	}
	ids := hbatch.IDs(len(ds), func(i int) string { return happ.CloudEventID(c.msgs[i], c.infos[i]) })
	// One backing array for every entry's headers, as Hopper has it: an
	// entry's are a full slice of it, which a later append that moves the
	// array leaves as it is.
	c.fields, c.entries = c.fields[:0], c.entries[:0]
	for i, m := range c.msgs {
		start := len(c.fields)
		c.fields, _ = happ.BuildHeaders(c.fields, m, c.infos[i])
		c.entries = append(c.entries, hbatch.Entry{ID: ids[i], Fields: c.fields[start:len(c.fields):len(c.fields)],
			ContentType: happ.SanitizeValue(m.ContentType), Body: m.Body})
	}
	return hbatch.AppendJSON(dst, c.entries)
}

// setHeaders sets the request headers Hopper's batch request carries
// besides its content type: the number of entries and the queue they came
// from (every entry's msg.Info names the work queue).
func (c *contractBatch) setHeaders(req *fasthttp.Request, n int) {
	req.Header.Set(happ.HdrBatchSize, strconv.Itoa(n))
	req.Header.Set(happ.HdrQueue, happ.SanitizeValue(c.queue))
}

// runRawBatch is the hand-written batching loop: workers channels on one
// connection, each consuming at prefetch/workers (at least size), taking
// up to size deliveries (waiting at most rawBatchWait for a batch to
// fill), POSTing them as one envelope and acking them with one
// multiple-ack after a 2xx. Each channel has one batch in flight, so a
// multiple-ack never covers another batch's deliveries. It knows the happy
// path only: any other answer requeues the batch.
func runRawBatch(ctx context.Context, url, queue string, prefetch, workers, size int, w *rawWorker) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	w.client = newRawClient(workers, w.timeout)
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	chans := make([]*amqp.Channel, workers)
	var wg sync.WaitGroup
	for i := range workers {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("channel: %w", err)
		}
		if err := ch.Qos(max(size, prefetch/workers), 0, false); err != nil { // prefetchSize=0, global=false
			return fmt.Errorf("qos: %w", err)
		}
		deliveries, err := ch.Consume(queue, "rawbatch-"+strconv.Itoa(i),
			false, // autoAck
			false, // exclusive
			false, // noLocal
			false, // noWait
			nil)
		if err != nil {
			return fmt.Errorf("consume: %w", err)
		}
		chans[i] = ch
		wg.Go(func() { w.batchLoop(deliveries, size) })
	}
	select {
	case <-ctx.Done():
	case e := <-closed:
		return fmt.Errorf("connection closed: %v", e)
	}
	// Stop taking deliveries, let the batches in flight settle, then close.
	for i, ch := range chans {
		if err := ch.Cancel("rawbatch-"+strconv.Itoa(i), false); err != nil { // noWait=false
			return fmt.Errorf("cancel: %w", err)
		}
	}
	wg.Wait()
	return nil
}

// batchLoop is one channel's loop of the raw batching worker; with
// --contract, each channel builds its bodies in a contractBatch of its own.
func (w *rawWorker) batchLoop(deliveries <-chan amqp.Delivery, size int) {
	batch := make([]amqp.Delivery, 0, size)
	var body []byte
	var cb *contractBatch
	if w.contract {
		cb = &contractBatch{queue: w.queue}
	}
	timer := time.NewTimer(rawBatchWait)
	timer.Stop()
	for d := range deliveries {
		batch = append(batch[:0], d)
		timer.Reset(rawBatchWait)
	fill:
		for len(batch) < size {
			select {
			case d, ok := <-deliveries:
				if !ok {
					break fill
				}
				batch = append(batch, d)
			case <-timer.C:
				break fill
			}
		}
		timer.Stop()
		body = w.postBatch(body[:0], batch, cb)
	}
}

// postBatch POSTs one batch, its body built by cb when set (else the small
// envelope of appendEnvelope), and settles it; it returns the body buffer
// for reuse.
func (w *rawWorker) postBatch(body []byte, batch []amqp.Delivery, cb *contractBatch) []byte {
	rawHandled.Add(int64(len(batch)))
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(w.appURL)
	req.Header.SetContentType("application/json")
	if cb != nil {
		body = cb.appendEnvelope(body, batch, time.Now())
		cb.setHeaders(req, len(batch))
	} else {
		body = appendEnvelope(body, batch)
	}
	req.SetBodyRaw(body)
	err := w.client.DoTimeout(req, resp, w.timeout)
	last := &batch[len(batch)-1]
	if err == nil && resp.StatusCode() >= 200 && resp.StatusCode() <= 299 && len(bytes.TrimSpace(resp.Body())) == 0 {
		_ = last.Ack(true) // multiple=true: the whole batch
		return body
	}
	if err == nil {
		err = fmt.Errorf("status %d, body %q", resp.StatusCode(), resp.Body())
	}
	fmt.Fprintf(os.Stderr, "raw-worker: batch of %d requeued: %v\n", len(batch), err)
	_ = last.Nack(true, true) // multiple=true, requeue=true
	return body
}

// runFloor is the broker's floor as a process of its own, started and
// measured as Hopper is: no app work, prefetch deliveries in flight, one
// multiple-ack every `every` deliveries (and one for the rest at the end).
// It tells the app at appURL when its first delivery came (a request the
// app takes as the run's first, as it takes Hopper's first) and, once the
// broker has taken the last ack (a synchronous call on the channel after
// it, which the broker answers only once it has handled what came
// before), that n messages are done. It then waits for ctx, so that the
// benchmark stops it as it stops Hopper.
func runFloor(ctx context.Context, url, queue, appURL string, n, prefetch, every int) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil { // prefetchSize=0, global=false
		return fmt.Errorf("floor: %w", err)
	}
	deliveries, err := ch.Consume(queue, "floor", false, false, false, false, nil) // autoAck, exclusive, noLocal, noWait
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	client := newRawClient(1, 30*time.Second)
	tell := func(final int) error {
		req := fasthttp.AcquireRequest()
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI(appURL)
		req.Header.Set(hdrFloorFinal, strconv.Itoa(final))
		if err := client.DoTimeout(req, resp, 30*time.Second); err != nil {
			return fmt.Errorf("floor: tell the app: %w", err)
		}
		return nil
	}
	first := make(chan error, 1)
	for i := 1; i <= n; i++ {
		var d amqp.Delivery
		var ok bool
		select {
		case d, ok = <-deliveries:
		case <-ctx.Done():
			return fmt.Errorf("floor: %d of %d delivered: %w", i-1, n, ctx.Err())
		}
		if !ok {
			return fmt.Errorf("floor: consumer closed after %d of %d deliveries", i-1, n)
		}
		if i == 1 {
			go func() { first <- tell(0) }()
		}
		if i%every == 0 || i == n {
			if err := d.Ack(true); err != nil { // multiple=true
				return fmt.Errorf("floor: %w", err)
			}
		}
	}
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil { // durable, autoDelete, exclusive, noWait
		return fmt.Errorf("floor: %w", err)
	}
	if err := <-first; err != nil {
		return err
	}
	if err := tell(n); err != nil {
		return err
	}
	if err := ch.Cancel("floor", false); err != nil { // noWait=false
		return fmt.Errorf("floor: %w", err)
	}
	<-ctx.Done()
	return nil
}

// batchSetting is Hopper's setting on the batch path.
func (o *options) batchSetting() consumerSetting {
	return consumerSetting{prefetch: o.batchPrefetch, workers: o.batchWorkers, batch: o.batchSize, batchWait: o.batchWait}
}

// batching drains the backlog with each of batchWho per run.
func (e *env) batching() (map[string][]runResult, error) {
	out := map[string][]runResult{}
	for run := 1; run <= e.o.runs; run++ {
		for _, who := range batchWho {
			if who == "base" && e.baseBin == "" || who == "rawbatchc" && !e.o.rawContract {
				continue
			}
			tag := fmt.Sprintf("bench-batch-%s-%d", who, run)
			var s spec
			switch who {
			case "raw":
				s = e.newSpec(tag, "raw", modeOK)
			case "floor", "rawbatch", "rawbatchc":
				// Hopper's config only declares their topology.
				s = e.newSpec(tag, who, modeBatch)
				s.consumer = consumerSetting{prefetch: e.o.batchPrefetch, workers: e.o.batchWorkers}
			case "hopper", "base":
				s = e.newSpec(tag, who, modeBatch)
				s.consumer = e.o.batchSetting()
			case "hopper-retry":
				s = e.newSpec(tag, "hopper", modeBatchRetry)
				s.consumer = e.o.batchSetting()
			}
			s.n = e.o.n
			res, err := e.drain(s)
			if err != nil {
				return nil, fmt.Errorf("batch path, %s run %d: %w", who, run, err)
			}
			out[who] = append(out[who], res)
			logRun("batch", who, run, e.o.runs, res)
			if res.batches > 0 {
				logf("      %d batch requests, %.1f entries per request", res.batches, float64(res.entries)/float64(res.batches))
			}
		}
	}
	return out, nil
}

// batchFigures are the medians the batch lines report.
type batchFigures struct {
	hopper, raw, floor, rawbatch, retry float64 // rates
	cpuRatio, rssMB, anonMB             float64
}

func (rep *report) batchFigures() batchFigures {
	return rep.batchFiguresOf("hopper")
}

// batchFiguresOf are the batch figures with who (hopper or base) in
// Hopper's place.
func (rep *report) batchFiguresOf(who string) batchFigures {
	med := func(who string) float64 { return summarize(rates(rep.batch[who])).med }
	return batchFigures{
		hopper: med(who), raw: med("raw"), floor: med("floor"), rawbatch: med("rawbatch"), retry: med("hopper-retry"),
		cpuRatio: consumerCPU(rep.batch[who]) / consumerCPU(rep.batch["raw"]),
		rssMB:    maxHWM(rep.batch[who]),
		anonMB:   maxAnon(rep.batch[who]),
	}
}

// baselineBatchLine is the batch line of --baseline-bin.
func (rep *report) baselineBatchLine() string {
	f := rep.batchFiguresOf("base")
	return fmt.Sprintf("baseline: batch size=%d base=%.0f/s raw=%.0f/s floor=%.0f/s of_floor=%.3f ratio=%.3f cpu_ratio=%.2f rss_mb=%.1f anon_mb=%.1f",
		rep.o.batchSize, f.hopper, f.raw, f.floor, f.hopper/f.floor, f.hopper/f.raw, f.cpuRatio, f.rssMB, f.anonMB)
}

// printBatch writes the batch path's table.
func (rep *report) printBatch(w io.Writer, o *options) {
	fmt.Fprintf(w, "batch: %d messages per request; raw at prefetch %d/workers %d, one POST per message; floor: no app, a multiple-ack every %d deliveries at prefetch %d;\n",
		o.batchSize, o.prefetch, o.workers, o.batchSize, o.batchPrefetch)
	wait := "not set"
	if o.batchWait > 0 {
		wait = config.FormatDuration(o.batchWait)
	}
	loops := "rawbatch"
	if len(rep.batch["rawbatchc"]) > 0 {
		loops = "rawbatch (its own envelope), rawbatchc (the contract's envelope)"
	}
	fmt.Fprintf(w, "%s and hopper at prefetch %d/workers %d (batch requests in flight), hopper's maxWait %s; hopper-retry: every %dth message answered 503 once, %s tier\n",
		loops, o.batchPrefetch, o.batchWorkers, wait, batchRetryEvery, config.FormatDuration(o.tier))
	fmt.Fprintf(w, "%-13s %9s %9s %9s %10s %10s %10s %8s %8s %9s %8s\n", "client", "median/s", "min/s", "max/s", "cpu_s/100k", "broker_cpu", "app_cpu", "rss_MiB", "anon_MiB", "per_req", "others")
	for _, who := range batchWho {
		rs := rep.batch[who]
		if len(rs) == 0 {
			continue
		}
		s := summarize(rates(rs))
		var others, perReq []float64
		for _, r := range rs {
			others = append(others, r.others)
			if r.batches > 0 {
				perReq = append(perReq, float64(r.entries)/float64(r.batches))
			}
		}
		per := "-"
		if len(perReq) > 0 {
			per = fmt.Sprintf("%.1f", summarize(perReq).med)
		}
		fmt.Fprintf(w, "%-13s %9.0f %9.0f %9.0f %10.2f %10.2f %10.2f %8.1f %8.1f %9s %8.2f\n", who, s.med, s.min, s.max, consumerCPU(rs),
			summarize(cpus(rs, func(r runResult) time.Duration { return r.broker })).med,
			summarize(cpus(rs, func(r runResult) time.Duration { return r.appCPU })).med,
			maxHWM(rs), maxAnon(rs), per, summarize(others).med)
	}
	f := rep.batchFigures()
	contract := ""
	if rc := rep.batch["rawbatchc"]; len(rc) > 0 {
		c := summarize(rates(rc)).med
		contract = fmt.Sprintf(", hopper/rawbatchc %.3f, cpu ratio (hopper/rawbatchc per message) %.2f",
			f.hopper/c, consumerCPU(rep.batch["hopper"])/consumerCPU(rc))
	}
	fmt.Fprintf(w, "batch  hopper/raw %.3f, hopper/floor %.3f, hopper/rawbatch %.3f, retry/happy %.3f, cpu ratio (hopper/raw per message) %.2f%s\n\n",
		f.hopper/f.raw, f.hopper/f.floor, f.hopper/f.rawbatch, f.retry/f.hopper, f.cpuRatio, contract)
}

// contractBatchLines are the batch path's lines of --raw-contract: Hopper
// (and the baseline, when it ran) against the batching loop sending the
// contract's envelope, rawbatchc (ratio of the rates, cpu_ratio of the CPU
// per message: what Hopper costs beyond the envelope), and that loop
// against the plain one (raw_cpu_ratio, rawbatchc_ratio: what the
// contract's envelope costs a loop, its own building and the app's
// parsing on the same cores).
func (rep *report) contractBatchLines() []string {
	rc := rep.batch["rawbatchc"]
	if len(rc) == 0 {
		return nil
	}
	plain := rep.batch["rawbatch"]
	c, p := summarize(rates(rc)).med, summarize(rates(plain)).med
	var out []string
	for _, who := range []string{"hopper", "base"} {
		runs := rep.batch[who]
		if len(runs) == 0 {
			continue
		}
		h := summarize(rates(runs)).med
		out = append(out, fmt.Sprintf("contract: batch size=%d %s=%.0f/s rawbatchc=%.0f/s ratio=%.3f cpu_ratio=%.2f raw_cpu_ratio=%.2f rawbatchc_ratio=%.3f",
			rep.o.batchSize, who, h, c, h/c, consumerCPU(runs)/consumerCPU(rc), consumerCPU(rc)/consumerCPU(plain), c/p))
	}
	return out
}

// batchLines are the batch path's summary lines.
func (rep *report) batchLines() []string {
	f := rep.batchFigures()
	size := rep.o.batchSize
	return []string{
		fmt.Sprintf("bench: batch size=%d hopper=%.0f/s raw=%.0f/s floor=%.0f/s of_floor=%.3f ratio=%.3f cpu_ratio=%.2f rss_mb=%.1f anon_mb=%.1f",
			size, f.hopper, f.raw, f.floor, f.hopper/f.floor, f.hopper/f.raw, f.cpuRatio, f.rssMB, f.anonMB),
		fmt.Sprintf("bench: batch-raw size=%d rawbatch=%.0f/s ratio=%.3f", size, f.rawbatch, f.hopper/f.rawbatch),
		fmt.Sprintf("bench: batch-retry size=%d hopper=%.0f/s of_happy=%.3f", size, f.retry, f.retry/f.hopper),
	}
}

// errBatchEnvelope is what a run reports when the app found a batch
// request breaking the envelope's rules.
var errBatchEnvelope = errors.New("the app got a batch request that breaks the envelope's rules")

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	happ "github.com/hopper-sidecar/hopper/app"
	"github.com/hopper-sidecar/hopper/msg"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/valyala/fasthttp"
)

// rawWorker is the reference consumer: what a competent hand-written
// amqp091-go + fasthttp loop does, and nothing more. Manual acks at the same
// prefetch as Hopper, the same number of workers, one POST per message, ack
// after a 2xx. A 5xx (or any non-2xx but 400) is republished to the retry
// queue with x-retry-count+1, a 400 to the DLQ, both on a confirm-mode
// channel of a separate connection, acking the original after the confirm;
// a transport error nacks with requeue. It sends only the request headers the
// bench app reads (message id, attempt, send time).
type rawWorker struct {
	appURL, retryQueue, dlq string
	timeout                 time.Duration
	// contract makes the loop carry the headers Hopper's contract has it
	// carry (see handleContract); queue is the work queue they name.
	contract bool
	queue    string
	// sign, when set, signs every request as the Standard Webhooks
	// specification has it (--sign-secret).
	sign *rawSigner

	client *fasthttp.Client
	pool   chan *amqp.Channel
}

func rawWorkerMain(args []string) int {
	fs := flag.NewFlagSet("raw-worker", flag.ExitOnError)
	url := fs.String("broker", "", "AMQP URL")
	queue := fs.String("queue", "", "work queue")
	appURL := fs.String("app", "", "app URL (POST target)")
	retryQueue := fs.String("retry-queue", "", "queue a 5xx is republished to")
	dlq := fs.String("dlq", "", "queue a 400 is republished to")
	prefetch := fs.Int("prefetch", 200, "AMQP prefetch")
	workers := fs.Int("workers", 64, "concurrent deliveries")
	pubChannels := fs.Int("publish-channels", 8, "confirm-mode channels for republishes")
	timeout := fs.Duration("timeout", 30*time.Second, "per request")
	batch := fs.Int("batch", 0, "when > 1: the batching loop, one POST of a JSON envelope per this many deliveries (happy path only); with --contract, the envelope and request headers Hopper's batch request has")
	floorN := fs.Int("floor", 0, "when > 0: the broker's floor, no app: take this many deliveries, acking them with one multiple-ack every --every, tell the app (--app) when the first came and when the last ack was taken, then wait for SIGTERM")
	every := fs.Int("every", 32, "with --floor: deliveries per multiple-ack")
	signSecret := fs.String("sign-secret", "", "a file holding one whsec_ secret: sign every request with it as the Standard Webhooks specification has it (webhook-id, webhook-timestamp, webhook-signature)")
	contract := fs.Bool("contract", false, "send the request headers and write the copy headers Hopper's contract has (with Hopper's own header functions), and nothing else of Hopper")
	_ = fs.Parse(args)
	if *url == "" || *queue == "" || *appURL == "" {
		fmt.Fprintln(os.Stderr, "raw-worker: --broker, --queue and --app are required")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// For comparing profiles: HOPPERBENCH_RAW_PROFILE=DIR writes the raw
	// loop's CPU profile and allocation counts there (not the floor's: it
	// counts no handled deliveries).
	if dir := os.Getenv("HOPPERBENCH_RAW_PROFILE"); dir != "" && *floorN == 0 {
		done, err := profileRaw(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "raw-worker: profile:", err)
			return 1
		}
		defer done()
	}
	w := &rawWorker{appURL: *appURL, retryQueue: *retryQueue, dlq: *dlq, timeout: *timeout, contract: *contract, queue: *queue}
	if *signSecret != "" {
		var err error
		if w.sign, err = newRawSigner(*signSecret); err != nil {
			fmt.Fprintln(os.Stderr, "raw-worker:", err)
			return 2
		}
	}
	run := func() error { return runRaw(ctx, *url, *queue, *prefetch, *workers, *pubChannels, w) }
	if *batch > 1 {
		run = func() error { return runRawBatch(ctx, *url, *queue, *prefetch, *workers, *batch, w) }
	}
	if *floorN > 0 {
		run = func() error { return runFloor(ctx, *url, *queue, *appURL, *floorN, *prefetch, *every) }
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "raw-worker:", err)
		return 1
	}
	return 0
}

func runRaw(ctx context.Context, url, queue string, prefetch, workers, pubChannels int, w *rawWorker) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	pubConn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("dial publisher: %w", err)
	}
	defer pubConn.Close()
	w.pool = make(chan *amqp.Channel, pubChannels)
	for range pubChannels {
		pc, err := pubConn.Channel()
		if err != nil {
			return fmt.Errorf("publish channel: %w", err)
		}
		if err := pc.Confirm(false); err != nil { // noWait=false
			return fmt.Errorf("confirm mode: %w", err)
		}
		w.pool <- pc
	}
	w.client = newRawClient(workers, w.timeout)

	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("channel: %w", err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil { // prefetchSize=0, global=false
		return fmt.Errorf("qos: %w", err)
	}
	deliveries, err := ch.Consume(queue, "raw",
		false, // autoAck
		false, // exclusive
		false, // noLocal
		false, // noWait
		nil)
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range deliveries {
				// Not ctx: a delivery taken before SIGTERM is finished
				// (its move confirmed and acked), as Hopper does.
				w.handle(context.Background(), &d)
			}
		}()
	}
	select {
	case <-ctx.Done():
	case e := <-closed:
		return fmt.Errorf("connection closed: %v", e)
	}
	// Stop taking deliveries, let the in-flight ones settle, then close.
	if err := ch.Cancel("raw", false); err != nil { // noWait=false
		return fmt.Errorf("cancel: %w", err)
	}
	wg.Wait()
	return nil
}

// newRawClient is the raw loops' HTTP client: a connection per worker, no
// retries of its own.
func newRawClient(workers int, timeout time.Duration) *fasthttp.Client {
	return &fasthttp.Client{
		Name:                          "raw",
		MaxConnsPerHost:               workers + 4,
		MaxIdleConnDuration:           30 * time.Second,
		ReadTimeout:                   timeout,
		WriteTimeout:                  timeout,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
		RetryIfErr:                    func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
	}
}

// rawHandled counts deliveries, for the profile's per-message figures.
var rawHandled atomic.Int64

// profileRaw starts a CPU profile from the first delivery on; the returned
// func writes it and the allocation counts per message.
func profileRaw(dir string) (func(), error) {
	f, err := os.Create(filepath.Join(dir, "raw-cpu.pprof"))
	if err != nil {
		return nil, err
	}
	started := make(chan runtime.MemStats, 1)
	go func() {
		for rawHandled.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "raw-worker: cpu profile:", err)
		}
		started <- ms
	}()
	return func() {
		ms0 := <-started
		pprof.StopCPUProfile()
		f.Close()
		var ms1 runtime.MemStats
		runtime.ReadMemStats(&ms1)
		n := float64(rawHandled.Load())
		fmt.Fprintf(os.Stderr, "raw-worker: %0.f deliveries, allocs/msg=%.1f bytes/msg=%.0f gcs=%d\n",
			n, float64(ms1.Mallocs-ms0.Mallocs)/n, float64(ms1.TotalAlloc-ms0.TotalAlloc)/n, ms1.NumGC-ms0.NumGC)
	}, nil
}

func (w *rawWorker) handle(ctx context.Context, d *amqp.Delivery) {
	rawHandled.Add(1)
	if w.contract {
		w.handleContract(ctx, d)
		return
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)

	retries, _ := asInt(d.Headers["x-retry-count"])
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(w.appURL)
	ct := d.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	req.Header.SetContentType(ct)
	req.Header.Set(hdrMessageID, d.MessageId)
	req.Header.Set(hdrAttempt, strconv.FormatInt(retries+1, 10))
	if sent, ok := asInt(d.Headers[sentHeader]); ok {
		req.Header.Set(hdrSent, strconv.FormatInt(sent, 10))
	}
	req.SetBodyRaw(d.Body)
	if w.sign != nil {
		w.sign.sign(req, d.MessageId, time.Now().Unix(), d.Body)
	}

	err := w.client.DoTimeout(req, resp, w.timeout)
	var status int
	if err == nil {
		status = resp.StatusCode()
	}
	switch {
	case err != nil:
		_ = d.Nack(false, true) // multiple=false, requeue=true
	case status >= 200 && status <= 299:
		_ = d.Ack(false)
	case status == fasthttp.StatusBadRequest:
		w.move(ctx, d, w.dlq, retries)
	default:
		w.move(ctx, d, w.retryQueue, retries+1)
	}
}

// move publishes a copy with confirms, then acks; a failed publish nacks.
func (w *rawWorker) move(ctx context.Context, d *amqp.Delivery, queue string, retries int64) {
	h := make(amqp.Table, len(d.Headers)+1)
	for k, v := range d.Headers {
		h[k] = v
	}
	h["x-retry-count"] = int32(retries)
	w.moveWith(ctx, d, queue, h)
}

// moveWith publishes a copy of d carrying headers to queue with a
// confirm, then acks d; a failed publish nacks it.
func (w *rawWorker) moveWith(ctx context.Context, d *amqp.Delivery, queue string, headers amqp.Table) {
	pc := <-w.pool
	err := publishConfirmed(ctx, pc, queue, amqp.Publishing{
		Headers:      headers,
		ContentType:  d.ContentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    d.MessageId,
		Body:         d.Body,
	})
	w.pool <- pc
	if err != nil {
		fmt.Fprintln(os.Stderr, "raw-worker: move:", err)
		_ = d.Nack(false, true) // multiple=false, requeue=true
		return
	}
	_ = d.Ack(false)
}

// handleContract is handle carrying what Hopper's contract makes a
// delivery carry, built by the functions Hopper builds it with: the
// request's headers (identity, history, trace context and every
// application header, app.BuildHeaders) and, on a failure, a retry copy
// with the attempt's history (msg.RetryCopy). What it leaves out is the
// rest of Hopper: breaker, limiter, acker, spans, metrics, the publisher's
// pipeline. Against it, Hopper's CPU per message is what Hopper costs
// beyond the contract's headers.
func (w *rawWorker) handleContract(ctx context.Context, d *amqp.Delivery) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)

	m := deliveryMessage(d)
	now := time.Now()
	in := msg.Read(m, w.queue, "", now)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(w.appURL)
	ct := d.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	req.Header.SetContentType(ct)
	var buf [32]happ.Header
	hs, _ := happ.BuildHeaders(buf[:0], m, in)
	for _, h := range hs {
		req.Header.Add(h.Name, h.Value)
	}
	req.SetBodyRaw(d.Body)

	err := w.client.DoTimeout(req, resp, w.timeout)
	var status int
	if err == nil {
		status = resp.StatusCode()
	}
	switch {
	case err != nil:
		_ = d.Nack(false, true) // multiple=false, requeue=true
	case status >= 200 && status <= 299:
		_ = d.Ack(false)
	default:
		queue := w.retryQueue
		if status == fasthttp.StatusBadRequest {
			queue = w.dlq
		}
		w.moveWith(ctx, d, queue, amqpTable(msg.RetryCopy(m, in, in.Retries+1, status, now).Headers))
	}
}

// deliveryMessage is d as the message Hopper's consumer hands its loop:
// the delivery's fields Hopper's consumer copies, and its headers as the
// plain maps Hopper's header functions read (plainTable). Both contract
// loops build their headers from it; the expiration among the fields
// gives a message its deadline header, as it does in Hopper.
func deliveryMessage(d *amqp.Delivery) *msg.Message {
	return &msg.Message{Exchange: d.Exchange, RoutingKey: d.RoutingKey, Redelivered: d.Redelivered, Headers: plainTable(d.Headers),
		ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: d.DeliveryMode, Priority: d.Priority,
		CorrelationID: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: d.Expiration, MessageID: d.MessageId,
		Timestamp: d.Timestamp, Type: d.Type, UserID: d.UserId, AppID: d.AppId, Body: d.Body}
}

// plainTable is t with its nested tables (x-death's entries) as the plain
// maps Hopper's header functions read, as Hopper's consumer hands them
// over.
func plainTable(t amqp.Table) map[string]any {
	h := make(map[string]any, len(t))
	for k, v := range t {
		h[k] = plainValue(v)
	}
	return h
}

func plainValue(v any) any {
	switch v := v.(type) {
	case amqp.Table:
		return plainTable(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = plainValue(e)
		}
		return out
	}
	return v
}

// amqpTable is plainTable's inverse, for publishing.
func amqpTable(h map[string]any) amqp.Table {
	t := make(amqp.Table, len(h))
	for k, v := range h {
		t[k] = amqpValue(v)
	}
	return t
}

func amqpValue(v any) any {
	switch v := v.(type) {
	case map[string]any:
		return amqpTable(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = amqpValue(e)
		}
		return out
	}
	return v
}

func publishConfirmed(ctx context.Context, ch *amqp.Channel, queue string, p amqp.Publishing) error {
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue,
		false, // mandatory
		false, // immediate
		p)
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("publisher nack")
	}
	return nil
}

// asInt reads an integer header as Hopper does.
func asInt(v any) (int64, bool) { return msg.AsInt(v) }

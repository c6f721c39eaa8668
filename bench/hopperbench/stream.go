package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
	"github.com/valyala/fasthttp"

	happ "github.com/hopper-sidecar/hopper/app"
	"github.com/hopper-sidecar/hopper/msg"
)

// The stream path asks what reading a stream through Hopper costs against
// a hand-written loop on the stream client: a backlog of --stream-n
// messages is published into a stream (with the stream protocol, confirmed)
// and drained, the forms alternating within a run:
//
//   - rawstream: `hopperbench stream-worker`, the stream client's consumer
//     from the first offset with manual offset tracking, the same number of
//     workers each doing one fasthttp POST per message, at most --prefetch
//     messages handed and not answered, and the offset below which every
//     message is answered stored every second (what Hopper stores);
//   - rawstreamc (--raw-contract): the same loop sending, per message, the
//     request headers Hopper's contract has, built by Hopper's own
//     functions (msg.Read, app.BuildHeaders) from the message as read
//     (stream-worker --contract), and nothing else of Hopper: what honoring
//     the contract costs a loop by itself, the floor Hopper is held to;
//   - hopper: Hopper with a stream subscription (queue.type: stream) at the
//     same prefetch and workers;
//   - base (--baseline-bin): the same with the baseline binary;
//   - hopper-batch: Hopper delivering the stream in batches of
//     --batch-size (consumer.batch), at --batch-prefetch/--batch-workers;
//   - base-batch (--baseline-bin): the same with the baseline binary.
//
// Every form reads under a consumer name of its own, on a stream of its
// own. The rate, CPU and peak RSS are measured as on the other paths.

// streamWho are the forms of the stream path, in the order they drain;
// those of --raw-contract and --baseline-bin only when set (streamForms).
var streamWho = []string{"rawstream", "rawstreamc", "hopper", "base", "hopper-batch", "base-batch"}

// streamForms are the forms of streamWho this bench drains.
func (o *options) streamForms(baseline bool) []string {
	var out []string
	for _, who := range streamWho {
		switch {
		case who == "rawstreamc" && !o.rawContract:
		case (who == "base" || who == "base-batch") && !baseline:
		default:
			out = append(out, who)
		}
	}
	return out
}

// streamConsumer is the consumer name every form reads under.
const streamConsumer = "bench"

// streamSpec is a drain of the stream path by who.
func (e *env) streamSpec(who string, run int) spec {
	s := e.newSpec(fmt.Sprintf("bench-stream-%s-%d", who, run), "hopper", modeOK)
	s.stream, s.n = true, e.o.streamN
	switch who {
	case "rawstream", "rawstreamc", "base":
		s.kind = who
	case "hopper-batch", "base-batch":
		s.kind = strings.TrimSuffix(who, "-batch")
		s.mode = modeBatch
		s.consumer = e.o.batchSetting()
	}
	return s
}

// streaming drains the stream backlog in every form once per run.
func (e *env) streaming() (map[string][]runResult, error) {
	out := map[string][]runResult{}
	for run := 1; run <= e.o.runs; run++ {
		for _, who := range e.o.streamForms(e.baseBin != "") {
			res, err := e.drain(e.streamSpec(who, run))
			if err != nil {
				return nil, fmt.Errorf("stream path, %s run %d: %w", who, run, err)
			}
			out[who] = append(out[who], res)
			logRun("stream", who, run, e.o.runs, res)
		}
	}
	return out, nil
}

// streamEnv connects to the bench broker's stream listener.
func (e *env) streamEnv() (*stream.Environment, error) {
	return stream.NewEnvironment(streamEnvOptions(e.b.StreamPort()))
}

// publishStreamBacklog declares the stream name and writes n messages of
// size bytes into it, ids prefix0…, in confirmed batches.
func (e *env) publishStreamBacklog(ctx context.Context, name, prefix string, n, size int) (time.Duration, error) {
	env, err := e.streamEnv()
	if err != nil {
		return 0, fmt.Errorf("stream connect: %w", err)
	}
	defer env.Close()
	if err := env.DeclareStream(name, stream.NewStreamOptions()); err != nil {
		return 0, fmt.Errorf("declare stream: %w", err)
	}
	p, err := env.NewProducer(name, stream.NewProducerOptions())
	if err != nil {
		return 0, fmt.Errorf("producer: %w", err)
	}
	defer p.Close()
	confirms := p.NotifyPublishConfirmation()
	b := body(size)
	start := time.Now()
	const batch = 1000
	for i := 0; i < n; i += batch {
		msgs := make([]message.StreamMessage, 0, batch)
		for j := i; j < min(n, i+batch); j++ {
			m := amqp.NewMessage(b)
			m.Properties = &amqp.MessageProperties{MessageID: prefix + strconv.Itoa(j), ContentType: "application/octet-stream"}
			msgs = append(msgs, m)
		}
		if err := p.BatchSend(msgs); err != nil {
			return 0, fmt.Errorf("send: %w", err)
		}
		for got := 0; got < len(msgs); {
			select {
			case cs := <-confirms:
				for _, c := range cs {
					if !c.IsConfirmed() {
						return 0, errors.New("a backlog message was not confirmed")
					}
				}
				got += len(cs)
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
	}
	return time.Since(start), nil
}

// deleteStream removes a drained stream.
func (e *env) deleteStream(name string) {
	env, err := e.streamEnv()
	if err != nil {
		logf("delete stream %s: %v", name, err)
		return
	}
	defer env.Close()
	if err := env.DeleteStream(name); err != nil {
		logf("delete stream %s: %v", name, err)
	}
}

// printStream writes the stream path's table.
func (rep *report) printStream(w io.Writer, o *options) {
	fmt.Fprintf(w, "stream: a backlog of %d messages of %d B in a stream, drained from its first offset; rawstream, rawstreamc, hopper and base at prefetch/workers %d/%d, hopper-batch and base-batch %d per request at %d/%d\n",
		o.streamN, o.size, o.prefetch, o.workers, o.batchSize, o.batchPrefetch, o.batchWorkers)
	fmt.Fprintf(w, "%-13s %9s %9s %9s %10s %10s %10s %8s %8s\n", "form", "median/s", "min/s", "max/s", "cpu_s/100k", "broker_cpu", "app_cpu", "rss_MiB", "anon_MiB")
	for _, who := range streamWho {
		runs := rep.stream[who]
		if len(runs) == 0 {
			continue
		}
		r := summarize(rates(runs))
		fmt.Fprintf(w, "%-13s %9.0f %9.0f %9.0f %10.2f %10.2f %10.2f %8.1f %8.1f\n", who, r.med, r.min, r.max, consumerCPU(runs),
			summarize(cpus(runs, func(r runResult) time.Duration { return r.broker })).med,
			summarize(cpus(runs, func(r runResult) time.Duration { return r.appCPU })).med, maxHWM(runs), maxAnon(runs))
	}
	// As on the raw paths: when the machine is CPU-bound, the rate is the
	// cores over the CPU per message of everything on the path, which
	// does not depend on how busy the rest of the machine was in each run.
	total := func(who string) float64 {
		return summarize(cpus(rep.stream[who], func(r runResult) time.Duration { return r.cpu + r.broker + r.appCPU })).med
	}
	for _, who := range []string{"rawstreamc", "hopper", "base"} {
		if len(rep.stream[who]) > 0 {
			fmt.Fprintf(w, "cpu-bound model: consumer+broker+app %.2f (rawstream) vs %.2f (%s) cpu_s/100k -> ratio %.3f\n",
				total("rawstream"), total(who), who, total("rawstream")/total(who))
		}
	}
	fmt.Fprintln(w)
}

// streamLines are the stream path's summary lines: Hopper per message and
// in batches against the hand-written stream loop; with --raw-contract,
// Hopper per message against the loop sending the contract's headers
// (contract: stream …, raw_cpu_ratio being what the headers cost the
// loop); with --baseline-bin, the baseline binary's in the same shape
// (baseline: stream …).
func (rep *report) streamLines() []string {
	raw := rep.stream["rawstream"]
	r := summarize(rates(raw)).med
	line := func(prefix, name, who string) string {
		runs := rep.stream[who]
		h := summarize(rates(runs)).med
		return fmt.Sprintf("%s: %s %s=%.0f/s rawstream=%.0f/s ratio=%.3f cpu_ratio=%.2f rss_mb=%.1f anon_mb=%.1f raw_rss_mb=%.1f",
			prefix, name, map[bool]string{true: "base", false: "hopper"}[prefix == "baseline"], h, r, h/r,
			consumerCPU(runs)/consumerCPU(raw), maxHWM(runs), maxAnon(runs), maxHWM(raw))
	}
	var out []string
	for _, f := range []struct{ prefix, name, who string }{
		{"baseline", "stream", "base"}, {"baseline", "stream-batch", "base-batch"},
		{"bench", "stream", "hopper"}, {"bench", "stream-batch", "hopper-batch"},
	} {
		if len(rep.stream[f.who]) > 0 {
			out = append(out, line(f.prefix, f.name, f.who))
		}
	}
	if rc := rep.stream["rawstreamc"]; len(rc) > 0 {
		c := summarize(rates(rc)).med
		for _, who := range []string{"hopper", "base"} {
			runs := rep.stream[who]
			if len(runs) == 0 {
				continue
			}
			h := summarize(rates(runs)).med
			out = append(out, fmt.Sprintf("contract: stream %s=%.0f/s rawstreamc=%.0f/s ratio=%.3f cpu_ratio=%.2f raw_cpu_ratio=%.2f rawstreamc_ratio=%.3f",
				who, h, c, h/c, consumerCPU(runs)/consumerCPU(rc), consumerCPU(rc)/consumerCPU(raw), c/r))
		}
	}
	return out
}

// streamWorkerMain is the hand-written stream loop (see the stream path).
func streamWorkerMain(args []string) int {
	fs := flag.NewFlagSet("stream-worker", flag.ExitOnError)
	port := fs.Int("port", 5552, "stream listener port on 127.0.0.1")
	name := fs.String("stream", "", "stream")
	consumer := fs.String("consumer", streamConsumer, "consumer name the offset is stored under")
	appURL := fs.String("app", "", "app URL (POST target)")
	prefetch := fs.Int("prefetch", 200, "messages handed to the workers and not answered, at most")
	workers := fs.Int("workers", 64, "concurrent requests")
	timeout := fs.Duration("timeout", 30*time.Second, "per request")
	contract := fs.Bool("contract", false, "send the request headers Hopper's contract has (with Hopper's own header functions), and nothing else of Hopper")
	queue := fs.String("queue", "", "with --contract: the queue the headers name (a stream subscription's own queue)")
	_ = fs.Parse(args)
	if *name == "" || *appURL == "" {
		fmt.Fprintln(os.Stderr, "stream-worker: --stream and --app are required")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// As raw-worker: HOPPERBENCH_RAW_PROFILE=DIR writes the loop's CPU
	// profile and allocation counts there.
	if dir := os.Getenv("HOPPERBENCH_RAW_PROFILE"); dir != "" {
		done, err := profileRaw(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "stream-worker: profile:", err)
			return 1
		}
		defer done()
	}
	sw := &streamWorker{appURL: *appURL, timeout: *timeout, client: newRawClient(*workers, *timeout)}
	post := sw.post
	if *contract {
		sw.stream, sw.queue = *name, *queue
		post = sw.postContract
	}
	if err := runStreamWorker(ctx, *port, *name, *consumer, *prefetch, *workers, post); err != nil {
		fmt.Fprintln(os.Stderr, "stream-worker:", err)
		return 1
	}
	return 0
}

// streamEnvOptions reach the bench broker's stream listener, with the
// socket buffers left to the kernel as Hopper leaves them: the client's
// default of 8 KiB holds a backlog's reading to a few hundred messages a
// second.
func streamEnvOptions(port int) *stream.EnvironmentOptions {
	return stream.NewEnvironmentOptions().SetHost("127.0.0.1").SetPort(port).SetReadBuffer(0).SetWriteBuffer(0)
}

// streamItem is one message handed to a worker.
type streamItem struct {
	off int64
	m   *amqp.Message
}

// runStreamWorker reads the stream from its first offset and has workers
// post each message (post, with a request and a response of the worker's
// own), at most prefetch handed and not answered; the offset below the
// lowest unanswered one is stored every second.
func runStreamWorker(ctx context.Context, port int, name, consumer string, prefetch, workers int,
	post func(req *fasthttp.Request, resp *fasthttp.Response, it streamItem)) error {
	env, err := stream.NewEnvironment(streamEnvOptions(port))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer env.Close()
	items := make(chan streamItem, prefetch)
	// inFlight are the offsets handed and not answered; the offset below
	// the lowest is stored every second.
	var mu sync.Mutex
	inFlight := map[int64]struct{}{}
	highest := int64(-1)
	c, err := env.NewConsumer(name, func(cc stream.ConsumerContext, m *amqp.Message) {
		off := cc.Consumer.GetOffset()
		mu.Lock()
		inFlight[off] = struct{}{}
		highest = off
		mu.Unlock()
		items <- streamItem{off: off, m: m}
	}, stream.NewConsumerOptions().SetConsumerName(consumer).SetManualCommit().SetOffset(stream.OffsetSpecification{}.First()))
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := fasthttp.AcquireRequest()
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for it := range items {
				rawHandled.Add(1)
				post(req, resp, it)
				mu.Lock()
				delete(inFlight, it.off)
				mu.Unlock()
			}
		}()
	}
	store := func() {
		mu.Lock()
		done := highest
		for off := range inFlight {
			done = min(done, off-1)
		}
		mu.Unlock()
		if done >= 0 {
			_ = c.StoreCustomOffset(done)
		}
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			store()
			_ = c.Close()
			return nil
		case <-tick.C:
			store()
		}
	}
}

// streamWorker is what the stream loop's workers post with.
type streamWorker struct {
	appURL  string
	timeout time.Duration
	client  *fasthttp.Client
	// stream and queue are what the contract's headers name: the stream
	// read and the subscription's own queue (postContract).
	stream, queue string
}

// post POSTs one stream message as the raw loop does a queue's: the body,
// its content type, the message id and the attempt.
func (w *streamWorker) post(req *fasthttp.Request, resp *fasthttp.Response, it streamItem) {
	m := it.m
	req.Reset()
	resp.Reset()
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(w.appURL)
	ct, id := "application/octet-stream", ""
	if p := m.Properties; p != nil {
		if p.ContentType != "" {
			ct = p.ContentType
		}
		id, _ = p.MessageID.(string)
	}
	req.Header.SetContentType(ct)
	req.Header.Set(hdrMessageID, id)
	req.Header.Set(hdrAttempt, "1")
	req.SetBodyRaw(m.GetData())
	_ = w.client.DoTimeout(req, resp, w.timeout)
}

// postContract is post carrying the request headers Hopper's contract
// makes a stream message carry, built by the functions Hopper builds them
// with: the message's identity and history read by msg.Read, its
// application properties, the stream and the offset it was read at, all
// through app.BuildHeaders. What it leaves out is the rest of Hopper:
// the prefetch budget, the offset tracker, the delivery loop, breaker,
// limiter, spans and metrics. Against it, Hopper's CPU per message is
// what Hopper costs beyond the contract's headers.
func (w *streamWorker) postContract(req *fasthttp.Request, resp *fasthttp.Response, it streamItem) {
	m := contractMessage(it.m, w.stream, it.off)
	in := msg.Read(m, w.queue, "", time.Now())
	req.Reset()
	resp.Reset()
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(w.appURL)
	ct := m.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	req.Header.SetContentType(ct)
	var buf [32]happ.Header
	hs, _ := happ.BuildHeaders(buf[:0], m, in)
	for _, h := range hs {
		req.Header.Add(h.Name, h.Value)
	}
	req.SetBodyRaw(m.Body)
	_ = w.client.DoTimeout(req, resp, w.timeout)
}

// contractMessage is the message Hopper's contract describes, read off a
// stream message as a loop would: its properties, its application
// properties as headers, and the stream and offset it was read at under
// the headers Hopper names them with (msg.HeaderStream,
// msg.HeaderStreamOffset).
func contractMessage(sm *amqp.Message, stream string, off int64) *msg.Message {
	m := &msg.Message{Headers: make(map[string]any, len(sm.ApplicationProperties)+2), Body: sm.GetData()}
	for k, v := range sm.ApplicationProperties {
		m.Headers[k] = v
	}
	if p := sm.Properties; p != nil {
		m.MessageID, _ = p.MessageID.(string)
		m.CorrelationID, _ = p.CorrelationID.(string)
		m.ContentType, m.ContentEncoding = p.ContentType, p.ContentEncoding
		m.Timestamp, m.Type = p.CreationTime, p.Subject
	}
	m.Headers[msg.HeaderStream] = stream
	m.Headers[msg.HeaderStreamOffset] = off
	return m
}

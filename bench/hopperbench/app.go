package main

import (
	"bytes"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// Request headers the app reads. Hopper sets them (proxy/headers.go); the
// raw worker sets the same ones so the app treats both alike.
const (
	hdrMessageID = "Hopper-Message-Id"
	hdrAttempt   = "Hopper-Attempt"
	// hdrSent carries the AMQP header sentHeader (Hopper forwards an
	// application header x as Hopper-Header-x).
	hdrSent = "Hopper-Header-" + sentHeader
	// sentHeader is the AMQP header holding the publish time, Unix ns.
	sentHeader = "x-bench-sent"
	// appPath receives the messages; healthPath answers GET 200.
	appPath    = "/messages"
	healthPath = "/healthz"
	// The fair path's two subscriptions post to paths of their own, which
	// is how the app tells a healthy message from a poison one.
	healthyPath = "/healthy"
	poisonPath  = "/poison"
	// slowPath is answered like appPath, but only after slowDelay: the slow
	// path's app, which takes its time as real apps do.
	slowPath = "/slow"
	// keyedPath is answered like appPath, but only after keyedDelay: the
	// keyed path's app, slow enough that how many messages are at the app
	// at once decides the rate.
	keyedPath = "/keyed"
	// bigPath is answered like appPath after bigDelay, counting how many
	// requests it holds at once: the big path's app.
	bigPath = "/big"
	// floorPath hears from the floor, which takes deliveries without
	// sending any: a request when its first delivery came (the run's
	// first request), and one with hdrFloorFinal N when the broker has
	// taken the ack of its last, N final answers at once.
	floorPath     = "/floor"
	hdrFloorFinal = "Hopper-Floor-Final"
)

// mode is how the app answers.
type mode int

const (
	modeOK      mode = iota // 200
	modeRetry               // 503 on attempt 1, then 200
	modeDLQ                 // 400
	modeLatency             // 200, recording receipt − send
	modeFair                // healthyPath 200, poisonPath 500 every time
	// modeBatch answers a batch request (a JSON envelope of entries) with
	// an empty 200, which acks every entry; a single message gets 200.
	modeBatch
	// modeBatchRetry answers a batch request with a results body in which
	// every batchRetryEvery-th message (by the number ending its id) gets
	// 503 the first time it is seen and every other entry 200.
	modeBatchRetry
)

func parseMode(s string) (mode, error) {
	switch s {
	case "ok", "happy":
		return modeOK, nil
	case "retry":
		return modeRetry, nil
	case "dlq":
		return modeDLQ, nil
	case "latency":
		return modeLatency, nil
	case "fair":
		return modeFair, nil
	case "batch":
		return modeBatch, nil
	case "batch-retry":
		return modeBatchRetry, nil
	}
	return 0, fmt.Errorf("unknown mode %q (want ok, retry, dlq, latency, fair, batch or batch-retry)", s)
}

// appRun is the app's state for one measured run.
type appRun struct {
	mode   mode
	target int64 // final answers that complete the run
	// onFirst runs, inline, on the first request (it samples CPU counters).
	onFirst func()

	total atomic.Int64 // every request
	final atomic.Int64 // final answers: 200 (ok, retry, latency) or 400 (dlq)
	first atomic.Int64 // Unix ns of the first request
	last  atomic.Int64 // Unix ns of the target-th final answer
	done  chan struct{}

	// Fair mode: total, final, first and last count the healthy path only;
	// the poison requests are counted apart, with their count sampled at
	// the first, the middle and the last healthy answer so the report can
	// tell that poison kept flowing for the whole drain.
	poison                                    atomic.Int64
	poisonAtFirst, poisonAtHalf, poisonAtLast atomic.Int64
	stray                                     atomic.Int64 // neither path: a misrouted message

	// Big path: requests being held now, and the most held at once.
	held, maxHeld atomic.Int64

	// Batch modes: the entries of batch requests (their mean per request
	// tells whether full batches formed), the entries answered 503, the
	// entries that broke the envelope's rules, and which messages have
	// been seen (by the number ending the id; see modeBatchRetry).
	entries, batches, entries503, badEntries atomic.Int64
	seen                                     []atomic.Bool
	// broken is closed when the app found the first request breaking the
	// batch envelope's rules; brokenWhy says what (set before the close).
	broken     chan struct{}
	brokenOnce sync.Once
	brokenWhy  string

	// lat holds receipt − send per client, told apart by the first byte
	// of the message id (see latencyClient).
	mu     sync.Mutex
	lat    [2][]time.Duration
	seq    [2][]int // the number ending each sample's message id, -1 if none
	badLat atomic.Int64
}

// latencyClient maps a latency message id to its client: ids start with
// "h" for Hopper's queue and "r" for the raw worker's.
func latencyClient(id []byte) int {
	if len(id) > 0 && id[0] == 'h' {
		return 1
	}
	return 0
}

func newAppRun(m mode, target int64, onFirst func()) *appRun {
	r := &appRun{mode: m, target: target, onFirst: onFirst, done: make(chan struct{}), broken: make(chan struct{})}
	if m == modeLatency {
		for i := range r.lat {
			r.lat[i] = make([]time.Duration, 0, 1<<14)
		}
	}
	if m == modeBatchRetry && target > 0 {
		r.seen = make([]atomic.Bool, target)
	}
	return r
}

// elapsed is first request → target-th final answer.
func (r *appRun) elapsed() time.Duration {
	return time.Duration(r.last.Load() - r.first.Load())
}

// latencies returns a copy of one client's samples, in arrival order, and
// the sequence number of each.
func (r *appRun) latencies(client int) ([]time.Duration, []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.lat[client]...), append([]int(nil), r.seq[client]...)
}

// idSeq is the number after the last '-' of a message id, or -1.
func idSeq(id []byte) int {
	i := bytes.LastIndexByte(id, '-')
	n, err := strconv.Atoi(string(id[i+1:]))
	if err != nil {
		return -1
	}
	return n
}

// received is how many latency samples a client has delivered so far.
func (r *appRun) received(client int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lat[client])
}

// app is the trivial HTTP app both consumers deliver to.
type app struct {
	run atomic.Pointer[appRun]
	srv *fasthttp.Server
	ln  net.Listener
	url string // base URL, no path
}

func startApp(addr string) (*app, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("app listen: %w", err)
	}
	a := &app{ln: ln, url: "http://" + ln.Addr().String()}
	a.srv = &fasthttp.Server{
		Handler:               a.handle,
		Name:                  "bench-app",
		ReadTimeout:           2 * time.Minute,
		IdleTimeout:           2 * time.Minute,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
		NoDefaultServerHeader: true,
	}
	go func() {
		if err := a.srv.Serve(ln); err != nil {
			logf("app server: %v", err)
		}
	}()
	return a, nil
}

func (a *app) close() error { return a.srv.Shutdown() }

func (a *app) handle(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		return // health check: 200
	}
	r := a.run.Load()
	if r == nil {
		return
	}
	now := time.Now()
	arrived := now // the first request's arrival starts the run
	switch string(ctx.Path()) {
	case slowPath:
		time.Sleep(slowDelay)
		now = time.Now() // a slow message is final when answered, after the delay
	case keyedPath:
		time.Sleep(keyedDelay)
		now = time.Now()
	case bigPath:
		h := r.held.Add(1)
		for m := r.maxHeld.Load(); h > m && !r.maxHeld.CompareAndSwap(m, h); m = r.maxHeld.Load() {
		}
		time.Sleep(bigDelay)
		r.held.Add(-1)
		now = time.Now()
	}
	if r.mode == modeFair {
		switch string(ctx.Path()) {
		case healthyPath:
		case poisonPath:
			r.poison.Add(1)
			ctx.SetStatusCode(fasthttp.StatusInternalServerError)
			return
		default:
			r.stray.Add(1)
			ctx.SetStatusCode(fasthttp.StatusNotFound)
			return
		}
	}
	r.total.Add(1)
	if r.first.Load() == 0 && r.first.CompareAndSwap(0, arrived.UnixNano()) {
		r.poisonAtFirst.Store(r.poison.Load())
		if r.onFirst != nil {
			r.onFirst()
		}
	}
	if string(ctx.Path()) == floorPath {
		n, _ := strconv.ParseInt(string(ctx.Request.Header.Peek(hdrFloorFinal)), 10, 64)
		r.finish(n, now)
		return
	}
	if r.mode == modeBatch || r.mode == modeBatchRetry {
		r.finish(a.handleBatch(ctx, r), now)
		return
	}
	switch r.mode {
	case modeRetry:
		if a := ctx.Request.Header.Peek(hdrAttempt); len(a) == 1 && a[0] == '1' {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			return
		}
	case modeDLQ:
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
	case modeLatency:
		sent, err := strconv.ParseInt(string(ctx.Request.Header.Peek(hdrSent)), 10, 64)
		if err != nil {
			r.badLat.Add(1)
			break
		}
		id := ctx.Request.Header.Peek(hdrMessageID)
		c, seq := latencyClient(id), idSeq(id)
		r.mu.Lock()
		r.lat[c] = append(r.lat[c], now.Sub(time.Unix(0, sent)))
		r.seq[c] = append(r.seq[c], seq)
		r.mu.Unlock()
	}
	r.finish(1, now)
}

// finish counts k final answers given at now, and ends the run when they
// reach its target.
func (r *appRun) finish(k int64, now time.Time) {
	if k == 0 {
		return
	}
	n := r.final.Add(k)
	if n >= r.target/2 && n-k < r.target/2 {
		r.poisonAtHalf.Store(r.poison.Load())
	}
	if n >= r.target && n-k < r.target {
		r.poisonAtLast.Store(r.poison.Load())
		r.last.Store(now.UnixNano())
		close(r.done)
	}
}

// appMain runs the app as a process of its own (for `hopperbench profile`,
// so the profiled process holds Hopper alone). It prints its URL on the
// first line of standard output and serves until SIGTERM.
func appMain(args []string) int {
	fs := flag.NewFlagSet("app", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "listen address")
	modeName := fs.String("mode", "ok", "ok, retry, dlq, latency, fair, batch or batch-retry")
	_ = fs.Parse(args)
	m, err := parseMode(*modeName)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hopperbench app:", err)
		return 2
	}
	a, err := startApp(*listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hopperbench app:", err)
		return 1
	}
	a.run.Store(newAppRun(m, -1, nil))
	fmt.Println(a.url)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	if err := a.close(); err != nil {
		fmt.Fprintln(os.Stderr, "hopperbench app: shutdown:", err)
	}
	return 0
}

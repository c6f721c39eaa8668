// Command demoapp is a scriptable HTTP app for trying Hopper out: each
// message says, in its AMQP header "demo-script", how the app should answer
// each attempt, so one run can show every row of Hopper's outcome table
// without writing an app.
//
// Hopper forwards the AMQP header demo-script as the request header
// Hopper-Header-Demo-Script. Its value is a comma-separated list of entries,
// one per delivery, for example "503,503,200":
//
//	<status>          answer that status (200-599); 425 also sets Retry-After: 1
//	sleep:<duration>  hang that long (e.g. sleep:40s) then answer 200, to show
//	                  Hopper's request timeout
//
// The entry used is number Hopper-Attempt - 1 + Hopper-Requeue-Count (both
// counters start where Hopper leaves them: attempt 1, 0 requeues), and the
// last entry repeats, so "503" fails for ever and "425,200" succeeds after
// one requeue. Without a script every request gets 200. A script that does
// not parse gets 400, which Hopper dead-letters at once: a typo shows up in
// the DLQ instead of looping.
//
// Each request is logged as one line on standard output:
//
//	demoapp: id=<Hopper-Message-Id> attempt=<n> requeues=<n> routing_key=<key> -> <status>
//
// Everything else (start, stop, errors) goes to standard error, so that
// tests can read standard output as the request log.
//
// Batches (Hopper's consumer.batch) are POSTed to the batch path, default
// /batch: the body is Hopper's envelope {"entries":[{"id":…,"headers":{…},
// …}]}, and each entry is answered by its own script, read from the
// headers the entry carries, in a results body:
//
//	{"results":[{"id":"m-1","status":200},{"id":"m-2","status":503,"error":"…"}]}
//
// A sleep: entry holds the whole request (the longest sleep of its
// entries), as a slow message holds a real batch handler. Each entry is
// logged as a request is, with "(batch of <n>)" after it.
//
// GET /stats returns the answers given so far as JSON (see stats); DELETE
// /stats resets them. GET on the health path answers 200.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Request headers set by Hopper (see proxy/headers.go). They are repeated
// here rather than imported so that the demo app stays what a real app is:
// an HTTP server that knows nothing of Hopper's code.
const (
	hdrMessageID  = "Hopper-Message-Id"
	hdrAttempt    = "Hopper-Attempt"
	hdrRequeues   = "Hopper-Requeue-Count"
	hdrRoutingKey = "Hopper-Routing-Key"
	hdrScript     = "Hopper-Header-Demo-Script"
)

// maxHistory bounds the per-message history kept for /stats, so a long
// test that retries one message for ever does not grow the app without end.
const maxHistory = 100

// maxBatchBytes bounds a batch request's body: Hopper's own bound
// (consumer.batch.maxBytes, 1 MiB by default) plus each entry's headers and
// the base64 of bodies that are not JSON, with room to spare.
const maxBatchBytes = 16 << 20

// maxSleep bounds a sleep: entry; a script is test input, and a typo like
// sleep:10000h must not pin a goroutine for a year.
const maxSleep = 10 * time.Minute

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to listen on")
	path := flag.String("path", "/", "path that receives Hopper's POSTs")
	batchPath := flag.String("batch-path", "/batch", "path that receives Hopper's batches (consumer.batch)")
	health := flag.String("health", "/healthz", "health check path (GET answers 200)")
	flag.Parse()

	errLog := log.New(os.Stderr, "demoapp: ", 0)
	if err := serve(*listen, *path, *batchPath, *health, errLog); err != nil {
		errLog.Print(err)
		os.Exit(1)
	}
}

// serve runs the app until SIGTERM or SIGINT, then lets requests in flight
// finish for a few seconds, as an app behind Hopper should.
func serve(listen, path, batchPath, health string, errLog *log.Logger) error {
	// http.ServeMux panics on these; say which flag is wrong instead.
	paths := []struct{ flag, path string }{{"--path", path}, {"--batch-path", batchPath}, {"--health", health}, {"", "/stats"}}
	for i, p := range paths {
		if !strings.HasPrefix(p.path, "/") || strings.ContainsAny(p.path, " {}") {
			return fmt.Errorf("%s %q: want a path starting with /, without spaces or braces", p.flag, p.path)
		}
		for _, q := range paths[:i] {
			if p.path == q.path {
				return fmt.Errorf("--path %q, --batch-path %q, --health %q and /stats must differ", path, batchPath, health)
			}
		}
	}
	a := &app{reqLog: log.New(os.Stdout, "demoapp: ", 0), stats: newStats()}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+health, func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /stats", a.getStats)
	mux.HandleFunc("DELETE /stats", a.resetStats)
	mux.HandleFunc(path, a.handle)
	mux.HandleFunc(batchPath, a.handleBatch)

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	errLog.Printf("listening on http://%s%s (batches %s, health %s, stats /stats)", ln.Addr(), path, batchPath, health)

	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	errLog.Print("shutting down")
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

type app struct {
	reqLog *log.Logger
	stats  *stats
}

// delivery is what the app reads of one message: from a request's headers,
// or from the headers a batch entry carries.
type delivery struct {
	id, routingKey, script string
	attempt, requeues      int
}

func readDelivery(h http.Header) delivery {
	return delivery{
		id:         h.Get(hdrMessageID),
		routingKey: h.Get(hdrRoutingKey),
		script:     h.Get(hdrScript),
		attempt:    headerInt(h, hdrAttempt, 1),
		requeues:   headerInt(h, hdrRequeues, 0),
	}
}

// answer is the script's answer to d: a status, or a sleep after which the
// answer is 200, or an error for a script that does not parse.
func (d delivery) answer() (status int, sleep time.Duration, err error) {
	return pick(d.script, d.attempt-1+d.requeues)
}

// handle answers one delivery as its script says.
func (a *app) handle(w http.ResponseWriter, r *http.Request) {
	d := readDelivery(r.Header)
	id, attempt, requeues := d.id, d.attempt, d.requeues

	status, sleep, err := d.answer()
	var (
		note string
		gone bool
	)
	switch {
	case err != nil:
		status, note = http.StatusBadRequest, fmt.Sprintf(" (bad %s: %v)", hdrScript, err)
	case sleep > 0:
		t := time.NewTimer(sleep)
		select {
		case <-t.C:
			note = fmt.Sprintf(" (after sleeping %v)", sleep)
		case <-r.Context().Done():
			// Hopper gave up (its request timeout); the 200 below goes
			// nowhere, which is the point of the demo.
			t.Stop()
			gone = true
			note = " (client gone before the sleep ended)"
		}
	}

	if status == http.StatusTooEarly {
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	if err != nil {
		fmt.Fprintf(w, "demoapp: %v\n", err)
	} else {
		fmt.Fprintf(w, "demoapp: %d %s\n", status, http.StatusText(status))
	}
	a.stats.record(id, entry{Attempt: attempt, Requeues: requeues, Status: status, ClientGone: gone})
	a.reqLog.Printf("id=%s attempt=%d requeues=%d routing_key=%s -> %d%s",
		id, attempt, requeues, d.routingKey, status, note)
}

// batchEntry is one message of Hopper's batch envelope, as far as the app
// reads it: the headers a single request would have carried.
type batchEntry struct {
	ID      string            `json:"id"`
	Headers map[string]string `json:"headers"`
}

// batchResult is one entry of the results body, Hopper's shape.
type batchResult struct {
	ID         string `json:"id"`
	Status     int    `json:"status"`
	RetryAfter string `json:"retryAfter,omitempty"`
	Error      string `json:"error,omitempty"`
}

// handleBatch answers a batch entry by entry, each as handle would have
// answered it alone, in one results body. A body that is not the envelope
// gets 400, which dead-letters the whole batch: a batch sent to the wrong
// path shows up in the DLQ instead of looping.
func (a *app) handleBatch(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Entries []batchEntry `json:"entries"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBatchBytes)).Decode(&req); err != nil {
		http.Error(w, "demoapp: not a batch envelope: "+err.Error(), http.StatusBadRequest)
		return
	}
	n := len(req.Entries)
	ds := make([]delivery, n)
	results := make([]batchResult, n)
	notes := make([]string, n)
	var longest time.Duration
	for i, e := range req.Entries {
		h := http.Header{}
		for k, v := range e.Headers {
			h.Set(k, v) // canonical names: Hopper-Header-demo-script reads as Hopper-Header-Demo-Script
		}
		ds[i] = readDelivery(h)
		if ds[i].id == "" {
			ds[i].id = e.ID // a message without an id: the entry's id is what Hopper made for it
		}
		status, sleep, err := ds[i].answer()
		results[i] = batchResult{ID: e.ID, Status: status}
		switch {
		case err != nil:
			results[i].Status, results[i].Error = http.StatusBadRequest, fmt.Sprintf("bad %s: %v", hdrScript, err)
			notes[i] = " (" + results[i].Error + ")"
		case status == http.StatusTooEarly:
			results[i].RetryAfter = "1"
		case status >= 300:
			results[i].Error = fmt.Sprintf("demoapp: %d %s", status, http.StatusText(status))
		}
		longest = max(longest, sleep)
	}
	gone := false
	if longest > 0 {
		t := time.NewTimer(longest)
		select {
		case <-t.C:
		case <-r.Context().Done(): // Hopper gave up on the whole batch
			t.Stop()
			gone = true
		}
	}
	for i, d := range ds {
		a.stats.record(d.id, entry{Attempt: d.attempt, Requeues: d.requeues, Status: results[i].Status, ClientGone: gone, Batch: n})
		if gone {
			notes[i] += " (client gone before the sleep ended)"
		}
		a.reqLog.Printf("id=%s attempt=%d requeues=%d routing_key=%s -> %d%s (batch of %d)",
			d.id, d.attempt, d.requeues, d.routingKey, results[i].Status, notes[i], n)
	}
	body, err := json.Marshal(map[string][]batchResult{"results": results})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body) // a failed write means the client left
}

// pick returns the answer for entry i of script: a status, or a sleep
// after which the answer is 200. An empty script answers 200.
func pick(script string, i int) (status int, sleep time.Duration, err error) {
	if strings.TrimSpace(script) == "" {
		return http.StatusOK, 0, nil
	}
	entries := strings.Split(script, ",")
	// Check every entry, not only the one used, so that a typo in a later
	// entry fails on the first attempt rather than minutes later.
	for _, e := range entries {
		if _, _, err := parseEntry(e); err != nil {
			return 0, 0, err
		}
	}
	i = min(max(i, 0), len(entries)-1)
	return parseEntry(entries[i])
}

func parseEntry(e string) (status int, sleep time.Duration, err error) {
	e = strings.TrimSpace(e)
	if d, ok := strings.CutPrefix(e, "sleep:"); ok {
		sleep, err = time.ParseDuration(d)
		if err != nil || sleep <= 0 || sleep > maxSleep {
			return 0, 0, fmt.Errorf("entry %q: want sleep:<duration> with a unit, up to %v", e, maxSleep)
		}
		return http.StatusOK, sleep, nil
	}
	status, err = strconv.Atoi(e)
	if err != nil || status < 200 || status > 599 {
		return 0, 0, fmt.Errorf("entry %q: want an HTTP status 200-599 or sleep:<duration>", e)
	}
	return status, 0, nil
}

// headerInt reads a counter header; a missing or garbled one means def, so
// the app also works when called by hand with curl.
func headerInt(h http.Header, name string, def int) int {
	n, err := strconv.Atoi(strings.TrimSpace(h.Get(name)))
	if err != nil || n < 0 {
		return def
	}
	return n
}

// entry is one answer given.
type entry struct {
	Attempt  int `json:"attempt"`
	Requeues int `json:"requeues"`
	Status   int `json:"status"`
	// ClientGone marks a sleep the client did not wait for: the status was
	// written but never read, so it is not counted under by_status.
	ClientGone bool `json:"client_gone,omitempty"`
	// Batch is the number of entries of the batch request the answer was
	// part of; 0 for a request of its own.
	Batch int `json:"batch,omitempty"`
}

// messageStats is what one message id received.
type messageStats struct {
	Requests   int            `json:"requests"`
	ByStatus   map[string]int `json:"by_status"`
	ClientGone int            `json:"client_gone"`
	// History lists the answers in order (at most maxHistory, the first
	// ones kept); Requests keeps counting past it.
	History []entry `json:"history"`
}

// stats counts answers by status and by message id (messages without an id
// are counted under ""): requests received, answers read by the client by
// status, and sleeps the client gave up on. It is the JSON served on GET
// /stats.
type stats struct {
	mu         sync.Mutex
	Requests   int                      `json:"requests"`
	ByStatus   map[string]int           `json:"by_status"`
	ClientGone int                      `json:"client_gone"`
	ByMessage  map[string]*messageStats `json:"by_message"`
}

func newStats() *stats {
	return &stats{ByStatus: map[string]int{}, ByMessage: map[string]*messageStats{}}
}

func (s *stats) record(id string, e entry) {
	code := strconv.Itoa(e.Status)
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.ByMessage[id]
	if m == nil {
		m = &messageStats{ByStatus: map[string]int{}}
		s.ByMessage[id] = m
	}
	s.Requests++
	m.Requests++
	if e.ClientGone {
		s.ClientGone++
		m.ClientGone++
	} else {
		s.ByStatus[code]++
		m.ByStatus[code]++
	}
	if len(m.History) < maxHistory {
		m.History = append(m.History, e)
	}
}

func (a *app) getStats(w http.ResponseWriter, _ *http.Request) {
	a.stats.mu.Lock()
	body, err := json.MarshalIndent(a.stats, "", "  ")
	a.stats.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(body, '\n')) // a failed write means the client left
}

func (a *app) resetStats(w http.ResponseWriter, _ *http.Request) {
	a.stats.mu.Lock()
	a.stats.Requests = 0
	a.stats.ClientGone = 0
	a.stats.ByStatus = map[string]int{}
	a.stats.ByMessage = map[string]*messageStats{}
	a.stats.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}
